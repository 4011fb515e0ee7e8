"""jax.random (threefry, which jax lowers to integer ops in a loop, and the rbg
implementations on rng_bit_generator), rng_bit_generator itself, bitcast_convert,
reduce_precision, clamp and optimization_barrier, inside shard_map bodies on the 4x4x4
mesh with per-chip keys, compared with CPU JAX.

Random bits must be equal bit for bit: the simulator runs XLA's generators on the same
states. Floats drawn from them go through the same elementwise ops as on CPU (see
test_ops.ELEMENTWISE_ULPS), so they must be equal too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, assert_same_bits, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))
EVERY_CHIP = P(("x", "y", "z"))


def chip_key(seed, impl: str):
    """A key that differs from chip to chip: seeded with the seed plus the chip's index."""
    chip = lax.axis_index("x") * 16 + lax.axis_index("y") * 4 + lax.axis_index("z")
    return jax.random.key(seed[0] + chip.astype(jnp.uint32), impl=impl)


# Draws per implementation, few because each threefry hash is a loop the simulator unrolls.
DRAWS = {
    "threefry2x32": lambda key: {"bits": jax.random.bits(key, (1, 6)),
                                 "normal": jax.random.normal(key, (1, 4), jnp.bfloat16)},
    "rbg": lambda key: {"bits": jax.random.bits(key, (1, 6)),
                        "uniform": jax.random.uniform(key, (1, 5))},
    "unsafe_rbg": lambda key: {"bits": jax.random.bits(key, (1, 6)),
                               "randint": jax.random.randint(key, (1, 7), -5, 20),
                               "permutation": jax.random.permutation(key, 8)[None]},
}


@pytest.mark.parametrize("impl", list(DRAWS))
def test_jax_random_per_chip(impl):
    def body(seed):
        return DRAWS[impl](chip_key(seed, impl))

    got, want = run_both(body, *MESH, P(), EVERY_CHIP, np.array([7], np.uint32))
    assert_same_bits(got, want)
    assert len(np.unique(np.asarray(got["bits"])[:, 0])) == 64  # each chip its own stream


@pytest.mark.parametrize("algorithm", list(lax.RandomAlgorithm))
def test_rng_bit_generator_algorithms(algorithm):
    """lax.rng_bit_generator with each algorithm and several widths, on a per-chip state,
    and the next state it returns."""
    def body(state):
        state = state + lax.axis_index("y").astype(jnp.uint32)
        new_state, u32 = lax.rng_bit_generator(state, (2, 3), jnp.uint32, algorithm)
        _, u8 = lax.rng_bit_generator(new_state, (1, 5), jnp.uint8, algorithm)
        _, u16 = lax.rng_bit_generator(state[::-1], (1, 4), jnp.uint16, algorithm)
        return {"state": new_state[None], "u32": u32, "u8": u8, "u16": u16}

    state = np.array([1, 2, 3, 4], np.uint32)
    got, want = run_both(body, *MESH, P(), P("y"), state)
    assert_matches(got, want, exact=True)


def test_bitcast_convert(rng):
    """Same-width, narrowing (adds a last dim) and widening (consumes it) bitcasts."""
    x = rng.standard_normal((16, 6)).astype(np.float32)
    h = rng.standard_normal((16, 6)).astype(ml_dtypes.bfloat16)

    def body(x, h):
        return {"f32_to_i32": lax.bitcast_convert_type(x, jnp.int32),
                "f32_to_u8": lax.bitcast_convert_type(x, jnp.uint8),
                "u16_to_f32": lax.bitcast_convert_type(
                    lax.bitcast_convert_type(x, jnp.uint16), jnp.float32),
                "bf16_to_i16": lax.bitcast_convert_type(h, jnp.int16)}

    got, want = run_both(body, *MESH, (P("x"), P("y")), EVERY_CHIP, x, h)
    assert_matches(got, want, exact=True)


def test_reduce_precision(rng):
    """Rounding to bf16-, fp16- and fp8-like formats in place: halfway cases round to even,
    overflow goes to infinity, NaN stays NaN (compared as bits)."""
    x = (rng.standard_normal((16, 16)) * np.exp2(rng.integers(-20, 20, (16, 16))))
    x[0, :4] = [np.nan, np.inf, 1e30, 1.0 + 2.0 ** -8]
    x = x.astype(np.float32)

    def body(x):
        return {f"e{e}m{m}": lax.reduce_precision(x, e, m)
                for e, m in ((8, 7), (5, 10), (4, 3), (5, 2), (3, 1))}

    got, want = run_both(body, *MESH, P("x"), P("x"), x)
    assert_same_bits(got, want)


