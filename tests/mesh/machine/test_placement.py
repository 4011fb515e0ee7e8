"""Meshes smaller than the topology: a compact block of chips, axes on rings or segments."""

import math

import numpy as np
import pytest

from mesh.machine import (chips_text, device_order, get_topology, place_first, place_mesh,
                          place_mesh_within)

ULTRA = get_topology("trn2-ultra")


def coords(placement, topo=ULTRA):
    return np.array([topo.coords(c) for c in placement.device_to_chip])


@pytest.mark.parametrize("shape", [(2, 4), (8,), (2, 2, 2), (4,), (16, 4), (2,), (6,), (32,),
                                   (3, 5), (7,)])
def test_sub_mesh_devices_take_distinct_chips(shape):
    placement = place_mesh(ULTRA, shape, tuple("abc"[: len(shape)]))
    assert len(set(placement.device_to_chip)) == math.prod(shape)
    for device in range(math.prod(shape)):
        assert placement.device_of(placement.chip_of(device)) == device


def test_short_axes_take_segments_and_long_ones_rings():
    placement = place_mesh(ULTRA, (2, 4), ("data", "model"))
    assert placement.physical_axes == ((1,), (0,))
    assert placement.axis_text(0, ULTRA.axis_names) == "segment 2 of y"
    assert placement.axis_text(1, ULTRA.axis_names) == "ring x"
    # a compact block at the origin: x 0..3, y 0..1, z 0
    assert sorted(map(tuple, coords(placement))) == \
        [(x, y, 0) for x in range(4) for y in range(2)]


@pytest.mark.parametrize("shape", [(2, 4), (2, 2, 2), (4,), (3,), (2, 3)])
def test_neighbours_along_a_segment_or_ring_are_one_link_apart(shape):
    placement = place_mesh(ULTRA, shape, tuple("abc"[: len(shape)]))
    grid = np.asarray(placement.device_to_chip).reshape(shape)
    for axis, size in enumerate(shape):
        for k in range(size - 1):
            a, b = (np.take(grid, k, axis).ravel(), np.take(grid, k + 1, axis).ravel())
            assert all(ULTRA.hops(int(i), int(j)) == 1 for i, j in zip(a, b))


def test_axis_longer_than_every_torus_axis_spans_a_block():
    placement = place_mesh(ULTRA, (8,), ("a",))
    assert placement.physical_axes == ((0, 1),)
    assert sorted(map(tuple, coords(placement))) == [(x, y, 0) for x in range(4) for y in range(2)]


def test_count_no_block_holds_takes_the_first_chips():
    assert place_mesh(ULTRA, (5,), ("a",)).device_to_chip == (0, 1, 2, 3, 4)


def test_process_grid_takes_the_first_chips():
    placement = place_first(ULTRA, (2, 4), ("replica", "partition"))
    assert placement.device_to_chip == tuple(range(8))


def test_trn2_holds_a_four_device_mesh_on_one_ring():
    trn2 = get_topology("trn2")
    placement = place_mesh(trn2, (4,), ("a",))
    assert placement.is_torus_ring(0) and placement.device_to_chip == (0, 4, 8, 12)


def test_chips_text_compresses_ranges():
    assert chips_text((5, 0, 1, 2, 7, 6)) == "0-2, 5-7"


def test_unoccupied_chip_has_no_device():
    with pytest.raises(ValueError, match="chip 63 runs no device of this mesh"):
        place_mesh(ULTRA, (2, 4), ("a", "b")).device_of(63)


def test_mesh_on_a_failed_chip_names_it_and_offers_placements_that_avoid_it():
    faulty = ULTRA.with_overrides(failed_chips={5})
    with pytest.raises(ValueError, match=r"chip 5 at torus \(0, 1, 1\) held device 5 "
                                         r"\(x=0, y=1, z=1\); no placement of 64 devices"):
        place_mesh(faulty, (4, 4, 4), ("x", "y", "z"))
    with pytest.raises(ValueError, match=r"chip 5 at torus \(0, 1, 1\) held device 4 \(a=1, "
                                         r"b=0\); placements that avoid the failed chips "
                                         r"start at torus origin \(0, 0, 0\), .*: "
                                         r"make_mesh\(\.\.\., origin=\(0, 0, 0\)\), or "
                                         r"from a shell `jax-trn2 inspect \.\.\. "
                                         r"--origin 0,0,0`"):
        place_mesh(faulty, (2, 4), ("a", "b"), origin=(0, 0, 1))


def test_origin_moves_the_first_chips_of_an_spmd_module():
    # Processes on chips 0-7, at torus (0, y, z) for y < 2; moved one step along z, wrapping.
    placement = place_first(ULTRA, (2, 4), ("replica", "partition"), origin=(0, 0, 1))
    assert placement.device_to_chip == (1, 2, 3, 0, 5, 6, 7, 4)


