"""Elementwise ops, the constant/iota/device-id producers and type conversions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, emulated_floats, isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.bits import bitcast_convert
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.matmul import converts_native_matmul, native_matmul_converted

UNARY = {
    "abs": lax.abs, "negate": lax.neg, "sign": lax.sign, "floor": lax.floor, "ceil": lax.ceil,
    "round_nearest_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "round_nearest_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "exponential": lax.exp, "exponential_minus_one": lax.expm1, "log": lax.log,
    "log_plus_one": lax.log1p, "logistic": lax.logistic, "tanh": lax.tanh, "sine": lax.sin,
    "cosine": lax.cos, "tan": lax.tan, "sqrt": lax.sqrt, "rsqrt": lax.rsqrt,
    "cbrt": lambda x: _cbrt(x),  # defined below
    "erf": lax.erf, "erf_inv": lax.erf_inv, "is_finite": lax.is_finite, "not": lax.bitwise_not,
    "popcnt": lax.population_count, "count_leading_zeros": lax.clz,
    # CHLO (jax's ops above StableHLO): the same functions lax's CPU lowering computes.
    "acos": lax.acos, "acosh": lax.acosh, "asin": lax.asin, "asinh": lax.asinh,
    "atan": lax.atan, "atanh": lax.atanh, "cosh": lax.cosh, "sinh": lax.sinh,
    "erfc": lax.erfc, "lgamma": lax.lgamma, "digamma": lax.digamma,
    "bessel_i1e": lax.bessel_i1e, "square": lax.square, "is_inf": lambda x: lax.abs(x) == jnp.inf,
    "is_pos_inf": lambda x: x == jnp.inf, "is_neg_inf": lambda x: x == -jnp.inf,
    # complex numbers: the parts, and (in BINARY) a complex number from two parts; the
    # spec also takes a real operand, its own real part with imaginary part 0
    "real": lambda x: lax.real(x) if _is_complex(x) else x,
    "imag": lambda x: lax.imag(x) if _is_complex(x) else jnp.zeros_like(x),
    # chlo.conj: the complex conjugate (jax emits it in linear algebra's transposes); the
    # identity on real numbers
    "conj": lambda x: lax.conj(x) if _is_complex(x) else x,
}

BINARY = {
    "add": lax.add, "subtract": lax.sub, "multiply": lax.mul, "divide": lax.div,
    "remainder": lax.rem, "maximum": lax.max, "minimum": lax.min, "power": lambda x, y: (
        lax.pow(x, y) if jnp.issubdtype(x.dtype, jnp.inexact) else _integer_power(x, y)),
    "atan2": lax.atan2, "and": lax.bitwise_and, "or": lax.bitwise_or, "xor": lax.bitwise_xor,
    "shift_left": lax.shift_left, "shift_right_arithmetic": lax.shift_right_arithmetic,
    "shift_right_logical": lax.shift_right_logical,
    "next_after": lax.nextafter, "polygamma": lax.polygamma, "zeta": lax.zeta,
    "mulhi": lambda x, y: _multiply_high(x, y),
    "complex": lax.complex,
}

COMPARISONS = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}


# Ops defined on the operands' own type, not computed in FP32: the neighbouring float.
OWN_TYPE_OPS = frozenset({"next_after"})

# StableHLO's add and multiply of booleans are logical or and and.
BOOLEAN_ARITHMETIC = {"add": "or", "multiply": "and"}


def boolean_equivalent(op: str, dtype) -> str:
    """The op that computes `op` on operands of `dtype` (differs for bool add/multiply)."""
    return BOOLEAN_ARITHMETIC.get(op, op) if dtype == np.bool_ else op


def _integer_power(x, y):
    """x ** y for integers, by squaring over y's bits; a negative y gives 0 unless |x| = 1
    (XLA's integer power)."""
    result, base, exponent = jnp.ones_like(x), x, jnp.abs(y)
    for _ in range(8 * y.dtype.itemsize):
        result = jnp.where(exponent & 1, result * base, result)
        base, exponent = base * base, exponent >> 1
    if jnp.issubdtype(y.dtype, jnp.signedinteger):
        odd = (y & 1) == 1
        reciprocal = jnp.where(x == 1, 1, jnp.where((x == -1) & odd, -1, jnp.where(x == -1, 1, 0)))
        result = jnp.where(y < 0, reciprocal.astype(x.dtype), result)
    return result


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _cbrt(x):
    """The cube root; of a complex number the principal one (StableHLO's cbrt accepts
    complex operands, lax.cbrt does not): |x|^(1/3) at a third of x's argument."""
    if not _is_complex(x):
        return lax.cbrt(x)
    radius = lax.cbrt(lax.abs(x))
    angle = lax.atan2(lax.imag(x), lax.real(x)) / 3
    return lax.complex(radius * lax.cos(angle), radius * lax.sin(angle))


_HALF_BITS = 32
_LOW_HALF = np.uint64(2 ** _HALF_BITS - 1)


def _multiply_high(x, y):
    """chlo.mulhi: the high half of the full 2w-bit product of w-bit integers, signed or
    unsigned as their type. Up to 32 bits the product is exact in 64 bits; 64-bit operands
    multiply as 32-bit halves (schoolbook), the signed result corrected from the unsigned."""
    bits = dtypes.bit_width(dtypes.dtype_name(x.dtype))
    signed = jnp.issubdtype(x.dtype, jnp.signedinteger)
    if bits <= _HALF_BITS:
        wide = jnp.int64 if signed else jnp.uint64
        return (x.astype(wide) * y.astype(wide) >> bits).astype(x.dtype)
    ux, uy = (lax.bitcast_convert_type(v, jnp.uint64) for v in (x, y))
    x0, x1, y0, y1 = ux & _LOW_HALF, ux >> _HALF_BITS, uy & _LOW_HALF, uy >> _HALF_BITS
    low_low, low_high, high_low = x0 * y0, x0 * y1, x1 * y0
    carry = ((low_low >> _HALF_BITS) + (low_high & _LOW_HALF) + (high_low & _LOW_HALF)) \
        >> _HALF_BITS
    high = x1 * y1 + (low_high >> _HALF_BITS) + (high_low >> _HALF_BITS) + carry
    if signed:  # x = ux - 2**64 [x < 0], so x*y's high half loses uy where x < 0, and ux
        high = high - jnp.where(x < 0, uy, 0) - jnp.where(y < 0, ux, 0)
    return lax.bitcast_convert_type(high, x.dtype)


def _align_rank(x: jnp.ndarray, nm: int, rank: int) -> jnp.ndarray:
    """A local scalar broadcast against rank-`rank` operands (clamp/select allow scalars)."""
    local = x.ndim - nm
    if local == rank:
        return x
    return x.reshape(x.shape[:nm] + (1,) * rank)


def _compare(instr: isa.Elementwise, lhs, rhs):
    if instr.compare_type == "TOTALORDER":
        # Total order on floats: -NaN < -Inf < ... < -0 < +0 < ... < Inf < NaN.
        lhs, rhs = _total_order_key(lhs), _total_order_key(rhs)
    return COMPARISONS[instr.direction](lhs, rhs)


def _total_order_key(x):
    """Integers ordered like the floats' total order: negative floats have their magnitude
    bits flipped so that they sort below the positive ones in reverse magnitude."""
    signed = jnp.dtype(f"int{x.dtype.itemsize * 8}")
    i = lax.bitcast_convert_type(x, signed)
    return jnp.where(i < 0, i ^ jnp.iinfo(signed).max, i)


@kernel(isa.Elementwise)
def elementwise(instr: isa.Elementwise, args, ctx: KernelContext):
    out_type = ctx.out_info(instr).type
    op = instr.op
    if op == "convert":
        (x,) = args
        made = ctx.made_by.get(instr.ins[0])
        if made is not None and converts_native_matmul(instr, made[0], ctx.program, ctx.uses,
                                                       ctx.on_cpu, ctx.rounding is None):
            return [native_matmul_converted(instr, made, ctx)]
        # To a float from a float (or into an emulated format from anything): rounded once.
        rounds = dtypes.is_float(out_type.dtype) and (
            dtypes.is_float(dtypes.dtype_name(x.dtype))
            or emulated_floats.is_emulated(out_type.dtype))
        return [numerics.round_to(numerics.widen(x), out_type.dtype, ctx.rounding) if rounds
                else lax.convert_element_type(x, dtypes.numpy_dtype(out_type.dtype))]
    if op == "bitcast_convert":  # a wider or narrower type drops or adds the last dim
        in_type = ctx.program.values[instr.ins[0]].type.dtype
        return [bitcast_convert(args[0], in_type, out_type.dtype)]
    rank = out_type.rank
    if op == "select":
        return [select(*(_align_rank(a, ctx.nm, rank) for a in args))]
    aligned = [_align_rank(a, ctx.nm, rank) for a in args]
    wide = aligned if op in OWN_TYPE_OPS else [numerics.widen(a) for a in aligned]
    if op == "compare":
        return [_compare(instr, *wide)]
    if op == "clamp":
        lo, x, hi = wide
        result = lax.min(lax.max(x, lo), hi)
    elif op in UNARY:
        result = UNARY[op](*wide)
    elif op == "divide":
        # XLA rewrites a / broadcast(b) as a * broadcast(1 / b), which is not correctly
        # rounded; the barrier keeps the layout broadcast from turning into that.
        lhs, rhs = jnp.broadcast_arrays(*wide)
        result = lax.div(lhs, lax.optimization_barrier(rhs))
    else:
        result = BINARY[boolean_equivalent(op, wide[0].dtype)](*jnp.broadcast_arrays(*wide))
    return [numerics.round_to(result, out_type.dtype, ctx.rounding)]


def select(pred: jnp.ndarray, on_true: jnp.ndarray, on_false: jnp.ndarray) -> jnp.ndarray:
    """stablehlo.select of operands that broadcast together (on_true and on_false of one
    dtype): jnp.where's result, without the function of its own it is in the program."""
    return lax.select(*jnp.broadcast_arrays(pred, on_true, on_false))


@kernel(isa.Map)
def map_(instr: isa.Map, args, ctx: KernelContext):
    """The scalar body on every element (of every chip's copy) at once, vectorised."""
    shape = ctx.out_shape(instr)
    flat = [jnp.broadcast_to(a, shape).reshape(-1) for a in args]
    result = jax.vmap(lambda *xs: ctx.run(instr.body, list(xs))[0])(*flat)
    return [result.reshape(shape)]


@kernel(isa.Constant)
def constant(instr: isa.Constant, args, ctx: KernelContext):
    value = np.asarray(instr.value)
    shape = ctx.out_shape(instr)
    if value.size > 1 and not any(value.strides):  # a splat: one value, broadcast
        scalar = emulated_floats.host_to_storage(value.reshape(-1)[:1])[0]
        return [jnp.broadcast_to(jnp.asarray(scalar), shape)]
    return [jnp.asarray(emulated_floats.host_to_storage(value).reshape(shape))]


@kernel(isa.Iota)
def iota(instr: isa.Iota, args, ctx: KernelContext):
    out_type = ctx.out_info(instr).type
    if emulated_floats.is_emulated(out_type.dtype):  # counted exactly, then rounded
        x = numerics.round_to(lax.broadcasted_iota(np.float32, out_type.shape, instr.dimension),
                              out_type.dtype)
    else:
        x = lax.broadcasted_iota(dtypes.numpy_dtype(out_type.dtype), out_type.shape,
                                 instr.dimension)
    return [x.reshape(ctx.out_shape(instr))]


@kernel(isa.DeviceId)
def device_id(instr: isa.DeviceId, args, ctx: KernelContext):
    """Each chip's id: the row-major index of its coordinates along `instr.axes`."""
    sizes = [ctx.mesh.axis_sizes[a] if a in instr.axes else 1 for a in range(ctx.nm)]
    ids = np.zeros(sizes, dtype=np.uint32)
    for a in instr.axes:
        ids = ids * sizes[a] + np.arange(sizes[a], dtype=np.uint32).reshape(
            [-1 if d == a else 1 for d in range(ctx.nm)])
    return [jnp.asarray(ids.reshape(ctx.out_shape(instr)))]

