"""jax_trn2.jit behaves like jax.jit: pytrees, keyword and static arguments, the cache,
lower()/compile(), programs without a shard_map."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import jax_trn2
from jax_trn2.core.executable import LoadedExecutable

MESH = jax_trn2.make_mesh()
RNG = np.random.default_rng(0)
X = RNG.standard_normal((16, 8)).astype(np.float32)
W = RNG.standard_normal((8, 8)).astype(np.float32)


def make_dense(mesh):
    """A pytree of parameters in, a pytree out, a keyword argument."""
    def dense(params, x, *, scale):
        h = jax.shard_map(lambda w, x: jax.lax.psum(x @ w, "y"), mesh=mesh,
                          in_specs=(P("y", None), P("x", "y")), out_specs=P("x", None))(
            params["w"], x)
        return {"out": (h + params["b"]) * scale, "stats": (jnp.max(h), jnp.min(h))}

    return dense


def test_pytrees_and_keyword_arguments():
    params = {"w": W, "b": np.arange(8, dtype=np.float32)}
    cpu_mesh = jax.make_mesh((4, 4, 4), ("x", "y", "z"), axis_types=(AxisType.Auto,) * 3,
                             devices=jax.devices("cpu")[:64])
    got = jax_trn2.jit(make_dense(MESH))(params, X, scale=np.float32(2))
    want = jax.jit(make_dense(cpu_mesh))(params, X, scale=np.float32(2))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(g, jax.Array)
        # The psum over y adds 4 partial products in another order than CPU JAX: FP32
        # rounding of sums of 8 terms of magnitude ~3.
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def power(x, n):
    return x ** n


@pytest.mark.parametrize("jitted", [jax_trn2.jit(power, static_argnums=1),
                                    jax_trn2.jit(power, static_argnames="n")],
                         ids=["static_argnums", "static_argnames"])
def test_static_arguments(jitted):
    x = np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(jitted(x, 2), x ** 2)
    np.testing.assert_array_equal(jitted(x, n=3), x ** 3)
    np.testing.assert_array_equal(jitted(x, 3), x ** 3)


def test_decorator_with_options():
    @jax_trn2.jit(static_argnames=("axis",))
    def total(x, axis):
        return jnp.sum(x, axis=axis)

    np.testing.assert_array_equal(total(np.ones((2, 3), np.int32), axis=1), [3, 3])



def test_a_pmapped_function_runs_on_the_mesh():
    """jax.pmap's function carries attributes of its own (`lower`, ...): jit takes its
    name and docstring only, as jax.jit does, and runs it like any other function."""
    def body(v):
        return jax.lax.ppermute(v, "i", [(j, (j + 3) % 8) for j in range(8)]) + \
            jax.lax.psum(v, "i") * jax.lax.axis_index("i")

    step = jax.pmap(body, axis_name="i", devices=jax.devices("cpu")[:8])
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    jitted = jax_trn2.jit(step)
    assert jitted.__name__ == step.__name__
    np.testing.assert_array_equal(jitted(x), step(x))

def test_cache_hit_does_not_lower_again(monkeypatch):
    lowerings = []
    original = LoadedExecutable.from_stablehlo.__func__

    def counting(cls, *args, **kwargs):
        lowerings.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(LoadedExecutable, "from_stablehlo", classmethod(counting))
    step = jax_trn2.jit(lambda x, n: x * n, static_argnums=1)
    step(X, 2)
    step(X + 1, 2)  # same shapes and static value: the cached program
    assert len(lowerings) == 1
    step(X[:8], 2)  # another shape
    step(X, 3)  # another static value
    assert len(lowerings) == 3
    np.testing.assert_array_equal(step(X, 3), X * 3)
    assert len(lowerings) == 3


def test_cache_is_per_mesh_context():
    """As jax.jit's: a program traced under jax.set_mesh(m) is not reused under another
    mesh, whose axes its PartitionSpecs may not even name."""
    step = jax_trn2.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P("y")))
    with jax.set_mesh(jax_trn2.make_mesh((2, 4), ("x", "y"))):
        np.testing.assert_array_equal(step(X), X * 2)
    with jax.set_mesh(jax_trn2.make_mesh((8,), ("x",))):
        with pytest.raises(ValueError, match="Resource axis: y"):
            step(X)


def test_the_simulation_runs_on_its_own_device_under_set_mesh():
    """The simulator's computation is compiled for its executor device even under
    jax.set_mesh (not replicated over the caller's 64 host devices, each doing all the
    work: 100 times slower)."""
    dense = make_dense(MESH)
    params = {"w": W, "b": np.zeros(8, np.float32)}
    with jax.set_mesh(MESH):
        executable = jax_trn2.jit(dense).lower(params, X, scale=2.0).compile().executable
        executable.execute([params["b"], W, X, np.float32(2.0)])
    compiled = executable._run_global.compiled
    compiled_for = {d for s in compiled.input_shardings[0] for d in s.device_set}
    assert len(compiled_for) == 1 and not compiled_for & set(MESH.devices.flat), compiled_for


def test_runs_on_the_mesh_under_disable_jit():
    # jax.disable_jit is for stepping through the user's Python: the simulation's own
    # computations still run compiled (they raised jax's AOT error under it)
    mesh = jax_trn2.make_mesh((4,), ("i",))
    f = jax.shard_map(lambda x: jax.lax.psum(x * x, "i"), mesh=mesh, in_specs=P("i"),
                      out_specs=P())
    x = np.arange(8, dtype=np.float32)
    with jax.disable_jit():
        got = jax_trn2.jit(f)(x)
    # small integers: every sum is exact in FP32, in any order
    np.testing.assert_array_equal(got, (x * x).reshape(4, 2).sum(0))


def test_typed_prng_keys_in_and_out():
    """jax.random.key arrays go in as their key data and come back as key arrays."""
    def f(key, x):
        return jax.random.split(key), x + jax.random.uniform(key, x.shape)

    key = jax.random.key(1)
    got, want = jax_trn2.jit(f)(key, X), jax.jit(f)(key, X)
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(jax.random.key_data(got[0]), jax.random.key_data(want[0]))
    np.testing.assert_array_equal(got[1], want[1])  # bit operations and one FP32 add


def test_single_chip_program():
    f = lambda x, w: jax.nn.relu(x @ w).sum(axis=0)  # noqa: E731
    lowered = jax_trn2.jit(f).lower(X, W)
    assert lowered.program.mesh.num_devices == 1
    got = lowered.compile()(X, W)
    # One FP32 matmul and a sum of 16 rows: rounding differs only in the order of adds.
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(f)(X, W)),
                               rtol=1e-5, atol=1e-5)


def test_lower_as_text_and_compile():
    step = jax_trn2.jit(jax.shard_map(lambda x: jax.lax.psum(x, "x"), mesh=MESH,
                                      in_specs=P("x"), out_specs=P()))
    lowered = step.lower(X)
    listing = lowered.as_text()
    assert "AllReduce" in listing and "mesh={x=4, y=4, z=4}" in listing
    stablehlo = lowered.as_text(dialect="stablehlo")
    assert "stablehlo.all_reduce" in stablehlo and "sdy.manual_computation" in stablehlo
    with pytest.raises(ValueError, match="dialect"):
        lowered.as_text(dialect="mhlo")
    compiled = lowered.compile()
    # A sum of 4 FP32 values, in the ring's order rather than numpy's.
    np.testing.assert_allclose(np.asarray(compiled(X)), X.reshape(4, 4, 8).sum(0),
                               rtol=1e-6, atol=1e-6)
    assert "AllReduce" in compiled.as_text()


def test_lower_with_shape_dtype_structs():
    spec = jax.ShapeDtypeStruct(X.shape, X.dtype)
    compiled = jax_trn2.jit(lambda x: x * 2).lower(spec).compile()
    np.testing.assert_array_equal(np.asarray(compiled(X)), X * 2)


def test_stages_describe_arguments_and_results_as_jaxs_do():
    params = {"w": W, "b": np.zeros(8, np.float32)}
    step = jax_trn2.jit(make_dense(MESH), static_argnames="scale", donate_argnums=0)
    ours = step.lower(params, X, scale=2.0)
    theirs = jax.jit(make_dense(MESH), static_argnames="scale",
                     donate_argnums=0).trace(params, X, scale=2.0).lower()
    for stage in (ours, ours.compile()):
        assert stage.out_info == theirs.out_info
        assert str(stage.args_info) == str(theirs.args_info)
        assert stage.args_info[0][0]["w"].donated and not stage.args_info[0][1].donated
        assert stage.in_avals == theirs.in_avals
        assert stage.donate_argnums == theirs.donate_argnums == (0, 1)  # params' two leaves


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("f, donate", [
    (lambda a, b: a + b, (0, 1)),           # one aliased to the result, one not usable
    (lambda a, b: (a * b).astype(jnp.int32), 0),  # a buffer donor (no result of its type)
    (lambda a, b: jnp.sum(a * b), 0),       # not usable: kept
    (lambda a, b: (a, b), 1),               # returned as it is
])
def test_donated_arguments_are_deleted_as_jax_deletes_them(f, donate):
    def arrays():
        return [jnp.asarray(X), jnp.asarray(X) + 1]

    ours, theirs = arrays(), arrays()
    got = jax_trn2.jit(f, donate_argnums=donate)(*ours)
    want = jax.jit(f, donate_argnums=donate)(*theirs)
    assert [a.is_deleted() for a in ours] == [a.is_deleted() for a in theirs]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):  # results intact
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("f, args", [
    (lambda x: x * 2, (3,)),                      # Python scalars in: weak results
    (lambda x: (x * 0.5, jnp.float32(2)), (3.0,)),  # one weak, one not
    (lambda: (2.0, jnp.arange(3)), ()),           # constants
    (lambda x, s: x * s, (np.ones(3, np.float32), 2.0)),  # an array makes it strong
])
def test_results_keep_jaxs_weak_types(f, args):
    """A weak result promotes as a Python scalar does: a learning rate computed by a
    jitted schedule, times BF16 parameters, stays BF16."""
    got, want = jax_trn2.jit(f)(*args), jax.jit(f)(*args)
    assert [jax.typeof(g) for g in jax.tree.leaves(got)] == \
        [jax.typeof(w) for w in jax.tree.leaves(want)]
    params = jnp.ones(3, jnp.bfloat16)
    assert [(params * g).dtype for g in jax.tree.leaves(got)] == \
        [(params * w).dtype for w in jax.tree.leaves(want)]


def test_outputs_that_are_inputs_or_constants():
    f = lambda x, y: (x, jnp.arange(3), y + 1, x)  # noqa: E731
    got = jax_trn2.jit(f)(X, np.int32(4))
    want = f(X, np.int32(4))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_lower_and_listing_do_not_compile_for_the_host(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("the host computation was compiled")

    monkeypatch.setattr("jax_trn2.core.executable.compile_program", no_compile)
    lowered = jax_trn2.jit(lambda a: a * 2).lower(np.ones(4, np.float32))
    assert "multiply" in lowered.as_text()
    with pytest.raises(AssertionError, match="compiled"):
        lowered.compile()


def test_unhashable_static_argument_has_jaxs_message():
    f = jax_trn2.jit(lambda x, n: x * len(n), static_argnums=1)
    with pytest.raises(ValueError, match=r"Non-hashable static arguments are not supported.*"
                                         r"<class 'list'>, \[1, 2\] \(static argument 1\)"):
        f(1.0, [1, 2])


def test_a_jitted_method_is_bound_to_its_instance():
    class Scaled:
        def __init__(self, scale):
            self.scale = scale

        @jax_trn2.jit
        def apply(self, x):  # self: a pytree-less object, so static through partial below
            return x * 2

        @functools.partial(jax_trn2.jit, static_argnums=0)
        def scaled(self, x):
            return x * self.scale

    model = Scaled(3.0)
    np.testing.assert_array_equal(model.scaled(X), X * 3)
    with pytest.raises(TypeError, match="Scaled"):  # self is an argument like any other
        model.apply(X)


def test_eval_shape_and_clear_cache_as_jax_jits():
    double = jax_trn2.jit(lambda x: {"y": x * 2})
    assert double.eval_shape(X) == jax.jit(lambda x: {"y": x * 2}).eval_shape(X)
    double(X)
    assert len(double._cache) == 1
    double.clear_cache()
    assert not double._cache
    np.testing.assert_array_equal(np.asarray(double(X)["y"]), X * 2)


def test_a_fresh_jit_of_the_same_function_does_not_compile_again(monkeypatch):
    """Every jax_trn2.jit of one function (with the same options) shares its programs, as
    jax.jit's do: `jax_trn2.jit(f)(x)` in a loop compiles once."""
    def triple(x):
        return x * 3
    jax_trn2.jit(triple)(X)
    lowerings = []
    monkeypatch.setattr(LoadedExecutable, "from_stablehlo",
                        lambda *a, **k: lowerings.append(a) or pytest.fail("compiled again"))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(jax_trn2.jit(triple)(X)), X * 3)
    assert not lowerings
    with pytest.raises(BaseException, match="compiled again"):  # other options: another
        jax_trn2.jit(triple, rounding="stochastic")(X)