def test_origin_moves_the_block():
    placement = place_mesh(ULTRA, (2, 4), ("a", "b"), origin=(0, 3, 2))
    assert sorted(map(tuple, coords(placement))) == \
        sorted((x, y % 4, 2) for x in range(4) for y in (3, 4))


def test_device_order_puts_the_fastest_links_innermost():
    order = device_order(ULTRA)
    # x, then y (128 GB/s inside a server), then z (64 GB/s across servers)
    assert [ULTRA.coords(c) for c in order[:5]] == \
        [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (0, 1, 0)]
    assert {ULTRA.coords(c)[2] for c in order[:16]} == {0}  # the first server
    cluster = get_topology("trn2-ultracluster-2")  # EFA between UltraServers: outermost
    assert {cluster.coords(c)[0] for c in device_order(cluster)[:64]} == {0}
    assert sorted(order) == list(range(64))


@pytest.mark.parametrize("shape", [(16, 4), (4, 16), (8, 8), (64,), (4, 4, 4), (2, 32),
                                   (8,), (2, 4), (2, 2, 2), (2, 2, 8), (16, 2)])
def test_mesh_within_the_chips_place_mesh_picks_is_place_mesh(shape):
    names = tuple("abc"[:len(shape)])
    placed = place_mesh(ULTRA, shape, names)
    given = sorted(placed.device_to_chip, reverse=True)  # any order of the same chips
    assert place_mesh_within(ULTRA, shape, names, given) == placed


def test_mesh_within_a_block_elsewhere_is_place_mesh_there():
    server = [c for c in range(64) if ULTRA.coords(c)[2] == 2]
    assert place_mesh_within(ULTRA, (4, 4), ("a", "b"), server) == \
        place_mesh(ULTRA, (4, 4), ("a", "b"), origin=(0, 0, 2))


def test_mesh_within_another_block_is_laid_out_on_it():
    # the first 32 devices (x, y, z < 2): the 16-device axis on x*y, the 2 on z
    block = [c for c in range(64) if ULTRA.coords(c)[2] < 2]
    placement = place_mesh_within(ULTRA, (2, 16), ("pipe", "model"), block)
    assert placement.physical_axes == ((2,), (0, 1))
    # a block wrapping around the z ring: z in {3, 0}
    wrapped = [c for c in range(64) if ULTRA.coords(c)[2] in (3, 0)]
    placement = place_mesh_within(ULTRA, (2, 16), ("pipe", "model"), wrapped)
    assert [ULTRA.coords(c)[2] for c in placement.device_to_chip[::16]] == [3, 0]


def test_chips_that_form_no_block_have_no_placement():
    l_shape = [0, 16, 32, 4]  # (0,0,0), (1,0,0), (2,0,0), (0,1,0)
    assert place_mesh_within(ULTRA, (4,), ("a",), l_shape) is None
    assert place_mesh_within(ULTRA, (2,), ("a",), [0, 2]) is None  # a gap on z
    with pytest.raises(ValueError, match="needs 4 distinct chip ids"):
        place_mesh_within(ULTRA, (4,), ("a",), [0, 1, 2, 2])


def test_outer_axes_take_the_slow_links_and_inner_ones_the_fast():
    """Data parallelism across servers, tensor parallelism on a chip's cores and the
    fastest links (AWS's advice for Trn2): the physical axes go slowest first to the
    mesh's outermost axes."""
    server = get_topology("trn2-ultraserver")  # x, y inside a server (128 GB/s), z across
    p = place_mesh(server, (4, 16, 4), ("dp", "fsdp", "tp"))
    cores = server.ndim  # the cores of a chip: the placement's last physical axis
    assert p.physical_axes == ((2,), (0, 1), (cores,))
    p = place_mesh(server, (4, 64), ("dp", "tp"))
    assert p.physical_axes == ((2,), (0, 1, cores))  # tp never crosses a server
    p = place_mesh(ULTRA, (16, 4), ("dp", "tp"))  # whole chips: tp on the x ring
    assert p.physical_axes == ((1, 2), (0,)) and p.is_torus_ring(1)
    cluster = get_topology("trn2-ultracluster-2")  # the EFA axis first, the slowest
    assert place_mesh(cluster, (2, 64), ("dp", "tp")).physical_axes == ((0,), (1, 2, 3))


def test_a_mesh_named_after_the_torus_axes_lies_on_them():
    p = place_mesh(ULTRA, (4, 4, 4), ("z", "x", "y"))
    assert p.physical_axes == ((2,), (0,), (1,))
    # a name that is a torus axis but not of its size: placed by link speed
    assert place_mesh(ULTRA, (2, 32), ("x", "y")).physical_axes == ((2,), (0, 1, 2))
