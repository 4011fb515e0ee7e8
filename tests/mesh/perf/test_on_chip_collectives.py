"""Collectives among the ranks (logical NeuronCores) of a chip: the Neuron runtime's
on-chip reduction and broadcast through the chip's HBM, around the stage between chips,
pinned to hand-worked formulas."""


import numpy as np
import pytest

from mesh import isa
from mesh.machine import get_topology, place_mesh
from mesh.perf.collectives import ON_CHIP, plan_collective

INSTANCE = get_topology("trn2.48xlarge")  # 16 chips, 4 devices (LNC=2) each
RT, CHIP = INSTANCE.runtime, INSTANCE.chip
HBM, SUSTAINED = CHIP.hbm_bandwidth, CHIP.hbm_bandwidth * RT.hbm_efficiency
DMA = RT.collective_dma_bytes_per_second
STAGE = RT.on_chip_stage_seconds + RT.dma_fixed_seconds  # fixed cost of each on-chip stage
BIG = 32 * 2**20


def all_reduce(shape, names, axes, nbytes, topology=INSTANCE):
    """The plan of an all-reduce of `nbytes` per rank along mesh `axes`."""
    ids = np.arange(int(np.prod(shape))).reshape(shape)
    rest = [a for a in range(len(shape)) if a not in axes]
    lines = ids.transpose(rest + list(axes)).reshape(-1, int(np.prod([shape[a] for a in axes])))
    groups = isa.Groups(tuple(tuple(int(d) for d in g) for g in lines), tuple(axes))
    instr = isa.AllReduce((1,), (0,), groups=groups, reduction="add")
    return plan_collective(instr, nbytes, topology, place_mesh(topology, shape, names))


def on_chip_all_reduce(r, m):
    """(ideal, expected) of an all-reduce of m bytes among r ranks of one chip: a
    reduce-scatter (each rank reads the r blocks of m/r it reduces, writes the sum: HBM
    (r+1) m per chip, DMA (r-1) m) and an all-gather (each block read once, written to the
    r-1 peers: HBM r m, DMA (r-1) m)."""
    hbm, dma = (r + 1) * m + r * m, 2 * (r - 1) * m
    return hbm / HBM, 2 * STAGE + max(hbm / SUSTAINED, dma / DMA)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("nbytes", [1024, 2**20, BIG])
def test_all_reduce_among_the_ranks_of_one_chip(ranks, nbytes):
    p = all_reduce((ranks,), ("tp",), (0,), nbytes)
    ideal, stages = on_chip_all_reduce(ranks, nbytes)
    assert p.algorithm == ON_CHIP and p.on_chip.stages == ("reduce-scatter", "all-gather")
    assert p.seconds == pytest.approx(ideal)
    # the runtime's launch, not the reduction's synchronisation between chips
    assert p.expected_seconds == pytest.approx(RT.collective_launch_seconds + stages)
    assert p.expected_seconds >= p.seconds


def test_a_small_on_chip_all_reduce_floors_at_tens_of_microseconds():
    """nccom-test's 2- and 4-rank runs on one chip (trn2_facts.md); before, the model had
    no such collective (a device was a chip)."""
    for ranks in (2, 4):
        assert 20e-6 <= all_reduce((ranks,), ("tp",), (0,), 1024).expected_seconds <= 50e-6


def test_sixteen_ranks_over_four_chips_run_the_on_chip_stages_around_the_ring():
    """16 ranks = 4 chips of 4: reduce-scatter on each chip, the all-reduce between chips
    among ranks of the same in-chip index (the chip's whole buffer, a ring of 4 chips:
    2(k-1) a + (k-1)/k M/B), all-gather on each chip."""
    p = all_reduce((16,), ("i",), (0,), BIG)
    k, alpha, b = 4, INSTANCE.link_latency[0], INSTANCE.link_bandwidth[0]
    assert p.algorithm == "ring" and p.rings == (k,) and p.on_chip.local_ranks == 4
    on_chip_ideal, on_chip_expected = on_chip_all_reduce(4, BIG)
    ring = 2 * (k - 1) * alpha + (k - 1) / k * BIG / b
    assert p.seconds == pytest.approx(ring + on_chip_ideal)
    # the stage between chips is what the whole-chip model gives 4 chips
    chips = all_reduce((4,), ("i",), (0,), BIG, topology=get_topology("trn2"))
    assert p.expected_seconds == pytest.approx(chips.expected_seconds + on_chip_expected)
    assert p.expected_seconds >= p.seconds


def test_groups_sharing_chips_carry_each_group_between_chips():
    """psum over fsdp of a (16, 4) mesh: 4 groups of 16 ranks, one rank of each on every
    chip, all on the same 16 chips: the chips' links carry 4 groups' buffers."""
    p = all_reduce((16, 4), ("fsdp", "tp"), (0,), BIG)
    chips = all_reduce((16,), ("i",), (0,), 4 * BIG, topology=get_topology("trn2"))
    assert p.on_chip is None and p.message_bytes == BIG
    assert p.seconds == pytest.approx(chips.seconds)
    assert p.expected_seconds == pytest.approx(chips.expected_seconds)


def test_whole_chip_presets_have_no_on_chip_stage():
    p = all_reduce((4,), ("i",), (0,), BIG, topology=get_topology("trn2"))
    assert p.on_chip is None and p.algorithm != ON_CHIP


def test_listing_shows_the_on_chip_stage():
    text = all_reduce((16,), ("i",), (0,), BIG).describe()
    assert "torus: all-reduce" in text
    assert "on chip: reduce-scatter + all-gather among 4 local ranks" in text


def test_a_permute_within_a_chip_copies_through_hbm():
    placement = place_mesh(INSTANCE, (4,), ("tp",))
    instr = isa.CollectivePermute((1,), (0,), pairs=((0, 1), (1, 2), (2, 3), (3, 0)))
    p = plan_collective(instr, BIG, INSTANCE, placement)
    # each of 4 ranks copies m: read and write (HBM 2 m each), the DMA rings move m each
    hbm, dma = 4 * 2 * BIG, 4 * BIG
    assert p.algorithm == ON_CHIP
    assert p.seconds == pytest.approx(hbm / HBM)
    assert p.expected_seconds == pytest.approx(
        RT.collective_launch_seconds + STAGE + max(hbm / SUSTAINED, dma / DMA))
