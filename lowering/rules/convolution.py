"""convolution onto the Tensor Engine."""

from __future__ import annotations

from lowering.registry import rule
from lowering.rules.windows import padding_attr, window_attr
from lowering.walker import LoweringContext, Op
from mesh import isa


@rule("stablehlo.convolution")
def convolution(ctx: LoweringContext, op: Op):
    dims = op.attrs["dimension_numbers"]
    return emit_convolution(ctx, op, padding_attr(op, len(dims.lhs_spec) - 2))


def emit_convolution(ctx: LoweringContext, op: Op,
                     padding: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """A Convolution of the op's lhs and rhs (its first two operands) with this padding
    and the op's other attributes."""
    dims = op.attrs["dimension_numbers"]
    spatial = len(dims.lhs_spec) - 2
    return ctx.emit(isa.Convolution, op, ins=op.operands[:2], lhs_spec=dims.lhs_spec,
                    rhs_spec=dims.rhs_spec, out_spec=dims.out_spec,
                    window_strides=window_attr(op, "window_strides", spatial, 1),
                    padding=padding,
                    lhs_dilation=window_attr(op, "lhs_dilation", spatial, 1),
                    rhs_dilation=window_attr(op, "rhs_dilation", spatial, 1),
                    window_reversal=tuple(op.attr("window_reversal", (False,) * spatial)),
                    feature_group_count=op.attr("feature_group_count", 1),
                    batch_group_count=op.attr("batch_group_count", 1),
                    out_dtype=op.result_types[0].dtype)
