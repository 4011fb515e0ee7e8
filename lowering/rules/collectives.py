"""Collectives: replica groups decoded into logical mesh axes.

A collective's replica_groups (or source_target_pairs) name replicas, partitions or
flattened process ids as its channel_id and use_global_device_ids say (the StableHLO spec's
grouping strategies); the module's process grid turns them into logical device ids.
"""

from __future__ import annotations

import numpy as np

from lowering.registry import custom_call_rule, rule
from lowering.mlir import MeshAxesGroups
from lowering.replica_groups import decode_groups, grouping_mode, mesh_axes_groups
from lowering.rules.reduction import monoid
from lowering.walker import LoweringContext, Op
from mesh import isa


def _mode(op: Op) -> str:
    channel_id = op.attr("channel_handle", (0, 0))[0]
    return grouping_mode(op.name, channel_id, bool(op.attr("use_global_device_ids", False)))


def _process_groups(ctx: LoweringContext, op: Op, complete: bool = True) -> np.ndarray:
    """The op's groups as logical device ids [groups, size]."""
    groups = op.attrs["replica_groups"]
    if isinstance(groups, MeshAxesGroups):  # axes of an sdy.mesh of the module, or inline
        mesh = ctx.walker.module_mesh(groups.mesh) if isinstance(groups.mesh, str) else \
            isa.MeshSpec(tuple(name for name, _ in groups.mesh),
                         tuple(size for _, size in groups.mesh))
        groups = mesh_axes_groups(mesh, groups.axes)
    return ctx.grid.process_groups(np.asarray(groups), _mode(op), complete)


def _groups(ctx: LoweringContext, op: Op) -> isa.Groups:
    return decode_groups(_process_groups(ctx, op), ctx.mesh)


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
    if groups.group_size == 1:  # every device alone: nothing to combine
        return op.operands
    # a variadic all-reduce (lowering.combine) is one collective launch of all its operands
    return ctx.emit(isa.AllReduce, op,
                    out_layouts=[_same_within_groups(ctx, v, groups) for v in op.operands],
                    groups=groups, reduction=reduction)


@rule("stablehlo.all_gather")
def all_gather(ctx: LoweringContext, op: Op):
    groups = _groups(ctx, op)
    if groups.group_size == 1:
        return op.operands
    return tuple(ctx.emit(isa.AllGather, op, ins=(v,), out_types=(t,),
                          varying=_same_within_groups(ctx, v, groups),
                          groups=groups, dimension=op.attrs["all_gather_dim"])[0]
                 for v, t in zip(op.operands, op.result_types))


@rule("stablehlo.reduce_scatter")
def reduce_scatter(ctx: LoweringContext, op: Op):
    groups, reduction = _groups(ctx, op), _reduction(ctx, op)
    if groups.group_size == 1:
        return op.operands
    (v,) = op.operands
    return ctx.emit(isa.ReduceScatter, op, varying=_per_member(ctx, v, groups), groups=groups,
                    dimension=op.attrs["scatter_dimension"], reduction=reduction)


@rule("stablehlo.all_to_all")
def all_to_all(ctx: LoweringContext, op: Op):
    groups = _groups(ctx, op)
    if groups.group_size != op.attrs["split_count"]:
        raise ValueError(f"split_count {op.attrs['split_count']} differs from the replica "
                         f"group size {groups.group_size}")
    if groups.group_size == 1:
        return op.operands
    return tuple(ctx.emit(isa.AllToAll, op, ins=(v,), out_types=(t,),
                          varying=_per_member(ctx, v, groups), groups=groups,
                          split_dimension=op.attrs["split_dimension"],
                          concat_dimension=op.attrs["concat_dimension"])[0]
                 for v, t in zip(op.operands, op.result_types))


@custom_call_rule("ragged_all_to_all")
def ragged_all_to_all(ctx: LoweringContext, op: Op):
    """jax.lax.ragged_all_to_all, a custom call whose replica groups and channel are in
    its backend config (read as all_to_all's)."""
    config = op.backend_config
    groups = ctx.grid.process_groups(
        np.asarray(config.get("replica_groups", np.zeros((0, 0), np.int64))),
        grouping_mode("ragged_all_to_all", int(config.get("channel_id", 0)), False))
    groups = decode_groups(groups, ctx.mesh)
    _check_ragged(op, groups.group_size)
    inputs = frozenset().union(*(ctx.varying(v) for v in op.operands))
    return ctx.emit(isa.RaggedAllToAll, op, groups=groups,
                    varying=inputs | _per_member(ctx, op.operands[1], groups))


def _check_ragged(op: Op, group_size: int) -> None:
    operand, output, *offsets = op.operand_types
    names = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    if not operand.shape or operand.dtype != output.dtype or \
            operand.shape[1:] != output.shape[1:]:
        raise ValueError(f"ragged_all_to_all: operand {operand} and output {output} must have "
                         "the same element type and the same shape after the leading dim")
    for name, t in zip(names, offsets):
        integer = t.dtype.startswith(("int", "uint"))
        if len(t.shape) != 1 or t.shape != offsets[0].shape or not integer:
            raise ValueError(f"ragged_all_to_all: {name} is {t}; the offsets and sizes must "
                             f"be 1-D integer arrays of one length")
    if offsets[0].shape[0] % group_size:
        raise ValueError(f"ragged_all_to_all: {offsets[0].shape[0]} offsets do not divide "
                         f"among the {group_size} members of a replica group")


@rule("stablehlo.collective_permute")
def collective_permute(ctx: LoweringContext, op: Op):
    pairs = ctx.grid.process_pairs(np.asarray(op.attrs["source_target_pairs"]), _mode(op))
    for column, role in ((0, "source"), (1, "target")):
        ids, counts = np.unique(pairs[:, column], return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"device {int(ids[counts > 1][0])} is the {role} of several pairs")
    (v,) = op.operands
    return ctx.emit(isa.CollectivePermute, op, varying=_permute_layout(ctx, v, pairs),
                    pairs=tuple((int(s), int(t)) for s, t in pairs))


@rule("stablehlo.collective_broadcast")
def collective_broadcast(ctx: LoweringContext, op: Op):
    """Each group's first member sends its operand to the others; a device in no group gets
    zeros. A one-to-many collective_permute."""
    groups = _process_groups(ctx, op, complete=False)
    pairs = np.stack([np.repeat(groups[:, 0], groups.shape[1]), groups.ravel()], axis=1)
    (v,) = op.operands
    return ctx.emit(isa.CollectivePermute, op, varying=_permute_layout(ctx, v, pairs),
                    pairs=tuple((int(s), int(t)) for s, t in pairs))


def _permute_layout(ctx: LoweringContext, value: int, pairs: np.ndarray) -> frozenset[int]:
    """The axes along which the result differs from chip to chip. A source sends the
    operand's copy named by its coordinates along the axes the operand varies along; a chip
    that receives nothing gets zeros. The result varies along an axis where what the chips
    receive changes along it (which need not be an axis the data moves along)."""
    mesh = ctx.mesh
    varying = sorted(ctx.varying(value))
    coords = mesh.device_coords()
    copy_of = np.ravel_multi_index(tuple(coords[:, varying].T),
                                   tuple(mesh.axis_sizes[a] for a in varying)) \
        if varying else np.zeros(mesh.num_devices, np.int64)
    received = np.full(mesh.num_devices, -1, np.int64)  # -1: zeros
    received[pairs[:, 1]] = copy_of[pairs[:, 0]]
    received = received.reshape(mesh.axis_sizes)
    return frozenset(a for a in range(mesh.rank) if (np.diff(received, axis=a) != 0).any())
