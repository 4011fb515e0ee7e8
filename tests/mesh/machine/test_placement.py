"""Meshes smaller than the topology: a compact block of chips, axes on rings or segments."""

import math

import numpy as np
import pytest

from mesh.machine import chips_text, get_topology, place_first, place_mesh

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
