"""Torus presets, neighbours, rings, routes and placement of logical meshes."""

import itertools

import pytest

from mesh import TOPOLOGY_NAMES, ChipSpec, Topology, get_topology, place_mesh

PRESET_NEIGHBOURS = {"trn2": 4, "trn2-ultra": 6, "trn2-ultra-max": 6}
PLACEMENT_SHAPES = {
    "trn2-ultra": [(4, 4, 4), (8, 8), (64,), (2, 4, 8), (2, 32), (16, 4)],
    "trn2": [(4, 4), (16,), (2, 8)],
    "trn2-ultra-max": [(4, 4, 16), (16, 16)],
}


def torus_distance(topo, a, b):
    """Manhattan distance with wraparound, computed from coordinates."""
    return sum(
        min(abs(x - y), size - abs(x - y))
        for x, y, size in zip(topo.coords(a), topo.coords(b), topo.shape)
    )


def are_neighbours(topo, a, b):
    return any(chip == b for chip, _, _ in topo.neighbours(a))


def test_preset_names_and_sizes():
    assert set(TOPOLOGY_NAMES) == {"trn2", "trn2-ultra", "trn2-ultra-max"}
    assert get_topology().name == "trn2-ultra"
    assert [get_topology(n).num_chips for n in ("trn2", "trn2-ultra", "trn2-ultra-max")] == [16, 64, 256]


def test_unknown_preset_lists_known():
    with pytest.raises(ValueError, match=r"'trn3'.*trn2-ultra-max"):
        get_topology("trn3")


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_coords_chip_id_round_trip(name):
    topo = get_topology(name)
    seen = set()
    for chip in range(topo.num_chips):
        coords = topo.coords(chip)
        assert all(0 <= c < s for c, s in zip(coords, topo.shape))
        assert topo.chip_id(coords) == chip
        seen.add(coords)
    assert len(seen) == topo.num_chips


def test_row_major_numbering():
    topo = get_topology("trn2-ultra")
    assert topo.coords(1) == (0, 0, 1)
    assert topo.coords(16) == (1, 0, 0)
    assert topo.chip_id((3, 2, 1)) == 3 * 16 + 2 * 4 + 1


def test_out_of_range_raises_with_value_and_range():
    topo = get_topology("trn2")
    with pytest.raises(ValueError, match=r"chip id 16 .*\[0, 16\)"):
        topo.coords(16)
    with pytest.raises(ValueError, match=r"coordinate 4 on axis 1 .*\[0, 4\)"):
        topo.chip_id((0, 4))


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_every_chip_has_distinct_neighbours(name):
    topo = get_topology(name)
    for chip in range(topo.num_chips):
        neighbours = [n for n, _, _ in topo.neighbours(chip)]
        assert len(set(neighbours)) == len(neighbours) == PRESET_NEIGHBOURS[name]
        assert chip not in neighbours
        assert all(torus_distance(topo, chip, n) == 1 for n in neighbours)


def test_size_two_and_size_one_axes():
    topo = get_topology("trn2-ultra", shape=(2, 1, 4))
    assert topo.neighbours(0) == ((4, 0, 1), (1, 2, 1), (3, 2, -1))
    assert topo.route(0, 4)[0].direction == 1


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_rings_are_closed_neighbour_cycles(name):
    topo = get_topology(name)
    for axis, chip in itertools.product(range(topo.ndim), range(topo.num_chips)):
        ring = topo.ring(axis, chip)
        assert len(ring) == topo.shape[axis]
        assert chip in ring
        assert [topo.coords(c)[axis] for c in ring] == list(range(topo.shape[axis]))
        for a, b in zip(ring, ring[1:] + ring[:1]):
            link = topo.link(a, b)
            assert (link.axis, link.direction) == (axis, 1)


def test_ring_length_four_on_ultra():
    topo = get_topology("trn2-ultra")
    assert {len(topo.ring(axis, 21)) for axis in range(3)} == {4}


def check_route(topo, src, dst):
    route = topo.route(src, dst)
    assert len(route) == torus_distance(topo, src, dst) == topo.hops(src, dst)
    here = src
    for link in route:
        assert link.src == here
        assert are_neighbours(topo, link.src, link.dst)
        assert topo.link(link.src, link.dst) == link
        here = link.dst
    assert here == dst
    axes = [link.axis for link in route]
    assert axes == sorted(axes), "dimension order: axis 0 first, then 1, ..."
    for axis in set(axes):
        assert len({link.direction for link in route if link.axis == axis}) == 1


@pytest.mark.parametrize("name", ["trn2", "trn2-ultra"])
def test_all_routes(name):
    topo = get_topology(name)
    for src, dst in itertools.product(range(topo.num_chips), repeat=2):
        check_route(topo, src, dst)


