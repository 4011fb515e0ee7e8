"""Link and chip faults change what a program costs, never what it computes."""

import jax
import numpy as np
import pytest
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


def test_a_mesh_made_again_for_another_machine_says_which_machine_its_programs_use():
    # jax makes equal meshes one object, so the healthy mesh's programs would silently be
    # costed on the faulty machine: make_mesh warns; distinct axis names keep both.
    faulty = get_topology("trn2-ultra").with_failed_cable(0, 16)
    jax_trn2.make_mesh((4, 16), ("rows", "cols"))
    with pytest.warns(UserWarning, match=r"made before for 'trn2-ultra'; .* from now on run on "
                                         r"'trn2-ultra' \(failed links 0->16, 16->0\)"):
        jax_trn2.make_mesh((4, 16), ("rows", "cols"), topology=faulty)
    with pytest.warns(UserWarning, match="from now on run on 'trn2-ultra'. To keep both"):
        healthy = jax_trn2.make_mesh((4, 16), ("rows", "cols"))
    broken = jax_trn2.make_mesh((4, 16), ("broken_rows", "broken_cols"), topology=faulty)
    x = jax.ShapeDtypeStruct((64 * 1024,), np.float32)
    # a psum over the axis of 16, on x and y: through the failed x cable
    seconds = [jax_trn2.jit(jax.shard_map(lambda a: lax.psum(a, names[1]), mesh=mesh,
                                          in_specs=P(names), out_specs=P(names[0])))
               .lower(x).cost_analysis()["optimal_seconds"]
               for mesh, names in ((healthy, ("rows", "cols")),
                                   (broken, ("broken_rows", "broken_cols")))]
    assert seconds[1] > seconds[0]
