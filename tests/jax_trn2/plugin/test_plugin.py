"""The trn2 PJRT plugin through plain JAX: devices, programs, buffers, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compute_on import compute_on2
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import jax_trn2
from mesh.machine import RuntimeSpec
from jax_trn2.plugin import executable as plugin_executable, table
from jax_trn2.plugin.client import Client
from jax_trn2.plugin.handles import Handles
from jax_trn2.core.options import ClientOptions
from mesh.executor import EXECUTOR_COMPILER_OPTIONS
from mesh.machine import get_topology
from tests.e2e.e2e_reference import cpu_mesh, trn2_mesh
from tests.e2e.test_remaining_ops import RAGGED_FORMS


@pytest.fixture(scope="module")
def devices():
    return jax.devices("trn2")


@pytest.fixture(scope="module")
def mesh(devices):
    return jax.make_mesh((8, 8), ("a", "b"), devices=devices, axis_types=(AxisType.Auto,) * 2)


def test_devices_are_the_chips(devices):
    assert len(devices) == 64
    assert [d.id for d in devices] == list(range(64))
    # numbered with the fastest links innermost: x, then y (in a server), then z
    assert [tuple(d.coords) for d in devices[:5]] == \
        [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (0, 1, 0)]
    assert devices[16].coords == [0, 0, 1]  # the next server
    assert "HBM of Trainium2 chip 16" in str(devices[1].default_memory())  # chip (1, 0, 0)
    assert devices[0].device_kind == "Trainium2"
    assert devices[0].platform == "neuron"
    assert jax.default_backend() == "cpu"  # installing the plugin leaves jax's default
    memory = devices[0].default_memory()
    assert memory.kind == "device" and "HBM" in str(memory)
    stats = devices[0].memory_stats()
    assert stats["bytes_limit"] == 96 * 2 ** 30


def test_default_assignment_runs_processes_on_the_first_chips():
    """An SPMD module's processes run on chips 0..n-1 (torus (0, 0, z) first), as
    jax_trn2.jit runs them (place_first), whatever the devices' ids."""
    client = Client(ClientOptions(get_topology("trn2-ultra")), Handles(), memory_vtable=0)
    assert [client.device(i).machine_device for i in client.default_assignment(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="65 processes need 65 devices; the trn2 client has 64"):
        client.default_assignment(65)


def test_sharded_program_matches_cpu(mesh, rng):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    f = jax.jit(lambda x, w: jnp.tanh(x @ w))
    xs = jax.device_put(x, NamedSharding(mesh, P("a", "b")))
    ws = jax.device_put(w, NamedSharding(mesh, P("b", None)))
    got = f(xs, ws)
    cpu = cpu_mesh((8, 8), ("a", "b"))
    want = f(jax.device_put(x, NamedSharding(cpu, P("a", "b"))),
             jax.device_put(w, NamedSharding(cpu, P("b", None))))
    assert got.sharding.spec == want.sharding.spec
    assert got.sharding.mesh.devices.flat[0].platform == "neuron"
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2 ** -14, atol=1e-6)


def test_shard_map_psum(mesh):
    x = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "b"), mesh=mesh,
                              in_specs=P("a", "b"), out_specs=P("a")))
    got = f(jax.device_put(x, NamedSharding(mesh, P("a", "b"))))
    np.testing.assert_array_equal(np.asarray(got),
                                  x.reshape(8, 8, 8, 2).sum(axis=2).reshape(64, 2))
    assert len(got.addressable_shards) == 64


