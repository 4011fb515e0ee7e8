"""jax.make_mesh on the plugin's devices places a mesh as jax_trn2.make_mesh does: one
placement (mesh.machine.place_mesh) and one estimate through both front doors."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2
from jax_trn2.core.machines import placement_for
from jax_trn2.plugin import executable as plugin_executable
from mesh.machine import get_topology

ULTRA = get_topology("trn2-ultra")


def chips(mesh) -> list[int]:
    """The chip of each device of a jax mesh of the plugin's devices, in mesh order."""
    return [ULTRA.chip_id(d.coords) for d in mesh.devices.flat]


def plugin_mesh(shape, names, devices=None):
    devices = jax.devices("trn2") if devices is None else devices
    return jax.make_mesh(shape, names, devices=devices,
                         axis_types=(AxisType.Auto,) * len(shape))


@pytest.mark.parametrize("shape", [(16, 4), (4, 16), (8, 8), (64,), (4, 4, 4), (2, 32)])
def test_jax_make_mesh_places_as_jax_trn2_make_mesh(shape):
    names = tuple(f"p{i}" for i in range(len(shape)))
    ours = placement_for(ULTRA, jax_trn2.make_mesh(shape, names).axis_sizes, names)
    assert chips(plugin_mesh(shape, names)) == list(ours.device_to_chip)


def test_first_devices_are_the_block_jax_trn2_make_mesh_takes():
    # jax.make_mesh keeps the first 8 devices given: x 0..3, y 0..1 of the first server
    got = chips(plugin_mesh((8,), ("i",), jax.devices("trn2")[:8]))
    assert got == list(placement_for(ULTRA, (8,), ("i",)).device_to_chip)


def test_a_block_elsewhere_is_placed_there():
    server = [d for d in jax.devices("trn2") if d.coords[2] == 2]  # z = 2: one server
    got = chips(plugin_mesh((4, 4), ("a", "b"), server))
    assert got == list(placement_for(ULTRA, (4, 4), ("a", "b"), origin=(0, 0, 2)).device_to_chip)


def test_devices_that_form_no_block_keep_the_order_given():
    devices = jax.devices("trn2")
    scattered = [devices[0], devices[5], devices[2], devices[63]]
    assert list(plugin_mesh((2, 2), ("a", "b"), scattered).devices.flat) == scattered


def test_a_reshape_of_the_devices_puts_the_last_axis_on_the_fastest_links():
    grid = np.array(jax.devices("trn2")).reshape(16, 4)
    assert [tuple(d.coords) for d in grid[0]] == [(x, 0, 0) for x in range(4)]  # a ring of x


def tp_matmul(mesh):
    """Megatron row-parallel matmul: the contraction split over 'tp', summed over it."""
    return jax.shard_map(lambda x, w: jax.lax.psum(x @ w, "tp"), mesh=mesh,
                         in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp", None))


def test_tp_matmul_estimate_is_the_same_through_both_front_doors():
    x, w = np.ones((1024, 4096), np.float32), np.ones((4096, 4096), np.float32)
    mesh = plugin_mesh((16, 4), ("dp", "tp"))
    plain = jax.jit(tp_matmul(mesh)).lower(
        jax.device_put(x, NamedSharding(mesh, P("dp", "tp"))),
        jax.device_put(w, NamedSharding(mesh, P("tp", None)))).compile()
    ours = jax_trn2.jit(tp_matmul(jax_trn2.make_mesh((16, 4), ("dp", "tp")))).lower(x, w)
    ours = ours.compile()
    placement = plugin_executable.of(plain).loaded.placement
    assert placement.axis_text(1, ULTRA.axis_names) == "ring x"  # tp on 128 GB/s links
    assert placement == ours.executable.placement
    # (PJRT carries the plugin's figures as 32-bit floats)
    assert np.float32(plain.cost_analysis()["trn2.step_seconds"]) == \
        np.float32(ours.cost_analysis()["trn2"]["step_seconds"])


def test_a_device_with_no_chip_on_the_programs_machine_is_named():
    """Device i runs the i-th chip (fastest links innermost) of the machine a program's
    trn2_topology names: trn2 has 16."""
    x = jax.device_put(np.ones(4, np.float32), jax.devices("trn2")[20])
    with pytest.raises(Exception, match=r"devices \[20\] have no chip on 'trn2' \(16 chips\)"):
        jax.jit(lambda v: v + 1, compiler_options={"trn2_topology": "trn2"})(x)
