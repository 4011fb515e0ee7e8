"""The machines as AWS rents them: devices are logical NeuronCores (4 per chip at LNC=2,
8 at LNC=1), each with its share of the chip, placed TP inside the chip."""

import pytest

from mesh.machine import (INSTANCE_NAMES, TOPOLOGY_NAMES, device_order, get_topology,
                          place_first, place_mesh, place_mesh_within)

GIB = 2**30


@pytest.mark.parametrize("name, chips, devices", [
    ("trn2.3xlarge", 1, 4), ("trn2.48xlarge", 16, 64), ("trn2u.48xlarge", 16, 64),
    ("trn2-ultraserver", 64, 256), ("trn2-ultraserver-cluster-2", 128, 512)])
def test_instances_have_four_devices_per_chip(name, chips, devices):
    t = get_topology(name)
    assert (t.lnc, t.num_chips, t.num_devices) == (2, chips, devices)
    assert t.device.hbm_bytes == 24 * GIB and t.device.neuron_cores == 2


def test_lnc_1_gives_eight_devices_per_chip():
    t = get_topology("trn2.48xlarge", lnc=1)
    assert t.num_devices == 128 and t.devices_per_chip == 8
    assert t.device.hbm_bytes == 12 * GIB


def test_a_device_has_its_share_of_the_chip():
    chip, device = get_topology("trn2.48xlarge").chip, get_topology("trn2.48xlarge").device
    for dtype in ("bfloat16", "float8_e4m3fn", "float32"):
        assert device.peak_flops_for(dtype) == pytest.approx(chip.peak_flops_for(dtype) / 4)
    assert device.hbm_bandwidth == pytest.approx(chip.hbm_bandwidth / 4)
    assert (device.sbuf_bytes_per_core, device.psum_bytes_per_core) == \
        (chip.sbuf_bytes_per_core, chip.psum_bytes_per_core)


def test_device_ids_are_consecutive_on_a_chip_and_coords_end_with_the_core():
    t = get_topology("trn2.48xlarge")
    assert [t.chip_of_device(d) for d in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.device_coords(6) == t.coords(1) + (2,)
    assert all(t.device_id(t.device_coords(d)) == d for d in range(t.num_devices))
    assert device_order(t)[:4] == (0, 1, 2, 3)


def test_whole_chip_presets_are_unchanged():
    assert set(TOPOLOGY_NAMES).isdisjoint(INSTANCE_NAMES)
    for name in TOPOLOGY_NAMES:
        t = get_topology(name)
        assert t.lnc is None and t.num_devices == t.num_chips and t.device == t.chip
    with pytest.raises(ValueError, match="whole-chip view"):
        get_topology("trn2-ultra", lnc=2)
    with pytest.raises(ValueError, match="LNC=3"):
        get_topology("trn2.48xlarge", lnc=3)


def test_tp4_is_one_chip_and_tp64_sixteen():
    t = get_topology("trn2.48xlarge")
    assert place_mesh(t, (4,), ("tp",)).device_to_chip == (0, 0, 0, 0)
    tp64 = place_mesh(t, (64,), ("tp",))
    assert sorted(set(tp64.device_to_chip)) == list(range(16))
    assert tp64.device_to_chip[:8] == (0, 0, 0, 0) + (tp64.device_to_chip[4],) * 4


def test_innermost_axis_on_the_cores_fsdp_across_chips():
    t = get_topology("trn2.48xlarge")
    p = place_mesh(t, (16, 4), ("fsdp", "tp"))
    chips = [p.device_to_chip[f * 4:(f + 1) * 4] for f in range(16)]
    assert all(len(set(c)) == 1 for c in chips)  # each tp group is one chip
    assert len({c[0] for c in chips}) == 16  # the fsdp axis spans the 16 chips
    assert p.axis_text(1, t.axis_names) == "4 cores of a chip"
    assert place_mesh_within(t, (16, 4), ("a", "b"), range(64)).device_ids == p.device_ids


def test_a_failed_chip_takes_its_cores():
    t = get_topology("trn2.48xlarge", failed_chips={0})
    with pytest.raises(ValueError, match="would run on failed chips: chip 0"):
        place_mesh(t, (4,), ("tp",))
    assert set(place_mesh(t, (4,), ("tp",), origin=(0, 1)).device_to_chip) == {1}


def test_a_mesh_larger_than_the_devices_is_refused():
    with pytest.raises(ValueError, match="only 4 devices"):
        place_mesh(get_topology("trn2.3xlarge"), (8,), ("tp",))


def test_process_grid_takes_the_first_devices():
    t = get_topology("trn2.48xlarge")
    assert place_first(t, (1, 6), ("replica", "partition")).device_ids == tuple(range(6))
