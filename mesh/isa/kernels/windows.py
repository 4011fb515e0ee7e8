"""Windowed reductions and their gradient (Vector engine): reduce_window (pooling, cumulative
sums) and select_and_scatter (the gradient of max/min pooling)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.elementwise import boolean_equivalent
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import broadcast_mesh, map_devices
from mesh.isa.kernels.indexing import scatter_elements
from mesh.isa.kernels.reduction import MONOIDS


@kernel(isa.ReduceWindow)
def reduce_window(instr: isa.ReduceWindow, args, ctx: KernelContext):
    """Windows never span chips: the mesh dims get windows of size 1. A known monoid on
    narrow floats is computed in FP32 and rounded once, as Reduce is."""
    nm = ctx.nm
    n = len(args) // 2
    operands = broadcast_mesh(args[:n], nm)
    inits = [i.reshape(()) for i in args[n:]]  # the same on every chip (lowering checks)
    window = dict(window_dimensions=(1,) * nm + instr.window_dimensions,
                  window_strides=(1,) * nm + instr.window_strides,
                  padding=((0, 0),) * nm + instr.padding,
                  base_dilation=(1,) * nm + instr.base_dilations,
                  window_dilation=(1,) * nm + instr.window_dilations)
    if instr.combiner is not None:
        (x,), (init,) = operands, inits
        combine = MONOIDS[boolean_equivalent(instr.combiner, x.dtype)][1]
        reduced = lax.reduce_window(numerics.widen(x), numerics.widen(init), combine, **window)
        return [numerics.round_to(reduced, ctx.out_info(instr).type.dtype, ctx.rounding)]
    results = lax.reduce_window(
        tuple(operands), tuple(inits),
        lambda acc, x: tuple(ctx.run(instr.body, list(acc) + list(x))), **window)
    return list(results)


@kernel(isa.SelectAndScatter)
def select_and_scatter(instr: isa.SelectAndScatter, args, ctx: KernelContext):
    return map_devices(lambda operand, source, init: [
        _select_and_scatter(instr, operand, source, init, ctx)], args, ctx.nm)


def _select_and_scatter(instr: isa.SelectAndScatter, operand, source, init, ctx):
    """For each window (one per source element): walk its elements inside the operand in
    row-major order, keeping the first and replacing it by each later one `select` does not
    prefer it to; then combine the source element into the result at the kept position."""
    positions, inside = (jnp.asarray(a) for a in
                         window_positions(operand.shape, source.shape, instr))
    flat = operand.reshape(-1)
    candidates = flat[positions]  # [windows, window elements]
    prefer = jax.vmap(lambda a, b: ctx.run(instr.select, [a, b])[0])

    def visit(k, state):
        kept, kept_at, found = state
        take = inside[:, k] & (~found | ~prefer(kept, candidates[:, k]))
        return (jnp.where(take, candidates[:, k], kept), jnp.where(take, positions[:, k], kept_at),
                found | inside[:, k])

    count = positions.shape[0]
    start = (candidates[:, 0], positions[:, 0], jnp.zeros((count,), bool))
    _, kept_at, found = lax.fori_loop(0, positions.shape[1], visit, start)
    # A window lying wholly in the padding selects nothing: its index falls outside and the
    # scatter skips it.
    target = jnp.where(found, kept_at, flat.size)
    result = jnp.broadcast_to(init, flat.shape)
    scattered = scatter_elements(result, target, source.reshape(-1), instr.scatter_combiner,
                                 instr.scatter_body, ctx)
    return scattered.reshape(operand.shape)


def window_positions(shape: tuple[int, ...], windows_shape: tuple[int, ...],
                     instr: isa.SelectAndScatter) -> tuple[np.ndarray, np.ndarray]:
    """([windows, window elements] flat operand positions of each window's elements in
    row-major order (clipped into the operand), and whether each lies inside it)."""
    rank = len(shape)
    starts = np.indices(windows_shape).reshape(rank, -1).T * np.asarray(instr.window_strides)
    offsets = np.indices(instr.window_dimensions).reshape(rank, -1).T
    low = np.asarray([lo for lo, _ in instr.padding])
    index = starts[:, None, :] + offsets[None, :, :] - low  # [windows, elements, rank]
    inside = ((index >= 0) & (index < np.asarray(shape))).all(-1)
    clipped = np.clip(index, 0, np.asarray(shape) - 1)
    positions = np.ravel_multi_index(tuple(np.moveaxis(clipped, -1, 0)), shape)
    return positions.astype(np.int32), inside