def test_routes_on_ultra_max_from_a_few_sources():
    topo = get_topology("trn2-ultra-max")
    for src in (0, 77, 255):
        for dst in range(topo.num_chips):
            check_route(topo, src, dst)


def test_route_ties_go_plus_and_short_way_goes_minus():
    topo = get_topology("trn2-ultra")
    assert [link.direction for link in topo.route(0, topo.chip_id((2, 0, 0)))] == [1, 1]
    assert [link.direction for link in topo.route(0, topo.chip_id((3, 0, 0)))] == [-1]
    assert topo.route(5, 5) == ()


def test_diameter():
    assert [get_topology(n).diameter for n in ("trn2", "trn2-ultra", "trn2-ultra-max")] == [4, 6, 12]
    topo = get_topology("trn2-ultra")
    assert max(topo.hops(0, d) for d in range(topo.num_chips)) == topo.diameter


def test_link_requires_neighbours():
    topo = get_topology("trn2-ultra")
    with pytest.raises(ValueError, match="not neighbours"):
        topo.link(0, 2)
    with pytest.raises(ValueError, match="not neighbours"):
        topo.link(0, 0)


def test_z_links_half_of_x_on_ultra():
    topo = get_topology("trn2-ultra")
    x_link = topo.link(0, topo.chip_id((1, 0, 0)))
    z_link = topo.link(0, topo.chip_id((0, 0, 1)))
    assert (x_link.axis, z_link.axis) == (0, 2)
    assert z_link.bandwidth == x_link.bandwidth / 2 == 64e9
    assert x_link.latency == pytest.approx(1.5e-6)


def test_overrides_take_effect():
    topo = get_topology("trn2-ultra", link_bandwidth=(1e9, 2e9, 3e9), chip=ChipSpec(tensor_clock_hz=1.0e9))
    assert topo.link(0, 1).bandwidth == 3e9
    assert topo.link(0, 16).bandwidth == 1e9
    assert topo.chip.tensor_clock_hz == 1.0e9
    assert get_topology("trn2-ultra").chip.tensor_clock_hz == 2.4e9
    assert topo.with_overrides(link_latency=[0.0] * 3).link(0, 4).latency == 0.0


def test_unknown_override_is_named():
    with pytest.raises(TypeError, match="bandwith"):
        get_topology("trn2", bandwith=(1.0, 1.0))


def test_invalid_topology_raises_with_numbers():
    with pytest.raises(ValueError, match=r"link_bandwidth has 2 entries .* shape \(4, 4, 4\) has 3"):
        get_topology("trn2-ultra", link_bandwidth=(1e9, 1e9))
    with pytest.raises(ValueError, match=r"positive bytes/s, got \(128000000000.0, -1.0\)"):
        get_topology("trn2", link_bandwidth=(128e9, -1.0))
    with pytest.raises(ValueError, match="distinct"):
        Topology("t", (2, 2), ("x", "x"), (1.0, 1.0), (0.0, 0.0))


def test_per_axis_fields_need_a_tuple_of_numbers():
    """A lone number (one bandwidth for every axis) or a non-number entry is named, not a
    bare "'float' object is not iterable"; a string is not a tuple of axis names."""
    with pytest.raises(ValueError,
                       match=r"link_bandwidth needs one entry per torus axis.*got 100000000000.0"):
        get_topology("trn2").with_overrides(link_bandwidth=100e9)
    with pytest.raises(ValueError, match=r"link_latency = \(1e-06, 'x'\): entries must be numbers"):
        get_topology("trn2").with_overrides(link_latency=(1e-6, "x"))
    with pytest.raises(ValueError, match="axis_names needs one entry per torus axis"):
        get_topology("trn2").with_overrides(axis_names="xy")
    with pytest.raises(ValueError, match="shape needs one entry per torus axis"):
        get_topology("trn2").with_overrides(shape=16)


@pytest.mark.parametrize(
    "name,shape", [(name, shape) for name, shapes in PLACEMENT_SHAPES.items() for shape in shapes]
)
def test_placement_is_a_bijection(name, shape):
    topo = get_topology(name)
    names = tuple("abc"[: len(shape)])
    placement = place_mesh(topo, shape, names)
    assert sorted(placement.device_to_chip) == list(range(topo.num_chips))
    for device in range(topo.num_chips):
        assert placement.device_of(placement.chip_of(device)) == device
    assert placement.axis_sizes == shape and placement.axis_names == names


@pytest.mark.parametrize(
    "name,shape", [("trn2-ultra", (4, 4, 4)), ("trn2", (4, 4)), ("trn2-ultra-max", (4, 4, 16))]
)
def test_matching_mesh_is_the_identity(name, shape):
    placement = place_mesh(get_topology(name), shape, tuple("xyz"[: len(shape)]))
    assert placement.device_to_chip == tuple(range(get_topology(name).num_chips))
    assert placement.physical_axes == tuple((i,) for i in range(len(shape)))
    assert all(placement.is_torus_ring(i) for i in range(len(shape)))