def test_trace_then_lower_as_jax_jits():
    f = lambda x, s: x * s  # noqa: E731
    traced = jax_trn2.jit(f, static_argnums=1).trace(X, 3.0)
    theirs = jax.jit(f, static_argnums=1).trace(X, 3.0)
    assert str(traced.jaxpr) == str(theirs.jaxpr)
    assert traced.out_info == theirs.out_info and traced.fun_name == theirs.fun_name
    compiled = traced.lower().compile()
    np.testing.assert_array_equal(np.asarray(compiled(X)), X * 3)
    assert compiled.runtime_executable() is compiled.executable
    assert traced.lower().as_text("hlo") == theirs.lower().as_text("hlo")


def test_jaxs_other_jit_keywords():
    x = jnp.asarray(X)
    for options in ({"keep_unused": True}, {"inline": True}):
        np.testing.assert_array_equal(
            np.asarray(jax_trn2.jit(lambda a, unused: a * 2, **options)(x, x)), X * 2)
    with pytest.warns(DeprecationWarning, match="backend and device argument"):
        on_2 = jax_trn2.jit(lambda a: a * 2, device=jax.devices()[2])
    got = on_2(x)
    assert got.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[2]) and got.committed
    # XLA's options are taken, as every backend takes them (XLA does not compile here);
    # what XLA does not know is refused in XLA's words
    xla_options = {"xla_cpu_enable_fast_math": True, "xla_embed_ir_in_executable": True}
    np.testing.assert_array_equal(
        np.asarray(jax_trn2.jit(lambda a: a * 2, compiler_options=xla_options)(x)), X * 2)
    with pytest.raises(ValueError, match="No such compile option: 'no_such_option'"):
        jax_trn2.jit(lambda a: a, compiler_options={"no_such_option": True})
    with pytest.raises(ValueError, match="No such compile option: 'trn2_roundin'"):
        jax_trn2.jit(lambda a: a, compiler_options={"trn2_roundin": "nearest"})
    with pytest.raises(ValueError, match="'maybe' is not a valid bool value"):
        jax_trn2.jit(lambda a: a, compiler_options={"xla_embed_ir_in_executable": "maybe"})