def test_results_split_along_inner_dims_read_back_whole(mesh):
    """A result sharded along a dim other than its first: each device's piece is a strided
    view of the simulator's result, made dense to be copied to the host. (A bug copied it
    from a temporary already freed: the first 16 bytes of every piece came back as
    malloc's free-list links; numpy recycles blocks under 1 KiB itself, so the pieces here
    are 4 KiB.)"""
    x = np.arange(8 * 64 * 128, dtype=np.float32).reshape(8, 64, 128)
    f = jax.jit(lambda v: v * 2, out_shardings=NamedSharding(mesh, P(None, "a", "b")))
    got = f(jax.device_put(x, NamedSharding(mesh, P())))
    assert got.addressable_shards[9].data.shape == (8, 8, 16)
    for _ in range(3):  # each read copies every piece again
        np.testing.assert_array_equal(np.asarray(got), x * 2)
        np.testing.assert_array_equal(np.asarray(got.addressable_shards[9].data),
                                      (x * 2)[:, 8:16, 16:32])


@pytest.mark.parametrize("spec", [P(("one", "all")), P(None, "all"), P("all", "one")])
def test_sharded_results_are_their_chips_pieces_and_feed_the_next_program(devices, spec):
    """A result the program's Unshard would assemble comes as its chips' pieces (each
    device's buffer a view of one), also where XLA's layout names an axis of size 1 the
    Unshard leaves out; a program that takes it assembles it then, once."""
    mesh = jax.make_mesh((1, 8), ("one", "all"), devices=devices[:8],
                         axis_types=(AxisType.Auto,) * 2)
    x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    f = jax.jit(jax.shard_map(lambda v: v * 2 + jax.lax.axis_index("all"), mesh=mesh,
                              in_specs=spec, out_specs=spec))
    xs = jax.device_put(x, NamedSharding(mesh, spec))
    assert plugin_executable.of(f.lower(xs).compile()).chip_outputs == {0}
    y = f(xs)
    index = np.zeros((16, 8), np.float32)  # each element's chip along 'all'
    for shard in jax.device_put(x, NamedSharding(cpu_mesh((1, 8), ("one", "all")), spec)) \
            .addressable_shards:
        index[shard.index] = shard.device.id % 8
    want = x * 2 + index
    np.testing.assert_array_equal(np.asarray(y), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v.T @ v)(y)), want.T @ want)


def test_scalar_results_read_back(mesh, devices):
    """jax asks for a scalar's host copy with a layout of no dims (its pointer NULL)."""
    x = jax.device_put(np.arange(64.0, dtype=np.float32), NamedSharding(mesh, P("a")))
    assert float(jax.jit(lambda v: v.sum())(x)) == 2016.0
    assert float(jax.device_put(np.float32(3.0), devices[1])) == 3.0


def test_shard_map_without_jit_and_its_gradient(rng):
    """jax runs a shard_map that is not under jit op by op, each op a program for the
    plugin compiled and run inside the shard_map's trace (and under jax.grad, its JVP's):
    the simulator's own computations run at jax's top level all the same."""
    def body(x, w):
        return jax.lax.psum(jnp.sum(jnp.tanh(x @ w)), ("data", "model"))

    def program(mesh):
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data", "model"), P("model", None)),
                             out_specs=P())

    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    ours, cpu = program(trn2_mesh((2, 4), ("data", "model"))), program(
        cpu_mesh((2, 4), ("data", "model")))
    np.testing.assert_allclose(np.asarray(ours(x, w)), cpu(x, w), rtol=2 ** -14)
    np.testing.assert_allclose(np.asarray(jax.grad(ours, argnums=1)(x, w)),
                               jax.grad(cpu, argnums=1)(x, w), rtol=2 ** -14, atol=1e-6)


def test_resharding_and_device_to_device(mesh, devices):
    x = np.arange(64 * 8, dtype=np.int32).reshape(64, 8)
    a = jax.device_put(x, NamedSharding(mesh, P("a", "b")))
    b = jax.device_put(a, NamedSharding(mesh, P(None, "a")))
    np.testing.assert_array_equal(np.asarray(b), x)
    c = jax.device_put(jax.device_put(x[:2], devices[5]), devices[9])
    assert c.devices() == {devices[9]}
    np.testing.assert_array_equal(np.asarray(c), x[:2])


