"""chlo.ragged_dot on the Tensor Engine: one matmul per group, with Matmul's numerics.

Each group is its own matmul (mesh.isa.kernels.matmul's passes): for a ragged free dim, a
group's rows against the rhs of that group; for a ragged contraction dim, the group's range
of the contraction, moved to start at 0 so that its PSUM passes start where the group does,
as the Tensor Engine would run it. Results are computed for every group and each row keeps
its own group's (rows in no group are zeros).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from mesh import isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.matmul import _passes


@kernel(isa.RaggedMatmul)
def ragged_matmul(instr: isa.RaggedMatmul, args, ctx: KernelContext):
    mesh = tuple(ctx.mesh.axis_sizes)
    lhs, rhs, sizes = (ctx.full(a).reshape((math.prod(mesh),) + a.shape[ctx.nm:])
                       for a in args)
    batch = math.prod(lhs.shape[1 + d] for d in instr.lhs_batch)
    groups = sizes.shape[-1]
    # One size per group, per batch element ([groups], or [batch dims..., groups]).
    sizes = jnp.broadcast_to(sizes.reshape(sizes.shape[0], -1, groups),
                             (sizes.shape[0], batch, groups)).astype(jnp.int64)
    ends = jnp.cumsum(sizes, axis=-1)
    if instr.lhs_ragged in instr.lhs_contract:
        out = _ragged_contraction(instr, lhs, rhs, sizes, ends - sizes, ctx)
    else:
        out = _ragged_rows(instr, lhs, rhs, ends - sizes, ends, ctx)
    return [ctx.fit(out.reshape(mesh + out.shape[1:]), instr)]


def _canonical(x, first: list[int], *groups: list[int]):
    """x [P, local...] transposed to [P, first..., groups...], each group of local dims
    flattened to one dim (`first` dims kept)."""
    order = [0] + [1 + d for d in first] + [1 + d for g in groups for d in g]
    y = lax.transpose(x, tuple(order))
    kept = y.shape[:1 + len(first)]
    sizes, at = [], 1 + len(first)
    for g in groups:
        sizes.append(math.prod(y.shape[at:at + len(g)]))
        at += len(g)
    return y.reshape(kept + tuple(sizes))


def _sizes(x, dims) -> tuple[int, ...]:
    """Sizes of local dims `dims` of x [P, local...]."""
    return tuple(x.shape[1 + d] for d in dims)


def _free(rank: int, *taken) -> list[int]:
    return [d for d in range(rank) if not any(d in t for t in taken)]


def _ragged_rows(instr, lhs, rhs, starts, ends, ctx):
    """Ragged free dim r: out[b, ..., i, ..., n] = lhs[b, ..., i, ..., :] . rhs[group(i)]."""
    r = instr.lhs_ragged
    p = lhs.shape[0]
    lhs_rank, rhs_rank = lhs.ndim - 1, rhs.ndim - 1
    rest = _free(lhs_rank, instr.lhs_batch, instr.lhs_contract, (r,))
    rhs_free = _free(rhs_rank, instr.rhs_batch, instr.rhs_contract, (instr.rhs_group,))
    # lhs [P, B, R, F, K], rhs [P, G, B, N, K]
    left = _canonical(lhs, [], list(instr.lhs_batch), [r], rest, list(instr.lhs_contract))
    right = _canonical(rhs, [instr.rhs_group], list(instr.rhs_batch), rhs_free,
                       list(instr.rhs_contract))
    _, b, rows, f, k = left.shape
    g, n = right.shape[1], right.shape[3]
    position = jnp.arange(rows)
    member = (starts[..., None] <= position) & (position < ends[..., None])  # [P, B, G, R]
    grouped = jnp.where(member[..., None, None], left[:, :, None], jnp.zeros((), left.dtype))
    out = _passes(grouped.reshape(p * b * g, rows * f, k),
                  jnp.moveaxis(right, 1, 2).reshape(p * b * g, n, k), instr, ctx)
    out = out.reshape(p, b, g, rows, f, n)
    group = jnp.sum(ends[..., None] <= position, axis=2)  # [P, B, R]: the row's group
    picked = jnp.take_along_axis(out, jnp.minimum(group, g - 1)[:, :, None, :, None, None],
                                 axis=2)[:, :, 0]
    result = jnp.where((group < g)[..., None, None], picked, jnp.zeros((), out.dtype))
    # [P, batch dims..., r, rest..., rhs free...] with r back among the lhs free dims.
    result = result.reshape((p,) + _sizes(lhs, instr.lhs_batch) + (rows,) + _sizes(lhs, rest)
                            + _sizes(rhs, rhs_free))
    lhs_free = sorted(rest + [r])
    nb = 1 + len(instr.lhs_batch)
    placed = [nb + 1 + rest.index(d) if d != r else nb for d in lhs_free]
    order = list(range(nb)) + placed + list(range(nb + 1 + len(rest), result.ndim))
    return lax.transpose(result, tuple(order))


def _ragged_contraction(instr, lhs, rhs, sizes, starts, ctx):
    """Ragged contraction dim: out[g, b, m, n] = sum over k in group g of lhs . rhs."""
    if len(instr.lhs_contract) != 1:
        raise NotImplementedError("ragged_dot with a ragged contraction dim among several "
                                  f"contraction dims {list(instr.lhs_contract)}")
    p = lhs.shape[0]
    lhs_free = _free(lhs.ndim - 1, instr.lhs_batch, instr.lhs_contract)
    rhs_free = _free(rhs.ndim - 1, instr.rhs_batch, instr.rhs_contract)
    left = _canonical(lhs, [], list(instr.lhs_batch), lhs_free, list(instr.lhs_contract))
    right = _canonical(rhs, [], list(instr.rhs_batch), rhs_free, list(instr.rhs_contract))
    _, b, m, k = left.shape
    n = right.shape[2]
    g = sizes.shape[-1]
    offset = jnp.arange(k)
    index = jnp.minimum(starts[..., None] + offset, k - 1)  # [P, B, G, K]
    inside = offset < sizes[..., None]

    def group_ranges(x):  # [P, B, X, K] -> [P, B, G, X, K]: each group's range from 0
        taken = jnp.take_along_axis(x[:, :, None], index[:, :, :, None, :], axis=-1)
        return jnp.where(inside[:, :, :, None, :], taken, jnp.zeros((), x.dtype))

    out = _passes(group_ranges(left).reshape(p * b * g, m, k),
                  group_ranges(right).reshape(p * b * g, n, k), instr, ctx)
    out = out.reshape((p,) + _sizes(lhs, instr.lhs_batch) + (g,) + _sizes(lhs, lhs_free)
                      + _sizes(rhs, rhs_free))
    return jnp.moveaxis(out, 1 + len(instr.lhs_batch), 1)  # [P, groups, batch..., ...]
