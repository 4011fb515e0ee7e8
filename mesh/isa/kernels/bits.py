"""Random bits and bit-level rounding."""

from __future__ import annotations

import numpy as np
from jax import lax

from mesh import dtypes, isa
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