def test_donation_deletes_the_donor(mesh):
    a = jax.device_put(np.zeros(64, np.float32), NamedSharding(mesh, P("a")))
    b = jax.jit(lambda v: v + 1, donate_argnums=0)(a)
    assert a.is_deleted()
    np.testing.assert_array_equal(np.asarray(b), np.ones(64, np.float32))


@pytest.mark.parametrize("guard", [jax.transfer_guard, jax.transfer_guard_host_to_device,
                                   jax.transfer_guard_device_to_host,
                                   jax.transfer_guard_device_to_device])
def test_programs_run_under_a_transfer_guard_on_arrays_already_on_the_chips(mesh, guard):
    """jax.transfer_guard (of every direction, or of one) guards the caller's transfers
    between the host and the chips; the simulator's own arrays on the host's executor
    devices are not the caller's."""
    x = jax.device_put(np.arange(64.0), NamedSharding(mesh, P(("a", "b"))))
    with guard("disallow"):
        doubled = jax.jit(lambda v: v * 2)(x)
    np.testing.assert_array_equal(np.asarray(doubled), np.arange(64.0) * 2)


def test_a_donated_buffer_also_read_by_the_call_is_refused(mesh):
    add = jax.jit(lambda u, v: u + v, donate_argnums=0)
    a = jax.device_put(np.zeros(64, np.float32), NamedSharding(mesh, P("a")))
    with pytest.raises(RuntimeError, match="donate a buffer which is also used"):
        add(a, a)
    assert not a.is_deleted()
    b = jax.device_put(np.ones(64, np.float32), NamedSharding(mesh, P("a")))
    np.testing.assert_array_equal(np.asarray(add(a, b)), np.ones(64, np.float32))


@pytest.mark.parametrize("algorithm", ["TF32_TF32_F32", "F16_F16_F32", "BF16_BF16_F32_X9"])
def test_dot_algorithms_xla_cpu_refuses_run(mesh, devices, algorithm, rng):
    """jax's CPU lowering refuses these algorithms; the plugin takes them, on one device and
    in a program XLA's partitioner partitions (whose XLA:CPU compile would crash on them)."""
    a, b = rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 4), np.float32)
    dot = jax.jit(lambda x, y: jax.lax.dot(x, y, precision=algorithm))
    # operands rounded to the algorithm's input type by jax, products summed in float32
    tol = 2e-2 if algorithm == "F16_F16_F32" else 1e-5
    np.testing.assert_allclose(dot(jax.device_put(a, devices[0]), jax.device_put(b, devices[0])),
                               a @ b, rtol=tol, atol=tol)
    sharded = dot(jax.device_put(a, NamedSharding(mesh, P("a"))),
                  jax.device_put(b, NamedSharding(mesh, P())))
    np.testing.assert_allclose(sharded, a @ b, rtol=tol, atol=tol)


def test_cost_and_memory_analysis_are_the_estimates(mesh):
    x = jax.device_put(np.ones((64, 16), np.float32), NamedSharding(mesh, P("a", "b")))
    compiled = jax.jit(lambda x: (x @ x.T).sum()).lower(x).compile()
    cost = compiled.cost_analysis()
    assert cost["flops"] > 0 and cost["optimal_seconds"] > 0
    assert cost["trn2.topology"] == "trn2-ultra" and cost["trn2.chips"] == 64
    memory = compiled.memory_analysis()
    assert memory.argument_size_in_bytes == 8 * 2 * 4  # each chip's piece of x
    assert "Trn2" in jax_trn2.listing(compiled) or "DMA" in jax_trn2.listing(compiled)


