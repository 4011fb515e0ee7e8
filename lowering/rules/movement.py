"""Data movement: broadcast, reshape, transpose, slices, concatenate, pad, reverse."""

from __future__ import annotations

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa


@rule("stablehlo.broadcast_in_dim")
def broadcast_in_dim(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.BroadcastInDim, op, dimensions=tuple(op.attrs["broadcast_dimensions"]),
                    shape=op.result_types[0].shape)


@rule("stablehlo.reshape")
def reshape(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Reshape, op, shape=op.result_types[0].shape)


@rule("stablehlo.transpose")
def transpose(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Transpose, op, permutation=tuple(op.attrs["permutation"]))


@rule("stablehlo.slice")
def slice_(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Slice, op, start=tuple(op.attrs["start_indices"]),
                    limit=tuple(op.attrs["limit_indices"]), strides=tuple(op.attrs["strides"]))


@rule("stablehlo.dynamic_slice")
def dynamic_slice(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.DynamicSlice, op, sizes=tuple(op.attrs["slice_sizes"]))


@rule("stablehlo.dynamic_update_slice")
def dynamic_update_slice(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.DynamicUpdateSlice, op)


@rule("stablehlo.concatenate")
def concatenate(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Concatenate, op, dimension=op.attrs["dimension"])


@rule("stablehlo.pad")
def pad(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Pad, op, low=tuple(op.attrs["edge_padding_low"]),
                    high=tuple(op.attrs["edge_padding_high"]),
                    interior=tuple(op.attrs["interior_padding"]))


@rule("stablehlo.reverse")
def reverse(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Reverse, op, dimensions=tuple(op.attrs["dimensions"]))
