"""A mesh across UltraServers: a logical axis over EFA, executed and estimated."""

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2


def test_two_ultraservers_run_a_step_across_efa(rng):
    mesh = jax_trn2.make_mesh((2, 64), ("dp", "fsdp"), topology="trn2-ultracluster-2")
    body = lambda x: lax.psum(x, ("dp", "fsdp"))  # noqa: E731
    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("dp", "fsdp")),
                                      out_specs=P(("dp", "fsdp"))))
    x = rng.integers(-100, 100, (128 * 2, 3)).astype(np.int32)  # integers: exact sums
    np.testing.assert_array_equal(step(x), np.tile(x.reshape(128, 2, 3).sum(0), (128, 1)))
    text = step.lower(x).compile().as_text()
    assert "mesh: dp=2 on ring s, fsdp=64 on spans x*y*z; chips 0-127 (128 of 128)" in text
    assert "EFA (switched: one hop between any two servers): all-reduce" in text
    assert "in server: reduce-scatter + all-gather among 64 local chips" in text


def test_mesh_beyond_the_presets_goes_to_an_ultracluster():
    from jax_trn2.core.machines import topology_for
    assert topology_for((16, 64), ("dp", "fsdp"), None).name == "trn2-ultracluster-16"


def test_a_psum_over_the_cross_server_axis_alone_runs_over_efa_alone():
    """docs/cost_model.md (topologies): over 'dp' alone each group holds one chip per
    UltraServer, so nothing can be reduced inside a server first and the whole buffer
    crosses EFA (a switch: one hop); over both axes it is hierarchical."""
    mesh = jax_trn2.make_mesh((16, 64), ("dp", "fsdp"), topology="trn2-ultracluster-16")
    x = jax.ShapeDtypeStruct((4096, 4096), np.float32)  # 64 MiB on every chip
    listings = {}
    for axes in ("dp", ("dp", "fsdp")):
        body = lambda x, axes=axes: lax.psum(x, axes)  # noqa: E731
        step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P()))
        listings[axes] = step.lower(x).compile().as_text()
    assert "all-reduce of 64.00 MiB over logical dp -> servers along s" in listings["dp"]
    assert "in server:" not in listings["dp"]
    assert "over logical dp,fsdp -> servers along s, 1.00 MiB per chip between servers" in \
        listings[("dp", "fsdp")]
    assert "in server: reduce-scatter + all-gather among 64 local chips" in \
        listings[("dp", "fsdp")]