def test_both_front_doors_compile_through_one_core():
    """jax_trn2.jit and plain jax.jit on the plugin's devices lower, plan and estimate a
    program with the same code: the same estimate (PJRT carries the plugin's figures as
    32-bit floats) and the same HBM figures."""
    def body(a):
        return jax.lax.psum(jnp.tanh(a) @ a.T, "b")

    x = np.ones((64, 16), np.float32)
    ours = jax_trn2.jit(jax.shard_map(body, mesh=jax_trn2.make_mesh((8, 8), ("a", "b")),
                                      in_specs=P("a", "b"), out_specs=P("a")))
    ours = ours.lower(x).compile()
    mesh = trn2_mesh((8, 8), ("a", "b"))
    plain = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a")))
    plain = plain.lower(jax.device_put(x, NamedSharding(mesh, P("a", "b")))).compile()
    cost, plain_cost = ours.cost_analysis(), plain.cost_analysis()
    for key in ("step_seconds", "ideal_step_seconds", "communication_seconds", "mfu"):
        assert np.float32(cost["trn2"][key]) == np.float32(plain_cost[f"trn2.{key}"]), key
    # the psum's expected runtime cost (its launch) is in it
    assert cost["trn2"]["step_seconds"] > RuntimeSpec().collective_launch_seconds
    memory, plain_memory = ours.memory_analysis(), plain.memory_analysis()
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "peak_memory_in_bytes"):
        assert getattr(memory, field) == getattr(plain_memory, field), field


def test_host_callbacks_and_linalg(devices, capfd):
    @jax.jit
    def f(x):
        jax.debug.print("sum {}", x.sum())
        return jax.pure_callback(lambda a: np.asarray(a) * 3,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

    got = f(jax.device_put(np.arange(4.0, dtype=np.float32), devices[0]))
    np.testing.assert_array_equal(np.asarray(got), [1, 4, 7, 10])
    assert "sum 6.0" in capfd.readouterr().out
    values = jax.jit(jnp.linalg.eigvalsh)(jax.device_put(np.diag([3.0, 1.0, 2.0]), devices[1]))
    np.testing.assert_allclose(np.asarray(values), [1, 2, 3])


def test_ordered_io_callbacks_run_in_program_order_call_after_call(devices):
    """jax threads an ordered effect's token through the calls (a runtime token: a token
    buffer the program gives and the next call takes)."""
    from jax.experimental import io_callback
    seen = []

    @jax.jit
    def f(x):
        io_callback(lambda v: seen.append(float(v.sum())), None, x, ordered=True)
        io_callback(lambda v: seen.append(-float(v.sum())), None, x * 2, ordered=True)
        return x + 1

    x = jax.device_put(np.ones(3, np.float32), devices[3])
    y = f(f(x))
    jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(y), [3, 3, 3])
    assert seen == [3.0, -6.0, 6.0, -12.0]


def test_tokens_are_token_buffers_as_on_xla(devices):
    """A program's token result is a token buffer (PJRT's TOKEN, no data), which jax
    refuses to read as an array, as on XLA:CPU, and takes back as a program's token."""
    for backend in ("trn2", "cpu"):
        with jax.default_device(jax.devices(backend)[0]):
            token = jax.lax.create_token()
            with pytest.raises(RuntimeError, match="Cannot convert a token-shape buffer to a "
                                                   "numpy array"):
                token._buf._value
            arr, out = jax.jit(lambda a, t: (a + 1, t))(jnp.ones(3), token)
            assert isinstance(out, jax._src.core.Token) and out is not token
            np.testing.assert_array_equal(np.asarray(arr), np.full(3, 2.0))


def test_unsupported_program_names_the_op_and_line(devices):
    x = jax.device_put(np.ones(4, np.float32), devices[0])
    def f(v):  # a kernel from a library jax-trn2 does not know
        return jax.ffi.ffi_call("vendor_fused_kernel", jax.ShapeDtypeStruct(v.shape, v.dtype))(v)

    with pytest.raises(jax.errors.JaxRuntimeError) as error:
        jax.jit(f).lower(x).compile()
    message = str(error.value)
    assert "UNIMPLEMENTED" in message and "test_plugin.py" in message
    assert isinstance(table.ERRORS.original(message), NotImplementedError)


def test_a_failed_call_raises_its_error_while_its_arguments_are_freed(devices):
    """The argument made in the call itself is freed (its buffers destroyed, a slot of the
    plugin) while the compile error is on its way out: the error must survive that."""
    f = jax.jit(lambda v: v * 2, compiler_options={"trn2_topology": "no-such-machine"})
    with pytest.raises(jax.errors.JaxRuntimeError, match="unknown topology 'no-such-machine'"):
        f(jax.device_put(np.ones(4, np.float32), devices[0]))


