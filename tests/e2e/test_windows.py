"""reduce_window and select_and_scatter as jax emits them: cumulative reductions, pooling
and their gradients, inside shard_map bodies on the 4x4x4 mesh, compared with CPU JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from e2e_reference import assert_matches, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))

# Float tolerances: sums over a window of at most 8 FP32 terms (cumsum over 8) or a few
# gradient contributions, added in an order XLA picks: e2e_reference.FLOAT_RTOL (2**-14
# relative to the largest magnitude) covers any order. Max/min pooling and its gradient
# pick elements and are exact.


def test_cumulative_reductions(rng):
    """cumsum/cumprod/cummax/cummin (reduce_window with a padded window as long as the
    dim), forward and reversed, on floats and ints that vary along x and y."""
    x = rng.standard_normal((16, 16, 8)).astype(np.float32)
    n = rng.integers(-9, 9, (16, 16, 8)).astype(np.int32)

    def body(x, n):
        return {"cumsum": jnp.cumsum(x, axis=-1), "cumprod": jnp.cumprod(x, axis=1),
                "cummax": lax.cummax(x, axis=2, reverse=True), "cummin": lax.cummin(n, axis=1),
                "int_cumsum": jnp.cumsum(n, axis=-1),
                "logcumsumexp": lax.cumlogsumexp(x, axis=2)}

    got, want = run_both(body, *MESH, (P("x", "y"), P("x", "y")), P("x", "y"), x, n)
    assert_matches(got, want)


def test_pooling(rng):
    """2-D max, min and sum pooling (NHWC) with strides, SAME/VALID/explicit padding, base
    and window dilation, on per-chip images."""
    x = rng.standard_normal((16, 9, 8, 3)).astype(np.float32)

    def pool(x, op, init, **kw):
        return lax.reduce_window(x, init, op, (1, 3, 2, 1), kw.pop("strides", (1, 2, 2, 1)),
                                 kw.pop("padding", "SAME"), **kw)

    def body(x):
        return {"max_same": pool(x, lax.max, -jnp.inf),
                "min_valid": pool(x, lax.min, jnp.inf, padding="VALID"),
                "sum_explicit": pool(x, lax.add, 0.0, padding=((0, 0), (2, 1), (0, 3), (0, 0))),
                "max_dilated": pool(x, lax.max, -jnp.inf, strides=(1, 1, 1, 1),
                                    window_dilation=(1, 2, 2, 1)),
                "sum_base_dilated": pool(x, lax.add, 0.0, padding="VALID",
                                         base_dilation=(1, 2, 1, 1))}

    got, want = run_both(body, *MESH, P("x"), P("x"), x)
    assert_matches(got, want)


def test_variadic_reduce_window(rng):
    """A two-operand reduce_window (argmax pooling: value and index) with a reducer that
    is not a monoid, run as a scalar program."""
    x = rng.integers(-4, 4, (16, 12)).astype(np.float32)  # ties, broken by the index

    def argmax_pool(x):
        def pick(a, b):
            take_b = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
            return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

        index = lax.broadcasted_iota(jnp.int32, x.shape, 1)
        return lax.reduce_window((x, index), (-jnp.inf, jnp.int32(0)), pick, (1, 3), (1, 2),
                                 "VALID")

    got, want = run_both(argmax_pool, *MESH, P("y"), P("y"), x)
    assert_matches(got, want, exact=True)


def test_pooling_gradients(rng):
    """Gradients of max pooling (select_and_scatter with GE), min pooling (LE), average
    pooling (reduce_window over a padded cotangent) and cumsum; overlapping windows and
    ties, so some elements receive several contributions and ties pick the first."""
    x = rng.integers(-3, 3, (16, 8, 7, 2)).astype(np.float32)

    def loss(x):
        def pool(op, init, padding):
            return lax.reduce_window(x, init, op, (1, 3, 3, 1), (1, 2, 1, 1), padding)
        weights = jnp.arange(1.0, 1.0 + 8 * 7 * 2).reshape(1, 8, 7, 2)
        return (jnp.sum(pool(lax.max, -jnp.inf, "SAME") * weights[:, :4])
                + jnp.sum(pool(lax.min, jnp.inf, "VALID") ** 2)
                + jnp.sum(jnp.sin(pool(lax.add, 0.0, "SAME")))
                + jnp.sum(jnp.cumsum(x, axis=2) * weights))

    got, want = run_both(jax.grad(loss), *MESH, P("x"), P("x"), x)
    assert_matches(got, want)