def test_compiler_options_are_the_plugins():
    """jax_trn2.jit reads the trn2_* compiler options as the plugin reads jax.jit's: the
    same program options give the same bits through both front doors, and say what the
    keywords say (one way at a time)."""
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    f = lambda a: (a * 3).astype(jnp.bfloat16)  # noqa: E731  rounded to BF16
    options = {"trn2_rounding": "stochastic", "trn2_seed": 7}
    got = np.asarray(jax_trn2.jit(f, compiler_options=options)(x))
    keywords = np.asarray(jax_trn2.jit(f, rounding="stochastic", seed=7)(x))
    plain = np.asarray(jax.jit(f, compiler_options=options)(
        jax.device_put(x, jax.devices("trn2")[0])))
    nearest = np.asarray(jax_trn2.jit(f)(x))
    assert got.view(np.uint16).tolist() == keywords.view(np.uint16).tolist() == \
        plain.view(np.uint16).tolist()
    assert (got != nearest).any()  # the option was applied
    with pytest.raises(ValueError, match="rounding= and compiler option 'trn2_rounding' both"):
        jax_trn2.jit(f, rounding="nearest", compiler_options=options)
    with pytest.raises(ValueError, match="unknown rounding mode 'up'"):
        jax_trn2.jit(f, compiler_options={"trn2_rounding": "up"})