def test_clamp_and_optimization_barrier(rng):
    """lax.clamp with per-chip bounds (scalar and array), and jax.checkpoint's
    optimization_barrier inside a gradient."""
    x = rng.standard_normal((16, 8)).astype(np.float32)
    n = rng.integers(-20, 20, (16, 8)).astype(np.int32)

    def body(x, n):
        low = lax.axis_index("y").astype(jnp.float32) * 0.25 - 0.5
        barrier_grad = jax.grad(jax.checkpoint(lambda v: jnp.sum(jnp.sin(v) ** 2)))(x)
        return {"scalar_bounds": lax.clamp(low, x, low + 0.5),
                "array_bounds": lax.clamp(jnp.full_like(x, low), x, jnp.abs(x[::-1])),
                "int": lax.clamp(-3 * lax.axis_index("z"), n, 7),
                "barrier": lax.optimization_barrier((x * 2, n))[0],
                "checkpointed_grad": barrier_grad}

    got, want = run_both(body, *MESH, (P("x"), P("x")), EVERY_CHIP, x, n)
    assert_matches(got, want)


# --- stablehlo.rng (lax.rng_uniform): bits of the implementation's choosing --------------

RNG_TEXT = """module @m {{
  func.func public @main(%a: tensor<{t}>, %b: tensor<{t}>) -> tensor<{shape}x{t}> {{
    %s = stablehlo.constant dense<[{dims}]> : tensor<{rank}xi64>
    %r = stablehlo.rng %a, %b, %s, distribution = {distribution}
      : (tensor<{t}>, tensor<{t}>, tensor<{rank}xi64>) -> tensor<{shape}x{t}>
    return %r : tensor<{shape}x{t}>
  }}
}}"""


def run_rng(distribution, mlir_type, dtype, a, b, shape=(256, 256)):
    text = RNG_TEXT.format(t=mlir_type, shape="x".join(map(str, shape)), rank=len(shape),
                           dims=", ".join(map(str, shape)), distribution=distribution)
    executable = jax_trn2.client().compile(text)
    args = [np.asarray(a, dtype), np.asarray(b, dtype)]
    return np.asarray(executable.execute(args)[0]), np.asarray(executable.execute(args)[0])


@pytest.mark.parametrize("mlir_type, dtype, a, b", [
    ("f32", np.float32, -2.0, 3.0), ("f64", np.float64, 1.0, 1.5),
    ("bf16", ml_dtypes.bfloat16, 0.0, 1.0), ("f8E4M3FN", ml_dtypes.float8_e4m3fn, -1.0, 0.0),
    ("f8E8M0FNU", ml_dtypes.float8_e8m0fnu, 0.25, 8.0)])
def test_rng_uniform_floats_lie_in_a_to_b(mlir_type, dtype, a, b):
    """Uniform on [a, b), rounded to the type: b itself never appears, even where rounding
    the FP32 draw would reach it (near 1 in BF16, near 0 in FP8); the mean is (a + b) / 2
    within 5 standard errors (the type's rounding shifts it by far less), and a second run
    draws the same numbers."""
    got, again = run_rng("UNIFORM", mlir_type, dtype, a, b)
    assert got.dtype == dtype and got.shape == (256, 256)
    np.testing.assert_array_equal(got, again)
    values = got.astype(np.float64)
    assert values.min() >= a and values.max() < b
    if mlir_type != "f8E8M0FNU":  # powers of two only: not uniform, but within bounds
        assert abs(values.mean() - (a + b) / 2) < 5 * (b - a) / np.sqrt(12 * values.size)


@pytest.mark.parametrize("mlir_type, dtype, a, b", [
    ("i32", np.int32, -3, 4), ("ui8", np.uint8, 250, 255), ("i4", ml_dtypes.int4, -8, 7),
    ("i64", np.int64, -2**40, 2**40)])
def test_rng_uniform_integers_take_every_value_in_a_to_b(mlir_type, dtype, a, b):
    got, _ = run_rng("UNIFORM", mlir_type, dtype, a, b, shape=(64, 64))
    assert got.dtype == dtype
    values = got.astype(np.int64)
    assert values.min() >= a and values.max() < b
    if b - a < 16:
        assert set(np.unique(values)) == set(range(a, b))


@pytest.mark.parametrize("mlir_type, dtype", [("f32", np.float32), ("bf16", ml_dtypes.bfloat16)])
def test_rng_normal_has_mean_a_and_standard_deviation_b(mlir_type, dtype):
    got, _ = run_rng("NORMAL", mlir_type, dtype, 5.0, 2.0)
    values = got.astype(np.float64)
    n = values.size
    assert abs(values.mean() - 5.0) < 5 * 2.0 / np.sqrt(n)
    assert abs(values.std() - 2.0) < 5 * 2.0 / np.sqrt(2 * n) + 2.0 * 2.0 ** -8  # + BF16's


def test_lax_rng_uniform_runs_per_op_and_per_chip_bounds():
    """Two ops draw different numbers; in a shard_map whose bounds differ per chip each
    chip draws in its own interval."""
    mesh = jax_trn2.make_mesh()

    def body(offset):
        return lax.rng_uniform(offset[0], offset[0] + 1.0, (1, 100))

    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=EVERY_CHIP,
                                      out_specs=EVERY_CHIP))
    got = np.asarray(step(np.arange(64, dtype=np.float32)))
    assert got.shape == (64, 100)
    assert (np.floor(got) == np.arange(64)[:, None]).all()
    first, second = jax_trn2.jit(lambda: (lax.rng_uniform(0.0, 1.0, (100,)),
                                          lax.rng_uniform(0.0, 1.0, (100,))))()
    assert not np.array_equal(first, second)
