"""Gather and scatter: data-dependent reads and read-modify-writes of local tensors.

Both run chip by chip (map_devices): the operand, the indices and the updates may each vary
across chips or not. StableHLO lets the index vector sit in any dim of the indices; lax
wants it last, so it is moved there first (the other index dims keep their order, which is
the order of the result's / updates' batch dims).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import map_devices

# The lax scatter of each of isa.SCATTER_COMBINERS.
SCATTERS = {
    isa.REPLACE: lax.scatter, "add": lax.scatter_add, "multiply": lax.scatter_mul,
    "minimum": lax.scatter_min, "maximum": lax.scatter_max,
}

# On bools StableHLO's add is `or` and multiply is `and`: the max and min of bools.
_bool_scatter = {"add": "maximum", "multiply": "minimum"}


def index_vector_last(indices: jnp.ndarray, index_vector_dim: int,
                      batching_dims: tuple[int, ...]) -> tuple[jnp.ndarray, tuple[int, ...]]:
    """Indices with the index vector as their last dim (a trailing dim of size 1 when
    `index_vector_dim` is the rank), and `batching_dims` renumbered to match."""
    if index_vector_dim == indices.ndim:
        return indices[..., None], batching_dims
    moved = jnp.moveaxis(indices, index_vector_dim, -1)
    return moved, tuple(d - (d > index_vector_dim) for d in batching_dims)


@kernel(isa.Gather)
def gather(instr: isa.Gather, args, ctx: KernelContext):
    def local(operand, indices):
        indices, batching = index_vector_last(indices, instr.index_vector_dim,
                                              instr.start_indices_batching_dims)
        dims = lax.GatherDimensionNumbers(
            offset_dims=instr.offset_dims, collapsed_slice_dims=instr.collapsed_slice_dims,
            start_index_map=instr.start_index_map,
            operand_batching_dims=instr.operand_batching_dims,
            start_indices_batching_dims=batching)
        # CLIP is the spec's clamping of start indices; lax emits a plain gather for it.
        return [lax.gather(operand, indices, dims, instr.slice_sizes,
                           indices_are_sorted=instr.indices_are_sorted,
                           mode=lax.GatherScatterMode.CLIP)]

    return map_devices(local, args, ctx.nm)


@kernel(isa.Scatter)
def scatter(instr: isa.Scatter, args, ctx: KernelContext):
    if instr.combiner is not None:
        return map_devices(lambda operand, indices, updates: [
            _lax_scatter(instr, operand, indices, updates)], args, ctx.nm)
    n = (len(args) - 1) // 2
    return map_devices(lambda *a: scatter_in_order(instr, list(a[:n]), a[n], list(a[n + 1:]),
                                                   ctx), args, ctx.nm)


def _lax_scatter(instr: isa.Scatter, operand, indices, updates):
    indices, batching = index_vector_last(indices, instr.index_vector_dim,
                                          instr.scatter_indices_batching_dims)
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=instr.update_window_dims,
        inserted_window_dims=instr.inserted_window_dims,
        scatter_dims_to_operand_dims=instr.scatter_dims_to_operand_dims,
        operand_batching_dims=instr.input_batching_dims,
        scatter_indices_batching_dims=batching)
    # FILL_OR_DROP is the spec's skipping of windows that do not fit; lax emits a plain
    # scatter for it. Narrow floats are combined in their own type, each update rounded, as
    # a read-modify-write of the operand in memory does.
    return SCATTERS[_bool_scatter.get(instr.combiner, instr.combiner) if operand.dtype == bool
                    else instr.combiner](operand, indices, updates, dims,
                                    indices_are_sorted=instr.indices_are_sorted,
                                    unique_indices=instr.unique_indices,
                                    mode=lax.GatherScatterMode.FILL_OR_DROP)


def scatter_in_order(instr: isa.Scatter, operands: list, indices, updates: list,
                     ctx: KernelContext) -> list:
    """The spec's scatter for any update computation and any number of operands: one
    update window after another, in row-major order of the update scatter indices."""
    indices, batching = index_vector_last(indices, instr.index_vector_dim,
                                          instr.scatter_indices_batching_dims)
    operand_shape = operands[0].shape
    rank = len(operand_shape)
    scatter_shape = indices.shape[:-1]  # also the updates' scatter dims, in order
    count = int(np.prod(scatter_shape, dtype=np.int64))
    starts = indices.reshape(count, indices.shape[-1]).astype(jnp.int64)
    # Each update scatter index's coordinates, for the operand's batching dims.
    coords = np.stack(np.unravel_index(np.arange(count), scatter_shape), -1) \
        if scatter_shape else np.zeros((1, 0), np.int64)
    skipped = set(instr.inserted_window_dims) | set(instr.input_batching_dims)
    window_dims = [d for d in range(rank) if d not in skipped]
    update_scatter_dims = [d for d in range(updates[0].ndim) if d not in instr.update_window_dims]
    window_shape = [1] * rank
    for d, u in zip(window_dims, instr.update_window_dims):
        window_shape[d] = updates[0].shape[u]
    windows = [lax.transpose(u, tuple(update_scatter_dims) + instr.update_window_dims)
               .reshape((count,) + tuple(window_shape)) for u in updates]

    def full_start(i):
        start = jnp.zeros((rank,), jnp.int64)
        start = start.at[np.asarray(instr.scatter_dims_to_operand_dims, np.int32)].set(starts[i])
        batch_coords = jnp.asarray(coords, jnp.int64)[i][np.asarray(batching, np.int32)]
        return start.at[np.asarray(instr.input_batching_dims, np.int32)].set(batch_coords)

    combine = jax.vmap(lambda *scalars: tuple(ctx.run(instr.body, list(scalars))))

    def step(i, current):
        start = full_start(i)  # in 64 bits: no index wraps into range
        fits = jnp.all(start >= 0) & jnp.all(start + np.asarray(window_shape) <= np.asarray(
            operand_shape))
        start = list(start.astype(jnp.int32))  # in range wherever `fits`
        old = [lax.dynamic_slice(c, start, window_shape).reshape(-1) for c in current]
        new = combine(*old, *(w[i].reshape(-1) for w in windows))
        return [jnp.where(fits, lax.dynamic_update_slice(c, v.reshape(window_shape), start), c)
                for c, v in zip(current, new)]

    return lax.fori_loop(0, count, step, list(operands))


def scatter_elements(operand, indices, updates, combiner: str | None,
                     body: isa.Program | None, ctx: KernelContext):
    """A 1-D operand with updates[i] combined into element indices[i] (by `combiner`, one of
    isa.SCATTER_COMBINERS, else by `body`); indices outside the operand are skipped."""
    instr = isa.Scatter((), (), update_window_dims=(), inserted_window_dims=(0,),
                        input_batching_dims=(), scatter_indices_batching_dims=(),
                        scatter_dims_to_operand_dims=(0,), index_vector_dim=1,
                        combiner=combiner, body=body)
    indices = indices[:, None]
    if combiner is not None:
        return _lax_scatter(instr, operand, indices, updates)
    return scatter_in_order(instr, [operand], indices, [updates], ctx)[0]
