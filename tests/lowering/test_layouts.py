"""The layouts lowering gives values: each varies along exactly the mesh axes its chips'
copies differ along, so the executor stores and computes replicated values once."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

import lowering
from mesh import isa

NAMES = ("x", "y", "z")
MESH = AbstractMesh((4, 4, 4), NAMES, axis_types=(AxisType.Auto,) * 3)
X, Y, Z = 0, 1, 2


def lower(body, in_specs, out_specs, *args) -> isa.Program:
    """The Trn2 program of a shard_map; jax's own replication checks are off, the layouts
    lowering infers are what is tested."""
    step = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False))
    return lowering.lower(step.lower(*args).compiler_ir("stablehlo"))


def layouts(program: isa.Program, cls: type) -> list[frozenset[int]]:
    """The layouts of the outputs of each instruction of class `cls`, in program order."""
    return [program.info(i.outs[0]).varying for i in program.instructions
            if isinstance(i, cls)]


def test_weight_replicated_over_z_stays_replicated():
    """Megatron-style: activations split over x (rows) and y (features), the weight split
    over y only. Neither varies along z, so nothing is computed per z coordinate."""
    def block(x, w):
        return jax.lax.psum(x @ w, "y")

    program = lower(block, (P("x", "y"), P("y", None)), P("x", None),
                    np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32))
    assert layouts(program, isa.Shard) == [{X, Y}, {Y}]
    assert layouts(program, isa.Matmul) == [{X, Y}]
    assert layouts(program, isa.AllReduce) == [{X}]


def test_psum_over_an_axis_the_value_does_not_vary_along():
    def body(v):
        return jax.lax.psum(v, "z"), jax.lax.psum(v, ("x", "z"))

    program = lower(body, P("x"), (P("x"), P()), np.zeros((16,), np.float32))
    assert layouts(program, isa.AllReduce) == [{X}, frozenset()]


def test_collectives_over_axes_keep_other_layouts():
    def body(v):
        return (jax.lax.all_gather(v, "x", tiled=True),
                jax.lax.psum_scatter(v, "z", tiled=True),
                jax.lax.all_to_all(v, "y", 0, 0, tiled=True))

    program = lower(body, P(("x", "y")), (P("y"), P(("x", "y", "z")), P(("x", "y"))),
                    np.zeros((16 * 16,), np.float32))
    assert layouts(program, isa.AllGather) == [{Y}]
    assert layouts(program, isa.ReduceScatter) == [{X, Y, Z}]
    assert layouts(program, isa.AllToAll) == [{X, Y}]


def test_ppermute_layout_is_where_received_copies_differ():
    """A shift along z of a value that does not vary along z receives the same copy on
    every z coordinate; a permutation that leaves a chip without a sender gives zeros
    there; one that moves along x by a distance depending on y varies along y."""
    skew = [(4 * x + y, 4 * ((x + y) % 4) + y) for x in range(4) for y in range(4)]

    def body(v):
        return (jax.lax.ppermute(v, "z", [(i, (i + 1) % 4) for i in range(4)]),
                jax.lax.ppermute(v, "x", [(0, 1)]),
                jax.lax.ppermute(v, ("x", "y"), skew))

    program = lower(body, P("x"), (P("x"), P("x"), P(("x", "y"))), np.zeros((8,), np.float32))
    assert layouts(program, isa.CollectivePermute) == [{X}, {X}, {X, Y}]


def test_axis_index_varies_along_its_axes_only():
    """jax computes axis_index from partition_id (which differs on every chip); the integer
    arithmetic is folded while lowering, so the index and what it selects vary along the
    named axes only: a weight's slice at the chip's x position is cut once per x."""
    def body(w):
        i = jax.lax.axis_index("x")
        return (jax.lax.dynamic_slice_in_dim(w, i * 2, 2),
                jax.lax.axis_index(("z", "y"))[None], (i < 2)[None])

    program = lower(body, P(), (P("x"), P(("z", "y")), P("x")), np.zeros((8, 3), np.float32))
    assert layouts(program, isa.DynamicSlice) == [{X}]
    unsharded = [program.info(i.ins[0]).varying for i in program.instructions
                 if isinstance(i, isa.Unshard)]
    assert unsharded == [{X}, {Y, Z}, {X}]
