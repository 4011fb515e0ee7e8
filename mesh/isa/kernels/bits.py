"""Random bits and numbers, bit-level rounding and bitcasts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from mesh import dtypes, emulated_floats, isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext

ALGORITHMS = {
    "DEFAULT": lax.RandomAlgorithm.RNG_DEFAULT,
    "THREE_FRY": lax.RandomAlgorithm.RNG_THREE_FRY,
    "PHILOX": lax.RandomAlgorithm.RNG_PHILOX,
}
RNG_SEED = 0  # of stablehlo.rng's generator: a fixed key, each op its own stream of it


@kernel(isa.RngBitGenerator)
def rng_bit_generator(instr: isa.RngBitGenerator, args, ctx: KernelContext):
    """XLA's generator for the algorithm, so the bits are those CPU JAX draws from the same
    state. Chips are run one after another on their own states (lax.map): vmapping the
    generator would draw every chip's bits from the first chip's state."""
    (state,) = args
    nm = ctx.nm
    bits_type = ctx.out_info(instr, 1).type
    bits_dtype = dtypes.numpy_dtype(bits_type.dtype)
    unsigned = np.dtype(f"uint{8 * bits_dtype.itemsize}")  # lax draws unsigned bits only

    def draw(chip_state):
        new_state, bits = lax.rng_bit_generator(chip_state, bits_type.shape, dtype=unsigned,
                                                algorithm=ALGORITHMS[instr.algorithm])
        return new_state, lax.bitcast_convert_type(bits, bits_dtype)

    mesh_shape = state.shape[:nm]
    new_states, bits = lax.map(draw, state.reshape((-1,) + state.shape[nm:]))
    return [new_states.reshape(state.shape), bits.reshape(mesh_shape + bits_type.shape)]


@kernel(isa.Rng)
def rng(instr: isa.Rng, args, ctx: KernelContext):
    """StableHLO's rng, whose bits the spec leaves to the implementation: Threefry-2x32
    (jax.random's counter-based generator) keyed by RNG_SEED folded with the id of the value
    the op defines, so each op draws its own numbers, the same on every call, in every trip
    of a loop and on every chip where a and b are the same (chips whose a or b differ draw
    their own). Floats are drawn in FP32 (FP64 for FP64), a + (b - a) u for u uniform on
    [0, 1) or a + b n for n standard normal, and rounded once to the result type; a uniform
    draw that rounds up to b becomes the largest value below it, so results stay in [a, b).
    Integers and booleans are uniform on the integers of [a, b)."""
    a, b = args
    out = ctx.out_info(instr).type
    shape = ctx.out_shape(instr)  # mesh dims (1 where a and b do not vary) + the result's
    a, b = (x.reshape(x.shape + (1,) * out.rank) for x in (a, b))  # broadcast over it
    key = jax.random.fold_in(jax.random.key(RNG_SEED, impl="threefry2x32"), instr.outs[0])
    if not dtypes.is_float(out.dtype):
        wide = jnp.uint64 if out.dtype == "uint64" else jnp.int64
        drawn = jax.random.randint(key, shape, a.astype(wide), b.astype(wide), dtype=wide)
        return [drawn != 0 if out.dtype == "bool" else
                drawn.astype(dtypes.storage_dtype(out.dtype))]
    wide = jnp.float64 if out.dtype == "float64" else jnp.float32
    a, b = a.astype(wide), b.astype(wide)
    if instr.distribution == "NORMAL":
        return [numerics.round_to(a + b * jax.random.normal(key, shape, wide), out.dtype,
                                  ctx.rounding)]
    drawn = numerics.round_to(a + (b - a) * jax.random.uniform(key, shape, wide), out.dtype,
                              ctx.rounding)
    top = numerics.round_to(b, out.dtype)
    return [jnp.where(drawn.astype(wide) >= b, _below(top, out.dtype), drawn)]


def _below(x, name: str):
    """The largest value of float type `name` below each x (of that type), by its bits:
    one less in magnitude above zero, one more below, the smallest negative one at zero."""
    bits = _to_unsigned(x, name)
    sign = np.uint64(1 << (dtypes.bit_width(name) - 1))
    signed = float(ml_dtypes.finfo(dtypes.numpy_dtype(name)).min) < 0  # not E8M0
    positive = (bits & sign) == 0 if signed else jnp.ones_like(bits, bool)
    magnitude = bits & ~sign if signed else bits
    below = jnp.where(magnitude == 0, sign | np.uint64(1),
                      jnp.where(positive, bits - np.uint64(1), bits + np.uint64(1)))
    return _from_unsigned(below, name)


@kernel(isa.ReducePrecision)
def reduce_precision(instr: isa.ReducePrecision, args, ctx: KernelContext):
    (x,) = args
    return [lax.reduce_precision(x, instr.exponent_bits, instr.mantissa_bits)]


def bitcast_convert(x, from_type: str, to_type: str):
    """StableHLO's bitcast_convert: the bits of each element of `x` (type `from_type`) read
    as elements of `to_type`. A wider operand element becomes the last dim of the result
    and a narrower one comes from the operand's last dim, least significant bits first (the
    StableHLO interpreter's order: i1[64] -> i64 puts element 0 in bit 0)."""
    if from_type != to_type and (from_type in dtypes.COMPLEX_PARTS or
                                 to_type in dtypes.COMPLEX_PARTS):
        return _bitcast_complex(x, from_type, to_type)
    from_bits, to_bits = dtypes.bit_width(from_type), dtypes.bit_width(to_type)
    native = {from_type, to_type}.isdisjoint(_BIT_LEVEL_TYPES)
    if native and min(from_bits, to_bits) >= 8:  # whole bytes: XLA's bitcast, same order
        return lax.bitcast_convert_type(x, dtypes.numpy_dtype(to_type))
    bits = _to_unsigned(x, from_type)
    if from_bits > to_bits:  # each element splits into the last dim, low bits first
        shifts = np.arange(from_bits // to_bits, dtype=np.uint64) * to_bits
        bits = (bits[..., None] >> shifts) & np.uint64(2 ** to_bits - 1)
    elif from_bits < to_bits:  # the last dim's elements combine, the first in the low bits
        shifts = np.arange(to_bits // from_bits, dtype=np.uint64) * from_bits
        bits = jnp.bitwise_or.reduce(bits << shifts, axis=-1)
    return _from_unsigned(bits, to_type)


def _bitcast_complex(x, from_type: str, to_type: str):
    """bitcast_convert between complex types of different widths: a complex element is
    its real part's bits then its imaginary part's (the interpreter's order), so the parts
    are bitcast as a stream of floats and paired up again."""
    if from_type not in dtypes.COMPLEX_PARTS or to_type not in dtypes.COMPLEX_PARTS:
        raise TypeError(f"bitcast_convert between {from_type} and {to_type}: a complex "
                        "operand needs a complex result and the other way round")
    from_part, to_part = dtypes.COMPLEX_PARTS[from_type], dtypes.COMPLEX_PARTS[to_type]
    parts = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)  # [..., (re, im)]
    ratio = dtypes.bit_width(from_part) // dtypes.bit_width(to_part)
    if ratio > 1:  # each part splits: [..., 2, ratio] -> `ratio` complex elements
        stream = bitcast_convert(parts, from_part, to_part).reshape(*x.shape, ratio, 2)
    else:  # the last dim's parts combine: [..., n] -> [..., 2, n / 2] -> one element
        n = x.shape[-1] * 2
        grouped = parts.reshape(*x.shape[:-1], 2, n // 2)
        stream = bitcast_convert(grouped, from_part, to_part)
    return lax.complex(stream[..., 0], stream[..., 1])


# Types whose bits are not reachable by XLA's bitcast (booleans, the emulated floats) or
# that XLA's bitcast does not split into or combine from bytes (sub-byte types).
_BIT_LEVEL_TYPES = frozenset(dtypes.SUB_BYTE_BITS) | frozenset(dtypes.STORAGE_TYPES)


def _to_unsigned(x, name: str):
    """Each element's bit pattern as a uint64."""
    if name == "bool":
        return x.astype(jnp.uint64)
    if emulated_floats.is_emulated(name):
        return emulated_floats.to_bits(x, name).astype(jnp.uint64)
    unsigned = _unsigned_type(name)
    return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint64)


def _from_unsigned(bits, name: str):
    """Elements of type `name` with the bit patterns `bits` (uint64, within the width)."""
    if name == "bool":
        return bits != 0
    if emulated_floats.is_emulated(name):
        return emulated_floats.from_bits(bits, name)
    return lax.bitcast_convert_type(bits.astype(_unsigned_type(name)), dtypes.numpy_dtype(name))


def _unsigned_type(name: str) -> np.dtype:
    return dtypes.numpy_dtype(f"uint{dtypes.bit_width(name)}")
