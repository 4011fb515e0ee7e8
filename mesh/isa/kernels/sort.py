"""Sorting along a local dim (GpSimd engine).

Sorting needs no per-chip mapping: each chip's data is sorted along its own local dim, so
the operands are broadcast to a common mesh layout and sorted along that dim in one go.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import broadcast_mesh
from mesh.isa.kernels.sub_byte import from_bytes, to_bytes


@kernel(isa.Sort)
def sort(instr: isa.Sort, args, ctx: KernelContext):
    operands = broadcast_mesh(args, ctx.nm)
    axis = ctx.nm + instr.dimension
    if instr.num_keys is not None:
        results = lax.sort(tuple(to_bytes(x) for x in operands), dimension=axis,
                           is_stable=instr.is_stable, num_keys=instr.num_keys)
        return [from_bytes(r, x.dtype) for r, x in zip(results, operands)]
    return sort_by_comparator(operands, axis, instr.comparator, ctx)


def sort_by_comparator(operands: list, axis: int, comparator: isa.Program,
                       ctx: KernelContext) -> list:
    """A stable sort by any comparator that is a strict weak order, as the spec asks.

    Every pair of elements along `axis` is compared (n**2 comparator evaluations per line):
    element i's place is the number of elements that go before it, those less than it and
    the equal ones that come earlier.
    """
    moved = [jnp.moveaxis(x, axis, -1) for x in operands]
    n = moved[0].shape[-1]
    pairs = jnp.broadcast_arrays(*[side for x in moved
                                   for side in (x[..., :, None], x[..., None, :])])
    less = jax.vmap(lambda *scalars: ctx.run(comparator, list(scalars))[0])(
        *[p.reshape(-1) for p in pairs]).reshape(pairs[0].shape)  # [..., i, j]: x_i < x_j
    earlier = np.tri(n, k=-1, dtype=bool)  # [i, j]: j comes before i
    goes_before = jnp.swapaxes(less, -1, -2) | (earlier & ~less)  # [i, j]: x_j goes first
    place = jnp.sum(goes_before, axis=-1, dtype=jnp.int32)
    order = jnp.argsort(place, axis=-1)
    return [jnp.moveaxis(jnp.take_along_axis(x, order, axis=-1), -1, axis) for x in moved]


@kernel(isa.TopK)
def top_k(instr: isa.TopK, args, ctx: KernelContext):
    (x,) = args
    values, indices = lax.top_k(to_bytes(x), instr.k)
    index_type = dtypes.numpy_dtype(ctx.out_info(instr, 1).type.dtype)
    return [from_bytes(values, x.dtype), indices.astype(index_type)]


@kernel(isa.ApproxTopK)
def approx_top_k(instr: isa.ApproxTopK, args, ctx: KernelContext):
    """XLA's ApproxTopKFallback keeping k (what it keeps without aggregate_to_topk depends
    on the operand's rank, which the mesh dims in front change: k is the result's size)."""
    (x,) = broadcast_mesh(args, ctx.nm)
    top = lax.approx_max_k if instr.largest else lax.approx_min_k
    return list(top(x, instr.k, reduction_dimension=ctx.nm + instr.dimension,
                    aggregate_to_topk=True))
