"""Ops with shape operands that stay after shape refinement (lowering.dynamic_shapes): their
result type is static, but an operand that gives sizes is not a constant of the module.

dynamic_iota, dynamic_reshape and dynamic_broadcast_in_dim are then their static forms (the
result type says all); dynamic_gather's slice sizes follow from its result type too. The
padding of dynamic_pad and dynamic_conv must be known while lowering (lowering.folding: a
value computed from constants and device ids); otherwise the error names the operand. A shape
operand known while lowering must give the result's type, as the spec requires.
"""

from __future__ import annotations

import numpy as np

from lowering.dynamic_shapes import SHAPE_OPERANDS
from lowering.registry import rule
from lowering.rules.convolution import emit_convolution
from lowering.rules.windows import window_attr
from lowering.walker import LoweringContext, Op
from mesh import isa


def known_operand(ctx: LoweringContext, op: Op, index: int) -> np.ndarray:
    """The value of operand `index`, known while lowering and the same on every chip."""
    known = ctx.builder.known.get(op.operands[index])
    name = SHAPE_OPERANDS[op.name][index]
    if known is None or any(n != 1 for n in known.shape[:ctx.mesh.rank]):
        why = "differs from chip to chip" if known is not None else \
            "is not known while lowering (a constant, or elementwise arithmetic on constants and " \
            "device ids)"
        raise NotImplementedError(f"operand {index} ({name}) of {op.name} {why}; jax-trn2 "
                                  "runs static shapes only")
    return known.reshape(known.shape[ctx.mesh.rank:])


def check_output_shape(ctx: LoweringContext, op: Op, index: int) -> None:
    """The spec's constraint that shape operand `index` is the result's shape, checked
    where the operand is known while lowering (it is the program's input otherwise)."""
    known = ctx.builder.known.get(op.operands[index])
    if known is None:
        return
    shape = op.result_types[0].shape
    given = np.unique(known.reshape(-1, len(shape)), axis=0)  # one row per distinct value
    if len(given) != 1 or tuple(given[0]) != shape:
        raise ValueError(f"operand {index} ({SHAPE_OPERANDS[op.name][index]}) is "
                         f"{given.tolist()}, but the result's shape is {list(shape)}")


@rule("stablehlo.dynamic_iota")
def dynamic_iota(ctx: LoweringContext, op: Op):
    check_output_shape(ctx, op, 0)
    return ctx.emit(isa.Iota, op, ins=(), dimension=op.attrs["iota_dimension"])


@rule("stablehlo.dynamic_reshape")
def dynamic_reshape(ctx: LoweringContext, op: Op):
    check_output_shape(ctx, op, 1)
    return ctx.emit(isa.Reshape, op, ins=op.operands[:1], shape=op.result_types[0].shape)


@rule("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(ctx: LoweringContext, op: Op):
    check_output_shape(ctx, op, 1)
    return ctx.emit(isa.BroadcastInDim, op, ins=op.operands[:1],
                    dimensions=tuple(op.attrs["broadcast_dimensions"]),
                    shape=op.result_types[0].shape)


@rule("stablehlo.dynamic_pad")
def dynamic_pad(ctx: LoweringContext, op: Op):
    low, high, interior = (tuple(int(v) for v in known_operand(ctx, op, i).ravel())
                           for i in (2, 3, 4))
    check_padded_shape(op, low, high, interior)
    return ctx.emit(isa.Pad, op, ins=op.operands[:2], low=low, high=high, interior=interior)


def check_padded_shape(op: Op, low: tuple[int, ...], high: tuple[int, ...],
                       interior: tuple[int, ...]) -> None:
    """The spec's constraint that the padding gives the result's shape (MLIR's verifier
    checks it only where the padding operands are constants of the module)."""
    operand, result = op.operand_types[0].shape, op.result_types[0].shape
    padded = tuple(lo + n + max(n - 1, 0) * inner + hi
                   for n, lo, hi, inner in zip(operand, low, high, interior))
    if padded != result:
        raise ValueError(f"operands 2, 3 and 4 (edge_padding_low, edge_padding_high, "
                         f"interior_padding) are {list(low)}, {list(high)} and "
                         f"{list(interior)}, which pad shape {list(operand)} to "
                         f"{list(padded)}, but the result's shape is {list(result)}")


@rule("stablehlo.dynamic_gather")
def dynamic_gather(ctx: LoweringContext, op: Op):
    """A gather whose slice sizes are its result's offset dims, in operand order, and 1 in
    the collapsed and batching dims."""
    dims = op.attrs["dimension_numbers"]
    result = op.result_types[0].shape
    offsets = iter(result[d] for d in dims.offset_dims)
    ones = set(dims.collapsed_slice_dims) | set(dims.operand_batching_dims)
    slice_sizes = tuple(1 if d in ones else next(offsets)
                        for d in range(op.operand_types[0].rank))
    return ctx.emit(isa.Gather, op, ins=op.operands[:2], offset_dims=dims.offset_dims,
                    collapsed_slice_dims=dims.collapsed_slice_dims,
                    operand_batching_dims=dims.operand_batching_dims,
                    start_indices_batching_dims=dims.start_indices_batching_dims,
                    start_index_map=dims.start_index_map,
                    index_vector_dim=dims.index_vector_dim, slice_sizes=slice_sizes,
                    indices_are_sorted=op.attr("indices_are_sorted", False))


@rule("stablehlo.dynamic_conv")
def dynamic_conv(ctx: LoweringContext, op: Op):
    padding = tuple((int(lo), int(hi)) for lo, hi in known_operand(ctx, op, 2).reshape(-1, 2))
    check_convolved_shape(op, padding)
    return emit_convolution(ctx, op, padding)


def check_convolved_shape(op: Op, padding: tuple[tuple[int, int], ...]) -> None:
    """The spec's constraint that the padding gives the result's spatial dims (MLIR's
    verifier checks it only where the padding operand is a constant of the module)."""
    dims = op.attrs["dimension_numbers"]
    spatial = len(padding)
    lhs, rhs = op.operand_types[0].shape, op.operand_types[1].shape
    strides = window_attr(op, "window_strides", spatial, 1)
    lhs_dilation = window_attr(op, "lhs_dilation", spatial, 1)
    rhs_dilation = window_attr(op, "rhs_dilation", spatial, 1)
    convolved = []
    for i, (low, high) in enumerate(padding):
        padded = low + _dilated(lhs[dims.lhs_spec[2 + i]], lhs_dilation[i]) + high
        window = _dilated(rhs[dims.rhs_spec[2 + i]], rhs_dilation[i])
        convolved.append(0 if padded < window else (padded - window) // strides[i] + 1)
    result = [op.result_types[0].shape[d] for d in dims.out_spec[2:]]
    if convolved != result:
        raise ValueError(f"operand 2 (padding) is {[list(p) for p in padding]}, which gives "
                         f"spatial dims {convolved}, but the result's are {result}")


def _dilated(size: int, dilation: int) -> int:
    """A dim's size with `dilation - 1` holes between its elements."""
    return 0 if size == 0 else (size - 1) * dilation + 1
