"""jax_trn2.jit functions under JAX's transformations and inside other jitted functions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2.core.executable import LoadedExecutable

# FP32 matmuls and tanh: the simulator's and XLA:CPU's results differ by the order of a few
# FP32 roundings of sums over K = 16, well inside 1e-5 relative.
RTOL = 1e-5
U = 2.0 ** -24  # FP32's unit roundoff


def loss(x, w):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def gamma(h: int) -> float:
    """The relative error bound of h roundings in a row, h*u / (1 - h*u)."""
    return h * U / (1 - h * U)


def loss_grad_bounds(x, w, cotangent: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """How far apart two FP32 computations of the gradient of `cotangent * loss` in x and
    in w can be, element by element: each within this first-order bound of the exact one
    (so twice it apart), whatever order its dots add in. Gradient elements are sums of
    terms of both signs, so the bound scales with the sum of their magnitudes, not with
    the element (mesh/numerics.py's dot bound, propagated):
    - y = x @ w: K products each rounded (the FP32 path), K - 1 additions: gamma(K) |x||w|;
    - t = tanh(y): |dt/dy| <= 1, plus the tanh's own error (4 ulps, 8u|t|, assumed);
    - g = 2t(1 - t^2): |dg/dt| = |2 - 6t^2| <= 4, plus 4 roundings of its products and
      difference (8u (|t| + |t|^3));
    - the gradients |x|^T g and g |w|^T: at most 32 roundings on a term's path (8 rows
      summed, or jacfwd's sum over all 32 of y's elements)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    t = np.tanh(x @ w)
    dy = gamma(x.shape[1]) * (np.abs(x) @ np.abs(w))
    dt = dy + 8 * U * np.abs(t)
    g = np.abs(2 * t * (1 - t ** 2))
    dg = 4 * dt + 8 * U * (np.abs(t) + np.abs(t) ** 3)
    scale = 2 * abs(cotangent)
    return (scale * (dg @ np.abs(w).T + gamma(32) * g @ np.abs(w).T),
            scale * (np.abs(x).T @ dg + gamma(32) * np.abs(x).T @ g))


def assert_within(got, want, bound):
    apart = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    assert np.all(apart <= bound), f"{np.max(apart / bound):.3g} times the bound apart"


def assert_grads_close(got, want, x, w, cotangent: float = 1.0):
    for g, r, bound in zip(got, want, loss_grad_bounds(x, w, cotangent)):
        assert_within(g, r, bound)


@pytest.fixture
def data(rng):
    return (rng.standard_normal((8, 16)).astype(np.float32),
            rng.standard_normal((16, 4)).astype(np.float32))


@pytest.fixture
def mesh_runs(monkeypatch):
    """How many programs ran on the simulated mesh."""
    runs = []
    execute = LoadedExecutable.execute

    def counting(self, *args, **kwargs):
        runs.append(self)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(LoadedExecutable, "execute", counting)
    return runs


def test_grad_runs_forward_and_backward_on_the_mesh(data, mesh_runs):
    x, w = data
    got = jax.grad(jax_trn2.jit(loss), argnums=(0, 1))(x, w)
    assert_grads_close(got, jax.grad(loss, argnums=(0, 1))(x, w), x, w)
    assert len(mesh_runs) == 2  # the primal part and the transposed linear part


def test_value_and_grad_and_vjp(data):
    x, w = data
    value, grad = jax.value_and_grad(jax_trn2.jit(loss))(x, w)
    np.testing.assert_allclose(value, loss(x, w), rtol=RTOL)
    assert_within(grad, jax.grad(loss)(x, w), loss_grad_bounds(x, w)[0])
    out, pullback = jax.vjp(jax_trn2.jit(loss), x, w)
    np.testing.assert_allclose(out, loss(x, w), rtol=RTOL)
    got, want = pullback(jnp.float32(2.0)), jax.vjp(loss, x, w)[1](jnp.float32(2.0))
    assert_grads_close(got, want, x, w, cotangent=2.0)


