"""Collectives on the torus, pinned to the alpha-beta formulas of trn2_facts.md."""

from dataclasses import replace

import numpy as np
import pytest

from mesh import isa
from mesh.perf.collectives import link_bytes, plan_collective
from mesh.machine import get_topology, place_mesh

ULTRA = get_topology("trn2-ultra")
ALPHA = ULTRA.link_latency[0]  # seconds per hop
BX, BZ = ULTRA.link_bandwidth[0], ULTRA.link_bandwidth[2]  # bytes/s per direction
EQUAL_LINKS = ULTRA.with_overrides(link_bandwidth=(BX,) * 3)
BIG = 64 * 2**20  # bytes per chip: bandwidth-dominated
K = 4  # ring length of each trn2-ultra axis


def mesh_groups(shape, axes):
    """isa.Groups of the lines of a row-major mesh along `axes` (rank order)."""
    ids = np.arange(int(np.prod(shape))).reshape(shape)
    rest = [a for a in range(len(shape)) if a not in axes]
    lines = ids.transpose(rest + list(axes)).reshape(-1, int(np.prod([shape[a] for a in axes])))
    return isa.Groups(tuple(tuple(int(d) for d in g) for g in lines), tuple(axes))


def planned(kind, axes, nbytes, topology=ULTRA, shape=(4, 4, 4), names=("x", "y", "z")):
    """The collective instruction with its plan, and the placement it was planned for."""
    groups = mesh_groups(shape, axes)
    instr = {"all-reduce": lambda: isa.AllReduce((1,), (0,), groups=groups, reduction="add"),
             "all-gather": lambda: isa.AllGather((1,), (0,), groups=groups, dimension=0),
             "reduce-scatter": lambda: isa.ReduceScatter((1,), (0,), groups=groups, dimension=0,
                                                         reduction="add"),
             "all-to-all": lambda: isa.AllToAll((1,), (0,), groups=groups, split_dimension=0,
                                                concat_dimension=0)}[kind]()
    placement = place_mesh(topology, shape, names)
    return replace(instr, plan=plan_collective(instr, nbytes, topology, placement)), placement


def plan(kind, axes, nbytes, topology=ULTRA, shape=(4, 4, 4), names=("x", "y", "z")):
    return planned(kind, axes, nbytes, topology, shape, names)[0].plan


def test_all_reduce_along_one_axis_is_the_bidirectional_ring_formula():
    p = plan("all-reduce", (0,), BIG)
    assert p.algorithm == "ring" and p.torus_axes == ("x",) and p.rings == (K,)
    assert p.steps == 2 * (K - 1)
    assert p.link_bytes == pytest.approx((K - 1) / K * BIG)  # per link per direction
    # float rounding of a sum of 6 steps
    assert p.seconds == pytest.approx(2 * (K - 1) * ALPHA + (K - 1) / K * BIG / BX, rel=1e-12)


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter"])
def test_all_gather_and_reduce_scatter_along_one_axis(kind):
    p = plan(kind, (1,), BIG)
    assert p.algorithm == "ring" and p.steps == K - 1 and p.torus_axes == ("y",)
    assert p.seconds == pytest.approx((K - 1) * ALPHA + (K - 1) / K * BIG / (2 * BX), rel=1e-12)


def test_z_is_twice_as_slow_as_x():
    no_latency = ULTRA.with_overrides(link_latency=(0.0,) * 3)
    x, z = (plan("all-reduce", (a,), BIG, no_latency).seconds for a in (0, 2))
    assert z == pytest.approx(2 * x, rel=1e-12)  # z links have half the bandwidth
    x, z = (plan("all-reduce", (a,), BIG).seconds for a in (0, 2))
    assert 1.95 < z / x < 2.0  # the same hop latency on both axes dilutes the ratio a little


def test_small_messages_take_a_latency_optimal_algorithm():
    """Like a collective library's tuner: a ring for large buffers, direct for small."""
    small, large = plan("all-reduce", (0,), 1024), plan("all-reduce", (0,), BIG)
    assert large.algorithm == "ring"
    assert small.algorithm in ("one-shot", "two-shot")
    assert small.latency_seconds < large.latency_seconds
    ring = dict(small.candidates)["ring"]
    assert small.seconds < ring == pytest.approx(6 * ALPHA + 0.75 * 1024 / BX, rel=1e-12)


