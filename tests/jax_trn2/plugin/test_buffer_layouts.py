"""Arrays in layouts other than row-major on the trn2 plugin, as a user program makes them:
jax.device_put to a Format, jit with concrete and AUTO layouts, with_sharding_constraint to
a Format; the same layouts and values as XLA:CPU's."""

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from jax_trn2.plugin import abi, executable as plugin_executable, table
from jax_trn2.plugin.abi import c
from jax_trn2.plugin.handles import Buffer

COLUMN_MAJOR = Layout(major_to_minor=(1, 0))


def sharding(platform: str, where: str = "mesh") -> NamedSharding | SingleDeviceSharding:
    """The platform's first device, or rows over a 2x2 mesh of its first 4 devices."""
    if where == "device":
        return SingleDeviceSharding(jax.devices(platform)[0])
    mesh = Mesh(np.array(jax.devices(platform)[:4]).reshape(2, 2), ("x", "y"))
    return NamedSharding(mesh, P("x", None))


# (a program over several devices is partitioned by XLA's partitioner: lowering.partition)
WHERE = pytest.mark.parametrize("where", ["device", "mesh"])


@WHERE
def test_device_put_to_a_column_major_format_then_jit_matches_cpu(where, rng):
    x = rng.standard_normal((16, 128)).astype(np.float32)
    results = {}
    for platform in ("cpu", "trn2"):
        a = jax.device_put(x, Format(COLUMN_MAJOR, sharding(platform, where)))
        assert a.format.layout.major_to_minor == (1, 0), platform
        assert all(s.data.format.layout.major_to_minor == (1, 0) for s in a.addressable_shards)
        np.testing.assert_array_equal(np.asarray(a), x)
        out = jax.jit(lambda v: jnp.sin(v) @ v.T + 1)(a)
        results[platform] = (np.asarray(out), out.format.layout)
    np.testing.assert_allclose(results["trn2"][0], results["cpu"][0], rtol=2e-5, atol=2e-5)
    assert results["trn2"][1] == results["cpu"][1]


FUNCTIONS = {"transpose": lambda x: x.T, "elementwise of a transpose": lambda x: jnp.sin(x).T + 1,
             "dot": lambda x: x @ x, "elementwise": lambda x: x * 2,
             "reshape then transpose": lambda x: jnp.transpose(x.reshape(4, 2, 8), (1, 2, 0)),
             "transpose of a broadcast": lambda x: jnp.broadcast_to(x[0], (8, 8)).T}


@WHERE
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("in_layout", [Layout.AUTO, COLUMN_MAJOR], ids=["auto", "column"])
def test_auto_layouts_are_xla_cpus_and_the_program_runs(name, in_layout, where, rng):
    """jit with in and out layouts AUTO (or a concrete input layout): the compiled layouts
    are those XLA:CPU chooses; called on arrays in them, the values are CPU JAX's."""
    x = rng.standard_normal((8, 8)).astype(np.float32)
    compiled = {}
    for platform in ("cpu", "trn2"):
        s = sharding(platform, where)
        in_format = Format(in_layout, s) if isinstance(in_layout, Layout) else Format(in_layout)
        step = jax.jit(FUNCTIONS[name], in_shardings=in_format,
                       out_shardings=Format(Layout.AUTO))
        c = step.lower(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)).compile()
        (arg_format,), _ = c.input_formats
        out = c(jax.device_put(x, arg_format))
        assert out.format == c.output_formats
        compiled[platform] = (arg_format.layout, c.output_formats.layout, np.asarray(out))
    assert compiled["trn2"][:2] == compiled["cpu"][:2]
    if name == "dot":
        # K = 8 products summed in the PE array's order and in CPU JAX's GEMM's: each
        # within K roundings (2**-24 each) of sum|a_k b_k| of the exact sum
        apart = np.abs(compiled["trn2"][2] - compiled["cpu"][2])
        assert np.all(apart <= 2 * 8 * 2.0 ** -24 * (np.abs(x) @ np.abs(x)))
    else:
        np.testing.assert_allclose(compiled["trn2"][2], compiled["cpu"][2], rtol=1e-6)


def test_compiled_text_shows_the_layouts_as_xla_cpus_does():
    def header(platform: str) -> str:
        s = SingleDeviceSharding(jax.devices(platform)[0])
        step = jax.jit(lambda x: (x.T, x * 2, x.sum()), in_shardings=Format(Layout.AUTO),
                       out_shardings=Format(Layout.AUTO))
        compiled = step.lower(jax.ShapeDtypeStruct((8, 4), np.float32, sharding=s)).compile()
        return compiled.as_text().split("entry_computation_layout=")[1].split(", allow")[0]

    assert header("trn2") == header("cpu") == \
        "{(f32[8,4]{1,0})->(f32[4,8]{0,1}, f32[8,4]{1,0}, f32[])}"


