"""Collectives across chips.

Every collective is written once over a grouped view of its operand: an array
[groups..., group_size, local...] holding, for each group, its members' values in rank order.
When the groups are lines of the mesh along some axes (`Groups.axes`), the view is a
transpose of the mesh dims and groups along axes the value does not vary along are not
materialised; otherwise it is a gather over the flattened device dim.

Reductions add the members' values in the order of the ring algorithm (each chunk starts at
the member after its owner and goes around the ring; mesh.isa.kernels.ring_order), each partial
sum rounded to the operand's type, as a ring does when it forwards partial sums between chips
in that type (the accumulation itself is FP32 on the collective engines).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.elementwise import boolean_equivalent
from mesh.isa.kernels.reduction import MONOIDS
from mesh.isa.kernels.ring_order import ring_reduce

class AxisView:
    """Groups that are the lines of the mesh along `axes` (rank order: major axis first)."""

    def __init__(self, groups: isa.Groups, ctx: KernelContext):
        self.axes = list(groups.axes)
        self.nm = ctx.nm
        self.sizes = ctx.mesh.axis_sizes
        self.rest = [a for a in range(self.nm) if a not in self.axes]

    def lines(self, x):
        """[rest mesh..., one dim per group axis (size 1 where x does not vary along it),
        local...]: each group's members, not broadcast."""
        return lax.transpose(x, tuple(self.rest + self.axes) + tuple(range(self.nm, x.ndim)))

    def gather(self, x):
        """[rest mesh..., group_size, local...], broadcast along the group's axes."""
        full = tuple(self.sizes[a] if a in self.axes else x.shape[a] for a in range(self.nm))
        x = jnp.broadcast_to(x, full + x.shape[self.nm:])
        y = lax.transpose(x, tuple(self.rest + self.axes) + tuple(range(self.nm, x.ndim)))
        n_rest = len(self.rest)
        members = int(np.prod([self.sizes[a] for a in self.axes], dtype=np.int64))
        # sizes spelled out, never -1: a zero-size operand has no size to infer it from
        return y.reshape(y.shape[:n_rest] + (members,) + y.shape[n_rest + len(self.axes):])

    def replicated(self, y):
        """[rest..., local...] (the same on every member) -> mesh layout."""
        return self._place(y, ())

    def per_member(self, y):
        """[rest..., group_size, local...] (member r gets entry r) -> mesh layout."""
        n_rest = len(self.rest)
        y = y.reshape(y.shape[:n_rest] + tuple(self.sizes[a] for a in self.axes)
                      + y.shape[n_rest + 1:])
        return self._place(y, tuple(self.axes))

    def _place(self, y, placed_axes):
        lead = self.rest + list(placed_axes)
        local = y.shape[len(lead):]
        missing = [a for a in range(self.nm) if a not in lead]
        y = y.reshape((1,) * len(missing) + y.shape)
        order = missing + lead
        perm = [order.index(a) for a in range(self.nm)] + list(range(self.nm, self.nm + len(local)))
        return lax.transpose(y, tuple(perm))


class DeviceView:
    """Arbitrary groups of logical device ids: work on the flattened device dim."""

    def __init__(self, groups: isa.Groups, ctx: KernelContext):
        self.groups = np.asarray(groups.device_groups, dtype=np.int64)  # [n_groups, size]
        self.nm = ctx.nm
        self.sizes = ctx.mesh.axis_sizes
        n = ctx.mesh.num_devices
        self.group_of = np.full(n, -1, np.int64)
        self.rank_of = np.full(n, -1, np.int64)
        for g, members in enumerate(self.groups):
            self.group_of[members] = g
            self.rank_of[members] = np.arange(len(members))
        if (self.group_of < 0).any():
            missing = np.nonzero(self.group_of < 0)[0].tolist()
            raise ValueError(f"devices {missing} are in no replica group")

    def gather(self, x):
        flat = jnp.broadcast_to(x, tuple(self.sizes) + x.shape[self.nm:])
        flat = flat.reshape((int(np.prod(self.sizes, dtype=np.int64)),) + x.shape[self.nm:])
        return flat[self.groups]

    def replicated(self, y):
        return y[self.group_of].reshape(tuple(self.sizes) + y.shape[1:])

    def per_member(self, y):
        return y[self.group_of, self.rank_of].reshape(tuple(self.sizes) + y.shape[2:])


