"""Programs that are not (only) shard_map: jax.jit over arguments with NamedShardings,
sharding constraints and reshards, shard_maps over some mesh axes only and nested
shard_maps, against CPU JAX.

A program with shardings outside shard_map bodies is partitioned by XLA's SPMD partitioner
(lowering.partition) and each chip runs its piece; results must equal CPU JAX's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, cpu_mesh
from mesh import sharding

SHAPE, NAMES = (4, 4, 4), ("x", "y", "z")


@pytest.fixture(scope="module")
def auto_mesh():
    return cpu_mesh(SHAPE, NAMES)


def on(mesh, array, spec):
    return jax.device_put(array, NamedSharding(mesh, spec))


def test_named_sharding_arguments_and_constraints(rng, auto_mesh):
    a = on(auto_mesh, rng.standard_normal((16, 8)).astype(np.float32), P("x", "y"))
    b = on(auto_mesh, rng.standard_normal((8, 4)).astype(np.float32), P("y", None))

    def f(a, b):
        c = jnp.tanh(a @ b)
        c = jax.lax.with_sharding_constraint(c, NamedSharding(auto_mesh, P(None, "z")))
        return c.sum(0), c

    got = jax_trn2.jit(f)(a, b)
    assert all(isinstance(g, jax.Array) for g in got)
    assert_matches(got, jax.jit(f)(a, b))


def test_explicit_axes_reshard_and_unreduced(rng):
    mesh = jax.make_mesh(SHAPE, NAMES, axis_types=(AxisType.Explicit,) * 3,
                         devices=jax.devices("cpu")[:64])
    x = on(mesh, rng.standard_normal((16, 8)).astype(np.float32), P(None, "x"))
    w = on(mesh, rng.standard_normal((8, 4)).astype(np.float32), P("x", None))

    def f(x, w):
        partial_sums = jnp.einsum("ij,jk->ik", x, w, out_sharding=P(None, None, unreduced={"x"}))
        y = jax.sharding.reshard(partial_sums, P(None, "z"))
        return jnp.sin(y)

    with jax.set_mesh(mesh):
        got, want = jax_trn2.jit(f)(x, w), jax.jit(f)(x, w)
    assert_matches(got, want)


def test_batched_factorisations_and_fft_on_sharded_batches(rng, auto_mesh):
    """After XLA's partitioner a LAPACK call's several results are one tuple that
    get_tuple_element takes apart."""
    g = rng.standard_normal((8, 4, 4)).astype(np.float32)
    spd = on(auto_mesh, g @ g.transpose(0, 2, 1) + 4 * np.eye(4, dtype=np.float32), P("x"))
    signal = on(auto_mesh, rng.standard_normal((8, 16)).astype(np.float32), P(None, "y"))

    def f(a, s):
        return jnp.linalg.cholesky(a), jnp.linalg.eigvalsh(a), jnp.fft.rfft(s)

    got, want = jax_trn2.jit(f)(spd, signal), jax.jit(f)(spd, signal)
    for g_, w in zip(got, want):
        # both run LAPACK on the same matrices; the FFT is DFT products in FP32 (rtol as
        # e2e_reference's FP32 re-association bound)
        np.testing.assert_allclose(g_, w, rtol=2.0 ** -14, atol=1e-5)


@pytest.mark.parametrize("context", ["set_mesh", "use_abstract_mesh"])
def test_mesh_context_with_partition_spec_constraints(rng, auto_mesh, context):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)

    def f(x, w):
        y = jax.lax.with_sharding_constraint(x @ w, P("x", "y"))
        return jnp.exp(y) * 2

    mesh = jax_trn2.make_mesh()
    with jax.set_mesh(mesh) if context == "set_mesh" else \
            jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        got = jax_trn2.jit(f)(x, w)
    with jax.set_mesh(auto_mesh):
        want = jax.jit(f)(x, w)
    assert_matches(got, want)


def test_shard_alike_groups_are_hints(rng, auto_mesh):
    from jax.experimental.shard_alike import shard_alike

    x = on(auto_mesh, rng.standard_normal((16, 8)).astype(np.float32), P("x"))

    def f(x):
        a, b = shard_alike(x, x * 2)
        return a + b

    assert_matches(jax_trn2.jit(f)(x), jax.jit(f)(x))


def _partial_manual(mesh):
    """A shard_map over x only inside an automatic program; axis_index('x') there is a
    shard_map over the other axes nested inside it."""
    def body(x, w):
        return jax.lax.psum(x @ w + jax.lax.axis_index("x"), "x")

    def f(x, w):
        y = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(),
                          axis_names={"x"})(x, w)
        return jnp.cos(y)
    return f


def test_shard_map_over_some_axes(rng, auto_mesh):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    got = jax_trn2.jit(_partial_manual(jax_trn2.make_mesh()))(x, w)
    assert_matches(got, jax.jit(_partial_manual(auto_mesh))(x, w))


def test_nested_shard_maps(rng, auto_mesh):
    def make(mesh):
        def inner(v):
            return jax.lax.psum(v * (1 + jax.lax.axis_index("y")), "y")

        def outer(v):
            v = v + jax.lax.axis_index("x")
            return jax.shard_map(inner, mesh=jax.sharding.get_abstract_mesh(),
                                 in_specs=P(None, "y"), out_specs=P(None, "y"),
                                 axis_names={"y"})(v)
        return jax.shard_map(outer, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             axis_names={"x"})

    v = rng.standard_normal((16, 8)).astype(np.float32)
    assert_matches(jax_trn2.jit(make(jax_trn2.make_mesh()))(v), jax.jit(make(auto_mesh))(v))


def test_execute_sharded_splits_by_argument_and_result_shardings(rng, auto_mesh):
    """PJRT-style: per-device pieces of the NamedSharding arguments go in, per-device
    pieces of the results (by their out_shardings) come out."""
    a = rng.standard_normal((16, 8)).astype(np.float32)
    out_sharding = NamedSharding(auto_mesh, P(None, "y"))
    f = jax.jit(lambda a: jnp.sin(a) * 3, out_shardings=out_sharding)
    lowered = f.lower(on(auto_mesh, a, P("x", "z")))
    executable = jax_trn2.client().compile(lowered.as_text())
    pieces = sharding.split(a, ((0,), (2,)), SHAPE)
    results = executable.execute_sharded([[p] for p in pieces])
    want = sharding.split(np.asarray(f(a)), ((), (1,)), SHAPE)
    for got, expected in zip(results, want, strict=True):
        assert_matches(np.asarray(got[0]), expected)
    with pytest.raises(TypeError, match=r"device 0: expected float32\[4,2\], got float32\[4\]"):
        executable.execute_sharded([[p[:, 0]] for p in pieces])


def test_custom_partitioning_runs_its_partition_callback(rng, auto_mesh):
    """XLA's partitioner calls the Python partition rule, as it does for CPU JAX."""
    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def triple(x):
        return x * 3

    triple.def_partition(
        partition=lambda mesh, args, result: (mesh, lambda x: x * 3, args[0].sharding,
                                              (args[0].sharding,)),
        infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
        sharding_rule="i j -> i j")
    x = on(auto_mesh, rng.standard_normal((16, 8)).astype(np.float32), P("x"))
    f = lambda x: triple(x) + 1  # noqa: E731
    assert_matches(jax_trn2.jit(f)(x), jax.jit(f)(x))


def test_xlas_full_rematerialization_log_is_explained_not_printed(capfd):
    """An embedding lookup whose table is split over tensor x fsdp and whose result must be
    split over the batch: XLA's partitioner rematerializes the gather in full and logs it
    from C++ to stderr; the user gets a Python warning saying what it costs instead."""
    mesh = jax_trn2.make_mesh((4, 4, 4), ("data", "fsdp", "tensor"))

    def lookup(embed, tokens):
        return jax.lax.with_sharding_constraint(
            embed[tokens], NamedSharding(mesh, P(("data", "fsdp"), None, None)))

    step = jax_trn2.jit(lookup, in_shardings=(NamedSharding(mesh, P("tensor", "fsdp")),
                                              NamedSharding(mesh, P(("data", "fsdp")))))
    with pytest.warns(UserWarning, match=r"no efficient way to reshard 1 value\(s\) .* "
                                         r"f32\[64,16,16\] \(%gather\) from \{devices="):
        step.lower(jax.ShapeDtypeStruct((512, 64), jnp.float32),
                   jax.ShapeDtypeStruct((64, 16), jnp.int32))
    assert "Involuntary full rematerialization. The compiler" not in capfd.readouterr().err
