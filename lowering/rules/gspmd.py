"""The custom calls of GSPMD programs (jax without Shardy): sharding annotations and the
boundaries of shard_map bodies, on the mesh the program's shardings are made of
(lowering.hlo_sharding).

jax enters a body with `Sharding(x) {mhlo.sharding = tiling}` then
`SPMDFullToShardShape {mhlo.sharding = manual}`, and leaves it with `Sharding {manual}` then
`SPMDShardToFullShape {mhlo.sharding = tiling}`. A partially manual body (shard_map with
axis_names=) has the manual axes as the MANUAL subgroup of its shardings.

stablehlo.custom_call's rule (rules/structure.py) dispatches these targets here
(lowering.registry.CUSTOM_CALL_RULES).
"""

from __future__ import annotations

from lowering import hlo_sharding
from lowering.registry import custom_call_rule
from lowering.walker import LoweringContext, Op
from mesh import isa


@custom_call_rule("Sharding")
def sharding(ctx: LoweringContext, op: Op):
    """The value is unchanged; its HloSharding is kept for an SPMDFullToShardShape."""
    if op.operand_types != op.result_types:
        raise ValueError("a Sharding custom call that changes its operand's type")
    if hlo_sharding.SHARDING_ATTR in op.attrs:
        ctx.walker.value_shardings[op.operands[0]] = op.attrs[hlo_sharding.SHARDING_ATTR]
    return op.operands


@custom_call_rule("SPMDFullToShardShape")
def full_to_shard(ctx: LoweringContext, op: Op):
    """Enter a shard_map body: the value split by the tiling annotated on it, along the
    axes that are manual inside the body and were not outside."""
    (value,) = op.operands
    annotation = ctx.walker.value_shardings.get(value)
    if annotation is None:
        raise ValueError("SPMDFullToShardShape of a value no Sharding custom call annotates")
    entered = _axes_between(ctx, inner=op.attrs[hlo_sharding.SHARDING_ATTR], outer=annotation)
    dim_axes = _dim_axes(ctx, annotation, op.operand_types[0].rank, entered)
    split = frozenset(a for axes in dim_axes for a in axes)
    return ctx.emit(isa.Shard, op, varying=(ctx.varying(value) - frozenset(entered)) | split,
                    dim_axes=dim_axes, manual_axes=_listed(ctx, entered))


@custom_call_rule("SPMDShardToFullShape")
def shard_to_full(ctx: LoweringContext, op: Op):
    """Leave a shard_map body: the pieces assembled by the op's own tiling, along the axes
    that were manual inside the body and are not outside."""
    (value,) = op.operands
    annotation = ctx.walker.value_shardings.get(value)
    if annotation is None:
        raise ValueError("SPMDShardToFullShape of a value no Sharding custom call annotates")
    target = op.attrs[hlo_sharding.SHARDING_ATTR]
    left = _axes_between(ctx, inner=annotation, outer=target)
    dim_axes = _dim_axes(ctx, target, op.result_types[0].rank, left)
    return ctx.emit(isa.Unshard, op, varying=ctx.varying(value) - frozenset(left),
                    dim_axes=dim_axes, manual_axes=_listed(ctx, left))


def _axes_between(ctx: LoweringContext, inner: str, outer: str) -> tuple[int, ...]:
    """The axes a body boundary crosses: manual in the body (sharding `inner`), not around
    it (`outer`; a nested body's surroundings are partially manual)."""
    around = set(hlo_sharding.manual_axes(outer, ctx.mesh))
    return tuple(a for a in hlo_sharding.manual_axes(inner, ctx.mesh) if a not in around)


def _dim_axes(ctx: LoweringContext, text: str, rank: int,
              crossed: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    tiling = hlo_sharding.parse(text)
    if tiling is None:
        return ((),) * rank
    return tuple(tuple(a for a in axes if a in crossed)
                 for axes in hlo_sharding.dim_axes(tiling, ctx.mesh))


def _listed(ctx: LoweringContext, crossed: tuple[int, ...]) -> tuple[int, ...] | None:
    """isa.Shard's manual_axes: None when the boundary crosses every axis."""
    return crossed if len(crossed) < ctx.mesh.rank else None
