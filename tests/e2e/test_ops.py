"""Op coverage, table-driven: each table runs as one shard_map program on the 4x4x4 mesh
through jax_trn2.jit and through jax.jit on CPU, and every output is compared.

Operands vary along different mesh axes (`a` along x, `b` along y, z replicated), so binary
ops also combine different executor layouts.
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
A_SPEC, B_SPEC = P("x"), P("y")
OUT_SPEC = P(("x", "y", "z"))  # every chip's local result, side by side

# Elementwise results are compared per element, in units in the last place (ulps) of the
# output type, and must be exact: the simulator evaluates each op with XLA's CPU
# implementation on the same values as the reference (BF16 widened exactly to FP32, the
# result rounded once, as the engines do), and the reference rounds every op's result to
# its type (e2e_reference). The exceptions, where the CPU reference departs from StableHLO:
# - jnp.log2 and jnp.log10 divide by a broadcast constant, and XLA on CPU rewrites a
#   division by a broadcast as a multiplication by the reciprocal (two roundings, so up to
#   1 ulp off); the simulator divides, correctly rounded, as StableHLO's divide says.
CPU_RECIPROCAL_DIVISION = {"log2(a)": 1, "log10(a)": 1}
# - For BF16 operands XLA on CPU expands these CHLO functions into several BF16 ops and
#   rounds after each; the simulator evaluates each as one function in FP32 and rounds once
#   (the Scalar engine's activation functions). They are checked against the CPU's FP32
#   result rounded to BF16 instead (test_bf16_functions_round_once).
CHLO_EXPANDED_IN_BF16 = ("arccos", "arccosh", "arcsin", "arcsinh", "arctanh")

FLOATS = ("float32", "bfloat16")
INTS = ("int32", "uint32", "int8")


# --- operands ----------------------------------------------------------------------------

# No subnormals: XLA on CPU runs with denormals-are-zero, and whether an op flushes one
# depends on the machine instruction LLVM picks (a select fused into a `minps` flushes), so
# two XLA programs computing the same thing need not agree on them. 1.5e-38 is just above
# the smallest normal FP32/BF16 magnitude (1.18e-38).
FLOAT_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, 2.5, -2.5,
                  3.0, -3.0, 0.999, -0.999, 1e-3, -1e-6, 1.5e-38, 88.5, -88.5, 100.0, 1e30,
                  -1e30, 7.0, -7.5, 0.25, 1.5, 4e9, -3e9, 300.0, -129.0]


def float_operand(rng, shape, dtype) -> np.ndarray:
    """Special values (zeros, infinities, NaN, tiny normals, halfway cases, values outside
    every integer type's range) followed by normals of spread 4."""
    values = rng.standard_normal(int(np.prod(shape))) * 4
    values[:len(FLOAT_SPECIALS)] = FLOAT_SPECIALS
    with np.errstate(over="ignore"):  # beyond FP16's range: infinities, as meant
        return values.reshape(shape).astype(dtype)


def int_operand(rng, shape, dtype) -> np.ndarray:
    """The type's extremes, 0 and +-1 first, then small and full-range values."""
    info = np.iinfo(dtype)
    specials = [0, 1, info.max, info.min, 2, 7, info.max - 1, info.min + 1]
    if info.min < 0:
        specials += [-1, -2, -7]
    n = int(np.prod(shape))
    values = np.concatenate([rng.integers(max(info.min, -9), min(info.max, 9), n // 2,
                                          endpoint=True),
                             rng.integers(info.min, info.max, n - n // 2, endpoint=True)])
    values[:len(specials)] = specials
    return values.reshape(shape).astype(dtype)


def operand(rng, dtype, shape=(16, 8)) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return int_operand(rng, shape, dtype)
    return float_operand(rng, shape, dtype)


def shift_amounts(rng, dtype, shape=(16, 8)) -> np.ndarray:
    """Shift amounts in and out of range: negative, 0..bits-1, bits and beyond."""
    bits = np.dtype(dtype).itemsize * 8
    low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -3
    return rng.integers(low, bits + 3, shape).astype(dtype)


# --- comparison --------------------------------------------------------------------------

def ordered_bits(x: np.ndarray) -> np.ndarray:
    """Integers in the order of the floats x: adjacent floats differ by 1, and -0 is the
    neighbour below +0 (a wrong sign of zero is a difference)."""
    bits = x.view(f"int{x.dtype.itemsize * 8}").astype(np.int64)
    return np.where(bits < 0, -(bits & (2 ** (8 * x.dtype.itemsize - 1) - 1)) - 1, bits)


def ulps_apart(got: np.ndarray, want: np.ndarray) -> int:
    """The largest distance in floats of the output type between got and want, where want
    is not NaN; NaN positions must agree (a mismatch counts as infinitely far)."""
    nan = np.isnan(want.astype(np.float32))
    if not np.array_equal(np.isnan(got.astype(np.float32)), nan):
        return np.iinfo(np.int64).max
    distance = np.abs(ordered_bits(got) - ordered_bits(want))[~nan]
    return int(distance.max()) if distance.size else 0


def assert_within_ulps(got: dict, want: dict, ulps: dict[str, int] | None = None) -> None:
    """Per output of a table: integers and bools equal, floats at most `ulps[name]` (0 by
    default) floats apart; reports every output that is off."""
    ulps = ulps or {}
    assert got.keys() == want.keys()
    off = {}
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (name, g.dtype, w.dtype)
        if np.issubdtype(w.dtype, np.floating) or w.dtype.kind == "V":
            distance = ulps_apart(g, w)
            if distance > ulps.get(name, 0):
                off[name] = f"{distance} ulps"
        elif not np.array_equal(g, w):
            off[name] = f"{int(np.sum(g != w))} of {w.size} differ"
    assert not off, str(off)


def run_table(table: dict, *args, specs=(A_SPEC, B_SPEC)):
    """Every function of the table applied to args, in one program."""
    def body(*xs):
        return {name: fn(*xs) for name, fn in table.items()}
    return run_both(body, *MESH, specs[:len(args)], OUT_SPEC, *args)


# --- elementwise tables ------------------------------------------------------------------

FLOAT_UNARY = {
    "abs": jnp.abs, "negative": jnp.negative, "sign": jnp.sign, "floor": jnp.floor,
    "ceil": jnp.ceil, "round": jnp.round, "trunc": jnp.trunc,
    "round_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log1p": jnp.log1p,
    "log2": jnp.log2, "log10": jnp.log10, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan,
    "arcsin": jnp.arcsin, "arccos": jnp.arccos, "arctan": jnp.arctan, "sinh": jnp.sinh,
    "cosh": jnp.cosh, "tanh": jnp.tanh, "arcsinh": jnp.arcsinh, "arccosh": jnp.arccosh,
    "arctanh": jnp.arctanh, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "cbrt": jnp.cbrt,
    "square": jnp.square, "reciprocal": jnp.reciprocal, "cube": lambda x: x ** 3,
    "logistic": lax.logistic, "erf": lax.erf, "erfc": lax.erfc, "erf_inv": lax.erf_inv,
    "lgamma": lax.lgamma, "digamma": lax.digamma, "isfinite": jnp.isfinite,
    "isinf": jnp.isinf, "isnan": jnp.isnan, "signbit": jnp.signbit, "relu": jax.nn.relu,
    "gelu": jax.nn.gelu, "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "softplus": jax.nn.softplus, "silu": jax.nn.silu, "spacing": jnp.spacing,
    "rint": jnp.rint, "fabs": jnp.fabs, "sinc": jnp.sinc, "deg2rad": jnp.deg2rad,
    "i0": jnp.i0, "frexp_mantissa": lambda x: jnp.frexp(x)[0],
    "frexp_exponent": lambda x: jnp.frexp(x)[1], "modf_fraction": lambda x: jnp.modf(x)[0],
    "modf_integer": lambda x: jnp.modf(x)[1],
}

FLOAT_BINARY = {
    "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply, "divide": jnp.divide,
    "floor_divide": jnp.floor_divide, "remainder": jnp.remainder, "fmod": jnp.fmod,
    "rem": lax.rem, "power": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum,
    "fmax": jnp.fmax, "arctan2": jnp.arctan2, "hypot": jnp.hypot, "copysign": jnp.copysign,
    "nextafter": jnp.nextafter, "logaddexp": jnp.logaddexp, "logaddexp2": jnp.logaddexp2,
    "heaviside": jnp.heaviside, "float_power": jnp.float_power,
    "ldexp": lambda a, b: jnp.ldexp(a, jnp.clip(b, -200, 200).astype(jnp.int32)),
}

COMPARISONS = {
    "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
    "gt": jnp.greater, "ge": jnp.greater_equal,
}

INT_UNARY = {
    "abs": jnp.abs, "negative": jnp.negative, "sign": jnp.sign, "square": jnp.square,
    "invert": jnp.invert, "popcount": lax.population_count, "clz": lax.clz,
}

INT_BINARY = {
    "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply,
    "floor_divide": jnp.floor_divide, "remainder": jnp.remainder, "div": lax.div,
    "rem": lax.rem, "maximum": jnp.maximum, "minimum": jnp.minimum, "and": jnp.bitwise_and,
    "or": jnp.bitwise_or, "xor": jnp.bitwise_xor, "power": lambda a, b: a ** (b & 7),
}

SHIFTS = {
    "shift_left": lax.shift_left, "shift_right_arithmetic": lax.shift_right_arithmetic,
    "shift_right_logical": lax.shift_right_logical, "jnp_left_shift": jnp.left_shift,
    "jnp_right_shift": jnp.right_shift,
}

BOOL_TABLE = {
    "and": jnp.logical_and, "or": jnp.logical_or, "xor": jnp.logical_xor,
    "not": lambda a, b: jnp.logical_not(a), "bit_and": lambda a, b: a & b,
    "bit_or": lambda a, b: a | b, "bit_xor": lambda a, b: a ^ b, "invert": lambda a, b: ~a,
}


def unary_of_a(table: dict) -> dict:
    """A table of unary functions as functions of (a, b), named `f(a)`."""
    return {f"{name}(a)": (lambda f: lambda a, *rest: f(a))(f) for name, f in table.items()}


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_elementwise(dtype, rng):
    a, b = operand(rng, dtype), operand(rng, dtype)
    unary = {k: f for k, f in FLOAT_UNARY.items()
             if not (dtype == "bfloat16" and k in CHLO_EXPANDED_IN_BF16)}
    got, want = run_table({**unary_of_a(unary), **FLOAT_BINARY, **COMPARISONS}, a, b)
    assert_within_ulps(got, want, CPU_RECIPROCAL_DIVISION)


def test_bf16_functions_round_once(rng):
    a = operand(rng, "bfloat16")
    table = unary_of_a({k: FLOAT_UNARY[k] for k in CHLO_EXPANDED_IN_BF16})
    got, _ = run_table(table, a)
    _, want_fp32 = run_table(table, a.astype(np.float32))
    assert_within_ulps(got, {k: np.asarray(v).astype(ml_dtypes.bfloat16)
                             for k, v in want_fp32.items()})


@pytest.mark.parametrize("dtype", INTS)
def test_int_elementwise(dtype, rng):
    a, b = operand(rng, dtype), operand(rng, dtype)
    unary = unary_of_a(INT_UNARY)
    binary = {k: (lambda f: lambda a, b, s: f(a, b))(f)
              for k, f in {**INT_BINARY, **COMPARISONS}.items()}
    shifts = {k: (lambda f: lambda a, b, s: f(a, s))(f) for k, f in SHIFTS.items()}
    got, want = run_table({**unary, **binary, **shifts}, a, b, shift_amounts(rng, dtype),
                          specs=(A_SPEC, B_SPEC, B_SPEC))
    assert_matches(got, want, exact=True)


def test_bool_elementwise(rng):
    a, b = operand(rng, np.bool_), operand(rng, np.bool_)
    got, want = run_table({**BOOL_TABLE, **COMPARISONS}, a, b)
    assert_matches(got, want, exact=True)


# --- conversions, compare, select, clamp between types ------------------------------------

ALL_TYPES = ("float32", "bfloat16", "float16", "int32", "uint32", "int8", "bool")


def test_convert_between_all_types(rng):
    """Every pair, from values that stress each conversion: NaN, infinities, halfway cases
    and values out of every integer type's range (float -> int of those is XLA's choice on
    both sides: StableHLO leaves it implementation-defined), negatives into unsigned types,
    wide integers into narrow ones (they wrap) and into BF16/FP16 (they round)."""
    operands = {t: operand(rng, t) for t in ALL_TYPES}

    def body(xs):
        return {f"{src}->{dst}": xs[src].astype(dst) for src in ALL_TYPES for dst in ALL_TYPES}

    got, want = run_both(body, *MESH, ({t: A_SPEC for t in ALL_TYPES},), OUT_SPEC, operands)
    assert_within_ulps(got, want)


@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_compare_select_clamp(dtype, rng):
    a, b = operand(rng, dtype), operand(rng, dtype)
    table = dict(COMPARISONS)
    table["select"] = lambda a, b: jnp.where(a < b, a, b)
    table["select_scalar"] = lambda a, b: jnp.where(b, a, jnp.zeros((), a.dtype)) \
        if dtype == "bool" else jnp.where(a > b, a, jnp.ones((), a.dtype))
    if dtype != "bool":
        table["clamp"] = lambda a, b: lax.clamp(jnp.minimum(a, b), a, jnp.maximum(a, b))
        table["clamp_scalars"] = lambda a, b: lax.clamp(jnp.asarray(1, a.dtype), b,
                                                        jnp.asarray(7, a.dtype))
    got, want = run_table(table, a, b)
    assert_within_ulps(got, want)


# --- reductions --------------------------------------------------------------------------

REDUCTION_AXES = {"0": 0, "1": 1, "all": None}

NUMERIC_REDUCTIONS = {
    "sum": jnp.sum, "prod": jnp.prod, "max": jnp.max, "min": jnp.min,
    "argmax": jnp.argmax, "argmin": jnp.argmin,
}


def reductions_table(dtype: str) -> dict:
    table = {}
    functions = {"any": jnp.any, "all": jnp.all, "sum": jnp.sum, "max": jnp.max,
                 "argmax": jnp.argmax} if dtype == "bool" else NUMERIC_REDUCTIONS
    for name, f in functions.items():
        for axis_name, axis in REDUCTION_AXES.items():
            table[f"{name}[{axis_name}]"] = (lambda f, axis: lambda a: f(a, axis=axis))(f, axis)
    if dtype != "bool":
        table["sum_of_empty"] = lambda a: jnp.sum(a[:, :0], axis=1)
        table["max_of_empty"] = lambda a: jnp.max(a[:0], axis=0, initial=3)
        table["min_where"] = lambda a: jnp.min(a, axis=1, where=a > 0, initial=9)
        # A two-operand reduce whose body is a known monoid per operand.
        table["sum_and_max"] = lambda a: jnp.stack(lax.reduce(
            (a, a), (jnp.zeros((), a.dtype), jnp.asarray(7, a.dtype)),
            lambda x, y: (x[0] + y[0], jnp.maximum(x[1], y[1])), (1,)))
    return table


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "int32", "uint32", "int8", "bool"))
def test_reductions(dtype, rng):
    """Sums of floats may add in another order than XLA on CPU does (e2e_reference's
    FLOAT_RTOL), so floats are finite normals here (special values: the test below);
    integers (which wrap) and bools are exact."""
    a = rng.standard_normal((16, 8)).astype(dtype) if dtype in FLOATS else operand(rng, dtype)
    table = reductions_table(dtype)
    got, want = run_both(lambda a: {k: jnp.atleast_1d(f(a)) for k, f in table.items()},
                         *MESH, A_SPEC, P("x"), a)
    assert_matches(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_arg_reductions_of_special_values(dtype, rng):
    """NaN, infinities and signed zeros: which value (and index) wins is exact."""
    a = operand(rng, dtype)
    table = {f"{name}[{axis_name}]": (lambda f, axis: lambda a: jnp.atleast_1d(
        f(a, axis=axis)))(NUMERIC_REDUCTIONS[name], axis)
        for name in ("max", "min", "argmax", "argmin")
        for axis_name, axis in REDUCTION_AXES.items()}
    got, want = run_both(lambda a: {k: f(a) for k, f in table.items()}, *MESH, A_SPEC,
                         P("x"), a)
    assert_within_ulps(got, want)


# --- dot_general -------------------------------------------------------------------------

def dot(contract, batch, preferred=None):
    """lax.dot_general contracting (lhs dims, rhs dims) with batch (lhs dims, rhs dims)."""
    return lambda lhs, rhs: lax.dot_general(lhs, rhs, (contract, batch),
                                            preferred_element_type=preferred)


def random_values(rng, shape, dtype) -> np.ndarray:
    """Normals for floats; INT8's whole range (int8 products summed in int32 stay in
    range), small values for wider integers."""
    if np.dtype(dtype) == np.int8:
        return rng.integers(-128, 128, shape).astype(dtype)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-20, 20, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# name: (local lhs shape, local rhs shape, dtype, function).
DOT_CASES = {
    "matmul": ((4, 6), (6, 5), "float32", jnp.matmul),
    "lhs_transposed": ((6, 4), (6, 5), "float32", dot(((0,), (0,)), ((), ()))),
    "rhs_transposed": ((4, 6), (5, 6), "float32", dot(((1,), (1,)), ((), ()))),
    "batch": ((4, 3, 6), (4, 6, 5), "float32", dot(((2,), (1,)), ((0,), (0,)))),
    "batch_not_leading": ((3, 4, 6), (6, 5, 4), "float32", dot(((2,), (0,)), ((1,), (2,)))),
    "two_batch_two_contract": ((4, 2, 3, 6, 5), (5, 6, 4, 2, 7), "float32",
                               dot(((3, 4), (1, 0)), ((0, 1), (2, 3)))),
    "vector": ((12,), (12,), "float32", jnp.dot),
    "matrix_vector": ((4, 6), (6,), "float32", jnp.dot),
    "long_contraction": ((4, 300), (300, 3), "float32", jnp.matmul),
    "bf16_to_f32": ((4, 200), (200, 5), "bfloat16", dot(((1,), (0,)), ((), ()), jnp.float32)),
    "bf16": ((4, 40), (40, 5), "bfloat16", jnp.matmul),
    "int8_to_int32": ((4, 64), (64, 5), "int8", dot(((1,), (0,)), ((), ()), jnp.int32)),
    "int32": ((4, 6), (6, 5), "int32", jnp.matmul),
    "einsum": ((4, 3, 6), (3, 6, 2), "float32",
               lambda l, r: jnp.einsum("bij,ijk->kb", l, r)),
}


# Mesh layouts of (lhs, rhs), with how many chips split their dim 0: an outer product on
# the mesh (each varies along its own axis), a batch on the mesh (both vary along z, the
# lhs also along x), and a weight replicated on every chip.
DOT_LAYOUTS = {
    "outer": ((P("x"), 4), (P("y"), 4)),
    "shared_axis": ((P(("x", "z")), 16), (P("z"), 4)),
    "replicated_rhs": ((P("y"), 4), (P(), 1)),
}


@pytest.mark.parametrize("layout", DOT_LAYOUTS)
def test_dot_general(layout, rng):
    """Float results may add in another order than XLA on CPU does (e2e_reference's
    FLOAT_RTOL); integer products are exact."""
    (lhs_spec, lhs_split), (rhs_spec, rhs_split) = DOT_LAYOUTS[layout]

    def global_operand(shape, dtype, split):
        return random_values(rng, (shape[0] * split,) + shape[1:], dtype)

    args = {name: (global_operand(l, t, lhs_split), global_operand(r, t, rhs_split))
            for name, (l, r, t, _) in DOT_CASES.items()}
    specs = {name: (lhs_spec, rhs_spec) for name in DOT_CASES}

    def body(args):
        return {name: jnp.atleast_1d(DOT_CASES[name][3](*args[name])) for name in DOT_CASES}

    got, want = run_both(body, *MESH, (specs,), OUT_SPEC, args)
    assert_matches(got, want)


# --- data movement -----------------------------------------------------------------------

def movement_table() -> dict:
    """Functions of (a, b) with local shapes (4, 8); indices that differ from chip to chip
    come from axis_index."""
    i = lambda: lax.axis_index("y")  # noqa: E731
    return {
        "iota": lambda a, b: lax.broadcasted_iota(jnp.int32, (3, 5), 1),
        "iota_as_operand": lambda a, b: lax.broadcasted_iota(jnp.int8, (4, 8), 0).astype(
            a.dtype),
        "arange_plus_index": lambda a, b: jnp.arange(6, dtype=jnp.int32) + i(),
        "broadcast": lambda a, b: jnp.broadcast_to(a[:, None, :], (4, 3, 8)),
        "reshape": lambda a, b: a.reshape(8, 2, 2),
        "transpose": lambda a, b: jnp.transpose(a.reshape(2, 2, 8), (2, 0, 1)),
        "slice_strided": lambda a, b: a[1:4:2, ::3],
        "slice_reversed": lambda a, b: a[::-1, 6:1:-2],
        "rev": lambda a, b: jnp.flip(a, (0, 1)),
        "dynamic_slice": lambda a, b: lax.dynamic_slice(a, (i(), 2 * i()), (2, 3)),
        "dynamic_slice_clamped": lambda a, b: lax.dynamic_slice(a, (3 * i() - 2, 7), (2, 4)),
        "dynamic_update_slice": lambda a, b: lax.dynamic_update_slice(a, b[:2, :3],
                                                                       (i(), 5 - i())),
        "concatenate": lambda a, b: jnp.concatenate([a, b, a[:1]], axis=0),
        "concatenate_1": lambda a, b: jnp.concatenate([a, b], axis=1),
        "pad": lambda a, b: lax.pad(a, jnp.asarray(1, a.dtype), ((1, 2, 1), (-2, 3, 0))),
        "pad_negative_interior": lambda a, b: lax.pad(a, jnp.asarray(0, a.dtype),
                                                      ((-1, -2, 2), (2, -3, 1))),
        "roll": lambda a, b: jnp.roll(a, 3, axis=1),
        "tile": lambda a, b: jnp.tile(a[:2], (2, 2)),
        "repeat": lambda a, b: jnp.repeat(a[:2], 2, axis=0),
        "triu": lambda a, b: jnp.triu(a),
        "expand_squeeze": lambda a, b: jnp.squeeze(a[None, :, None], axis=(0, 2)),
    }


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "int8", "bool"))
def test_data_movement(dtype, rng):
    a, b = operand(rng, dtype), operand(rng, dtype)
    table = movement_table()
    got, want = run_table(table, a, b)
    assert_same_bits(got, want)


BOOLEAN_ARITHMETIC_MODULE = """
module @boolean_arithmetic {
  func.func public @main(%a: tensor<2x4xi1>, %b: tensor<2x4xi1>) -> (tensor<2x4xi1>,
      tensor<2x4xi1>, tensor<4xi1>, tensor<4xi1>) {
    %sum = stablehlo.add %a, %b : tensor<2x4xi1>
    %product = stablehlo.multiply %a, %b : tensor<2x4xi1>
    %false = stablehlo.constant dense<false> : tensor<i1>
    %true = stablehlo.constant dense<true> : tensor<i1>
    %any = stablehlo.reduce(%a init: %false) applies stablehlo.add across dimensions = [0]
        : (tensor<2x4xi1>, tensor<i1>) -> tensor<4xi1>
    %all = stablehlo.reduce(%a init: %true) applies stablehlo.multiply across dimensions = [0]
        : (tensor<2x4xi1>, tensor<i1>) -> tensor<4xi1>
    return %sum, %product, %any, %all : tensor<2x4xi1>, tensor<2x4xi1>, tensor<4xi1>,
        tensor<4xi1>
  }
}"""


def test_boolean_add_and_multiply_are_or_and():
    """StableHLO's add and multiply of booleans (jax never emits them; other producers
    may) are logical or and and, also as reduce bodies."""
    a = np.array([[True, True, False, False], [True, False, True, False]])
    b = np.array([[True, False, True, False], [False, False, True, True]])
    outs = jax_trn2.client().compile(BOOLEAN_ARITHMETIC_MODULE).execute([a, b])
    for got, want in zip(outs, [a | b, a & b, a.any(0), a.all(0)]):
        np.testing.assert_array_equal(np.asarray(got), want)