def test_jvp(data, mesh_runs):
    x, w = data
    out, tangent = jax.jvp(jax_trn2.jit(loss), (x, w), (x, w))
    want_out, want_tangent = jax.jvp(loss, (x, w), (x, w))
    np.testing.assert_allclose(out, want_out, rtol=RTOL)
    np.testing.assert_allclose(tangent, want_tangent, rtol=RTOL)
    assert len(mesh_runs) == 1


def test_linearize_of_numpy_arguments(data, mesh_runs):
    # the linear part takes x and w themselves as residuals: NumPy arrays, as given
    x, w = data
    y, f_jvp = jax.linearize(jax_trn2.jit(loss), x, w)
    want_y, want_jvp = jax.linearize(jax.jit(loss), x, w)
    np.testing.assert_allclose(y, want_y, rtol=RTOL)
    np.testing.assert_allclose(f_jvp(x, 2 * w), want_jvp(x, 2 * w), rtol=RTOL)
    assert len(mesh_runs) == 2  # the primal part, then the linear part


def test_vmap_runs_the_batched_function_on_the_mesh(data, mesh_runs):
    x, w = data
    xs = np.stack([x, 2 * x, -x])
    got = jax.vmap(jax_trn2.jit(loss), in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(got, jax.vmap(loss, in_axes=(0, None))(xs, w), rtol=RTOL)
    assert len(mesh_runs) == 1


def test_vmap_with_an_axis_name_over_a_jitted_function(data, mesh_runs):
    # the call is evaluated inside vmap's axis environment: the function's psum over the
    # vmapped axis is traced there, its program runs as at the top level
    x, w = data

    def normalised(x, w):
        return loss(x, w) / jax.lax.psum(loss(x, w), "batch")

    got = jax.vmap(jax_trn2.jit(normalised), in_axes=(0, None), axis_name="batch")(
        x.reshape(2, 4, 16), w)
    want = jax.vmap(normalised, in_axes=(0, None), axis_name="batch")(x.reshape(2, 4, 16), w)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert len(mesh_runs) == 1


def test_second_derivatives(data):
    x, w = data
    f = jax_trn2.jit(loss)
    got = jax.grad(jax.grad(lambda a: f(a * x, w)))(1.5)
    want = jax.grad(jax.grad(lambda a: loss(a * x, w)))(1.5)
    np.testing.assert_allclose(got, want, rtol=1e-4)  # two more levels of FP32 rounding
    assert_within(jax.jacfwd(f, argnums=1)(x, w), jax.jacfwd(loss, argnums=1)(x, w),
                  loss_grad_bounds(x, w)[1])


def test_jit_of_a_jitted_function_inlines_it(data, mesh_runs):
    x, w = data
    inner = jax_trn2.jit(loss)
    outer = jax_trn2.jit(lambda x, w: inner(x, w) * 2 + inner(w.T, x.T))
    np.testing.assert_allclose(outer(x, w), loss(x, w) * 2 + loss(w.T, x.T), rtol=RTOL)
    np.testing.assert_allclose(jax_trn2.jit(inner)(x, w), loss(x, w), rtol=RTOL)
    assert len(mesh_runs) == 2  # one program each: the inner calls are inlined
    np.testing.assert_allclose(jax.jit(inner)(x, w), loss(x, w), rtol=RTOL)  # XLA:CPU


def test_transformations_that_close_over_concrete_arguments(data, mesh_runs):
    """checkify and make_jaxpr trace a function of no arguments that calls the jax_trn2.jit
    function on concrete arrays: the call is traced, not run while tracing."""
    from jax.experimental import checkify

    def checked(x):
        checkify.check(jnp.all(x >= 0), "negative entry {m}", m=x.min())
        return jnp.sqrt(x)

    x = np.array([4.0, -1.0], np.float32)
    error, _ = checkify.checkify(jax_trn2.jit(checked))(x)
    assert error.get() == "negative entry -1.0 (`check` failed)"
    assert len(mesh_runs) == 1  # the checkified function ran on the mesh
    jaxpr = jax.make_jaxpr(lambda: jax_trn2.jit(loss)(*data))()
    assert "trn2_call" in str(jaxpr) and len(mesh_runs) == 1


def test_static_arguments_under_a_transformation(data):
    x, w = data
    f = jax_trn2.jit(lambda x, w, power: jnp.sum((x @ w) ** power), static_argnums=2)
    np.testing.assert_allclose(jax.grad(f, argnums=1)(x, w, 3),
                               jax.grad(lambda w: jnp.sum((x @ w) ** 3))(w), rtol=1e-4)


def test_grad_of_a_shard_map_program(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("data", "model"))

    def body(x, w):
        return jax.lax.psum(jnp.sum(jnp.tanh(x @ w)), ("data", "model"))

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("data", "model"), P("model", None)),
                      out_specs=P())
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_allclose(jax.grad(jax_trn2.jit(f), argnums=1)(x, w),
                               jax.grad(f, argnums=1)(x, w), rtol=RTOL, atol=1e-6)


