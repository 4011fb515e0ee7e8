"""rng_bit_generator, rng and reduce_precision."""

from __future__ import annotations

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa

# RNG state types lax.rng_bit_generator takes (XLA's u64[2], or the same bits as u32[4]).
RNG_STATE_TYPES = (isa.TensorType((2,), "uint64"), isa.TensorType((4,), "uint32"))


@rule("stablehlo.rng_bit_generator")
def rng_bit_generator(ctx: LoweringContext, op: Op):
    state = op.operand_types[0]
    if state not in RNG_STATE_TYPES:
        raise NotImplementedError(f"rng_bit_generator with a {state} state (supported: "
                                  f"{', '.join(map(str, RNG_STATE_TYPES))})")
    return ctx.emit(isa.RngBitGenerator, op, algorithm=op.attr("rng_algorithm", "DEFAULT"))


@rule("stablehlo.rng")
def rng(ctx: LoweringContext, op: Op):
    """Random numbers of the result's shape from scalars a and b (the shape operand gives
    the result type, static here; MLIR's verifier has checked the spec's constraints)."""
    return ctx.emit(isa.Rng, op, ins=op.operands[:2], distribution=op.attr("rng_distribution"))


@rule("stablehlo.reduce_precision")
def reduce_precision(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.ReducePrecision, op, exponent_bits=op.attrs["exponent_bits"],
                    mantissa_bits=op.attrs["mantissa_bits"])
