"""Link and chip faults change what a program costs, never what it computes."""

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh.machine import get_topology


def ring_program(mesh):
    def body(x):
        ring = [(i, (i + 1) % 4) for i in range(4)]
        return lax.psum(x, "x"), lax.ppermute(x, "x", ring), lax.all_gather(x, "x", tiled=True)

    every_chip = P(("x", "y", "z"))
    return jax.shard_map(body, mesh=mesh, in_specs=every_chip,
                         out_specs=(every_chip, every_chip, every_chip))


def test_results_are_unchanged_by_link_faults_and_only_the_cost_grows(rng):
    x = rng.standard_normal((64 * 4, 256)).astype(np.float32)
    healthy = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))
    faulty_topology = get_topology("trn2-ultra").with_failed_cable(0, 16).with_overrides(
        degraded_links=((1, 17, 0.25),))
    healthy_step = jax_trn2.jit(ring_program(healthy))
    faulty_step = jax_trn2.jit(ring_program(healthy), topology=faulty_topology)
    for got, want in zip(faulty_step(x), healthy_step(x)):
        np.testing.assert_array_equal(got, want)  # the same arithmetic, bit for bit
    faulty = faulty_step.lower(x).compile()
    healthy_cost = healthy_step.lower(x).compile().cost_analysis()["optimal_seconds"]
    assert faulty.cost_analysis()["optimal_seconds"] > healthy_cost
    text = faulty.as_text()
    assert "faults: failed links 0->16, 16->0; degraded links 1->17 x0.25" in text
    assert "x the healthy" in text


def test_sub_mesh_placed_off_a_failed_chip_runs(rng):
    topology = get_topology("trn2-ultra").with_overrides(failed_chips={0})
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"), topology=topology, origin=(0, 1, 0))
    step = jax_trn2.jit(jax.shard_map(lambda x: lax.psum(x, "b"), mesh=mesh,
                                      in_specs=P("a", "b"), out_specs=P("a")))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    # four addends: another order of FP32 additions stays within a few ulps
    np.testing.assert_allclose(step(x), x.reshape(4, 4, 2).sum(1), rtol=1e-6)
    chips = [d.id for d in step.lower(x).compile().executable.devices()]
    assert 0 not in chips and chips == [4, 20, 36, 52, 8, 24, 40, 56]