@WHERE
def test_with_sharding_constraint_to_a_format_keeps_the_value(where, rng):
    x = rng.standard_normal((16, 128)).astype(np.float32)
    s = sharding("trn2", where)
    a = jax.device_put(x, s)

    @jax.jit
    def f(v):
        return jax.lax.with_sharding_constraint(v.T * 2, Format(Layout((0, 1)), s))

    out = f(a)
    np.testing.assert_array_equal(np.asarray(out), x.T * 2)
    assert out.format == a.format


def test_a_buffers_bytes_are_in_its_layout(rng):
    """A column-major buffer's memory holds the columns one after another."""
    x = rng.standard_normal((4, 6)).astype(np.float32)
    device = jax.devices("trn2")[0]
    a = jax.device_put(x, Format(COLUMN_MAJOR, SingleDeviceSharding(device)))
    memory = (ctypes.c_float * x.size).from_address(a.unsafe_buffer_pointer())
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32), x.T.reshape(-1))


def test_an_argument_laid_out_otherwise_than_compiled_is_refused():
    """The program reads its arguments' bytes in the layouts it was compiled for: a buffer
    in another is refused (jax lays arguments out before it calls)."""
    device = jax.devices("trn2")[0]
    s = SingleDeviceSharding(device)
    compiled = jax.jit(lambda v: v + 1, in_shardings=Format(COLUMN_MAJOR, s)).lower(
        jax.ShapeDtypeStruct((2, 3), np.float32, sharding=s)).compile()
    executable = plugin_executable.of(compiled)
    row_major = Buffer(np.zeros((2, 3), np.float32), executable.addressable_devices[0],
                       executable.addressable_devices[0].memories[0])
    with pytest.raises(ValueError, match=r"argument 0 .* is laid out with "
                                         r"major_to_minor=\(0, 1\), but the program was "
                                         r"compiled for major_to_minor=\(1, 0\)"):
        executable.execute([[row_major]], set())


def test_a_tiled_layout_is_refused_naming_it():
    device = jax.devices("trn2")[0]
    tiled = Layout(major_to_minor=(1, 0), tiling=((8, 128),))
    step = jax.jit(lambda v: v * 2, out_shardings=Format(tiled, SingleDeviceSharding(device)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"UNIMPLEMENTED: .*the layout "
                                                        r"\{0,1:T\(8,128\)\} has tiles"):
        step.lower(jax.ShapeDtypeStruct((16, 128), np.float32)).compile()


def call(slot: str, args) -> None:
    """Call PJRT slot `slot` of the plugin's table, as jaxlib does, with `args`."""
    from jax_trn2 import plugin
    args.struct_size = ctypes.sizeof(args)
    error = abi.SlotFunction(getattr(plugin._api, f"PJRT_{slot}"))(ctypes.addressof(args))
    assert not error, slot


def memory_layout(minor_to_major: tuple[int, ...]):
    """A PJRT_Buffer_MemoryLayout of a dim order alone (and the array it points into)."""
    order = (ctypes.c_int64 * len(minor_to_major))(*minor_to_major)
    layout = c.PJRT_Buffer_MemoryLayout(struct_size=ctypes.sizeof(c.PJRT_Buffer_MemoryLayout),
                                        type=c.PJRT_Buffer_MemoryLayout_Type_Tiled)
    layout.tiled.minor_to_major = ctypes.addressof(order)
    layout.tiled.minor_to_major_size = len(minor_to_major)
    return layout, order


def test_a_host_buffer_put_in_a_device_layout_comes_back_in_the_layout_asked_for(rng):
    """PJRT's BufferFromHostBuffer with a device layout, then ToHostBuffer: in the buffer's
    own layout without a host layout, else in the one given."""
    x = rng.standard_normal((2, 3)).astype(np.float32)
    s = SingleDeviceSharding(jax.devices("trn2")[0])
    client = plugin_executable.of(jax.jit(lambda v: v).lower(
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)).compile()).client
    column_major, _column_order = memory_layout((0, 1))
    dims = (ctypes.c_int64 * 2)(*x.shape)
    put = c.PJRT_Client_BufferFromHostBuffer_Args(
        client=table.HANDLES.pointer(client), data=x.ctypes.data, type=c.PJRT_Buffer_Type_F32,
        dims=ctypes.addressof(dims), num_dims=2,
        memory=table.HANDLES.pointer(client.devices[0].memories[0]),
        device_layout=ctypes.addressof(column_major))
    call("Client_BufferFromHostBuffer", put)
    row_major, _row_order = memory_layout((1, 0))
    for host_layout, expected in [(None, x.T), (ctypes.addressof(row_major), x)]:
        out = np.zeros(x.size, np.float32)
        call("Buffer_ToHostBuffer", c.PJRT_Buffer_ToHostBuffer_Args(
            src=put.buffer, host_layout=host_layout, dst=out.ctypes.data, dst_size=out.nbytes))
        np.testing.assert_array_equal(out, expected.reshape(-1))
    call("Buffer_Destroy", c.PJRT_Buffer_Destroy_Args(buffer=put.buffer))
