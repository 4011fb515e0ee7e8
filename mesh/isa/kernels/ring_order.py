"""The order in which ring collectives add up their members' values.

A ring reduce-scatter over k members cuts the buffer into k chunks, chunk c for member c.
Chunk c starts at the member after its owner and travels around the ring, each member adding
its own contribution, and ends at c: it is added in the order c+1, c+2, ..., c+k-1, c (mod k).
A bidirectional ring sends the first half of every chunk that way and the second half the
other way round (c-1, c-2, ..., c). Each partial sum is rounded to the operand's type when it
is sent (the collective engines add in FP32, but partials travel in the operand's type).
All-reduce is reduce-scatter then all-gather, so every element is added in the order of the
chunk it falls in.

Groups over several mesh axes use the multi-dimensional algorithm: a ring reduce-scatter
along one group axis after another. Element e ends on its owner: the member whose rank is
e's block when the buffer is cut into one block per member (for a reduce-scatter, the block
along the scattered dim that member receives). It never moves along an axis once that axis
is done, so on the ring along axis a its chunk is the one of the owner's coordinate r_a.

Assumed: bidirectional rings, the group's axes reduced major first, ring order = rank order
along each mesh axis (make_mesh places a logical axis as long as a torus axis on a physical
ring, so rank neighbours are ring neighbours); groups that are not mesh lines form one ring in
rank order. This order is used whatever algorithm the collective's plan names: the cost
model's one-shot, two-shot and rotated-ring variants change the time estimate, not the order
of the additions computed here.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import numerics


def _ring_positions(ring_sizes: Sequence[int], n: int, xp=np, grid: bool = False):
    """For buffer elements 0..n-1: each one's owner coordinate on every ring and its
    direction of travel (+1 or -1). `xp` is numpy (host) or jax.numpy (in the program).

    With `grid` (n a whole number of blocks, one per owner), the elements are laid out as
    [owner, position in its block]: the owners' coordinates are then small host constants
    ([members, 1]) and the directions an iota along the other dim, which XLA recomputes
    inside each step's fused pass at no cost, where per-element divisions over a flat
    buffer are computed once into index arrays as large as the buffer."""
    members = int(np.prod(ring_sizes, dtype=np.int64))
    block = max(-(-n // members), 1)  # elements per owner (the last blocks may be short)
    index = np.int32 if n < 2 ** 31 else np.int64
    if grid:
        owner = np.arange(members, dtype=index)[:, None]
        position = xp.arange(block, dtype=index)[None, :]
        block_length = block
    else:
        element = xp.arange(n, dtype=index)
        owner = _div(element, block)
        position = element - owner * block
        block_length = xp.minimum(block, n - owner * block)
    direction = xp.where(position < (block_length + 1) // 2, 1, -1).astype(index)
    strides = np.cumprod((1,) + tuple(ring_sizes[:0:-1]))[::-1]  # row-major, per ring
    return [_rem(_div(owner, int(stride)), size)
            for stride, size in zip(strides, ring_sizes)], direction


def _div(a, b: int):
    """a // b of non-negative integers: in the program a plain division (jnp's // corrects
    for signs with selects that XLA keeps in every fused pass)."""
    return lax.div(a, np.asarray(b, a.dtype)) if isinstance(a, jnp.ndarray) else a // b


def _rem(a, b: int):
    """a % b of non-negative integers (as _div)."""
    return lax.rem(a, np.asarray(b, a.dtype)) if isinstance(a, jnp.ndarray) else a % b


def ring_orders(ring_sizes: Sequence[int], n: int) -> list:
    """For each ring (group axis, rank order), an int array [k, n]: the member whose value
    is added at step s (s = 0 first) to the partial sum of buffer element e."""
    coords, direction = _ring_positions(ring_sizes, n)
    return [((c + direction * np.arange(1, k + 1)[:, None]) % k).astype(np.int32)
            for c, k in zip(coords, ring_sizes)]


# Grid buffers of up to this many elements (all members') take each step's members with
# gathers of constant rows (_grid_ring_steps): a few ops per step, where a select among k
# members takes 2k, so a small program compiles in half the time (a psum over 8 chips:
# 61 -> 33 ms). XLA:CPU runs such a gather element by element, so large buffers, whose
# run costs more than their compile, select (measured, 64 MiB of FP32 over a ring of 4:
# 13 ms selecting, 38 ms gathering).
GATHERED_MAX_ELEMENTS = 1 << 16

# Up to this ring length each step picks its members with a select over all k of them (XLA
# fuses the whole ring into one pass over the buffer, but the program grows as k^2); longer
# rings gather each step's members instead.
SELECT_MAX_RING = 8


def _ring_members(members, dim: int) -> Callable:
    """A function of an order ([elements] or [owner, position]: a member's rank per buffer
    element) giving [..., elements], the value of that member at each element. The members
    are cut apart once, for all the ring's steps."""
    count = members.shape[dim]
    if count == 1:  # the same value on every member
        value = lax.index_in_dim(members, 0, dim, keepdims=False)
        return lambda order: value
    if count <= SELECT_MAX_RING:
        candidates = [lax.index_in_dim(members, m, dim, keepdims=False) for m in range(count)]
        return lambda order: lax.select_n(
            jnp.broadcast_to(order, candidates[0].shape).astype(jnp.int32), *candidates)

    def gathered(order):  # order as an index of members' rank (other dims 1)
        index = order.reshape((1,) * (members.ndim - order.ndim) + order.shape)
        return jnp.take_along_axis(members, index, axis=dim).squeeze(dim)
    return gathered


