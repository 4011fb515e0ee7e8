"""reduce_window (pooling, cumulative sums) and select_and_scatter (max-pool gradients)."""

from __future__ import annotations

import numpy as np

from lowering.registry import rule
from lowering.rules.indexing import scatter_combiner
from lowering.rules.reduction import monoid
from lowering.walker import LoweringContext, Op
from mesh import isa


def window_attr(op: Op, name: str, rank: int, default: int) -> tuple[int, ...]:
    """An optional per-dim window attribute (strides, dilations), `default` in every dim
    when absent."""
    return tuple(int(v) for v in op.attr(name, (default,) * rank))


def padding_attr(op: Op, rank: int) -> tuple[tuple[int, int], ...]:
    """The optional `padding` attribute as (low, high) per dim; no padding when absent."""
    pairs = np.asarray(op.attr("padding", np.zeros((rank, 2), np.int64))).reshape(rank, 2)
    return tuple((int(low), int(high)) for low, high in pairs)


@rule("stablehlo.reduce_window")
def reduce_window(ctx: LoweringContext, op: Op):
    rank = op.operand_types[0].rank
    if any(ctx.varying(v) for v in op.operands[len(op.operands) // 2:]):
        raise NotImplementedError("a reduce_window whose init value differs from chip to chip")
    body = ctx.scalar_program(op.regions[0], "reducer")
    combiner = monoid(body) if len(op.operands) == 2 else None
    return ctx.emit(isa.ReduceWindow, op,
                    window_dimensions=tuple(op.attrs["window_dimensions"]),
                    window_strides=window_attr(op, "window_strides", rank, 1),
                    base_dilations=window_attr(op, "base_dilations", rank, 1),
                    window_dilations=window_attr(op, "window_dilations", rank, 1),
                    padding=padding_attr(op, rank), combiner=combiner,
                    body=None if combiner else body)


@rule("stablehlo.select_and_scatter")
def select_and_scatter(ctx: LoweringContext, op: Op):
    rank = op.operand_types[0].rank
    select = ctx.scalar_program(op.regions[0], "select")
    scatter = ctx.scalar_program(op.regions[1], "scatter")
    combiner = scatter_combiner(scatter)
    return ctx.emit(isa.SelectAndScatter, op,
                    window_dimensions=window_attr(op, "window_dimensions", rank, 1),
                    window_strides=window_attr(op, "window_strides", rank, 1),
                    padding=padding_attr(op, rank), select=select, scatter_combiner=combiner,
                    scatter_body=None if combiner else scatter)
