"""Collectives across UltraServers: EFA as a switched fabric (one hop between any two
servers, each chip's NIC share the bandwidth) and the Neuron runtime's hierarchical
collectives (inside each server over NeuronLink, across over EFA among the chips of the
same in-server index, inside again), pinned to hand-worked formulas."""

import math
from dataclasses import replace

import numpy as np
import pytest

from mesh import isa
from mesh.machine import get_topology, place_mesh
from mesh.perf.collectives import link_bytes, plan_collective

CLUSTER = get_topology("trn2-ultracluster-16")  # 16 UltraServers of 64 chips: 1,024 chips
ULTRA = get_topology("trn2-ultra")  # one UltraServer on its own
RT = CLUSTER.runtime
A_EFA = CLUSTER.link_latency[0]  # 15 us: one hop through the switch
B_NIC = CLUSTER.link_bandwidth[0]  # 25 GB/s per direction: a chip's share of 3,200 Gbit/s
SUSTAINED = B_NIC * RT.efa_efficiency
REDUCTION_FIXED = RT.collective_launch_seconds  # the launch; no constant per reduction
M = 4 * 2**20  # the issue's psum: 4 MiB per chip
SERVERS, CHIPS = 16, 64
ISSUE_BOUND = 1.4e-3  # any algorithm over EFA's switch at its sustained rate (issue 37)


def instruction(kind, groups):
    return {"all-reduce": lambda: isa.AllReduce((1,), (0,), groups=groups, reduction="add"),
            "all-gather": lambda: isa.AllGather((1,), (0,), groups=groups, dimension=0),
            "reduce-scatter": lambda: isa.ReduceScatter((1,), (0,), groups=groups,
                                                        dimension=0, reduction="add"),
            "all-to-all": lambda: isa.AllToAll((1,), (0,), groups=groups, split_dimension=0,
                                               concat_dimension=0)}[kind]()


def planned(kind, axes, nbytes, topology=CLUSTER, shape=(SERVERS, CHIPS)):
    """The `kind` collective along mesh `axes` of a (dp, fsdp) mesh, with its plan, and
    the placement."""
    ids = np.arange(int(np.prod(shape))).reshape(shape)
    rest = [a for a in range(len(shape)) if a not in axes]
    lines = ids.transpose(rest + list(axes)).reshape(-1, int(np.prod([shape[a] for a in axes])))
    groups = isa.Groups(tuple(tuple(int(d) for d in g) for g in lines), tuple(axes))
    instr = instruction(kind, groups)
    placement = place_mesh(topology, shape, ("dp", "fsdp")[:len(shape)])
    return replace(instr, plan=plan_collective(instr, nbytes, topology, placement)), placement


def plan(kind, axes, nbytes, topology=CLUSTER, shape=(SERVERS, CHIPS)):
    return planned(kind, axes, nbytes, topology, shape)[0].plan


def switched_all_reduce(s, m):
    """{algorithm: (steps, bytes through each chip's NIC per direction)} of an all-reduce of
    m bytes per chip among s chips, one per server, over a switch: every step is one hop.
    A ring, recursive halving-doubling and two-shot all send 2 (s-1)/s m (in 2(s-1),
    2 log2 s and 2 steps); one-shot sends every peer the whole buffer in one step."""
    sent = 2 * (s - 1) / s * m
    return {"ring": (2 * (s - 1), sent), "recursive halving-doubling": (2 * math.log2(s), sent),
            "two-shot": (2, sent), "one-shot": (1, (s - 1) * m)}


def ideal_and_expected(s, m):
    """The least ideal time and the least expected time of the runtime's algorithms over
    EFA for that all-reduce (the runtime picks the cheapest), links bounding the transfer."""
    candidates = switched_all_reduce(s, m).values()
    ideal = min(steps * A_EFA + sent / B_NIC for steps, sent in candidates)
    expected = REDUCTION_FIXED + min(steps * A_EFA + sent / SUSTAINED
                                     for steps, sent in candidates)
    return ideal, expected


def test_a_psum_over_16_ultraservers_meets_the_switched_fabric_bound():
    """Issue 37: a 4 MiB psum over 16 UltraServers came out at 3.4 ms expected (RDH routed
    around a ring of servers); any algorithm over the switch at EFA's sustained rate takes
    at most ~1.4 ms with fixed costs and hop latencies. The ring, the slowest of the
    runtime's algorithms here, bounds it: fixed + 2(s-1) a + 2 (s-1)/s M / B_sustained."""
    p = plan("all-reduce", (0,), M)
    ideal, expected = ideal_and_expected(SERVERS, M)
    ring_bound = REDUCTION_FIXED + 2 * (SERVERS - 1) * A_EFA + \
        2 * (SERVERS - 1) / SERVERS * M / SUSTAINED
    assert p.over_efa and p.max_hops == 1 and not p.routed  # one hop, no ring of servers
    assert p.in_server is None  # one chip per server: nothing to reduce inside first
    assert p.transfer_bound == "links"
    assert p.seconds == pytest.approx(ideal)
    assert p.expected_seconds == pytest.approx(expected)
    assert p.seconds <= p.expected_seconds <= ring_bound <= ISSUE_BOUND