def _grid_ring_steps(members, dim: int, ring_sizes: Sequence[int], axis: int) -> list:
    """For the ring along group axis `axis` of a grid buffer (members [..., k at `dim`,
    ..., owner, position]), each step's values, steps 1..k: at step s, an element takes
    the member s after its owner's coordinate c on this ring going forward (the first half
    of each block's positions), s before it going back (the rest). Each step is a pair
    (forward part, backward part or None), each [..., owner, its positions] (`dim` gone):
    kept apart, XLA fuses every step's reads into the additions.

    With the member dim put just before the owner's coordinate on this ring and the two
    flattened, member (c + s) mod k of owner coordinate c is row (s * k + c * (k + 1))
    mod k^2: a step each way is one gather of k constant rows (where selecting among k
    members per element takes 2k ops)."""
    k = ring_sizes[axis]
    before = int(np.prod(ring_sizes[:axis], dtype=np.int64))
    after = int(np.prod(ring_sizes[axis + 1:], dtype=np.int64))
    block = members.shape[-1]
    # [..., owner, position] with the owner as its coordinates (before, this ring, after)
    split = members.reshape(members.shape[:-2] + (before, k, after, block))
    owner = split.ndim - 3  # this ring's coordinate of the owner
    paired = jnp.moveaxis(split, dim, owner - 1)  # [..., before, member, owner, after, p]
    pair = owner - 1  # the member and owner dims, flattened
    flat = paired.reshape(paired.shape[:pair] + (k * k,) + paired.shape[owner + 1:])
    half = (block + 1) // 2  # positions going forward; the rest go back
    dims = lax.GatherDimensionNumbers(
        offset_dims=tuple(d for d in range(flat.ndim) if d != pair),
        collapsed_slice_dims=(pair,), start_index_map=(pair,))

    def diagonal(first: int, positions: tuple[int, int]):
        # each way's positions sliced first: a gather of both would be shared by the two
        # ways' sums (XLA merges equal gathers) and so not fused into either
        part = lax.slice_in_dim(flat, *positions, axis=flat.ndim - 1)
        rows = (first + np.arange(k) * (k + 1)) % (k * k)
        value = lax.gather(part, rows.astype(np.int32)[:, None], dims,
                           part.shape[:pair] + (1,) + part.shape[pair + 1:],
                           unique_indices=True,
                           mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
        return value.reshape(value.shape[:pair - 1] + (before * k * after, value.shape[-1]))

    return [(diagonal(step * k, (0, half)),
             diagonal((k - step) * k, (half, block)) if block > half else None)
            for step in range(1, k + 1)]


def ring_reduce(members: jnp.ndarray, lead: int, ring_sizes: Sequence[int], combine: Callable,
                rounding: Callable | None, axis_order: Sequence[int] | None = None
                ) -> jnp.ndarray:
    """Reduce [lead..., m_1, ..., m_L, n] over the L member dims, ring by ring (in
    `axis_order`, default major first), each element in its ring order (ring_orders).

    m_i is ring_sizes[i], or 1 where the value is the same on every member of that ring (it
    is then added to itself k - 1 times, as the ring would). Returns [lead..., n].
    Where the buffer is a grid of blocks (one per owner) of at most GATHERED_MAX_ELEMENTS,
    each step's members are gathers of constant rows (_grid_ring_steps). Otherwise the member added at each step is
    chosen per element with a select over the k members, so XLA fuses a whole ring into
    one pass over the buffer. On a ring longer than SELECT_MAX_RING (rounding to nearest
    even) the members are gathered, in a loop over the steps.
    """
    n = members.shape[-1]
    dtype_name = np.dtype(members.dtype).name
    blocks = int(np.prod(ring_sizes, dtype=np.int64))
    grid = n > 0 and n % blocks == 0
    if grid:  # [..., n] as [..., owner, position] (see _ring_positions)
        members = members.reshape(members.shape[:-1] + (blocks, n // blocks))
    coords, direction = _ring_positions(ring_sizes, n, jnp, grid)
    forward = direction > 0
    remaining = list(range(len(ring_sizes)))  # group axes still in `members`, in dim order

    def add(partial, value):
        return numerics.round_to(combine(numerics.widen(partial), numerics.widen(value)),
                                 dtype_name, rounding)

    for axis in (range(len(ring_sizes)) if axis_order is None else axis_order):
        dim = lead + remaining.index(axis)
        size = ring_sizes[axis]
        # step s adds the member s after the owner's coordinate c going forward, s before
        # it going back (c - s + size >= 0 keeps the remainder's operand non-negative)
        long_loop = size > SELECT_MAX_RING and rounding is None
        if grid and members.shape[dim] > 1 and not long_loop and \
                members.size <= GATHERED_MAX_ELEMENTS:
            steps = _grid_ring_steps(members, dim, ring_sizes, axis)
            sum_ahead, sum_behind = steps[0]
            for ahead, behind in steps[1:]:
                sum_ahead = add(sum_ahead, ahead)
                sum_behind = sum_behind if behind is None else add(sum_behind, behind)
            members = sum_ahead if sum_behind is None else \
                lax.concatenate([sum_ahead, sum_behind], sum_ahead.ndim - 1)
            remaining.remove(axis)
            continue
        c = coords[axis]
        in_order = _ring_members(members, dim)

        def member(s, c=c, size=size, in_order=in_order):
            # (jnp.where would be a function of its own in the program)
            going, ahead, behind = jnp.broadcast_arrays(forward, _rem(c + s, size),
                                                        _rem(c - s + size, size))
            return in_order(lax.select(going, ahead, behind))

        if long_loop:
            # a long ring's steps as one loop: its step compiles once (a ring of 64 compiled
            # 64 gathers and adds: a psum over 64 chips took a second to compile). Not with
            # stochastic rounding: each step is a rounding site of its own
            members = lax.fori_loop(2, size + 1, lambda s, partial: add(partial, member(s)),
                                    member(1))
        else:
            partial = member(1)
            for s in range(2, size + 1):
                partial = add(partial, member(s))
            members = partial
        remaining.remove(axis)
    return members.reshape(members.shape[:lead] + (n,))
