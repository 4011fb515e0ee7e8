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

Assumed while collective instructions carry no algorithm of their own (`plan`): bidirectional
rings, the group's axes reduced major first, ring order = rank order along each mesh axis
(make_mesh places a logical axis as long as a torus axis on a physical ring, so rank
neighbours are ring neighbours); groups that are not mesh lines form one ring in rank order.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import numerics


def ring_orders(ring_sizes: Sequence[int], n: int, bidirectional: bool = True) -> list:
    """For each ring (group axis, rank order), an int array [k, n]: the member whose value
    is added at step s (s = 0 first) to the partial sum of buffer element e."""
    members = int(np.prod(ring_sizes, dtype=np.int64))
    block = max(-(-n // members), 1)  # elements per owner (the last blocks may be short)
    element = np.arange(n)
    owner = element // block
    position = element - owner * block
    block_length = np.minimum(block, n - owner * block)
    forward = (position < (block_length + 1) // 2) | (not bidirectional)
    direction = np.where(forward, 1, -1)
    coords = np.unravel_index(owner, tuple(ring_sizes))
    steps_of = [np.arange(1, k + 1)[:, None] for k in ring_sizes]
    return [((c + direction * steps) % k).astype(np.int32)
            for c, steps, k in zip(coords, steps_of, ring_sizes)]


def ring_reduce(members: jnp.ndarray, lead: int, ring_sizes: Sequence[int], combine: Callable,
                rounding: Callable | None, axis_order: Sequence[int] | None = None
                ) -> jnp.ndarray:
    """Reduce [lead..., m_1, ..., m_L, n] over the L member dims, ring by ring (in
    `axis_order`, default major first), each element in its ring order.

    m_i is ring_sizes[i], or 1 where the value is the same on every member of that ring (it
    is then added to itself k - 1 times, as the ring would). Returns [lead..., n].
    """
    n = members.shape[-1]
    dtype_name = np.dtype(members.dtype).name
    orders = ring_orders(ring_sizes, n)
    remaining = list(range(len(ring_sizes)))  # group axes still in `members`, in dim order
    for axis in (range(len(ring_sizes)) if axis_order is None else axis_order):
        dim = lead + remaining.index(axis)
        size = ring_sizes[axis]
        if members.shape[dim] == 1:
            value = lax.index_in_dim(members, 0, dim, keepdims=False)
            steps = [value] * size
        else:
            index = orders[axis].reshape((1,) * dim + (size,) + (1,) * (members.ndim - dim - 2)
                                         + (n,))
            ordered = jnp.take_along_axis(members, jnp.asarray(index), axis=dim)
            steps = [lax.index_in_dim(ordered, s, dim, keepdims=False) for s in range(size)]
        partial = steps[0]
        for value in steps[1:]:
            partial = numerics.round_to(combine(numerics.widen(partial), numerics.widen(value)),
                                        dtype_name, rounding)
        members = partial
        remaining.remove(axis)
    return members
