"""Matmuls on the Tensor Engine model against a float64 reference (with the error bound of the
accumulation model) and against CPU JAX; stochastic rounding of matmul outputs; FP8
overflow and NaN through matmuls, per format.

The bound (mesh.numerics): a dot product of length K runs in passes of P = min(K, 128) summed
in FP32, n = ceil(K / 128) passes added into PSUM in FP32, so every product meets at most
h = (P - 1) + (n - 1) FP32 roundings on its way to the result (one more for FP32 inputs,
whose products are rounded; `extra` more for partial sums added afterwards, e.g. a psum).
With u = 2**-24:  |acc - exact| <= gamma(h) * sum_k |a_k b_k|,  gamma(h) = h u / (1 - h u),
and rounding acc once to the output type adds at most half an ulp of the output at the
result (RNE never moves to a smaller binade, so the ulp at the result bounds the ulp at acc).
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2.reports.numerics import ulp
from tests.mesh.test_native_pass_matmul import reference_bf16

U = 2.0 ** -24  # FP32 unit roundoff
PASS = 128  # contraction rows of one Tensor Engine pass
INPUTS = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3",
          "float8_e3m4", "float32")
# (batch, M, K, N): K one row over a pass, several passes with a short last one, K = 1;
# odd M and N throughout.
SHAPES = [((), 5, 129, 3), ((2,), 7, 300, 9), ((), 3, 1, 5)]


def gamma(h: int) -> float:
    return h * U / (1 - h * U)


def roundings(k: int, fp32_inputs: bool, extra: int = 0) -> int:
    """FP32 roundings a product meets in the Tensor Engine model (h above)."""
    return (min(k, PASS) - 1) + (math.ceil(k / PASS) - 1) + int(fp32_inputs) + extra


def operands(rng, name, batch, m, k, n):
    """Normals for a and normals / sqrt(K) for b, so that the products' sums are about 1:
    within every format's range (FP8 E3M4 tops at 15.5), with b reaching into the FP8
    subnormals."""
    dtype = jnp.dtype(name)
    a = rng.standard_normal(batch + (m, k)).astype(dtype)
    b = (rng.standard_normal(batch + (k, n)) / math.sqrt(k)).astype(dtype)
    return a, b


def exact_product(a, b):
    """(a @ b, |a| @ |b|) in float64: exact for these sizes up to float64's own rounding,
    some 2**29 times below the bounds here."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.matmul(a64, b64), np.matmul(np.abs(a64), np.abs(b64))


def matmuls(out_dtype):
    """All of SHAPES in one program: (a0, b0, a1, b1, ...) -> their products."""
    def f(*pairs):
        return tuple(jnp.matmul(a, b, preferred_element_type=out_dtype)
                     for a, b in zip(pairs[::2], pairs[1::2]))
    return f


def assert_within_bound(got, a, b, fp32_inputs, extra=0):
    exact, magnitude = exact_product(a, b)
    k = a.shape[-1]
    got64 = np.asarray(got, np.float64)
    bound = gamma(roundings(k, fp32_inputs, extra)) * magnitude
    if got.dtype != np.float32:  # one rounding to the narrow output type
        bound = bound + ulp(got64, got.dtype) / 2
    excess = np.abs(got64 - exact) - bound
    assert (excess <= 0).all(), (got.dtype, k, np.unravel_index(np.argmax(excess), got.shape))


@pytest.mark.parametrize("name", INPUTS)
def test_matmul_within_the_accumulation_bound(name, rng):
    pairs = [x for shape in SHAPES for x in operands(rng, name, *shape)]
    results = list(jax_trn2.jit(matmuls(jnp.float32))(*pairs))
    if name != "float32":
        results += jax_trn2.jit(matmuls(None))(*pairs)  # rounded once to the input type
    for got, a, b in zip(results, pairs[::2] * 2, pairs[1::2] * 2):
        assert_within_bound(got, a, b, name == "float32")


@pytest.mark.parametrize("name", INPUTS)
@pytest.mark.parametrize("k", [16, 128, 129])
def test_matmul_of_a_transposed_operand_within_the_bound(name, k, rng):
    """x.T @ g, the weight gradient of every matmul: its left operand contracts along its
    first dim (one pass up to K = 128, two after)."""
    x, g = operands(rng, name, (), k, 8, 4)[0], operands(rng, name, (), k, 4, 8)[0]
    got = jax_trn2.jit(lambda x, g: jax.lax.dot_general(
        x, g, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32))(x, g)
    assert_within_bound(got, np.asarray(x).T, g, name == "float32")


@pytest.mark.parametrize("name", ["float4_e2m1fn", "int4"])
@pytest.mark.parametrize("k", [100, 300])
def test_sub_byte_operands_over_one_pass_and_several_are_exact(name, k, rng):
    """FP4 and int4 operands (converted before the pass loop: there is no unsigned integer
    of their width to cut passes from as bits). Their products are multiples of 1/4 of at
    most 64 in magnitude, so sums of 300 of them are exact in FP32: every element must be
    the exact product."""
    dtype = jnp.dtype(name)
    if name == "int4":
        values = np.arange(-8, 8)
    else:
        values = np.unique(np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64))
    a = rng.choice(values, (5, k)).astype(dtype)
    b = rng.choice(values, (k, 7)).astype(dtype)
    got = jax_trn2.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))(a, b)
    exact, _ = exact_product(a, b)
    np.testing.assert_array_equal(np.asarray(got, np.float64), exact)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float32"])
