"""One program on every logical mesh shape of the topologies, against CPU JAX (and, for the
256 chips of trn2-ultra-max, which have no CPU reference here, against numpy).

Sums of floats may add in another order than XLA on CPU does: e2e_reference's FLOAT_RTOL.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, run_both

MESHES = [
    ((4, 4, 4), ("x", "y", "z"), "trn2-ultra"),
    ((8, 8), ("data", "model"), "trn2-ultra"),
    ((64,), ("i",), "trn2-ultra"),
    ((2, 32), ("pipe", "data"), "trn2-ultra"),
    ((2, 4, 8), ("a", "b", "c"), "trn2-ultra"),
    ((4, 4), ("x", "y"), "trn2"),
    ((1, 64), ("one", "all"), "trn2-ultra"),  # collectives over an axis of size 1
    ((64, 1), ("all", "one"), "trn2-ultra"),
    # meshes smaller than the topology: a compact block of its chips
    ((2, 4), ("data", "model"), "trn2-ultra"),
    ((8,), ("i",), "trn2-ultra"),
    ((2, 2, 2), ("a", "b", "c"), "trn2-ultra"),
    ((16, 4), ("data", "model"), "trn2-ultra"),
    ((4,), ("i",), "trn2"),
    ((3, 2), ("a", "b"), "trn2"),
    # the machines as rented, a device per logical NeuronCore: a program written for a
    # trn2.48xlarge's 64 devices (TP4 on each chip, FSDP over the chips; TP64), and for
    # one chip's 4 (TP4 on a trn2.3xlarge); the same 64-device program on the whole-chip
    # view is ((16, 4), ...) and ((64,), ...) on trn2-ultra above
    ((16, 4), ("fsdp", "tp"), "trn2.48xlarge"),
    ((64,), ("tp",), "trn2.48xlarge"),
    ((4,), ("tp",), "trn2.3xlarge"),
]


def mesh_program(names: tuple[str, ...]):
    """A step that uses every kind of collective: rows split over the leading axes, the
    last axis splitting the contraction (Megatron row-parallel, so the product is summed or
    reduce-scattered over it), and rings, gathers and all_to_alls along the axes."""
    first, last = names[0], names[-1]

    def body(x, w):  # x: [rows, k / n_last], w: [k / n_last, 64], both per chip
        n_last = lax.axis_size(last)
        ring = [(i, (i + 1) % n_last) for i in range(n_last)]
        return {
            "matmul_psum": lax.psum(x @ w, last),
            "matmul_scatter": lax.psum_scatter(x @ w, last, scatter_dimension=1, tiled=True),
            "mean_all": lax.pmean(jnp.sum(x, axis=1), names)[None],
            "max_all": lax.pmax(x, names),
            "gather_first": lax.all_gather(x, first, tiled=True),
            "ring_last": lax.ppermute(x, last, ring),
            "all_to_all_last": lax.all_to_all(jnp.tile(x, (n_last, 1)), last, 0, 1,
                                              tiled=True),
            "index": lax.axis_index(names)[None],
        }

    return body


@pytest.mark.parametrize("shape, names, topology", MESHES,
                         ids=[f"{'x'.join(map(str, m[0]))}-{m[2]}" for m in MESHES])
def test_mesh_program(shape, names, topology, rng):
    chips = math.prod(shape)
    rows, k = 2 * (chips // shape[-1]), 4 * shape[-1]
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, 64)).astype(np.float32)
    specs = (P(names[:-1] or None, names[-1]), P(names[-1], None))
    out_spec = P(names)  # each chip's local result side by side
    got, want = run_both(mesh_program(names), shape, names, specs, out_spec, x, w,
                         topology=topology)
    assert_matches(got, want)
    assert got["index"].tolist() == list(range(chips))


def test_trn2_ultra_max_256_chips(rng):
    """(4,4,16) on trn2-ultra-max, against numpy: a sum over all 256 chips, a ring along z
    and each chip's index."""
    mesh = jax_trn2.make_mesh((4, 4, 16), ("x", "y", "z"), topology="trn2-ultra-max")
    x = rng.integers(-100, 100, (256 * 2, 3)).astype(np.int32)
    ring = [(i, (i + 1) % 16) for i in range(16)]

    def body(x):
        return (lax.psum(x, ("x", "y", "z")), lax.ppermute(x, "z", ring),
                lax.axis_index(("x", "y", "z"))[None])

    every_chip = P(("x", "y", "z"))
    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=every_chip,
                                      out_specs=every_chip))
    total, shifted, index = step(x)
    assert len(step.lower(x).compile().executable.devices()) == 256

    chips = x.reshape(4, 4, 16, 2, 3)
    np.testing.assert_array_equal(total, np.tile(chips.sum((0, 1, 2)), (256, 1)))
    np.testing.assert_array_equal(shifted, np.roll(chips, 1, axis=2).reshape(-1, 3))
    np.testing.assert_array_equal(index, np.arange(256))


def test_mesh_larger_than_the_topology_is_an_error_listing_shapes_that_fit():
    with pytest.raises(ValueError, match=r"has only 16 chips .* e\.g\. \[\(4, 4\), \(1, 16\)\]"):
        jax_trn2.make_mesh((4, 8), topology="trn2")
    with pytest.raises(ValueError, match="has only 64 chips"):
        jax_trn2.make_mesh((128,))


def test_sub_mesh_runs_on_its_chips_only(rng):
    """(2, 4) on trn2-ultra: 8 chips run, the listing says which and how the axes lie."""
    mesh = jax_trn2.make_mesh((2, 4), ("data", "model"))
    step = jax_trn2.jit(jax.shard_map(lambda x: lax.psum(x, "model"), mesh=mesh,
                                      in_specs=P("data", "model"), out_specs=P("data")))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    compiled = step.lower(x).compile()
    # logical order: model (ring x) varies fastest
    assert [d.id for d in compiled.executable.devices()] == [0, 16, 32, 48, 4, 20, 36, 52]
    text = compiled.as_text()
    assert "mesh: data=2 on segment 2 of y, model=4 on ring x; chips 0, 4, 16, 20, 32, 36, " \
           "48, 52 (8 of 64)" in text
    assert "(8 of its 64 chips)" in compiled.executable.timed_text()
    # four addends: FP32 rounding of a different order stays within a few ulps
    np.testing.assert_allclose(step(x), x.reshape(4, 4, 2).sum(1), rtol=1e-6)


def test_a_mesh_make_mesh_did_not_make_runs_on_its_default_topology_if_it_fits():
    from jax_trn2.core.machines import topology_for
    assert topology_for((2, 4), ("p", "q"), None).name == "trn2-ultra"  # as make_mesh's
    assert topology_for((4, 16), ("p", "q"), None).name == "trn2-ultra"
    assert topology_for((8, 16), ("p", "q"), None).name == "trn2-ultra-max"


def test_axis_types_are_the_third_positional_argument_as_in_jax_make_mesh():
    explicit = (AxisType.Explicit,) * 2
    mesh = jax_trn2.make_mesh((2, 4), ("data", "model"), explicit)
    assert mesh.axis_types == explicit
    assert jax_trn2.make_mesh((2, 4), ("data", "model")).axis_types == (AxisType.Auto,) * 2