def test_a_psum_over_both_axes_of_1024_chips_is_the_sum_of_its_stages():
    """Reduce-scatter among the 64 chips of each UltraServer (NeuronLink, exactly what the
    UltraServer alone gives), all-reduce of the M/64 each chip holds over EFA among the 16
    chips of the same in-server index (64 such groups, each chip through its own NIC), then
    all-gather inside. The collective's launch is paid once, with the stage over EFA."""
    p = plan("all-reduce", (0, 1), M)
    inside = [plan(kind, (0,), M, topology=ULTRA, shape=(CHIPS,))
              for kind in ("reduce-scatter", "all-gather")]
    ideal, expected = ideal_and_expected(SERVERS, M / CHIPS)
    assert p.stage_bytes == M / CHIPS and p.in_server.local_ranks == CHIPS
    assert p.in_server.stages == ("reduce-scatter", "all-gather")
    assert p.seconds == pytest.approx(ideal + sum(q.seconds for q in inside))
    assert p.expected_seconds == pytest.approx(
        expected + sum(q.expected_seconds - q.fixed_seconds for q in inside))
    assert p.fixed_seconds == REDUCTION_FIXED
    # the issue measured 3.5 ms expected (one flat RDH) beside a 0.5 ms hierarchical ideal
    assert p.seconds <= p.expected_seconds < 0.5e-3


def test_a_psum_inside_one_ultraserver_is_unchanged_by_the_cluster():
    """Groups inside one UltraServer run over NeuronLink alone, as on trn2-ultra."""
    p = plan("all-reduce", (1,), M)
    alone = plan("all-reduce", (0,), M, topology=ULTRA, shape=(CHIPS,))
    assert "s" not in p.torus_axes
    assert p.seconds == pytest.approx(alone.seconds, rel=1e-12)
    assert p.expected_seconds == pytest.approx(alone.expected_seconds, rel=1e-12)


def test_an_all_to_all_across_servers_is_one_hop_through_each_nic():
    """Direct: every chip sends (s-1)/s of its buffer to the other servers at once, all of
    it through its NIC, one hop whatever the servers' distance."""
    p = plan("all-to-all", (0,), M)
    assert p.algorithm == "direct" and p.max_hops == 1
    assert p.seconds == pytest.approx(A_EFA + (SERVERS - 1) / SERVERS * M / B_NIC)


def test_ranks_sharing_a_chip_share_its_nic():
    """At LNC=2 a chip holds 4 ranks, each of another dp group: the 4 groups' buffers cross
    EFA through the chip's one NIC (4x the whole-chip cluster's bytes)."""
    lnc = get_topology("trn2-ultraserver-cluster-2")
    whole = get_topology("trn2-ultracluster-2")
    instr, placement = planned("all-reduce", (0,), M, topology=lnc, shape=(2, 256))
    chips, chip_placement = planned("all-reduce", (0,), M, topology=whole, shape=(2, 64))
    assert instr.plan.link_bytes == pytest.approx(4 * chips.plan.link_bytes)
    np.testing.assert_allclose(link_bytes(instr, lnc, placement),
                               4 * link_bytes(chips, whole, chip_placement))


def test_link_bytes_of_a_hierarchical_psum_put_the_efa_stage_on_the_nics():
    instr, placement = planned("all-reduce", (0, 1), M)
    loads = link_bytes(instr, CLUSTER, placement)
    # every chip sends and receives its two-shot's 2 (s-1)/s of M/64 through its NIC
    efa = switched_all_reduce(SERVERS, M / CHIPS)[instr.plan.algorithm][1]
    np.testing.assert_allclose(loads[:, 0, :], efa)
    assert loads[:, 1:, :].max() > 0  # and the stages inside use NeuronLink


def test_listing_shows_the_stage_over_efa_and_the_stages_in_each_server():
    text = plan("all-reduce", (0, 1), M).describe()
    assert "EFA (switched: one hop between any two servers): all-reduce" in text
    assert "64.00 KiB per chip between servers" in text
    assert "in server: reduce-scatter + all-gather among 64 local chips" in text


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
@pytest.mark.parametrize("axes", [(0,), (1,), (0, 1)])
@pytest.mark.parametrize("nbytes", [4096, M, 256 * 2**20])
@pytest.mark.parametrize("name", ["trn2-ultracluster-4", "trn2-ultraserver-cluster-2"])
def test_expected_is_never_below_ideal(kind, axes, nbytes, name):
    topology = get_topology(name)
    servers = topology.shape[0]
    p = plan(kind, axes, nbytes, topology, (servers, topology.num_devices // servers))
    assert 0 < p.seconds <= p.expected_seconds
    if 0 in axes:  # across servers: one hop over the switch, never routed round a ring
        # (an all-to-all's transfers inside a server still take NeuronLink's routes)
        assert p.over_efa and p.max_hops <= (ULTRA.diameter if kind == "all-to-all" else 1)
