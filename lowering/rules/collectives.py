"""Collectives: replica groups decoded into logical mesh axes."""

from __future__ import annotations

import numpy as np

from lowering.registry import rule
from lowering.replica_groups import decode_groups
from lowering.rules.reduction import monoid
from lowering.walker import LoweringContext, Op
from mesh import isa


def _groups(ctx: LoweringContext, op: Op) -> isa.Groups:
    return decode_groups(np.asarray(op.attrs["replica_groups"]), ctx.mesh)


def _reduction(ctx: LoweringContext, op: Op) -> str:
    body = ctx.scalar_program(op.regions[0], "reducer")
    reduction = monoid(body)
    if reduction is None:
        raise NotImplementedError(f"{op.name} with a reduction body other than one of "
                                  f"{', '.join(isa.REDUCTIONS)}")
    return reduction


def _same_within_groups(ctx: LoweringContext, value: int, groups: isa.Groups) -> frozenset[int]:
    """Layout of a result that is the same on every member of a group."""
    if groups.axes is None:
        return frozenset(range(ctx.mesh.rank))
    return ctx.varying(value) - frozenset(groups.axes)


def _per_member(ctx: LoweringContext, value: int, groups: isa.Groups) -> frozenset[int]:
    """Layout of a result that differs from member to member."""
    if groups.axes is None:
        return frozenset(range(ctx.mesh.rank))
    return ctx.varying(value) | frozenset(groups.axes)


@rule("stablehlo.all_reduce")
def all_reduce(ctx: LoweringContext, op: Op):
    groups, reduction = _groups(ctx, op), _reduction(ctx, op)
    return tuple(ctx.emit(isa.AllReduce, op, ins=(v,), out_types=(t,),
                          varying=_same_within_groups(ctx, v, groups),
                          groups=groups, reduction=reduction)[0]
                 for v, t in zip(op.operands, op.result_types))


@rule("stablehlo.all_gather")
def all_gather(ctx: LoweringContext, op: Op):
    groups = _groups(ctx, op)
    return tuple(ctx.emit(isa.AllGather, op, ins=(v,), out_types=(t,),
                          varying=_same_within_groups(ctx, v, groups),
                          groups=groups, dimension=op.attrs["all_gather_dim"])[0]
                 for v, t in zip(op.operands, op.result_types))


@rule("stablehlo.reduce_scatter")
def reduce_scatter(ctx: LoweringContext, op: Op):
    groups, reduction = _groups(ctx, op), _reduction(ctx, op)
    (v,) = op.operands
    return ctx.emit(isa.ReduceScatter, op, varying=_per_member(ctx, v, groups), groups=groups,
                    dimension=op.attrs["scatter_dimension"], reduction=reduction)


@rule("stablehlo.all_to_all")
def all_to_all(ctx: LoweringContext, op: Op):
    groups = _groups(ctx, op)
    if groups.group_size != op.attrs["split_count"]:
        raise ValueError(f"split_count {op.attrs['split_count']} differs from the replica "
                         f"group size {groups.group_size}")
    return tuple(ctx.emit(isa.AllToAll, op, ins=(v,), out_types=(t,),
                          varying=_per_member(ctx, v, groups), groups=groups,
                          split_dimension=op.attrs["split_dimension"],
                          concat_dimension=op.attrs["concat_dimension"])[0]
                 for v, t in zip(op.operands, op.result_types))


@rule("stablehlo.collective_permute")
def collective_permute(ctx: LoweringContext, op: Op):
    pairs = np.asarray(op.attrs["source_target_pairs"], dtype=np.int64).reshape(-1, 2)
    n = ctx.mesh.num_devices
    if pairs.size and (pairs.min() < 0 or pairs.max() >= n):
        raise ValueError(f"source_target_pairs name devices outside 0..{n - 1}")
    for column, role in ((0, "source"), (1, "target")):
        ids, counts = np.unique(pairs[:, column], return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"device {int(ids[counts > 1][0])} is the {role} of several pairs")
    (v,) = op.operands
    return ctx.emit(isa.CollectivePermute, op, varying=_permute_layout(ctx, v, pairs),
                    pairs=tuple((int(s), int(t)) for s, t in pairs))


def _permute_layout(ctx: LoweringContext, value: int, pairs: np.ndarray) -> frozenset[int]:
    """The result varies along the axes data moves along (and those the input varies
    along); where some device receives nothing it gets zeros, so the result varies along
    every axis."""
    if len(set(pairs[:, 1].tolist())) < ctx.mesh.num_devices:
        return frozenset(range(ctx.mesh.rank))
    coords = ctx.mesh.device_coords()
    moved = coords[pairs[:, 0]] != coords[pairs[:, 1]]
    return ctx.varying(value) | frozenset(np.nonzero(moved.any(axis=0))[0].tolist())