def test_sort_and_reductions_with_constants_hoisted_out_of_their_bodies(devices):
    """jaxlib's serialization for a plugin hoists a comparator's or reducer's constants out
    of its region (jnp.sort's NaN and zero)."""
    x = np.array([[3.0, np.nan, -0.0, 0.0, -1.0, 2.0]], np.float32)
    got = jax.jit(lambda v: (jnp.sort(v, axis=-1), jax.lax.reduce_window(
        v, -np.inf, jax.lax.max, (1, 2), (1, 1), "VALID")))(jax.device_put(x, devices[0]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.sort(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(got[1]), np.maximum(x[:, :-1], x[:, 1:]))


def test_functions_computed_as_on_the_cpu_and_subnormal_constants_kept(devices):
    """jaxlib's serialization for a plugin would expand lgamma, erf, ... into StableHLO
    approximations of its own, and it compiles on threads that flush subnormals (a
    subnormal constant of jnp.spacing read as 0): the plugin gives CPU JAX's bits."""
    x = np.array([0.0, 0.3, 1.5, 7.0, -2.5], np.float32)
    functions = (jax.lax.lgamma, jax.lax.digamma, jax.lax.erf, jax.lax.erf_inv, jnp.spacing,
                 lambda v: jnp.spacing(v.astype(jnp.bfloat16)))
    for f in functions:
        got = np.asarray(jax.jit(f)(jax.device_put(x, devices[0])))
        want = np.asarray(jax.jit(f, compiler_options=EXECUTOR_COMPILER_OPTIONS)(x))
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"),
                                      want.view(f"u{want.itemsize}"))


@pytest.mark.parametrize("form", RAGGED_FORMS)
def test_ragged_dot_is_the_grouped_matmul_through_both_doors(form, devices, rng):
    """ragged_dot_general lowers for the plugin's platform as for the TPU, to
    chlo.ragged_dot (a composite in the module jaxlib serializes for a plugin), not as for
    the CPU (a dense dot over every group with a masked operand), where the lhs has one
    free dim (jaxlib cannot serialize it with more: those keep the CPU's rule). Every form
    through jax.jit on the trn2 devices and through jax_trn2.jit, with the same bits and
    CPU JAX's values."""
    lhs_shape, rhs_shape, sizes, dims = RAGGED_FORMS[form]
    numbers = jax.lax.RaggedDotDimensionNumbers(*dims)

    def f(lhs, rhs, group_sizes):
        return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, numbers)

    args = (rng.standard_normal(lhs_shape).astype(np.float32),
            rng.standard_normal(rhs_shape).astype(np.float32), np.array(sizes, np.int32))
    plain = jax.jit(f).lower(*jax.device_put(args, devices[0])).compile()
    simulated = jax_trn2.jit(f).lower(*args).compile()
    (lhs_contract, _), (lhs_batch, _) = numbers.dot_dimension_numbers
    if len(lhs_shape) - len(lhs_contract) - len(lhs_batch) == 1:
        grouped = "Tensor.Matmul(" if form == "batch" else "Tensor.RaggedMatmul("
        assert grouped in simulated.as_text()
        assert plain.memory_analysis().temp_size_in_bytes == 0  # no masked operand
    got = np.asarray(simulated(*args))
    np.testing.assert_array_equal(np.asarray(plain(*jax.device_put(args, devices[0]))), got)
    # as tests/e2e/test_remaining_ops.py: FP32 products rounded to FP32 and summed in
    # another order than CPU JAX's, |error| <= (K + 1) * 2**-24 * sum|a_k b_k|, K <= 10
    bound = 11 * 2.0 ** -24 * np.abs(args[0]).max() * np.abs(args[1]).max() * 10
    np.testing.assert_allclose(got, np.asarray(jax.jit(f)(*args)), rtol=0, atol=bound)


