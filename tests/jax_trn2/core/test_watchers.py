"""A replacement of jax's lowering of jaxprs (mlir.jaxpr_subcomp, which jax's own tests
install to collect the jaxprs jax lowers) sees the caller's jaxprs on trn2, as on any
backend: never the simulator's own jax computations (its constant folding, its executor),
and still the caller's after the simulator ran."""

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir


def test_a_replaced_jaxpr_lowering_sees_only_the_callers_jaxprs():
    device = jax.devices("trn2")[0]
    x = jax.device_put(np.float32(1), device)
    # jnp.arange(4) * 2 is a constant the simulator's lowering folds with jax
    f = jax.jit(lambda x: x + jnp.arange(4, dtype=jnp.float32) * 2)
    jax_own = mlir.jaxpr_subcomp
    seen = []

    def collect(ctx, jaxpr, *args, **kwargs):
        seen.append(jaxpr)
        return jax_own(ctx, jaxpr, *args, **kwargs)

    mlir.jaxpr_subcomp = collect
    try:
        np.testing.assert_array_equal(f(x), [1, 3, 5, 7])
        assert [[e.primitive.name for e in j.eqns] for j in seen] == [["iota", "mul", "add"]]
        jax.jit(lambda y: y * 3).lower(1.0)  # the caller's later lowerings still reach it
        assert len(seen) == 2
    finally:
        mlir.jaxpr_subcomp = jax_own