def test_all_gather_over_three_axes_reaches_the_injection_bound():
    """(p-1)/p * M/(2nB) with n=3 equal axes: 0.164 M/B; splitting the data three ways with
    rotated axis orders reaches it."""
    p_chips = 64
    bound = (p_chips - 1) / p_chips * BIG / (2 * 3 * BX)
    equal = plan("all-gather", (0, 1, 2), BIG, EQUAL_LINKS)
    assert equal.algorithm.startswith("rotated rings")
    assert equal.seconds >= bound
    assert equal.bandwidth_seconds == pytest.approx(bound, rel=1e-9)
    assert bound == pytest.approx(0.164 * BIG / BX, rel=0.01)
    # one dimension after another: about n times the bound
    by_dims = min(s for a, s in equal.candidates if a.startswith("rings"))
    assert 2.9 < (by_dims - 9 * ALPHA) / bound < 3.1


def test_all_gather_on_trn2_ultra_respects_the_injection_bound_of_its_links():
    """A chip can receive at most 2 * (Bx + By + Bz) bytes/s, whatever the algorithm."""
    p = plan("all-gather", (0, 1, 2), BIG)
    assert p.seconds >= 63 / 64 * BIG / (2 * sum(ULTRA.link_bandwidth))
    assert p.latency_seconds >= 6 * ALPHA  # the diameter: 6 hops


def test_all_reduce_over_three_axes_lower_bound():
    equal = plan("all-reduce", (0, 1, 2), BIG, EQUAL_LINKS)
    assert equal.seconds >= 0.328 * BIG / BX
    assert equal.bandwidth_seconds == pytest.approx(2 * 63 / 64 * BIG / (6 * BX), rel=1e-9)


def test_all_to_all_meets_the_bisection_bound():
    """Direct all-to-all with ties split both ways round each ring: 0.5 M/B on 4x4x4."""
    p = plan("all-to-all", (0, 1, 2), BIG, EQUAL_LINKS)
    assert p.algorithm == "direct"
    assert p.link_bytes == pytest.approx(0.5 * BIG)
    assert p.seconds >= 0.5 * BIG / BX


def test_logical_axis_of_8_is_routed_and_counts_the_busiest_link():
    """On an (8, 8) mesh, the inner axis of 8 spans x and half of y, the outer one the other
    half of y and z: its y neighbours are 2 hops apart."""
    p = plan("all-reduce", (0,), BIG, shape=(8, 8), names=("a", "b"))
    assert p.logical_axes == ("a",) and p.torus_axes == ("y", "z")
    assert p.routed and p.max_hops > 1
    assert p.seconds > plan("all-reduce", (0,), BIG).seconds  # slower than a ring of 4


def test_mesh_of_64_runs_on_torus_rings():
    """A (64,) logical axis is the whole torus: only the set of chips matters, so it runs
    as fast as the (4,4,4) all-reduce over x,y,z."""
    flat = plan("all-reduce", (0,), BIG, shape=(64,), names=("a",))
    cube = plan("all-reduce", (0, 1, 2), BIG)
    assert flat.torus_axes == ("x", "y", "z") and not flat.routed
    assert flat.seconds == pytest.approx(cube.seconds, rel=1e-12)


def test_permute_load_on_the_busiest_link():
    """Two sends along z that share a link: 0->2 and 1->3 both cross z1->z2."""
    topo = get_topology("trn2-ultra-max")  # z is a ring of 16: no ties
    placement = place_mesh(topo, (4, 4, 16), ("x", "y", "z"))
    m = 2**20
    p = plan_collective(isa.CollectivePermute((1,), (0,), pairs=((0, 2), (1, 3))), m, topo,
                        placement)
    alpha, bz = topo.link_latency[2], topo.link_bandwidth[2]
    assert p.max_hops == 2 and p.routed and p.logical_axes == ("z",)
    assert p.link_bytes == 2 * m
    assert p.seconds == pytest.approx(2 * alpha + 2 * m / bz, rel=1e-12)


def test_arbitrary_groups_are_planned():
    """Groups that are not mesh lines (every 16th device) still get a routed plan."""
    groups = isa.Groups(tuple(tuple(range(i, 64, 16)) for i in range(16)), None)
    p = plan_collective(isa.AllGather((1,), (0,), groups=groups, dimension=0), BIG, ULTRA,
                        place_mesh(ULTRA, (4, 4, 4), ("x", "y", "z")))
    assert p.logical_axes is None and p.group_size == 4 and p.torus_axes == ("x",)
    assert p.seconds >= (K - 1) / K * BIG / (2 * BX)


def test_group_of_one_is_free():
    p = plan("all-reduce", (0,), BIG, shape=(1, 64), names=("a", "b"))
    assert p.seconds == 0 and p.steps == 0


def test_not_a_collective_is_an_error():
    with pytest.raises(ValueError, match="Elementwise is not a collective"):
        plan_collective(isa.Elementwise((1,), (0,), op="add"), 1, ULTRA, None)


