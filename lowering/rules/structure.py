"""Program structure: shard_map bodies, calls, and ops that only carry sharding hints."""

from __future__ import annotations

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa


def _dim_axes(ctx: LoweringContext, sharding) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(ctx.mesh.axis_index(a) for a in dim) for dim in sharding.dims)


@rule("sdy.manual_computation")
def manual_computation(ctx: LoweringContext, op: Op):
    """A shard_map body: split the global operands by in_shardings, run the body per chip,
    assemble the results by out_shardings."""
    pieces = []
    for value, sharding, local in zip(op.operands, op.attrs["in_shardings"],
                                      op.regions[0].arg_types):
        if ctx.varying(value):
            raise NotImplementedError("a shard_map nested inside another shard_map")
        dim_axes = _dim_axes(ctx, sharding)
        pieces += ctx.emit(isa.Shard, op, ins=(value,), out_types=(local,),
                           varying=frozenset(a for axes in dim_axes for a in axes),
                           dim_axes=dim_axes)
    results = ctx.inline_region(op.regions[0], pieces)
    return tuple(ctx.emit(isa.Unshard, op, ins=(value,), out_types=(global_,),
                          varying=frozenset(), dim_axes=_dim_axes(ctx, sharding))[0]
                 for value, sharding, global_ in zip(results, op.attrs["out_shardings"],
                                                     op.result_types))


@rule("func.call")
def call(ctx: LoweringContext, op: Op):
    return ctx.call(op.attrs["callee"], op.operands)


@rule("sdy.sharding_constraint", "sdy.reshard", "stablehlo.optimization_barrier")
def identity(ctx: LoweringContext, op: Op):
    """Sharding hints and barriers do not change values."""
    return op.operands


@rule("stablehlo.custom_call")
def custom_call(ctx: LoweringContext, op: Op):
    target = op.attrs["call_target_name"]
    if target == "Sharding" and op.operand_types == op.result_types:
        return op.operands
    raise NotImplementedError(f"stablehlo.custom_call @{target} is not supported by jax-trn2")
