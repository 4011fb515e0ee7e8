"""decode_groups: replica groups (logical device ids) -> mesh axes, or None for groups that
are not lines of the mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

import lowering
from lowering.replica_groups import axis_groups, decode_groups
from mesh import isa

CUBE = isa.MeshSpec(("x", "y", "z"), (4, 4, 4))
WIDE = isa.MeshSpec(("a", "b"), (2, 32))
LINE = isa.MeshSpec(("i",), (64,))


def ids(mesh: isa.MeshSpec) -> np.ndarray:
    return np.arange(mesh.num_devices).reshape(mesh.axis_sizes)


def lines(mesh: isa.MeshSpec, axes: tuple[int, ...]) -> np.ndarray:
    """Groups along `axes` built by hand: the other coordinates fixed, members row-major
    over `axes` in the order given."""
    rest = [a for a in range(mesh.rank) if a not in axes]
    moved = np.transpose(ids(mesh), rest + list(axes))
    return moved.reshape(-1, int(np.prod([mesh.axis_sizes[a] for a in axes])))


def shuffled_groups(mesh, axes):
    groups = lines(mesh, axes)
    return groups[np.random.default_rng(0).permutation(len(groups))]


# (name, mesh, replica groups, expected axes or None)
CASES = [
    ("x", CUBE, lines(CUBE, (0,)), (0,)),
    ("y", CUBE, lines(CUBE, (1,)), (1,)),
    ("z", CUBE, lines(CUBE, (2,)), (2,)),
    ("xy", CUBE, lines(CUBE, (0, 1)), (0, 1)),
    ("yx", CUBE, lines(CUBE, (1, 0)), (1, 0)),
    ("zx", CUBE, lines(CUBE, (2, 0)), (2, 0)),
    ("xyz", CUBE, lines(CUBE, (0, 1, 2)), (0, 1, 2)),
    ("zyx", CUBE, lines(CUBE, (2, 1, 0)), (2, 1, 0)),
    ("groups listed in any order", CUBE, shuffled_groups(CUBE, (1, 2)), (1, 2)),
    ("empty: one group of all", CUBE, np.zeros((0, 0), np.int64), (0, 1, 2)),
    ("one device per group", CUBE, np.arange(64)[:, None], ()),
    ("axis_index_groups pairs along x", CUBE,
     lines(CUBE, (0,)).reshape(-1, 2), None),
    ("members in reverse order", CUBE, lines(CUBE, (0,))[:, ::-1], None),
    ("a ring that is not a line", CUBE,
     np.stack([np.roll(g, 1) for g in lines(CUBE, (1,))]), None),
    ("halves of the mesh", CUBE, np.arange(64).reshape(2, 32), None),
    ("2x32 long axis", WIDE, lines(WIDE, (1,)), (1,)),
    ("2x32 both axes, minor first", WIDE, lines(WIDE, (1, 0)), (1, 0)),
    ("64 in a line", LINE, np.arange(64)[None], (0,)),
    ("64 in strided groups", LINE, np.arange(64).reshape(8, 8).T, None),
]


@pytest.mark.parametrize("mesh, groups, axes", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decode_groups(mesh, groups, axes):
    decoded = decode_groups(groups, mesh)
    assert decoded.axes == axes
    expected_groups = np.arange(mesh.num_devices)[None] if groups.size == 0 else groups
    assert decoded.device_groups == tuple(map(tuple, expected_groups.tolist()))
    if axes is not None:  # the axes reproduce the groups, member order included
        assert set(map(tuple, axis_groups(mesh, axes).tolist())) == \
            set(decoded.device_groups)


@pytest.mark.parametrize("groups, message", [
    (np.array([[0, 1], [1, 2]]), "do not partition"),
    (lines(CUBE, (0,))[:-1], "do not partition"),
    (np.arange(64), "expected"),
])
def test_bad_groups_are_refused(groups, message):
    with pytest.raises(ValueError, match=message):
        decode_groups(groups, CUBE)


@pytest.mark.parametrize("axes, expected", [
    ("x", (0,)), ("z", (2,)), (("y", "z"), (1, 2)), (("z", "y"), (2, 1)),
    (("z", "x", "y"), (2, 0, 1)),
])
def test_groups_jax_emits_decode_to_their_axes(axes, expected):
    """What jax writes into replica_groups for psum/all_gather over `axes`."""
    mesh = AbstractMesh((4, 4, 4), ("x", "y", "z"), axis_types=(AxisType.Auto,) * 3)
    body = lambda v: (jax.lax.psum(v, axes), jax.lax.all_gather(v, axes))  # noqa: E731
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("x", "y", "z")),
                                 out_specs=P(("x", "y", "z")), check_vma=False))
    program = lowering.lower(step.lower(np.zeros(64, np.float32)).compiler_ir("stablehlo"))
    collectives = [i for i in program.instructions
                   if isinstance(i, (isa.AllReduce, isa.AllGather))]
    assert [c.groups.axes for c in collectives] == [expected, expected]