@pytest.mark.parametrize("k", [2, 3])
def test_group_on_a_segment_of_a_ring_runs_a_line(k):
    """A k-chip group on a segment of the 4-chip y ring (the inner axis of 2 on x): no
    wraparound link inside the group, so a line: k-1 steps, each link carrying (k-1)/k of
    the buffer per direction (twice a ring's); for k = 2 that is the one link between the
    two chips, and the plan."""
    p = plan("all-gather", (0,), BIG, shape=(k, 2), names=("seg", "other"))
    line = (k - 1) * ALPHA + (k - 1) / k * BIG / BX
    assert dict(p.candidates)["line"] == pytest.approx(line, rel=1e-12)
    assert p.seconds <= line and p.torus_axes == ("y",)
    if k == 2:
        assert p.algorithm == "line" and p.rings == (2,) and not p.routed
        assert p.link_bytes == pytest.approx(BIG / 2)
    all_reduce = plan("all-reduce", (0,), BIG, shape=(k, 2), names=("seg", "other"))
    # reduce-scatter + all-gather on the line (for k = 2 one-shot saves one hop latency)
    assert dict(all_reduce.candidates)["line"] == pytest.approx(2 * line, rel=1e-12)


def test_whole_ring_is_cheaper_than_a_segment_of_the_same_length():
    whole = plan("all-gather", (0,), BIG, shape=(4, 2), names=("ring", "other"))
    assert whole.algorithm == "ring"  # (4, 2): the 2 takes a segment of x, the 4 the y ring
    segment = plan("all-gather", (1,), BIG, shape=(4, 2), names=("ring", "other"))
    assert segment.algorithm == "line" and segment.torus_axes == ("x",)


def test_ring_with_a_failed_link_runs_as_a_line_opened_there():
    """One x cable down (chips 0 and 16): the x ring through them becomes a line starting
    after the break, and the all-reduce costs the line formula, twice the ring's bytes."""
    faulty = ULTRA.with_failed_cable(0, 16)
    p = plan("all-reduce", (0,), BIG, topology=faulty)
    line = 2 * (K - 1) * ALPHA + 2 * (K - 1) / K * BIG / BX
    assert p.algorithm == "line" and p.detours == 0
    assert p.seconds == pytest.approx(line, rel=1e-12)
    healthy = 2 * (K - 1) * ALPHA + (K - 1) / K * BIG / BX
    assert p.healthy_seconds == pytest.approx(healthy, rel=1e-12)
    assert "faults: 1.98x the healthy 402.216 us" in p.describe()


def test_transfer_across_a_failed_link_goes_the_other_way_round():
    faulty = ULTRA.with_failed_cable(0, 16)
    pairs = ((0, 16),)  # logical devices 0 and 16 are chips 0 and 16 on (4, 4, 4)
    instr = isa.CollectivePermute((1,), (0,), pairs=pairs)
    p = plan_collective(instr, BIG, faulty, place_mesh(faulty, (4, 4, 4), ("x", "y", "z")))
    assert p.detours == 1 and p.max_hops == 3  # 0 -> 48 -> 32 -> 16
    assert p.latency_seconds == pytest.approx(3 * ALPHA)


def test_degraded_link_slows_the_ring_it_is_on():
    no_latency = ULTRA.with_overrides(link_latency=(0.0,) * 3)
    slow = no_latency.with_overrides(degraded_links=((0, 16, 0.5),))
    healthy, degraded = (plan("all-gather", (0,), BIG, topology=t) for t in (no_latency, slow))
    # the bottleneck link runs at half speed; the tuner may prefer a line avoiding it
    assert degraded.seconds <= 2 * healthy.seconds
    assert degraded.seconds > healthy.seconds
    assert degraded.healthy_seconds == pytest.approx(healthy.seconds, rel=1e-12)


# --- the expected time: the Neuron runtime's algorithm and costs ------------------------

RT = ULTRA.runtime


def test_recursive_halving_doubling_exchanges_halving_then_doubling_blocks():
    p = plan("all-reduce", (0,), BIG)
    assert "recursive halving-doubling" in dict(p.candidates)
    # 4 chips: distance-2 partners exchange M/2, distance-1 partners M/4, then back. On a
    # 4-ring a distance-2 partner is 2 hops away, its bytes split both ways round, and each
    # link carries two such halves (M/2); a distance-1 exchange puts M/4 on a link.
    rdh = dict(p.candidates)["recursive halving-doubling"]
    assert rdh == pytest.approx(2 * (2 * ALPHA + ALPHA) + 2 * (BIG / 2 / BX + BIG / 4 / BX),
                                rel=1e-12)


@pytest.mark.parametrize("nbytes,family", [(64 * 2**10, ("one-shot", "two-shot")),
                                           (8 * 2**20, ("recursive halving-doubling",)),
                                           (256 * 2**20, ("ring", "rings", "rotated", "line"))])