def test_matmul_agrees_with_cpu_jax(name, rng):
    # CPU JAX sums in FP32 in its own order (any order: gamma(K - 1) at most) and, for FP8
    # outputs, rounds via float16 first (its HLO converts f32 -> f16 -> f8): both results lie
    # within their bounds of the exact value, so they are within the sum of the bounds of
    # each other, plus two output ulps for the two (or three) final roundings.
    pairs = [x for shape in SHAPES for x in operands(rng, name, *shape)]
    fun = matmuls(None)
    got = jax_trn2.jit(fun)(*pairs)
    want = jax.jit(fun)(*pairs)
    for g, w, a, b in zip(got, want, pairs[::2], pairs[1::2]):
        _, magnitude = exact_product(a, b)
        k = a.shape[-1]
        fp32 = name == "float32"
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        tolerance = (gamma(roundings(k, fp32)) + gamma(k - 1 + fp32)) * magnitude
        if g.dtype != np.float32:
            tolerance = tolerance + 2 * ulp(np.maximum(np.abs(g64), np.abs(w64)), g.dtype)
        assert (np.abs(g64 - w64) <= tolerance).all()


def test_one_pass_is_the_pe_arrays_sum_and_several_are_not_one_gemms(rng):
    """benchmarks/pass_order.py's figures (docs/benchmarks.md): at K = 128 the model sums
    one pass as the native loop sums every pass (a chain of BF16 dot instructions:
    reference_bf16, on any host; on an AMD Zen 4 also the host GEMM's order, so nothing
    differs from CPU JAX there); at K = 512 four passes add in PSUM in another order than
    one GEMM's, and most results differ from CPU JAX's."""
    fun = lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)
    a = jnp.asarray(rng.standard_normal((512, 128)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((128, 512)), jnp.bfloat16)
    np.testing.assert_array_equal(jax_trn2.jit(fun)(a, b),
                                  reference_bf16(np.asarray(a), np.asarray(b), 128))
    a = jnp.asarray(rng.standard_normal((512, 512)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((512, 512)), jnp.bfloat16)
    got, want = np.asarray(jax_trn2.jit(fun)(a, b)), np.asarray(jax.jit(fun)(a, b))
    assert int((got.view(np.uint32) != want.view(np.uint32)).sum()) > 512 * 512 // 2


def test_sharded_matmul_with_fp32_psum_within_the_bound(rng):
    # K = 4 * 75 split over 'y': each chip does a 75-long dot (one pass), the psum adds the
    # 4 FP32 partials along the ring: 3 more roundings.
    mesh = jax_trn2.make_mesh()
    a, b = operands(rng, "bfloat16", (4,), 5, 300, 3)

    def body(a, b):
        partial = jnp.matmul(a, b, preferred_element_type=jnp.float32)
        return jax.lax.psum(partial, "y")

    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x", None, "y"),
                                                                P("x", "y", None)),
                                      out_specs=P("x")))
    got = step(a, b)
    exact, magnitude = exact_product(a, b)
    bound = gamma(roundings(75, False, extra=3)) * magnitude
    assert (np.abs(np.asarray(got, np.float64) - exact) <= bound).all()


def test_stochastic_rounding_of_matmul_outputs_is_unbiased():
    # Every output is 1 + 2**-9 exactly in FP32: a quarter of a BF16 ulp (2**-7) above 1.
    # Round-to-nearest always gives 1 (bias -2**-9); stochastic rounding gives 1 + 2**-7
    # with probability 1/4, so the mean of the outputs is 1 + 2**-9 up to sampling noise.
    m = n = 64
    a = np.tile(np.array([[1.0, 2.0 ** -9]], ml_dtypes.bfloat16), (m, 1))
    b = np.ones((2, n), ml_dtypes.bfloat16)
    x = 1 + 2.0 ** -9
    nearest = jax_trn2.jit(jnp.matmul)(a, b)
    np.testing.assert_array_equal(np.asarray(nearest, np.float64), 1.0)
    stochastic = jax_trn2.jit(jnp.matmul, rounding="stochastic", seed=0)
    got = np.asarray(stochastic(a, b), np.float64)
    assert set(np.unique(got)) == {1.0, 1 + 2.0 ** -7}
    # Mean of m*n two-point draws, spread 2**-7, p = 1/4: sigma = 2**-7 sqrt(3/16 / 4096)
    # ~ 5.3e-5; 5 sigma is still 7x below the round-to-nearest bias.
    sigma = 2.0 ** -7 * math.sqrt(0.25 * 0.75 / (m * n))
    assert abs(got.mean() - x) <= 5 * sigma
    np.testing.assert_array_equal(got, np.asarray(stochastic(a, b), np.float64))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3",
                                  "float8_e3m4"])
def test_fp8_matmul_overflow_and_nan_per_format(name):
    # Row 0 sums beyond the format's largest value (NaN for e4m3fn, +inf otherwise), row 1
    # holds a NaN input, row 2 stays in range. Compared bit for bit with CPU JAX.
    dtype = jnp.dtype(name)
    big = float(ml_dtypes.finfo(dtype).max)
    a = np.array([[big, big], [np.nan, 1.0], [1.0, 0.5]], dtype)
    b = np.ones((2, 3), dtype)
    fp8 = lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype)
    got = np.asarray(jax_trn2.jit(fp8)(a, b)).astype(np.float32)
    want = np.asarray(jax.jit(fp8)(a, b)).astype(np.float32)
    overflow = np.nan if name == "float8_e4m3fn" else np.inf
    np.testing.assert_array_equal(got[0], overflow)
    assert np.isnan(got[1]).all() and (got[2] == 1.5).all()
    np.testing.assert_array_equal(got, want)
