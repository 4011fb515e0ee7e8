"""Random bits, bit-level rounding and bitcasts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, emulated_floats, isa
from mesh.isa.kernels import kernel
from mesh.isa.kernels.context import KernelContext

ALGORITHMS = {
    "DEFAULT": lax.RandomAlgorithm.RNG_DEFAULT,
    "THREE_FRY": lax.RandomAlgorithm.RNG_THREE_FRY,
    "PHILOX": lax.RandomAlgorithm.RNG_PHILOX,
}


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