def test_torus_ring_axes_step_over_links_with_wraparound():
    topo = get_topology("trn2-ultra")
    placement = place_mesh(topo, (4, 4, 4), ("x", "y", "z"))
    for i, stride in enumerate((16, 4, 1)):
        for k in range(4):
            a = placement.chip_of(k * stride)
            b = placement.chip_of(((k + 1) % 4) * stride)
            assert topo.link(a, b).axis == i


def test_large_logical_axes_span_several_physical_axes():
    placement = place_mesh(get_topology("trn2-ultra"), (8, 8), ("a", "b"))
    assert placement.physical_axes == ((1, 2), (0, 1))  # the inner axis on x, the fastest
    assert not placement.is_torus_ring(0) and not placement.is_torus_ring(1)
    placement = place_mesh(get_topology("trn2-ultra"), (64,), ("a",))
    assert placement.physical_axes == ((0, 1, 2),) and not placement.is_torus_ring(0)


def test_equal_sized_logical_axis_takes_a_whole_physical_axis():
    placement = place_mesh(get_topology("trn2-ultra"), (16, 4), ("a", "b"))
    assert placement.physical_axes == ((1, 2), (0,))
    assert placement.is_torus_ring(1) and not placement.is_torus_ring(0)
    placement = place_mesh(get_topology("trn2-ultra-max"), (16, 16), ("a", "b"))
    assert placement.physical_axes == ((2,), (0, 1))
    assert placement.is_torus_ring(0) and not placement.is_torus_ring(1)
    # no axis of 4 left for b once c takes x and half of y: packed from the fastest axis
    placement = place_mesh(get_topology("trn2-ultra"), (2, 4, 8), ("a", "b", "c"))
    assert placement.physical_axes == ((2,), (1, 2), (0, 1))


def test_size_one_axis_takes_no_physical_axis():
    placement = place_mesh(get_topology("trn2"), (1, 4, 4), ("p", "x", "y"))
    assert placement.physical_axes == ((), (0,), (1,))
    assert not placement.is_torus_ring(0)


def test_too_large_mesh_names_chip_count_and_shapes_that_fit():
    expected = (r"mesh shape \(8, 16\) has 128 devices but topology 'trn2-ultra' has only 64 "
                r"chips .* e\.g\. \[\(16, 4\), \(1, 64\)\]")
    with pytest.raises(ValueError, match=expected):
        place_mesh(get_topology("trn2-ultra"), (8, 16), ("x", "y"))


def test_mesh_names_must_match_sizes():
    with pytest.raises(ValueError, match="distinct names"):
        place_mesh(get_topology("trn2"), (4, 4), ("x",))


def test_route_goes_around_a_failed_cable():
    faulty = get_topology("trn2-ultra").with_failed_cable(0, 16)
    assert [l.dst for l in faulty.route(0, 16)] == [48, 32, 16]
    assert [l.dst for l in faulty.route(0, 1)] == [1]  # other routes unchanged


def test_faults_are_checked():
    ultra = get_topology("trn2-ultra")
    with pytest.raises(ValueError, match="are not neighbours"):
        ultra.with_failed_cable(0, 2)
    with pytest.raises(ValueError, match=r"factor in \(0, 1\)"):
        ultra.with_overrides(degraded_links=((0, 1, 0.0),))
    with pytest.raises(ValueError, match="out of range"):
        ultra.with_overrides(failed_chips={64})


def test_isolated_chip_has_no_route():
    topo = get_topology("trn2")
    for peer, _, _ in topo.neighbours(0):
        topo = topo.with_failed_cable(0, peer)
    with pytest.raises(ValueError, match="no route from chip 0"):
        topo.route(0, 5)


def test_ultracluster_joins_ultraservers_by_efa():
    cluster = get_topology("trn2-ultracluster-16")
    assert cluster.shape == (16, 4, 4, 4) and cluster.num_chips == 1024
    assert cluster.axis_names == ("s", "x", "y", "z") and cluster.efa_axes == {0}
    # the s axis numbers the UltraServers; its bandwidth is a chip's NIC share of the
    # instance's 3,200 Gbit/s of EFA (16 chips), 25 GB/s per direction, and its latency
    # 15 us: a minimal packet HBM to HBM between servers (ib_write_lat, Neuron runtime docs)
    link = cluster.link(5, 64 + 5)
    assert link.axis == 0 and link.bandwidth == 25e9 and link.latency == 15e-6
    assert cluster.link(5, 6).bandwidth == 64e9  # z inside the UltraServer: NeuronLink


def test_ultracluster_name_needs_a_server_count():
    with pytest.raises(ValueError, match="must be a positive integer"):
        get_topology("trn2-ultracluster-x")
