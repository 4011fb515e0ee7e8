"""The executor's inputs: on executor devices that are not CPUs, floats narrower than FP32
go in as their bits, on CPUs as themselves (the native matmul loop reads BF16 as it is);
either is a view of the caller's host array (no copy), with the same results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh import dtypes, executor

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("name, bits", [
    ("bfloat16", "uint16"), ("float16", "uint16"), ("float8_e4m3fn", "uint8"),
    ("float6_e2m3fn", "uint8"),  # held as FP8 E4M3FN
    ("float32", "float32"), ("int8", "int8"), ("bool", "bool"),
    ("float4_e2m1fn", "float4_e2m1fn"),  # 4 bits in a byte: held as it is
])
def test_narrow_floats_are_taken_as_bits_off_cpus(name, bits):
    assert executor.input_dtype(name, on_cpu=False) == np.dtype(bits)
    assert executor.input_dtype(name, on_cpu=True) == dtypes.storage_dtype(name)


def test_host_arrays_go_in_as_a_view():
    values = RNG.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    as_bits = executor.as_input(values, "bfloat16", on_cpu=False)
    assert as_bits.dtype == np.uint16 and np.shares_memory(as_bits, values)
    on_cpu = jnp.asarray(values)
    as_bits = executor.as_input(on_cpu, "bfloat16", on_cpu=False)
    assert np.shares_memory(as_bits, np.asarray(on_cpu))
    np.testing.assert_array_equal(as_bits, values.view(np.uint16))
    as_floats = executor.as_input(values, "bfloat16", on_cpu=True)
    assert as_floats.dtype == ml_dtypes.bfloat16 and np.shares_memory(as_floats, values)
    wide = np.ones(3, np.float32)
    assert executor.as_input(wide, "float32") is wide


def test_large_arrays_go_to_the_executors_device_as_the_same_memory():
    from lowering.host import host_devices
    device = host_devices(1)[0]
    rows = executor.ZERO_COPY_MIN_BYTES // (2 * 256)
    values = jnp.asarray(RNG.standard_normal((rows, 256)), jnp.bfloat16)  # an XLA buffer
    moved = executor.as_input(values, "bfloat16", device, on_cpu=False)
    assert moved.devices() == {device} and moved.dtype == np.uint16
    assert moved.unsafe_buffer_pointer() == np.asarray(values).ctypes.data
    small = _aligned_ones(4, alignment=64)  # jaxlib would import this memory as it is
    copied = executor.as_input(small, "float32", device)  # a copy there, not the memory
    assert copied.devices() == {device}
    assert copied.unsafe_buffer_pointer() != small.ctypes.data
    small[:] = 2  # the caller's writes after the call do not reach the program's input
    np.testing.assert_array_equal(np.asarray(copied), np.ones(4, np.float32))


def _aligned_ones(size: int, alignment: int) -> np.ndarray:
    """FP32 ones whose memory starts at a multiple of `alignment` bytes."""
    storage = np.ones(size + alignment // 4, np.float32)
    skip = (-storage.ctypes.data % alignment) // 4
    return storage[skip:skip + size]


@pytest.mark.parametrize("dtype", [">f4", ">f2", ">i4"])
def test_inputs_in_the_other_byte_order_are_read_by_value(dtype):
    """A NumPy array in non-native byte order has the same values, not the same bytes."""
    values = np.arange(1, 5).astype(dtype)
    native = values.astype(np.dtype(dtype).newbyteorder("="))
    assert np.array_equal(executor.as_input(values, native.dtype.name),
                          executor.as_input(native, native.dtype.name))
    executable = jax_trn2.client("trn2").compile(
        jax.jit(lambda a: a * 2).lower(native).as_text())
    np.testing.assert_array_equal(np.asarray(executable.execute([values])[0]), native * 2)


def test_bits_and_floats_give_the_same_results():
    """A BF16 matmul with several passes (K = 384) and an FP8 operand, run from the floats
    and from their bits: the bits are the same values, so the results are bit-identical."""
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))
    fn = jax_trn2.jit(jax.shard_map(
        lambda x, w, s: (x @ w).astype(jnp.float32) * s.astype(jnp.float32),
        mesh=mesh, in_specs=(P("a"), P(None, "b"), P("a", "b")), out_specs=P("a", "b")))
    x = RNG.standard_normal((16, 384)).astype(ml_dtypes.bfloat16)
    w = RNG.standard_normal((384, 8)).astype(ml_dtypes.bfloat16)
    s = RNG.standard_normal((16, 8)).astype(ml_dtypes.float8_e4m3fn)
    executable = fn.lower(x, w, s).compile().executable
    program = executable.program
    compiled = executor.compile_program(program, global_io=True)
    from_floats = compiled(x, w, s)
    from_bits = compiled(*(executor.as_input(a, program.values[v].type.dtype, on_cpu=False)
                           for a, v in zip((x, w, s), program.inputs)))
    np.testing.assert_array_equal(np.asarray(from_bits[0]), np.asarray(from_floats[0]))
    expected = (x.astype(np.float32) @ w.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(np.asarray(fn(x, w, s)),
                               expected.astype(np.float32) * s.astype(np.float32),
                               # two BF16 roundings the reference lacks (the scaled
                               # result's, and its sum's in another order), each at most
                               # half an ulp: one ulp, at most 2^-7 relative
                               rtol=2 ** -7)


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4])
def test_sub_byte_results_go_back_in_as_arguments(dtype):
    """A trn2 result of a 4-bit type is an XLA:CPU array whose layout is not the one the
    executor's computation takes (jax refused it); it goes in as its values, as on the CPU."""
    values = np.array([0, 1, 2, 3, 5, 6], dtype=dtype)  # +1 stays in range
    device = jax.devices("trn2")[0]
    added = jax.jit(lambda x: x + 1)(jax.device_put(values, device))
    widened = jax.jit(lambda x: x.astype(jnp.int8))(added)
    expected = jax.jit(lambda x: (x + 1).astype(jnp.int8))(values)  # on the CPU
    np.testing.assert_array_equal(np.asarray(widened), np.asarray(expected))
    assert widened.devices() == {device}