def loss_shardings(mesh) -> tuple[NamedSharding, NamedSharding]:
    return NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P(None, "model"))


def sharded_loss_setup(rng):
    """The loss's shardings over a simulated (2, 4) mesh and over 8 CPU devices, and data."""
    cpu = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                        devices=jax.devices("cpu")[:8])
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    return (loss_shardings(jax_trn2.make_mesh((2, 4), ("data", "model"))),
            loss_shardings(cpu), x, w)


def test_grad_keeps_in_shardings_and_runs_partitioned(rng, mesh_runs):
    """Both programs jax.grad runs are partitioned as jax.jit's in_shardings say: each has
    the all-reduces XLA's partitioner inserted for the sum over the sharded rows."""
    sim_shardings, cpu_shardings, x, w = sharded_loss_setup(rng)
    got = jax.grad(jax_trn2.jit(loss, in_shardings=sim_shardings), argnums=(0, 1))(x, w)
    want = jax.grad(jax.jit(loss, in_shardings=cpu_shardings), argnums=(0, 1))(x, w)
    assert_grads_close(got, want, x, w)
    assert len(mesh_runs) == 2
    for executable in mesh_runs:
        assert executable.program.mesh.axis_sizes == (2, 4)
        assert "inserted by XLA's SPMD partitioner: all-reduce" in executable.as_text()


def test_vmap_and_jit_keep_in_shardings(rng, mesh_runs):
    sim_shardings, cpu_shardings, x, w = sharded_loss_setup(rng)
    f = jax_trn2.jit(loss, in_shardings=sim_shardings)
    ws = np.stack([w, 2 * w])
    np.testing.assert_allclose(jax.vmap(f, in_axes=(None, 0))(x, ws),
                               [loss(x, w), loss(x, 2 * w)], rtol=RTOL)
    (vmapped,) = mesh_runs
    assert vmapped.program.mesh.axis_sizes == (2, 4)
    assert "inserted by XLA's SPMD partitioner: all-reduce" in vmapped.as_text()
    text = jax_trn2.jit(lambda x, w: 2 * f(x, w)).lower(x, w).as_text()
    assert "inserted by XLA's SPMD partitioner" in text


@pytest.mark.parametrize("bad", ["structure", "indivisible"])
def test_bad_in_shardings_under_grad_give_jax_jits_error(bad, rng):
    """in_shardings of the wrong structure, or a dim (7 rows over data=2) they do not
    divide: under jax.grad, the same error as jax.jit gives."""
    sim_shardings, cpu_shardings, x, w = sharded_loss_setup(rng)
    if bad == "structure":
        sim_shardings, cpu_shardings = sim_shardings[:1], cpu_shardings[:1]
    else:
        x = x[:7]
    with pytest.raises(ValueError) as expected:
        jax.grad(jax.jit(loss, in_shardings=cpu_shardings))(x, w)
    with pytest.raises(ValueError) as got:
        jax.grad(jax_trn2.jit(loss, in_shardings=sim_shardings))(x, w)
    assert str(got.value) == str(expected.value)