def test_the_runtime_picks_its_algorithm_by_message_size(nbytes, family):
    """Mesh below 1 MB, recursive halving-doubling to 56 MB, rings above (the runtime's
    intra-node collectives page)."""
    p = plan("all-reduce", (0, 1), nbytes)
    assert p.expected_algorithm.startswith(family)


def test_expected_fixed_cost_is_the_launch_for_every_kind():
    """No constant per reduction: what a reduction costs beyond an all-gather is its
    steps (twice the hops' latency) and its HBM traffic."""
    reduce, gather = plan("all-reduce", (0,), 1024), plan("all-gather", (0,), 1024)
    assert reduce.fixed_seconds == gather.fixed_seconds == RT.collective_launch_seconds
    assert reduce.expected_seconds > gather.expected_seconds  # its HBM traffic
    for p in (reduce, gather):
        assert p.expected_seconds == pytest.approx(
            p.fixed_seconds + p.expected_latency_seconds + p.transfer_seconds)
        assert p.expected_seconds > p.seconds


def test_a_large_ring_all_reduce_is_bound_by_its_links():
    """A ring all-reduce over a 4-chip ring sends 2 (K-1)/K of the buffer from each chip;
    the bidirectional ring's links carry (K-1)/K M / B (trn2_facts.md), slower than the
    collective DMA rings' rate, so the links bound it."""
    m = 512 * 2**20
    p = plan("all-reduce", (0,), m)
    sent = 2 * (K - 1) / K * m
    assert p.expected_algorithm == "ring" and p.transfer_bound == "links"
    assert p.transfer_seconds == pytest.approx((K - 1) / K * m / ULTRA.link_bandwidth[0])
    assert sent / RT.collective_dma_bytes_per_second < p.transfer_seconds
    # HBM: every byte sent read, every byte received written; the reduce-scatter half of
    # what arrives is also read and summed into the local part
    assert p.hbm_bytes == pytest.approx(sent + sent * (1 + 2 * 0.5))


def test_expected_efa_runs_at_its_sustained_share():
    cluster = get_topology("trn2-ultracluster-2")
    p = plan("all-gather", (0,), BIG, topology=cluster, shape=(2, 4, 4, 4),
             names=("s", "x", "y", "z"))
    # every chip sends to the other server through its NIC, at 77% of its rate
    assert p.transfer_bound == "links"
    assert p.transfer_seconds == pytest.approx(p.bandwidth_seconds / RT.efa_efficiency)


# --- link loads -----------------------------------------------------------------------------

def test_link_bytes_of_a_ring_load_the_axis_links_evenly():
    """An all-reduce along x: each of the 64 chips sends (K-1)/K of the buffer each way
    along x (the plan's busiest link), and no y or z link carries anything."""
    instr, placement = planned("all-reduce", (0,), BIG)
    loads = link_bytes(instr, ULTRA, placement)
    assert loads.shape == (64, 3, 2)
    np.testing.assert_allclose(loads[:, 0, :], instr.plan.link_bytes)
    assert instr.plan.link_bytes == pytest.approx((K - 1) / K * BIG)
    assert not loads[:, 1:, :].any()


def test_link_bytes_of_a_broken_ring_leave_the_failed_link_empty():
    faulty = ULTRA.with_failed_cable(0, 16)  # chip 0 (x=0) and chip 16 (x=1)
    instr, placement = planned("all-reduce", (0,), BIG, topology=faulty)
    loads = link_bytes(instr, faulty, placement)
    assert loads[0, 0, 1] == loads[16, 0, 0] == 0  # 0 -> 16 goes up x, 16 -> 0 down
    assert loads.max() == pytest.approx(instr.plan.link_bytes)  # the line's, twice a ring's
    assert instr.plan.link_bytes == pytest.approx(2 * (K - 1) / K * BIG)


def test_link_bytes_of_a_permute_follow_its_routes():
    topo = get_topology("trn2-ultra-max")  # z is a ring of 16
    placement = place_mesh(topo, (4, 4, 16), ("x", "y", "z"))
    instr = isa.CollectivePermute((1,), (0,), pairs=((0, 2), (1, 3), (5, 5)))
    instr = replace(instr, plan=plan_collective(instr, 2**20, topo, placement))
    loads = link_bytes(instr, topo, placement)
    # z+ links out of chips 0, 1 and 2: 0->1, 1->2 (both sends), 2->3
    assert (loads[0, 2, 1], loads[1, 2, 1], loads[2, 2, 1]) == (2**20, 2 * 2**20, 2**20)
    assert loads.sum() == 4 * 2**20


def test_link_bytes_of_what_moves_nothing_are_zeros():
    instr, placement = planned("all-reduce", (0,), BIG, shape=(1, 64), names=("a", "b"))
    assert not link_bytes(instr, ULTRA, placement).any()
    assert not link_bytes(isa.Elementwise((1,), (0,), op="add"), ULTRA, placement).any()
