"""Elementwise ops, constants, iota and device ids."""

from __future__ import annotations

import numpy as np

from lowering import folding
from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa
from mesh.isa.kernels.elementwise import BINARY, UNARY

# Kernel ops jax emits in the CHLO dialect (the others are StableHLO ops; tan is both).
CHLO = frozenset({"acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan",
                  "erf", "erfc", "erf_inv", "lgamma", "digamma", "bessel_i1e", "square",
                  "is_inf", "is_pos_inf", "is_neg_inf", "next_after", "polygamma", "zeta",
                  "mulhi", "conj"})


def _elementwise(ctx: LoweringContext, op: Op):
    return _emit_elementwise(ctx, op, op=op.short_name)


def _emit_elementwise(ctx: LoweringContext, op: Op, /, **params) -> tuple[int, ...]:
    """An Elementwise instruction, or the Constant it computes when its operands are
    known while lowering (integer arithmetic on device ids: lowering.folding)."""
    return folding.fold(ctx, op, isa.Elementwise, **params) or \
        ctx.emit(isa.Elementwise, op, **params)


# HLO has an erf op but StableHLO does not: a module XLA partitioned (converted back from
# HLO) spells chlo.erf mhlo.erf.
MHLO = frozenset({"erf"})

# The elementwise ops' names (with their dialects), those with the rule below and compare's:
# what lowering.memory_layouts keeps a value's memory order through.
OP_NAMES: set[str] = {"stablehlo.compare"}
for _name in list(UNARY) + list(BINARY) + ["select", "clamp", "convert", "bitcast_convert"]:
    _dialects = ("chlo", "stablehlo") if _name == "tan" else \
        ("chlo",) if _name in CHLO else ("stablehlo",)
    _dialects += ("mhlo",) if _name in MHLO else ()
    OP_NAMES.update(f"{d}.{_name}" for d in _dialects)
    rule(*(f"{d}.{_name}" for d in _dialects))(_elementwise)


@rule("stablehlo.map")
def map_(ctx: LoweringContext, op: Op):
    rank = op.result_types[0].rank
    if tuple(op.attrs["dimensions"]) != tuple(range(rank)):
        raise ValueError(f"map over dimensions {list(op.attrs['dimensions'])}: the spec "
                         f"requires all of them in order, {list(range(rank))}")
    return ctx.emit(isa.Map, op, body=ctx.scalar_program(op.regions[0], "computation"))


@rule("stablehlo.compare")
def compare(ctx: LoweringContext, op: Op):
    return _emit_elementwise(ctx, op, op="compare",
                             direction=op.attrs["comparison_direction"],
                             compare_type=op.attr("compare_type", ""))


@rule("stablehlo.constant")
def constant(ctx: LoweringContext, op: Op):
    value = np.asarray(op.attrs["value"]).reshape(op.result_types[0].shape)
    (out,) = ctx.emit(isa.Constant, op, value=value)
    folding.remember(ctx, out, value.reshape((1,) * ctx.mesh.rank + value.shape))
    return (out,)


@rule("stablehlo.iota")
def iota(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Iota, op, dimension=op.attrs["iota_dimension"])


@rule("stablehlo.partition_id", "stablehlo.replica_id")
def device_id(ctx: LoweringContext, op: Op):
    kind = "partition" if op.short_name == "partition_id" else "replica"
    axes = ctx.grid.partition_axes if kind == "partition" else ctx.grid.replica_axes
    (out,) = ctx.emit(isa.DeviceId, op, ins=(), varying=frozenset(axes), kind=kind, axes=axes)
    folding.remember_source(ctx, out, isa.DeviceId, kind=kind, axes=axes)
    return (out,)