def test_a_sharded_ragged_dot_runs_through_both_doors(mesh, rng):
    """A grouped matmul with its experts' weights split over a mesh axis: XLA's SPMD
    partitioner leaves it as mhlo.ragged_dot, which is the same grouped matmul."""
    def f(lhs, rhs, group_sizes):
        return jax.lax.ragged_dot(lhs, rhs, group_sizes)

    lhs = rng.standard_normal((96, 8)).astype(np.float32)
    rhs = rng.standard_normal((3, 8, 16)).astype(np.float32)
    sizes = np.array([40, 30, 26], np.int32)
    shardings = (NamedSharding(mesh, P()), NamedSharding(mesh, P(None, None, "b")),
                 NamedSharding(mesh, P()))
    simulated_mesh = jax_trn2.make_mesh((8, 8), ("a", "b"))
    simulated = jax_trn2.jit(f, in_shardings=tuple(
        NamedSharding(simulated_mesh, s.spec) for s in shardings))
    assert "Tensor.RaggedMatmul(" in simulated.lower(lhs, rhs, sizes).compile().as_text()
    plain = np.asarray(jax.jit(f, in_shardings=shardings)(lhs, rhs, sizes))
    np.testing.assert_array_equal(plain, np.asarray(simulated(lhs, rhs, sizes)))
    # FP32 products rounded to FP32 and summed over K = 8 in another order than CPU JAX's:
    # |error| <= (K + 1) * 2**-24 * sum|a_k b_k|
    bound = 9 * 2.0 ** -24 * np.abs(lhs).max() * np.abs(rhs).max() * 8
    np.testing.assert_allclose(plain, np.asarray(jax.jit(f)(lhs, rhs, sizes)), rtol=0,
                               atol=bound)


def test_out_of_hbm_is_resource_exhausted(devices):
    huge = jax.ShapeDtypeStruct((120_000, 120_000), jnp.float32,
                                sharding=jax.sharding.SingleDeviceSharding(devices[0]))
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        jax.jit(lambda a, b: a - b).lower(huge, huge).compile()


def test_no_buffer_growth_over_many_calls(devices):
    f = jax.jit(lambda v: v * 2)
    x = jax.device_put(np.ones(8, np.float32), devices[0])
    f(x).block_until_ready()
    before = len(table.HANDLES)
    for _ in range(2000):
        f(x).block_until_ready()
    assert len(table.HANDLES) <= before + 2
    assert devices[0].memory_stats()["bytes_in_use"] < 10_000


def test_host_memory_kinds_hold_arrays_outside_hbm(devices):
    """pinned_host and unpinned_host, as jax offloads to them on TPU and GPU: device_put
    there and back, a program's result placed there (compute_on's), none counted in
    the chip's HBM."""
    device = devices[5]
    assert [m.kind for m in device.addressable_memories()] == \
        ["device", "pinned_host", "unpinned_host"]
    assert "host memory" in str(device.memory("pinned_host"))
    in_use = device.memory_stats()["bytes_in_use"]
    x = np.arange(4096, dtype=np.float32)
    on_host = jax.device_put(x, SingleDeviceSharding(device, memory_kind="pinned_host"))
    assert on_host.sharding.memory_kind == "pinned_host"
    assert device.memory_stats()["bytes_in_use"] == in_use
    back = jax.device_put(on_host, SingleDeviceSharding(device))
    assert back.sharding.memory_kind == "device"
    assert device.memory_stats()["bytes_in_use"] == in_use + x.nbytes
    np.testing.assert_array_equal(np.asarray(back), x)

    @compute_on2(compute_type="device_host", out_memory_spaces=jax.memory.Space.Host)
    def double(v):
        return v * 2

    doubled = double(back)
    assert doubled.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(doubled), x * 2)


def test_unsafe_buffer_pointer_is_the_pieces_address(devices):
    x = jax.device_put(np.arange(8.0, dtype=np.float32), devices[3])
    y = jnp.array(x, copy=True)
    assert x.unsafe_buffer_pointer() != 0
    assert x.unsafe_buffer_pointer() != y.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(y), np.arange(8.0, dtype=np.float32))


