"""mesh.optimization_level: which executor computations XLA compiles at LLVM level 2, and
that those give the bits level 3 gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mesh import optimization_level
from mesh.executor import EXECUTOR_COMPILER_OPTIONS

rng = np.random.default_rng(5)
F32 = (rng.standard_normal((24, 40)) *
       np.exp2(rng.integers(-40, 40, (24, 40)))).astype(np.float32)
I32 = rng.integers(-2**31, 2**31 - 1, (24, 40), dtype=np.int64).astype(np.int32)

# Programs whose float ops are all exactly rounded (or that have none)
LEVEL_FREE = {
    "random integers": (lambda k: jax.random.randint(jax.random.key(k), (16, 6, 7), -9, 99),
                        (np.uint32(3),)),
    "random bits": (lambda k: jax.random.bits(jax.random.key(k), (50,)), (np.uint32(8),)),
    "integer ops": (lambda x: (x * 7 + (x >> 3)) ^ (x << 2) - x // 5 + x % 9, (I32,)),
    "integer loop": (lambda x: lax.fori_loop(0, 5, lambda i, c: c * 3 + i, x), (I32,)),
    "FP32 sums and quotients": (lambda x: x + x[::-1] / (x + 2.5) - jnp.sqrt(jnp.abs(x)),
                                (F32,)),
    "narrow floats": (lambda x: (x.astype(jnp.bfloat16) + 1).astype(jnp.float32) +
                      x.astype(jnp.float8_e4m3fn).astype(jnp.float32) +
                      (x.astype(jnp.float16) / 7).astype(jnp.float32), (F32,)),
    "moves and selects": (lambda x: jnp.where(x > 0, jnp.flip(x, 0), jnp.clip(x, -3, 3))
                          .T[::2, :20] + jnp.floor(x[:20, :20]).reshape(10, 40).T.reshape(20, 20),
                          (F32,)),
    "integer reduction": (lambda x: jnp.sum(x, 0) + jnp.max(x, 1).sum(), (I32,)),
}
# Programs with float reductions, products or transcendental functions: XLA's code for
# them depends on the level
LEVEL_BOUND = {
    "product and sum": (lambda x: x * 3.1 + x[::-1], (F32,)),
    "random uniform": (lambda k: jax.random.uniform(jax.random.key(k), (16, 6, 7)),
                       (np.uint32(3),)),
    "FP32 row sum": (lambda x: jnp.sum(x, 1), (F32,)),
    "softmax": (jax.nn.softmax, (F32,)),
    "exp": (jnp.exp, (F32,)),
    "atan": (jnp.arctan, (F32,)),
    "random normal": (lambda k: jax.random.normal(jax.random.key(k), (64,)), (np.uint32(3),)),
    "complex product": (lambda x: (x + 1j * x[::-1]) * (x - 2j), (F32,)),
    "FP32 dot": (lambda x: x @ x.T, (F32,)),
}


def _module(function, args):
    return jax.jit(function).lower(*args).compiler_ir("stablehlo")


@pytest.mark.parametrize("name", LEVEL_FREE)
def test_level_free_programs_compile_at_level_2_and_give_level_3s_bits(name):
    function, args = LEVEL_FREE[name]
    options = optimization_level.compiler_options(_module(function, args))
    assert options == {"xla_backend_optimization_level": optimization_level.EXACT_LEVEL}
    results = []
    for level in (3, optimization_level.EXACT_LEVEL):
        compiled = jax.jit(function, compiler_options={
            **EXECUTOR_COMPILER_OPTIONS, "xla_backend_optimization_level": level})
        result = np.asarray(compiled(*args))
        results.append(result.view(f"u{result.dtype.itemsize}"))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("name", LEVEL_BOUND)
def test_float_reductions_products_and_approximations_keep_xlas_default_level(name):
    function, args = LEVEL_BOUND[name]
    assert optimization_level.compiler_options(_module(function, args)) == {}
