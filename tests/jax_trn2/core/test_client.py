"""The PJRT-style surface: Client, Device, Buffer, LoadedExecutable."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2

RNG = np.random.default_rng(0)
A = RNG.standard_normal((16, 8)).astype(np.float32)
B = RNG.standard_normal((8, 4)).astype(np.float32)


def matmul_psum(a, b):
    return jax.lax.psum(a @ b, "y")


def jitted_matmul_psum():
    """jax.jit of a shard_map over the 4x4x4 mesh: a [x, y] times b [y, -]."""
    return jax.jit(jax.shard_map(matmul_psum, mesh=jax_trn2.make_mesh(),
                                 in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None)))


def lowered_matmul_psum():
    return jitted_matmul_psum().lower(A, B)


def bytecode(module) -> bytes:
    out = io.BytesIO()
    module.operation.write_bytecode(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def client():
    return jax_trn2.client(topology="trn2-ultra")


def test_client_and_devices(client):
    assert client.platform_name == "trn2"
    devices = client.devices()
    assert [d.id for d in devices] == list(range(64))
    assert {d.device_kind for d in devices} == {"Trainium2"}
    assert sorted(d.coords for d in devices) == sorted(
        (x, y, z) for x in range(4) for y in range(4) for z in range(4))


def test_trn2_client_has_a_4x4_torus():
    devices = jax_trn2.client("trn2").devices()
    assert len(devices) == 16 and {len(d.coords) for d in devices} == {2}


@pytest.mark.parametrize("form", ["text", "bytecode", "module", "portable artifact"])
def test_compile_stablehlo_in_every_form(client, form):
    lowered = lowered_matmul_psum()
    program = {"text": lambda: lowered.as_text(),
               "bytecode": lambda: bytecode(lowered.compiler_ir("stablehlo")),
               "module": lambda: lowered.compiler_ir("stablehlo"),
               # VHLO bytecode, as jax.export serializes a module
               "portable artifact": lambda: jax.export.export(jitted_matmul_psum())(
                   A, B).mlir_module_serialized}[form]()
    executable = client.compile(program)
    (out,) = executable.execute([A, B])
    # psum over y of the row block times the column block: a plain matmul, summed in
    # another order than numpy's (4 partial products of 2 terms): FP32 rounding only.
    np.testing.assert_allclose(np.asarray(out), A @ B, rtol=1e-5, atol=1e-5)


def test_execute_sharded_takes_and_returns_per_device_buffers(client):
    """With the shardings of main's arguments and results given (jit's in_shardings over a
    mesh of the same shape), each device holds its own pieces, as under PJRT."""
    names = ("x", "y", "z")
    mesh = jax.make_mesh((4, 4, 4), names, axis_types=(AxisType.Auto,) * 3,
                         devices=jax.devices("cpu")[:64])
    a_spec, b_spec, out_spec = P("x", "y"), P("y", None), P("x", None)
    step = jax.jit(jax.shard_map(matmul_psum, mesh=mesh, in_specs=(a_spec, b_spec),
                                 out_specs=out_spec),
                   in_shardings=(NamedSharding(mesh, a_spec), NamedSharding(mesh, b_spec)),
                   out_shardings=NamedSharding(mesh, out_spec))
    executable = client.compile(step.lower(A, B).as_text())
    devices = executable.devices()
    assert len(devices) == 64
    coords = [np.unravel_index(d, (4, 4, 4)) for d in range(64)]  # logical (x, y, z)
    per_device = [[client.buffer_from_pyval(A[4 * x:4 * x + 4, 2 * y:2 * y + 2], device),
                   client.buffer_from_pyval(B[2 * y:2 * y + 2], device)]
                  for (x, y, _), device in zip(coords, devices)]
    results = executable.execute_sharded(per_device)
    assert len(results) == 64
    for (x, _, _), device, (out,) in zip(coords, devices, results):
        assert out.device == device
        np.testing.assert_allclose(np.asarray(out), (A @ B)[4 * x:4 * x + 4],
                                   rtol=1e-5, atol=1e-5)


def test_execute_sharded_refuses_buffers_on_the_wrong_device(client):
    """PJRT checks that the buffers at position d live on device d; so do we."""
    executable = client.compile(lowered_matmul_psum().as_text())
    devices = executable.devices()
    per_device = [[client.buffer_from_pyval(A, devices[63 - d]),
                   client.buffer_from_pyval(B, devices[63 - d])] for d in range(64)]
    expected = (r"argument 0 at position 0 is a buffer on Trn2Device\(id=63.*but position 0 "
                r"runs on Trn2Device\(id=0")
    with pytest.raises(ValueError, match=expected):
        executable.execute_sharded(per_device)


def test_execute_sharded_refuses_copies_that_differ(client):
    """Without shardings on main, every device holds the whole (replicated) arguments."""
    executable = client.compile(lowered_matmul_psum().as_text())
    per_device = [[A, B + d] for d in range(64)]
    with pytest.raises(ValueError, match="argument 1.*equal copies"):
        executable.execute_sharded(per_device)


def test_execute_sharded_says_why_an_unsharded_argument_wants_the_whole_array(client):
    """A piece where main's argument has no sharding: the error says each device takes the
    whole array, and how to give the argument a sharding."""
    executable = client.compile(lowered_matmul_psum().as_text())
    per_device = [[A[:4], B] for _ in range(64)]
    with pytest.raises(TypeError, match=r"argument 0 of device 0: expected float32\[16,8\], "
                                        r"got float32\[4,8\] \(main's argument 0 has no "
                                        r"sharding.*in_shardings"):
        executable.execute_sharded(per_device)


def test_buffer_from_pyval(client):
    device = client.devices()[5]
    buffer = client.buffer_from_pyval(np.arange(6, dtype=np.int32).reshape(2, 3), device)
    assert buffer.device == device and buffer.shape == (2, 3) and buffer.dtype == np.int32
    assert (buffer.ndim, buffer.size, buffer.nbytes) == (2, 6, 24)  # as a jax.Array's
    np.testing.assert_array_equal(np.asarray(buffer), np.arange(6).reshape(2, 3))
    other = jax_trn2.client("trn2").devices()[0]
    with pytest.raises(ValueError, match="not a device"):
        client.buffer_from_pyval(np.zeros(3), other)


def test_single_chip_module(client):
    """A module without a mesh runs on one chip."""
    text = jax.jit(lambda x: jnp.tanh(x) * 2).lower(A).as_text()
    executable = client.compile(text)
    assert len(executable.devices()) == 1
    (out,) = executable.execute([A])
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(
        lambda x: jnp.tanh(x) * 2)(A)))


def test_compile_rejects_what_is_not_stablehlo(client):
    with pytest.raises(ValueError, match="not a StableHLO module"):
        client.compile("this is not MLIR")
    with pytest.raises(TypeError, match="expected StableHLO"):
        client.compile(42)