def _view(groups: isa.Groups, ctx: KernelContext):
    return AxisView(groups, ctx) if groups.axes is not None else DeviceView(groups, ctx)


def _reduce_members(x, groups: isa.Groups, reduction: str, ctx: KernelContext,
                    scatter_dimension: int | None = None):
    """(view, [rest..., local...]): the reduction of x over each group, every element added
    in the order of the ring algorithm (mesh.isa.kernels.ring_order). For a reduce-scatter the
    ring's chunks are the blocks along `scatter_dimension`."""
    if groups.axes is None:
        view = DeviceView(groups, ctx)
        members, ring_sizes = view.gather(x), (groups.group_size,)
    else:
        view = AxisView(groups, ctx)
        members, ring_sizes = view.lines(x), tuple(ctx.mesh.axis_sizes[a] for a in groups.axes)
    lead = members.ndim - len(ring_sizes) - (x.ndim - ctx.nm)
    first_local = lead + len(ring_sizes)
    if scatter_dimension is not None:
        members = jnp.moveaxis(members, first_local + scatter_dimension, first_local)
    flat = members.reshape(members.shape[:first_local]
                           + (int(np.prod(members.shape[first_local:], dtype=np.int64)),))
    combine = MONOIDS[boolean_equivalent(reduction, x.dtype)][1]
    reduced = ring_reduce(flat, lead, ring_sizes, combine, ctx.rounding)
    local = members.shape[first_local:]
    reduced = reduced.reshape(reduced.shape[:lead] + local)
    if scatter_dimension is not None:
        reduced = jnp.moveaxis(reduced, lead, lead + scatter_dimension)
    return view, reduced


def _member_axis(view) -> int:
    return len(view.rest) if isinstance(view, AxisView) else 1


@kernel(isa.AllReduce)
def all_reduce(instr: isa.AllReduce, args, ctx: KernelContext):
    """Each operand reduced on its own (a combined all-reduce moves them in one launch)."""
    results = []
    for x in args:
        view, reduced = _reduce_members(x, instr.groups, instr.reduction, ctx)
        results.append(view.replicated(reduced))
    return results