def test_an_array_donated_and_passed_again_is_refused_as_jax_refuses_it():
    x = jnp.asarray(X)
    add = jax_trn2.jit(lambda a, b: a + b, donate_argnums=0)
    with pytest.raises(ValueError, match="argument 'a' is donated, and the same array is "
                                         "passed again as argument 'b'"):
        add(x, x)
    assert not x.is_deleted()
    with pytest.raises(Exception, match="donated"):  # jax refuses it too
        jax.jit(lambda a, b: a + b, donate_argnums=0)(x, x)


def test_compiled_formats_and_memory_fields_as_jax_jits():
    f = lambda x, s: (x * 2, s)  # noqa: E731
    ours = jax_trn2.jit(f).lower(X, 1.0).compile()
    theirs = jax.jit(f).lower(X, 1.0).compile()
    assert ours.input_formats == theirs.input_formats
    assert ours.output_formats == theirs.output_formats
    stats = ours.memory_analysis()
    assert stats.host_temp_size_in_bytes == stats.host_argument_size_in_bytes == 0
    with pytest.raises(ValueError, match="No such compile option: 'xla_no_such_option'"):
        jax_trn2.jit(f).lower(X, 1.0).compile({"xla_no_such_option": True})
    with pytest.raises(ValueError, match="Lowered.compile: the program was lowered for its "
                                         "machine and rounding"):
        jax_trn2.jit(f).lower(X, 1.0).compile({"trn2_rounding": "stochastic"})
    lowered = jax_trn2.jit(f).lower(X, 1.0)
    assert "loc(" in lowered.as_text("stablehlo", debug_info=True)


