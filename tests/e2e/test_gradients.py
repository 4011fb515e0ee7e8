"""jax.grad / jax.vjp through shard_map bodies on the 4x4x4 mesh, against CPU JAX.

Reverse mode emits the transposes of the forward collectives: psum of cotangents (for
values a collective or pvary replicated), reduce_scatter for all_gather and back, the
reversed ppermute, the inverse all_to_all, and loops run backwards over saved residuals."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, cpu_mesh

SHAPE, NAMES = (4, 4, 4), ("x", "y", "z")
RING_X = [(i, (i + 1) % 4) for i in range(4)]


def both_grads(make_loss, *args, argnums=0):
    """(simulated, CPU) jax.grad of the scalar loss `make_loss(mesh)` at `args`."""
    sim = jax_trn2.jit(jax.grad(make_loss(jax_trn2.make_mesh(SHAPE, NAMES)), argnums))
    ref = jax.jit(jax.grad(make_loss(cpu_mesh(SHAPE, NAMES)), argnums))
    return sim(*args), ref(*args)


def shard_mapped(body, in_specs, out_specs=P()):
    return lambda mesh: jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def test_grad_of_data_parallel_loss_psums_replicated_weight_grads(rng):
    """The weight is replicated (in_spec P()): its cotangent is summed over every chip."""
    def loss(w, x):
        return jax.lax.psum(jnp.sum(jnp.tanh(x @ w) ** 2), NAMES)

    w = rng.standard_normal((8, 4)).astype(np.float32) * 0.3
    x = rng.standard_normal((64, 8)).astype(np.float32)
    got, want = both_grads(shard_mapped(loss, (P(), P(NAMES))), w, x, argnums=(0, 1))
    assert_matches(got, want)


def test_grad_through_all_gather_is_a_reduce_scatter(rng):
    def loss(w, x):
        full = jax.lax.all_gather(w, "y", axis=1, tiled=True)
        return jax.lax.psum(jnp.sum(jnp.sin(x @ full)), ("x", "y"))

    w = rng.standard_normal((8, 16)).astype(np.float32)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    make_loss = shard_mapped(loss, (P(None, "y"), P("x")))
    got, want = both_grads(make_loss, w, x)
    assert_matches(got, want)
    text = jax.jit(jax.grad(make_loss(jax_trn2.make_mesh()))).lower(w, x).as_text()
    assert "reduce_scatter" in text


def test_grad_through_psum_scatter_is_an_all_gather(rng):
    def loss(x):
        part = jax.lax.psum_scatter(x * x, "z", scatter_dimension=0, tiled=True)
        return jax.lax.psum(jnp.sum(jnp.cos(part)), ("x", "z"))

    x = rng.standard_normal((16, 8)).astype(np.float32)
    got, want = both_grads(shard_mapped(loss, (P("x", "z"),)), x)
    assert_matches(got, want)


def test_grad_through_ppermute_and_all_to_all(rng):
    def loss(w, x):
        h = jnp.tanh(x @ w)
        h = jax.lax.ppermute(h, "x", RING_X)
        h = jax.lax.all_to_all(h, "z", 1, 0, tiled=True)
        weights = jnp.arange(h.size, dtype=h.dtype).reshape(h.shape)  # not symmetric
        return jax.lax.psum(jnp.sum(weights * h), ("x", "z"))

    w = rng.standard_normal((8, 16)).astype(np.float32) * 0.5
    x = rng.standard_normal((16, 8)).astype(np.float32)
    got, want = both_grads(shard_mapped(loss, (P(), P("x"))), w, x, argnums=(0, 1))
    assert_matches(got, want)


def test_vjp_with_sharded_cotangents(rng):
    """jax.vjp of a sharded-output function: the cotangent enters split like the output."""
    def forward(mesh):
        def body(w, x):
            return jax.lax.psum(x @ w, "y") * jax.lax.axis_index("z")
        return jax.shard_map(body, mesh=mesh, in_specs=(P("y", None), P("x", "y")),
                             out_specs=P(("x", "z")))

    def pullback(mesh):
        def run(w, x, ct):
            _, vjp = jax.vjp(forward(mesh), w, x)
            return vjp(ct)
        return run

    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    ct = rng.standard_normal((64, 4)).astype(np.float32)
    got = jax_trn2.jit(pullback(jax_trn2.make_mesh(SHAPE, NAMES)))(w, x, ct)
    want = jax.jit(pullback(cpu_mesh(SHAPE, NAMES)))(w, x, ct)
    assert_matches(got, want)


def test_grad_through_scan_with_collectives(rng):
    """Reverse mode runs the loop backwards: a forward scan saves residuals, a second
    while loop walks them in reverse with the transposed collectives."""
    def loss(w, xs):
        def step(h, x):
            y_weight = 1.0 + jax.lax.axis_index("y")
            h = jnp.tanh(h @ w + jax.lax.psum(x * y_weight, "y"))
            return jax.lax.ppermute(h, "x", RING_X), None
        h0 = jax.lax.pcast(jnp.zeros((4, 8), jnp.float32), ("x",), to="varying")
        h, _ = jax.lax.scan(step, h0, xs)
        return jax.lax.psum(jnp.sum(h ** 2), "x")

    w = rng.standard_normal((8, 8)).astype(np.float32) * 0.4
    xs = rng.standard_normal((3, 16, 8)).astype(np.float32)
    got, want = both_grads(shard_mapped(loss, (P(), P(None, "x"))), w, xs, argnums=(0, 1))
    assert_matches(got, want)


def test_grad_through_cond_on_axis_index(rng):
    def loss(x):
        y = jax.lax.cond(jax.lax.axis_index("x") < 2, jnp.sin, lambda v: v ** 3, x)
        return jax.lax.psum(jnp.sum(y), "x")

    x = rng.standard_normal((16, 4)).astype(np.float32)
    got, want = both_grads(shard_mapped(loss, (P("x"),)), x)
    assert_matches(got, want)


def test_grad_taken_inside_the_shard_map_body(rng):
    """Each chip differentiates its own loss and the gradients are averaged with pmean,
    as data-parallel training does."""
    def body(w, x):
        grads = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return jax.lax.pmean(grads, NAMES)

    w = rng.standard_normal((8, 4)).astype(np.float32)
    x = rng.standard_normal((128, 8)).astype(np.float32)
    specs = (P(), P(NAMES)), P()
    sim = jax_trn2.jit(jax.shard_map(body, mesh=jax_trn2.make_mesh(), in_specs=specs[0],
                                     out_specs=specs[1]))
    ref = jax.jit(jax.shard_map(body, mesh=cpu_mesh(SHAPE, NAMES), in_specs=specs[0],
                                out_specs=specs[1]))
    assert_matches(sim(w, x), ref(w, x))