def test_a_program_without_outputs_runs(devices):
    """XLA gives a program whose result is the empty tuple one output sharding, and jaxlib
    requires exactly one (an argument kept but nothing returned)."""
    x = jax.device_put(np.arange(3.0, dtype=np.float32), devices[0])
    assert jax.jit(lambda v: None, keep_unused=True)(x) is None


def test_host_arrays_with_negative_strides_are_copied_whole(devices):
    """jaxlib hands a reversed numpy view over as its first element's address and negative
    byte strides: its lowest byte is before that address."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (a[::-1], a[:, ::-1], a[::-1, ::-2], a.T[::-1], np.broadcast_to(a[0], (3, 4))):
        np.testing.assert_array_equal(np.asarray(jax.device_put(view, devices[0])), view)


def test_a_result_made_one_array_per_chip_reads_back_and_feeds_the_next_program(
        devices, rng, monkeypatch):
    """The simulator's per-chip arrays of a product (mesh.executor.PER_CHIP_MIN_BYTES, here
    0) are the devices' buffers: the bits of jax_trn2.jit's result, assembled once when a
    next program takes them whole."""
    from mesh import executor
    monkeypatch.setattr(executor, "PER_CHIP_MIN_BYTES", 0)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((512, 64)).astype(np.float32)

    def program(mesh):
        return jax.shard_map(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32),
                             mesh=mesh, in_specs=(P("x", "y"), P("y", "z")),
                             out_specs=P("x", ("y", "z")))

    mesh = jax.make_mesh((2, 2, 2), ("x", "y", "z"), devices=devices[:8],
                         axis_types=(AxisType.Auto,) * 3)
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in
            ((x, P("x", "y")), (w, P("y", "z")))]
    got = jax.jit(program(mesh))(*args)
    want = jax_trn2.jit(program(jax_trn2.make_mesh((2, 2, 2), ("x", "y", "z"))))(x, w)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                  np.asarray(want).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v.T * 2)(got)),
                                  np.asarray(want).T * 2)


def test_a_program_xla_cpu_aborts_on_after_partitioning_runs():
    """XLA:CPU aborts on this program in a pass after SPMD partitioning (AllReducePromotion:
    "Invalid binary instruction opcode copy", tests/lowering/test_xla_log.py runs it there);
    the simulator needs XLA only up to the partitioned program: it runs, and its gradient is
    the hand-worked one (d/dw of sum(pmean(2 w)) over replicated w is 2 everywhere)."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices("trn2")[:8],
                         axis_types=(AxisType.Auto,) * 2)

    def loss(w):
        mean = jax.shard_map(lambda w: jax.lax.pmean(w * 2, "b"), mesh=mesh, in_specs=P(),
                             out_specs=P(), axis_names={"b"})(w)
        return mean.astype(jnp.float32).sum()

    w = jax.device_put(jnp.ones((16, 16), jnp.bfloat16), NamedSharding(mesh, P("a")))
    grad = jax.jit(jax.grad(loss))(w)
    np.testing.assert_array_equal(np.asarray(grad, np.float32), np.full((16, 16), 2.0))


def test_a_one_device_programs_text_is_its_computation():
    """compiled.as_text() of a program on one device shows its computation, as XLA's
    optimized module does (a dce_sink kept by jax shows there too)."""
    def f(x):
        jax.lax.dce_sink(jnp.sin(x) + 1, prevent_mlir_dce=True)
        return x * 2
    x = jax.device_put(np.ones(3, np.float32), jax.devices("trn2")[0])
    compiled = jax.jit(f).lower(x).compile()
    text = compiled.as_text()
    assert all(op in text for op in ("sine(", "add(", "multiply(", "dce_sink"))
    np.testing.assert_array_equal(np.asarray(compiled(x)), np.full(3, 2.0, np.float32))