def test_jax_export_of_a_jitted_function_runs_on_the_simulator():
    """jax.export exports the function's StableHLO (jax's lowering of it), which the
    simulator's client compiles and runs."""
    exported = jax.export.export(jax_trn2.jit(lambda x: jnp.sin(x) * 2))(X)
    executable = jax_trn2.client().compile(exported.mlir_module_serialized)
    (got,) = executable.execute([X])
    # XLA's FP32 sin and NumPy's may differ by an ulp or two (about 1e-7 relative)
    np.testing.assert_allclose(np.asarray(got), np.sin(X) * 2, rtol=1e-6)


def test_calling_with_a_shape_dtype_struct_is_jaxs_type_error():
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    f = jax_trn2.jit(lambda x: x + 1)
    with pytest.raises(TypeError, match="of type <class 'jax.ShapeDtypeStruct'> is not a "
                                        "valid JAX type"):
        f(spec)
    with pytest.raises(TypeError, match="is not a valid JAX type"):
        f.lower(spec).compile()(spec)


def test_float0_arguments_and_results_as_jax_jits():
    """jax.grad(..., allow_int=True) gives integer arguments float0 gradients: no data,
    taken and returned as jax.jit takes and returns them."""
    grad = jax.grad(lambda x, n: (x * n).sum(), argnums=(0, 1), allow_int=True)
    args = (jnp.ones(4), jnp.arange(4))
    got, want = jax_trn2.jit(grad)(*args), jax.jit(grad)(*args)
    assert got[1].dtype == want[1].dtype == jax.dtypes.float0 and got[1].shape == (4,)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    zero = np.zeros(2, jax.dtypes.float0)
    f = lambda x, z: (x * 2, z)  # noqa: E731
    got, want = jax_trn2.jit(f)(jnp.ones(2), zero), jax.jit(f)(jnp.ones(2), zero)
    assert type(got[1]) is type(want[1]) and got[1].dtype == jax.dtypes.float0


def test_unused_arguments_are_dropped_unless_keep_unused():
    """As jax.jit: the program takes only the arguments the function uses; Compiled's
    shardings and formats say None for the others."""
    f = lambda a, unused, b: a * b  # noqa: E731
    args = (X, X, X)
    for keep, taken in ((False, 2), (True, 3)):
        lowered = jax_trn2.jit(f, keep_unused=keep).lower(*args)
        assert len(lowered.program.inputs) == taken
        compiled = lowered.compile()
        theirs = jax.jit(f, keep_unused=keep).lower(*args).compile()
        assert compiled.input_formats == theirs.input_formats
        assert (compiled.input_shardings[0][1] is None) == (not keep)
        np.testing.assert_array_equal(np.asarray(compiled(*args)), X * X)


def test_a_donated_array_on_the_default_device_is_deleted_as_jax_deletes_it():
    device = jax.devices()[3]
    with jax.default_device(device):
        for J in (jax.jit, jax_trn2.jit):
            x = jnp.ones(4)
            assert x.sharding == jax.sharding.SingleDeviceSharding(device)
            J(lambda a: a * 2, donate_argnums=0)(x)
            assert x.is_deleted()


def test_host_callbacks_of_a_program_lowered_for_the_plugins_devices():
    """An argument on a trn2 device makes jax lower for the plugin's platform, whose host
    callbacks are numbered across the process (jax_trn2.core.lowerings): jax_trn2.jit
    finds its callback after jax.jit has lowered others for trn2."""
    on_trn2 = jax.device_put(X, jax.devices("trn2")[0])
    for offset in (1.0, 2.0):  # callbacks lowered for trn2 before: ids 0, 1, ... taken
        bumped = jax.jit(lambda a, offset=offset: jax.pure_callback(
            lambda v: v + offset, jax.ShapeDtypeStruct(a.shape, a.dtype), a))(on_trn2)
        np.testing.assert_array_equal(np.asarray(bumped), X + offset)
    tripled = jax_trn2.jit(lambda a: jax.pure_callback(
        lambda v: v * 3, jax.ShapeDtypeStruct(a.shape, a.dtype), a))(on_trn2)
    np.testing.assert_array_equal(np.asarray(tripled), X * 3)