@kernel(isa.ReduceScatter)
def reduce_scatter(instr: isa.ReduceScatter, args, ctx: KernelContext):
    view, reduced = _reduce_members(args[0], instr.groups, instr.reduction, ctx,
                                    scatter_dimension=instr.dimension)
    lead = reduced.ndim - (args[0].ndim - ctx.nm)
    size = instr.groups.group_size
    d = lead + instr.dimension
    y = reduced.reshape(reduced.shape[:d] + (size, reduced.shape[d] // size)
                        + reduced.shape[d + 1:])
    y = jnp.moveaxis(y, d, lead)  # member index after the group dims
    return [view.per_member(y)]


@kernel(isa.AllGather)
def all_gather(instr: isa.AllGather, args, ctx: KernelContext):
    view = _view(instr.groups, ctx)
    y = view.gather(args[0])  # [lead..., size, local...]
    lead = _member_axis(view)
    d = lead + instr.dimension  # position of the gathered dim once the member dim is gone
    y = jnp.moveaxis(y, lead, d)
    y = y.reshape(y.shape[:d] + (y.shape[d] * y.shape[d + 1],) + y.shape[d + 2:])
    return [view.replicated(y)]


@kernel(isa.AllToAll)
def all_to_all(instr: isa.AllToAll, args, ctx: KernelContext):
    """Member s cuts its value into `size` blocks along split_dimension and sends block r to
    member r, which concatenates the blocks it receives along concat_dimension in order s."""
    view = _view(instr.groups, ctx)
    y = view.gather(args[0])  # [lead..., sender, local...]
    lead = _member_axis(view)
    size = instr.groups.group_size
    split = lead + 1 + instr.split_dimension
    y = y.reshape(y.shape[:split] + (size, y.shape[split] // size) + y.shape[split + 1:])
    y = jnp.moveaxis(y, split, lead)  # [lead..., receiver, sender, local with split cut]
    concat = lead + 2 + instr.concat_dimension
    y = jnp.moveaxis(y, lead + 1, concat - 1)
    y = y.reshape(y.shape[:concat - 1] + (y.shape[concat - 1] * y.shape[concat],)
                  + y.shape[concat + 1:])
    return [view.per_member(y)]


@kernel(isa.CollectivePermute)
def collective_permute(instr: isa.CollectivePermute, args, ctx: KernelContext):
    (x,) = args
    n = ctx.mesh.num_devices
    source = np.full(n, -1, np.int64)
    for s, t in instr.pairs:
        source[t] = s
    flat = ctx.full(x).reshape((n,) + x.shape[ctx.nm:])
    received = flat[np.maximum(source, 0)]
    if (source < 0).any():
        mask = (source >= 0).reshape((n,) + (1,) * (x.ndim - ctx.nm))
        received = jnp.where(mask, received, jnp.zeros((), x.dtype))
    return [ctx.fit(received.reshape(ctx.mesh.axis_sizes + x.shape[ctx.nm:]), instr)]


@kernel(isa.RaggedAllToAll)
def ragged_all_to_all(instr: isa.RaggedAllToAll, args, ctx: KernelContext):
    """Each receiver looks up, for every row of its output, the last slice written over it
    (slices are applied in slot order, as jax's docstring writes them one after another)
    and gathers that row from its sender; rows no slice covers keep `output`."""
    n = ctx.mesh.num_devices
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes = (
        ctx.full(x).reshape((n,) + x.shape[ctx.nm:]) for x in args)
    size = instr.groups.group_size
    per_member = input_offsets.shape[1] // size  # slices each member sends each other one
    # peer[d, j]: the member that sends the slice device d receives in its slot j;
    # sent_as[d, j]: that slice's slot at the sender
    groups = np.asarray(instr.groups.device_groups, dtype=np.int64)
    group_of, rank_of = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for g, members in enumerate(groups):
        group_of[members], rank_of[members] = g, np.arange(size)
    slot = np.arange(size * per_member)
    peer = groups[group_of][:, slot // per_member]
    sent_as = rank_of[:, None] * per_member + slot % per_member
    start_in, start_out = input_offsets[peer, sent_as], output_offsets[peer, sent_as]
    count = jnp.minimum(send_sizes[peer, sent_as], recv_sizes)  # [n, K]
    rows = jnp.arange(output.shape[1], dtype=start_out.dtype)[None, :, None]  # [1, M, 1]
    source_row = start_in[:, None, :] + rows - start_out[:, None, :]  # [n, M, K]
    writes = ((rows >= start_out[:, None, :]) & (rows < (start_out + count)[:, None, :])
              & (source_row >= 0) & (source_row < operand.shape[1]))
    last = writes.shape[2] - 1 - jnp.argmax(writes[:, :, ::-1], axis=2)  # [n, M]
    source_row = jnp.take_along_axis(source_row, last[:, :, None], axis=2)[:, :, 0]
    received = operand[jnp.asarray(peer)[np.arange(n)[:, None], last],
                       jnp.clip(source_row, 0, operand.shape[1] - 1)]
    written = writes.any(axis=2).reshape(writes.shape[:2] + (1,) * (output.ndim - 2))
    result = jnp.where(written, received, output)
    return [ctx.fit(result.reshape(ctx.mesh.axis_sizes + output.shape[1:]), instr)]
