"""Offloads to and reloads from host memory (jax's pinned_host memory kind): their time over
the host link in the estimate, their bytes out of the HBM peak and in jax's host fields,
and their values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

import jax_trn2
from mesh.machine.chip import GIB, ChipSpec
from mesh.machine.runtime import RuntimeSpec

LINK = ChipSpec().host_link_bandwidth  # bytes/s per chip and direction
DMA_START = RuntimeSpec().dma_fixed_seconds


def adam_moment(m, g):
    """An optimizer state kept in host memory: reloaded, updated, offloaded again."""
    m = jax.device_put(m, jax.memory.Space.Device)
    return jax.device_put(0.9 * m + g, jax.memory.Space.Host)


def in_hbm(m, g):
    return 0.9 * m + g


def _compiled(fn, memory_kind):
    device = jax.devices("trn2")[0]
    on_host = SingleDeviceSharding(device, memory_kind=memory_kind)
    in_hbm_ = SingleDeviceSharding(device)
    shape = jax.ShapeDtypeStruct((GIB // 4,), jnp.float32)  # 1 GiB
    return jax.jit(fn, in_shardings=(on_host, in_hbm_), out_shardings=on_host).lower(
        jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=on_host),
        jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=in_hbm_)).compile()


def test_an_offloaded_state_costs_its_moves_over_the_host_link():
    """Reloading 1 GiB and offloading 1 GiB: each 2^30 B / 32 GB/s = 33.554 ms over the
    chip's PCIe link plus the DMA's 1.3 us start, 67.11 ms in all, which the 1 GiB
    multiply-add (about 1.1 ms of HBM traffic) cannot hide."""
    compiled = _compiled(adam_moment, "pinned_host")
    cost = compiled.cost_analysis()
    transfer = GIB / LINK + DMA_START
    assert transfer == pytest.approx(33.5557e-3, rel=1e-5)
    assert cost["trn2.engine_busy_seconds.HostLink"] == pytest.approx(2 * transfer, rel=1e-6)
    assert 2 * transfer < cost["trn2.step_seconds"] < 2 * transfer + 3e-3
    listing = jax_trn2.listing(compiled)
    assert "HostLink.Reload" in listing and "HostLink.Offload" in listing


def test_an_offloaded_state_leaves_the_hbm_peak():
    """In HBM the step holds m, g and the new m (3 GiB: the result cannot overwrite an
    argument not donated); with m in host memory it holds g and the reloaded m, which the
    update overwrites (2 GiB), and jax's host fields report m and the new m."""
    hbm = jax.jit(in_hbm).lower(*[jax.ShapeDtypeStruct((GIB // 4,), jnp.float32)] * 2,
                                ).compile().memory_analysis()
    host = _compiled(adam_moment, "pinned_host").memory_analysis()
    assert hbm.peak_memory_in_bytes == 3 * GIB
    assert host.peak_memory_in_bytes == hbm.peak_memory_in_bytes - GIB
    assert (host.argument_size_in_bytes, host.host_argument_size_in_bytes) == (GIB, GIB)
    assert (host.output_size_in_bytes, host.host_output_size_in_bytes) == (0, GIB)
    assert hbm.host_argument_size_in_bytes == hbm.host_output_size_in_bytes == 0


def test_offloaded_values_equal_the_cpus():
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    g = np.ones((8, 4), np.float32)

    def offload_and_back(x):
        y = x * 2
        h = jax.device_put(y, jax.memory.Space.Host)
        return jax.device_put(h, jax.memory.Space.Device) + 1, h

    expected = jax.jit(offload_and_back)(jax.device_put(x, jax.devices("cpu")[0]))
    ours = jax_trn2.jit(offload_and_back)(x)
    plain = jax.jit(offload_and_back)(jax.device_put(x, jax.devices("trn2")[0]))
    for result in (ours, plain):
        assert result[1].sharding.memory_kind == "pinned_host"
        for got, want in zip(result, expected):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    mesh = jax.sharding.Mesh(np.array(jax.devices("trn2")[:8]), ("a",))
    sharded = NamedSharding(mesh, P("a"))
    on_host = sharded.with_memory_kind("pinned_host")
    step = jax.jit(adam_moment, in_shardings=(on_host, sharded), out_shardings=on_host)
    out = step(jax.device_put(x, on_host), jax.device_put(g, sharded))
    assert out.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(out), in_hbm(x, g))


def test_a_program_without_memory_kinds_has_no_host_transfers():
    compiled = jax_trn2.jit(in_hbm).lower(np.ones(8, np.float32), np.ones(8, np.float32)).compile()
    assert "HostLink." not in jax_trn2.listing(compiled)
    assert compiled.cost_analysis()["trn2"]["engine_busy_seconds"]["HostLink"] == 0.0
