"""Every StableHLO element type: 2- and 4-bit integers computed at their width, the FNUZ,
E8M0 and MX float formats with exact conversions, bitcasts between types of any width
(booleans included), and tuple types. Compared with CPU JAX where jax has the type, else
with ml_dtypes and the StableHLO spec's own examples (its interpreter tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import ml_dtypes
import numpy as np
import pytest

import jax_trn2


def run(text: str, *args) -> list[np.ndarray]:
    return [np.asarray(r) for r in jax_trn2.client().compile(text).execute(list(args))]


def module(arguments: str, results: str, body: str) -> str:
    return (f"module @m {{\n  func.func public @main({arguments}) -> ({results}) {{\n{body}"
            "\n  }\n}")


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Exactly equal: same dtype and the same bit pattern in every element (-0.0 is not
    0.0), or NaN in both (the spec leaves a NaN's sign and payload to the implementation)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    unsigned = np.dtype(f"uint{8 * got.dtype.itemsize}")
    bad = got.view(unsigned) != want.view(unsigned)
    if np.issubdtype(got.dtype, np.floating) or got.dtype.name.startswith("float"):
        bad &= ~(np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
    assert not bad.any(), (got[bad], want[bad])


# --- 2- and 4-bit integers ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.int2, jnp.int4, jnp.uint2, jnp.uint4])
def test_sub_byte_integers_wrap_around_as_cpu_jax(dtype):
    """Every pair of values: arithmetic wraps around at the type's width, conversions
    from a wider type keep the low bits, comparisons and shifts are the type's."""
    info = ml_dtypes.iinfo(dtype)
    values = np.arange(info.min, info.max + 1)
    x, y = (a.ravel().astype(dtype) for a in np.meshgrid(values, values))

    def f(x, y):
        return (x + y, x * y, x - y, -x, x & y, x ^ ~y, jnp.maximum(x, y), x < y,
                (x.astype(jnp.int8) * 3).astype(dtype), x << (y & 1), x >> (y & 1),
                x.astype(jnp.float32), lax.reduce(x, np.array(0, dtype), lax.add, (0,)))

    for got, want in zip(jax_trn2.jit(f)(x, y), jax.jit(f)(x, y), strict=True):
        same_bits(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", [jnp.int2, jnp.uint4])
def test_sub_byte_integers_in_variadic_reductions_sorts_and_top_k(dtype):
    """argmax (a two-operand reduce), a key-value sort, argsort and top_k, which XLA on CPU
    rejects for sub-byte operands (so CPU JAX cannot run them): compared with the same
    program on the values as 8-bit integers, which order the same way."""
    info = ml_dtypes.iinfo(dtype)
    rng = np.random.default_rng(1)
    x = rng.integers(info.min, info.max, (3, 9), endpoint=True).astype(dtype)
    payload = np.arange(27, dtype=np.int32).reshape(3, 9)

    def f(x, payload):
        return (jnp.argmax(x, axis=1), lax.sort((x, payload), num_keys=1),
                jnp.argsort(x, axis=1, stable=True), lax.top_k(x, 4))

    wide = np.int8 if info.min < 0 else np.uint8
    want = jax.tree.map(lambda w: np.asarray(w).astype(dtype) if w.dtype == wide else w,
                        jax.jit(f)(x.astype(wide), payload))
    got = jax_trn2.jit(f)(x, payload)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        same_bits(np.asarray(g), np.asarray(w))


# --- narrow float formats ----------------------------------------------------------------

NARROW_FLOATS = {  # MLIR spelling -> ml_dtypes type
    "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "f8E4M3B11FNUZ": ml_dtypes.float8_e4m3b11fnuz, "f8E8M0FNU": ml_dtypes.float8_e8m0fnu,
    "f8E4M3": ml_dtypes.float8_e4m3, "f8E3M4": ml_dtypes.float8_e3m4,
    "f4E2M1FN": ml_dtypes.float4_e2m1fn, "f6E2M3FN": ml_dtypes.float6_e2m3fn,
    "f6E3M2FN": ml_dtypes.float6_e3m2fn,
}


def every_value(dtype) -> np.ndarray:
    bits = ml_dtypes.finfo(dtype).bits
    return np.arange(2 ** bits, dtype=np.uint8).view(dtype)


def conversion_inputs(dtype) -> np.ndarray:
    """FP32 values that probe a conversion: every value of the format, the midpoints between
    neighbours and their FP32 neighbours (ties go to even), beyond the largest value,
    subnormals, infinities, NaNs and random bit patterns."""
    values = every_value(dtype).astype(np.float32)
    finite = np.unique(values[np.isfinite(values)])
    mids = (finite[1:] + finite[:-1]) / 2
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN values, beyond FP32's range
        return np.concatenate([
            values, mids, np.nextafter(mids, -np.inf), np.nextafter(mids, np.inf),
            finite * 1.5, finite * 4, [np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3e38],
            rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        ]).astype(np.float32)


# Formats XLA:CPU has no conversion for ("Invalid XLA PrimitiveType"): ml_dtypes is the
# reference there.
NOT_IN_XLA_CPU = {"f6E2M3FN", "f6E3M2FN"}


def rounded_as_jax_does(x: np.ndarray, spelling: str) -> np.ndarray:
    """FP32 values rounded to a narrow format as CPU JAX rounds them (XLA:CPU's
    conversion), the simulator's reference; ml_dtypes' where XLA:CPU lacks the format.
    ml_dtypes is not the reference elsewhere: its releases have rounded differently from
    XLA (0.7.0's FP32 -> float8_e8m0fnu near 2**-127)."""
    dtype = NARROW_FLOATS[spelling]
    if spelling not in NOT_IN_XLA_CPU:
        on_cpu = jax.device_put(x, jax.devices("cpu")[0])
        return np.asarray(jax.jit(lambda v: v.astype(dtype))(on_cpu))
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(dtype)
    if not np.isnan(every_value(dtype).astype(np.float32)).any():
        # A format without NaN: XLA converts a NaN to -0.0 (ml_dtypes keeps the opposite of
        # the NaN's sign).
        want[np.isnan(x)] = -0.0
    return want


@pytest.mark.parametrize("spelling", NARROW_FLOATS)
def test_conversions_to_and_from_narrow_floats_are_exact(spelling):
    """FP32 -> the format rounds as CPU JAX does (to nearest even, the format's own
    overflow: NaN, saturation or inf), bit for bit; the format -> FP32 and -> int32 are
    exact; every value survives a round trip through FP32."""
    dtype = NARROW_FLOATS[spelling]
    x = conversion_inputs(dtype)
    n = x.size
    values = every_value(dtype)
    m = values.size
    text = module(f"%x: tensor<{n}xf32>, %v: tensor<{m}x{spelling}>",
                  f"tensor<{n}x{spelling}>, tensor<{m}xf32>, tensor<{m}x{spelling}>", f"""
    %0 = stablehlo.convert %x : (tensor<{n}xf32>) -> tensor<{n}x{spelling}>
    %1 = stablehlo.convert %v : (tensor<{m}x{spelling}>) -> tensor<{m}xf32>
    %2 = stablehlo.convert %1 : (tensor<{m}xf32>) -> tensor<{m}x{spelling}>
    return %0, %1, %2 : tensor<{n}x{spelling}>, tensor<{m}xf32>, tensor<{m}x{spelling}>""")
    rounded, widened, round_trip = run(text, x, values)
    same_bits(rounded, rounded_as_jax_does(x, spelling))
    same_bits(widened, values.astype(np.float32))
    same_bits(round_trip, values)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz,
                                   jnp.float8_e4m3b11fnuz, jnp.float8_e8m0fnu, jnp.float4_e2m1fn])
def test_narrow_float_arithmetic_matches_cpu_jax(dtype):
    """Every pair of values: computed in FP32 and rounded once to the format (the Vector
    Engine's model, mesh.numerics), which is what CPU JAX gives, bit for bit."""
    values = every_value(dtype)
    x, y = (a.ravel() for a in np.meshgrid(values, values))
    integers = np.arange(-x.size // 2, x.size - x.size // 2, dtype=np.int32)

    def f(x, y, i):
        return x * y, x + y, x / y, jnp.maximum(x, y), x < y, i.astype(dtype)

    for got, want in zip(jax_trn2.jit(f)(x, y, integers), jax.jit(f)(x, y, integers),
                         strict=True):
        same_bits(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("spelling", ["f6E2M3FN", "f6E3M2FN"])
def test_fp6_arithmetic_rounds_once_from_fp32(spelling):
    """The FP6 formats, which the host's XLA cannot compute with: every pair of values,
    each result FP32's result rounded to the format (as ml_dtypes rounds)."""
    dtype = NARROW_FLOATS[spelling]
    values = every_value(dtype)
    x, y = (a.ravel() for a in np.meshgrid(values, values))
    n = x.size
    t = f"tensor<{n}x{spelling}>"
    text = module(f"%x: {t}, %y: {t}, %i: tensor<{n}xi32>", f"{t}, {t}, {t}, {t}, {t}", f"""
    %0 = stablehlo.multiply %x, %y : {t}
    %1 = stablehlo.add %x, %y : {t}
    %2 = stablehlo.divide %x, %y : {t}
    %3 = stablehlo.exponential %x : {t}
    %4 = stablehlo.convert %i : (tensor<{n}xi32>) -> {t}
    return %0, %1, %2, %3, %4 : {t}, {t}, {t}, {t}, {t}""")
    integers = np.arange(-n // 2, n - n // 2, dtype=np.int32)
    got = run(text, x, y, integers)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    with np.errstate(all="ignore"):
        want = [x32 * y32, x32 + y32, x32 / y32, np.exp(x32), integers.astype(np.float32)]
        for g, w in zip(got, want, strict=True):
            rounded = w.astype(np.float32).astype(dtype)
            rounded[np.isnan(w)] = -0.0  # 0/0: XLA's conversion of a NaN (see above)
            same_bits(g, rounded)


def test_mx_formats_through_a_program():
    """FP6 values (which the host's XLA cannot hold) as arguments, constants, iota and
    results: each op's FP32 result is rounded to the format, beyond its range saturating."""
    f6 = ml_dtypes.float6_e2m3fn
    x = np.array([7, -8, 3, -1], np.float32)
    c = np.array([1.0, 0.5, 7.5, -0.125], f6)
    text = module("%x: tensor<4xf32>, %c: tensor<4xf6E2M3FN>",
                  "tensor<4xf6E2M3FN>, tensor<4xi1>, tensor<4xf6E3M2FN>", """
    %0 = stablehlo.convert %x : (tensor<4xf32>) -> tensor<4xf6E2M3FN>
    %1 = stablehlo.multiply %0, %0 : tensor<4xf6E2M3FN>
    %2 = stablehlo.add %1, %c : tensor<4xf6E2M3FN>
    %k = stablehlo.constant dense<[0.25, 28.0, -0.0625, 3.0]> : tensor<4xf6E3M2FN>
    %i = stablehlo.iota dim = 0 : tensor<4xf6E3M2FN>
    %3 = stablehlo.subtract %k, %i : tensor<4xf6E3M2FN>
    %4 = stablehlo.compare LT, %2, %c : (tensor<4xf6E2M3FN>, tensor<4xf6E2M3FN>) -> tensor<4xi1>
    return %2, %4, %3 : tensor<4xf6E2M3FN>, tensor<4xi1>, tensor<4xf6E3M2FN>""")
    total, less, difference = run(text, x, c)
    first = x.astype(f6).astype(np.float32)
    want = ((first * first).astype(f6).astype(np.float32) + c.astype(np.float32)).astype(f6)
    same_bits(total, want)
    np.testing.assert_array_equal(less, want.astype(np.float32) < c.astype(np.float32))
    same_bits(difference, np.array([0.25, 27, -2.0625, 0], np.float32)
              .astype(ml_dtypes.float6_e3m2fn))


def test_fp6_sort_reduce_and_sqrt():
    """A total-order sort (-0 before +0), a sum rounded once to FP6 E3M2 (-23.6875 is -24
    on its grid) and sqrt of a negative value (NaN, which FP6 has not: -0, as XLA
    converts)."""
    t = "tensor<6xf6E3M2FN>"
    text = module(f"%x: {t}", f"{t}, tensor<f6E3M2FN>, {t}", f"""
    %0 = "stablehlo.sort"(%x) ({{
      ^bb0(%a: tensor<f6E3M2FN>, %b: tensor<f6E3M2FN>):
        %c = stablehlo.compare LT, %a, %b, TOTALORDER
          : (tensor<f6E3M2FN>, tensor<f6E3M2FN>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
    }}) {{dimension = 0 : i64, is_stable = true}} : ({t}) -> {t}
    %z = stablehlo.constant dense<0.0> : tensor<f6E3M2FN>
    %1 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0]
      : ({t}, tensor<f6E3M2FN>) -> tensor<f6E3M2FN>
    %2 = stablehlo.sqrt %x : {t}
    return %0, %1, %2 : {t}, tensor<f6E3M2FN>, {t}""")
    f6 = ml_dtypes.float6_e3m2fn
    x = np.array([3, -0.0, 0.0, -28, 1.25, 0.0625], f6)
    ordered, total, root = run(text, x)
    same_bits(ordered, np.array([-28, -0.0, 0.0, 0.0625, 1.25, 3], f6))
    same_bits(total, np.array(-24, f6))
    same_bits(root, np.array([1.75, -0.0, 0, -0.0, 1, 0.25], f6))


@pytest.mark.parametrize("spelling", ["f6E2M3FN", "f4E2M1FN", "f8E5M2FNUZ"])
def test_stochastic_rounding_to_narrow_formats_is_unbiased(spelling):
    """Stochastic rounding of 1.1 goes to the two neighbours on the format's grid with a
    mean of 1.1; 1000, beyond the FP6 and FP4 ranges, saturates to their largest value."""
    n = 100_000
    t = f"tensor<{n}x{spelling}>"
    text = module(f"%x: tensor<{n}xf32>", t, f"""
    %0 = stablehlo.convert %x : (tensor<{n}xf32>) -> {t}
    return %0 : {t}""")
    executable = jax_trn2.client().compile(text, rounding="stochastic", seed=3)
    (rounded,) = executable.execute([np.full(n, 1.1, np.float32)])
    values = np.asarray(rounded).astype(np.float32)
    grid = every_value(NARROW_FLOATS[spelling]).astype(np.float32)
    below, above = grid[grid <= 1.1].max(), grid[grid > 1.1].min()
    assert set(np.unique(values)) == {below, above}
    # Each draw is `below` or `above`: the mean of n has standard deviation at most
    # (above - below) / 2 / sqrt(n); 6 of them is a bound that fails by chance < 1e-8.
    assert abs(values.mean() - 1.1) < 6 * (above - below) / 2 / np.sqrt(n)
    (top,) = executable.execute([np.full(n, 1000.0, np.float32)])
    largest = grid[np.isfinite(grid)].max()
    if not np.isnan(grid).any():  # no NaN, no infinity: saturates
        assert (np.asarray(top).astype(np.float32) == largest).all()


# --- bitcast_convert -----------------------------------------------------------------------

# The StableHLO interpreter's bitcast_convert tests: 0x0123456789ABCDEF as i1[64], least
# significant bit first.
BITS_0123456789ABCDEF = [bool(0x0123456789ABCDEF >> i & 1) for i in range(64)]


def i1_literal(bits) -> str:
    return ", ".join("true" if b else "false" for b in bits)


def test_bitcast_convert_i1_and_wide_types_as_the_spec_examples():
    text = module("", "tensor<i64>, tensor<64xi1>, tensor<i64>, tensor<2xi32>", f"""
    %b = stablehlo.constant dense<[{i1_literal(BITS_0123456789ABCDEF)}]> : tensor<64xi1>
    %0 = stablehlo.bitcast_convert %b : (tensor<64xi1>) -> tensor<i64>
    %f = stablehlo.constant dense<0x0123456789ABCDEF> : tensor<f64>
    %1 = stablehlo.bitcast_convert %f : (tensor<f64>) -> tensor<64xi1>
    %h = stablehlo.constant dense<[0xCDEF, 0x89AB, 0x4567, 0x0123]> : tensor<4xbf16>
    %2 = stablehlo.bitcast_convert %h : (tensor<4xbf16>) -> tensor<i64>
    %3 = stablehlo.bitcast_convert %f : (tensor<f64>) -> tensor<2xi32>
    return %0, %1, %2, %3 : tensor<i64>, tensor<64xi1>, tensor<i64>, tensor<2xi32>""")
    from_bools, to_bools, from_bf16, to_i32 = run(text)
    assert int(from_bools) == 0x0123456789ABCDEF
    np.testing.assert_array_equal(to_bools, BITS_0123456789ABCDEF)
    assert int(from_bf16) == 0x0123456789ABCDEF
    np.testing.assert_array_equal(to_i32, np.array([0x89ABCDEF, 0x01234567], np.uint32)
                                  .view(np.int32))


def test_bitcast_convert_sub_byte_types():
    """Bytes split into nibbles and crumbs low bits first and back; i4 <-> ui4 and
    f4E2M1FN <-> ui4 keep the bits; an FP6 value's six bits as i1[6] and as the other FP6
    format (ml_dtypes' encodings)."""
    every_byte = np.arange(256, dtype=np.uint8)
    text = module("%b: tensor<256xui8>", "tensor<256x2xi4>, tensor<256xui8>, tensor<256x4xui2>, "
                  "tensor<256x2xf4E2M1FN>, tensor<256x2xui4>", """
    %0 = stablehlo.bitcast_convert %b : (tensor<256xui8>) -> tensor<256x2xi4>
    %1 = stablehlo.bitcast_convert %0 : (tensor<256x2xi4>) -> tensor<256xui8>
    %2 = stablehlo.bitcast_convert %b : (tensor<256xui8>) -> tensor<256x4xui2>
    %3 = stablehlo.bitcast_convert %0 : (tensor<256x2xi4>) -> tensor<256x2xf4E2M1FN>
    %4 = stablehlo.bitcast_convert %3 : (tensor<256x2xf4E2M1FN>) -> tensor<256x2xui4>
    return %0, %1, %2, %3, %4 : tensor<256x2xi4>, tensor<256xui8>, tensor<256x4xui2>,
      tensor<256x2xf4E2M1FN>, tensor<256x2xui4>""")
    nibbles, bytes_, crumbs, fp4, unsigned = run(text, every_byte)
    low, high = every_byte & 15, every_byte >> 4
    want_nibbles = np.stack([low, high], axis=1)
    same_bits(nibbles, ((want_nibbles ^ 8) - 8).astype(ml_dtypes.int4))
    same_bits(bytes_, every_byte)
    same_bits(crumbs, np.stack([every_byte >> (2 * i) & 3 for i in range(4)], axis=1)
              .astype(ml_dtypes.uint2))
    same_bits(fp4, every_value(ml_dtypes.float4_e2m1fn)[want_nibbles])
    same_bits(unsigned, want_nibbles.astype(ml_dtypes.uint4))

    f6 = every_value(ml_dtypes.float6_e2m3fn)
    text = module("%x: tensor<64xf6E2M3FN>", "tensor<64x6xi1>, tensor<64xf6E3M2FN>", """
    %0 = stablehlo.bitcast_convert %x : (tensor<64xf6E2M3FN>) -> tensor<64x6xi1>
    %1 = stablehlo.bitcast_convert %x : (tensor<64xf6E2M3FN>) -> tensor<64xf6E3M2FN>
    return %0, %1 : tensor<64x6xi1>, tensor<64xf6E3M2FN>""")
    bits, other = run(text, f6)
    np.testing.assert_array_equal(bits, (np.arange(64)[:, None] >> np.arange(6)) & 1 == 1)
    same_bits(other, every_value(ml_dtypes.float6_e3m2fn))


def test_bitcast_convert_of_booleans_to_booleans_and_bytes():
    mask = np.array([[True, False, True, True, False, False, False, True]] * 2)
    text = module("%m: tensor<2x8xi1>", "tensor<2x8xi1>, tensor<2xui8>", """
    %0 = stablehlo.bitcast_convert %m : (tensor<2x8xi1>) -> tensor<2x8xi1>
    %1 = stablehlo.bitcast_convert %m : (tensor<2x8xi1>) -> tensor<2xui8>
    return %0, %1 : tensor<2x8xi1>, tensor<2xui8>""")
    same, byte = run(text, mask)
    np.testing.assert_array_equal(same, mask)
    np.testing.assert_array_equal(byte, [0b10001101] * 2)


def test_bitcast_convert_between_complex_widths():
    """A complex element's bits are its real part's then its imaginary part's, so
    complex<f64> -> 2 x complex<f32> and back are numpy's views of the same memory
    (little-endian: the low half of the real part is the first element's real part)."""
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex128)
    text = module("%z: tensor<3xcomplex<f64>>",
                  "tensor<3x2xcomplex<f32>>, tensor<3xcomplex<f64>>", """
    %0 = stablehlo.bitcast_convert %z : (tensor<3xcomplex<f64>>) -> tensor<3x2xcomplex<f32>>
    %1 = stablehlo.bitcast_convert %0 : (tensor<3x2xcomplex<f32>>) -> tensor<3xcomplex<f64>>
    return %0, %1 : tensor<3x2xcomplex<f32>>, tensor<3xcomplex<f64>>""")
    narrow, back = run(text, wide)
    assert (narrow.dtype, back.dtype) == (np.complex64, np.complex128)
    # compared part by part, bit for bit
    same_bits(narrow.view(np.float32), wide.view(np.complex64).reshape(3, 2).view(np.float32))
    same_bits(back.view(np.float64), wide.view(np.float64))

# --- tuples --------------------------------------------------------------------------------

def test_tuples_through_calls_loops_and_main():
    """tuple and get_tuple_element (nested), a tuple passed to and returned from a function,
    a loop condition that reads an element of a tuple of the enclosing scope, and
    tuple-typed arguments and results of main, which are passed as their leaves in order
    (PJRT's untupled arguments and results)."""
    text = """module @m {
      func.func private @swap(%t: tuple<tensor<3xf32>, tuple<tensor<i32>>>)
          -> tuple<tuple<tensor<i32>>, tensor<3xf32>> {
        %a = stablehlo.get_tuple_element %t[0]
          : (tuple<tensor<3xf32>, tuple<tensor<i32>>>) -> tensor<3xf32>
        %b = stablehlo.get_tuple_element %t[1]
          : (tuple<tensor<3xf32>, tuple<tensor<i32>>>) -> tuple<tensor<i32>>
        %r = stablehlo.tuple %b, %a : tuple<tuple<tensor<i32>>, tensor<3xf32>>
        return %r : tuple<tuple<tensor<i32>>, tensor<3xf32>>
      }
      func.func public @main(%x: tensor<3xf32>, %t: tuple<tensor<i32>, tensor<2xi32>>)
          -> (tuple<tensor<3xf32>, tensor<i32>>, tensor<2xi32>) {
        %n = stablehlo.get_tuple_element %t[0] : (tuple<tensor<i32>, tensor<2xi32>>) -> tensor<i32>
        %v = stablehlo.get_tuple_element %t[1]
          : (tuple<tensor<i32>, tensor<2xi32>>) -> tensor<2xi32>
        %i = stablehlo.tuple %n : tuple<tensor<i32>>
        %u = stablehlo.tuple %x, %i : tuple<tensor<3xf32>, tuple<tensor<i32>>>
        %s = func.call @swap(%u)
          : (tuple<tensor<3xf32>, tuple<tensor<i32>>>) -> tuple<tuple<tensor<i32>>, tensor<3xf32>>
        %y = stablehlo.get_tuple_element %s[1]
          : (tuple<tuple<tensor<i32>>, tensor<3xf32>>) -> tensor<3xf32>
        %c = stablehlo.constant dense<2> : tensor<i32>
        %w:2 = stablehlo.while(%k = %c, %acc = %x) : tensor<i32>, tensor<3xf32>
          cond {
            %limit = stablehlo.get_tuple_element %t[0]
              : (tuple<tensor<i32>, tensor<2xi32>>) -> tensor<i32>
            %p = stablehlo.compare LT, %k, %limit : (tensor<i32>, tensor<i32>) -> tensor<i1>
            stablehlo.return %p : tensor<i1>
          } do {
            %one = stablehlo.constant dense<1> : tensor<i32>
            %k1 = stablehlo.add %k, %one : tensor<i32>
            %a1 = stablehlo.add %acc, %y : tensor<3xf32>
            stablehlo.return %k1, %a1 : tensor<i32>, tensor<3xf32>
          }
        %r = stablehlo.tuple %w#1, %w#0 : tuple<tensor<3xf32>, tensor<i32>>
        return %r, %v : tuple<tensor<3xf32>, tensor<i32>>, tensor<2xi32>
      }
    }"""
    x = np.array([1, 2, 3], np.float32)
    total, count, v = run(text, x, np.int32(5), np.array([7, 8], np.int32))
    np.testing.assert_array_equal(total, 4 * x)  # x plus 3 iterations (k = 2, 3, 4) of x
    assert count == 5
    np.testing.assert_array_equal(v, [7, 8])


def test_collectives_on_fp6_and_int4_values_per_device():
    """An SPMD module (16 processes on trn2) reducing FP6 and int4 values in groups of 4:
    partial sums are in the operand's type (FP6 saturates at 7.5; int4 wraps), and FP6
    buffers stay numpy arrays (jax cannot hold them)."""
    groups = "dense<[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]>"
    reductions = []
    for name, t in (("x", "f6E2M3FN"), ("y", "i4")):
        reductions.append(f"""
    %{name}r = "stablehlo.all_reduce"(%{name}) ({{
      ^bb0(%a: tensor<{t}>, %b: tensor<{t}>):
        %s = stablehlo.add %a, %b : tensor<{t}>
        stablehlo.return %s : tensor<{t}>
    }}) {{replica_groups = {groups} : tensor<4x4xi64>, use_global_device_ids,
      channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>}}
      : (tensor<2x{t}>) -> tensor<2x{t}>""")
    text = ("module @m attributes {mhlo.num_partitions = 16 : i32, mhlo.num_replicas = 1 : i32}"
            " {\n  func.func public @main(%x: tensor<2xf6E2M3FN>, %y: tensor<2xi4>) -> "
            "(tensor<2xf6E2M3FN>, tensor<2xi4>) {" + "".join(reductions) +
            "\n    return %xr, %yr : tensor<2xf6E2M3FN>, tensor<2xi4>\n  }\n}")
    f6, i4 = ml_dtypes.float6_e2m3fn, ml_dtypes.int4
    per_device = [[np.array([0.5 * d, 1.0], f6), np.array([d % 8, 3], i4)] for d in range(16)]
    results = jax_trn2.client("trn2").compile(text).execute_sharded(per_device)
    for d, (x, y) in enumerate(results):
        group = range(d // 4 * 4, d // 4 * 4 + 4)
        partial = np.float32(0)
        for member in group:  # in any order: these partial sums are exact or saturate
            partial = np.float32(partial + np.float32(0.5 * member)).astype(f6).astype(np.float32)
        same_bits(np.asarray(x), np.array([partial, 4.0], f6))
        wrapped = (sum(m % 8 for m in group) + 8) % 16 - 8
        same_bits(np.asarray(y), np.array([wrapped, (12 + 8) % 16 - 8], i4))
