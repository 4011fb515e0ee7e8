"""Data movement: layout changes, slicing, padding, and splitting/assembling shardings."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh import isa
from mesh.isa.kernels import native
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import broadcast_mesh, map_devices
from mesh.isa.kernels.matmul import native_matmul_placed, runs_natively
from mesh.isa.kernels.views import manual_axes, unshard_strides
from mesh.sharding import split_order


def _mesh_dims(nm: int) -> tuple[int, ...]:
    return tuple(range(nm))


@kernel(isa.Reshape)
def reshape(instr: isa.Reshape, args, ctx: KernelContext):
    (x,) = args
    return [x.reshape(x.shape[:ctx.nm] + instr.shape)]


@kernel(isa.HostTransfer)
def host_transfer(instr: isa.HostTransfer, args, ctx: KernelContext):
    """A copy between HBM and host memory: the same value on the other side."""
    return list(args)


@kernel(isa.BroadcastInDim)
def broadcast_in_dim(instr: isa.BroadcastInDim, args, ctx: KernelContext):
    (x,) = args
    nm = ctx.nm
    dims = _mesh_dims(nm) + tuple(nm + d for d in instr.dimensions)
    return [lax.broadcast_in_dim(x, x.shape[:nm] + instr.shape, dims)]


@kernel(isa.Transpose)
def transpose(instr: isa.Transpose, args, ctx: KernelContext):
    (x,) = args
    nm = ctx.nm
    return [lax.transpose(x, _mesh_dims(nm) + tuple(nm + p for p in instr.permutation))]


@kernel(isa.Slice)
def slice_(instr: isa.Slice, args, ctx: KernelContext):
    (x,) = args
    mesh = x.shape[:ctx.nm]
    return [lax.slice(x, (0,) * ctx.nm + instr.start, mesh + instr.limit,
                      (1,) * ctx.nm + instr.strides)]


@kernel(isa.Reverse)
def reverse(instr: isa.Reverse, args, ctx: KernelContext):
    (x,) = args
    return [lax.rev(x, tuple(ctx.nm + d for d in instr.dimensions))]


@kernel(isa.Concatenate)
def concatenate(instr: isa.Concatenate, args, ctx: KernelContext):
    return [lax.concatenate(broadcast_mesh(args, ctx.nm), ctx.nm + instr.dimension)]


@kernel(isa.Pad)
def pad(instr: isa.Pad, args, ctx: KernelContext):
    config = list(zip(instr.low, instr.high, instr.interior))
    return map_devices(lambda x, v: [lax.pad(x, v, config)], args, ctx.nm)


@kernel(isa.DynamicSlice)
def dynamic_slice(instr: isa.DynamicSlice, args, ctx: KernelContext):
    """Start indices are clamped into range, as the spec says (lax does the same once told
    not to wrap negative ones). Starts that are the same on every chip (a loop counter)
    slice all chips at once."""
    x, *starts = args
    if _same_on_every_chip(starts, ctx.nm):
        return [lax.dynamic_slice(x, _with_mesh_starts(starts, ctx.nm),
                                  x.shape[:ctx.nm] + instr.sizes, allow_negative_indices=False)]
    return map_devices(lambda x, *starts: [lax.dynamic_slice(x, starts, instr.sizes,
                                                             allow_negative_indices=False)],
                       args, ctx.nm)


@kernel(isa.DynamicUpdateSlice)
def dynamic_update_slice(instr: isa.DynamicUpdateSlice, args, ctx: KernelContext):
    x, update, *starts = args
    if _same_on_every_chip(starts, ctx.nm):
        x, update = broadcast_mesh([x, update], ctx.nm)
        return [lax.dynamic_update_slice(x, update, _with_mesh_starts(starts, ctx.nm),
                                         allow_negative_indices=False)]
    return map_devices(lambda x, update, *starts: [lax.dynamic_update_slice(
        x, update, starts, allow_negative_indices=False)], args, ctx.nm)


def _same_on_every_chip(values, nm: int) -> bool:
    return all(v.shape[:nm] == (1,) * nm for v in values)


def _with_mesh_starts(starts, nm: int) -> tuple:
    """Scalar start indices for the whole array: 0 along the mesh dims, then `starts`."""
    dtype = starts[0].dtype if starts else jnp.int32
    return (jnp.zeros((), dtype),) * nm + tuple(s.reshape(()) for s in starts)


@kernel(isa.Shard)
def shard(instr: isa.Shard, args, ctx: KernelContext):
    """Global value -> per-chip pieces: dim d is cut into blocks over its mesh axes (major
    first) and block i of axis a goes to the chips at coordinate i along a."""
    (x,) = args
    nm, sizes = ctx.nm, ctx.mesh.axis_sizes
    manual = manual_axes(instr, nm)
    x = x[tuple(slice(0, 1) if a in manual else slice(None) for a in range(nm))]
    local = ctx.out_info(instr).type.shape
    global_ = x.shape[nm:]
    split_shape, order = split_order(instr.dim_axes, sizes, local)
    unused = [a for a in range(nm) if a not in order]
    y = x.reshape(tuple(x.shape[a] for a in unused) + split_shape)
    perm_from = unused + order  # current dim i holds logical dim perm_from[i]
    inverse = [perm_from.index(i) for i in range(nm + len(global_))]
    return [lax.transpose(y, tuple(inverse))]


@kernel(isa.Unshard)
def unshard(instr: isa.Unshard, args, ctx: KernelContext):
    """Per-chip pieces -> global value (inverse of `shard`); along mesh axes no dim is split
    over, the piece of the chip at coordinate 0 is taken."""
    (x,) = args
    placed = _placed_matmul(instr, x.shape, ctx)
    if placed is not None:
        return [placed]
    nm, sizes = ctx.nm, ctx.mesh.axis_sizes
    manual = manual_axes(instr, nm)
    local = x.shape[nm:]
    split_shape, order = split_order(instr.dim_axes, sizes, local)
    used = set(order) - set(range(nm, nm + len(local)))
    index = tuple(slice(0, 1) if a in manual and a not in used else slice(None)
                  for a in range(nm))
    x = x[index]
    x = jnp.broadcast_to(x, tuple(sizes[a] if a in used else x.shape[a] for a in range(nm))
                         + local)
    unused = [a for a in range(nm) if a not in used]
    y = lax.transpose(x, tuple(unused + order))
    return [y.reshape(ctx.out_shape(instr))]


def _placed_matmul(instr: isa.Unshard, shape: tuple[int, ...], ctx: KernelContext):
    """The Unshard of a matmul's result, as the matmul writing each element where the
    Unshard puts it (matmul.native_matmul_placed), where unshard_places_matmul says so;
    else None."""
    value = instr.ins[0]
    made = ctx.made_by.get(value)
    if made is None or ctx.executor is not None or not unshard_places_matmul(
            instr, made[0], ctx.program, ctx.uses, ctx.on_cpu, ctx.rounding is None):
        return None
    placement = native.Placement(shape, unshard_strides(instr, shape, ctx.mesh),
                                 ctx.out_shape(instr))
    return native_matmul_placed(made[0], made[1], ctx, placement)


def unshard_places_matmul(instr: isa.Unshard, made_by: isa.Instruction,
                          program: isa.Program, uses: dict[int, int], on_cpu: bool,
                          nearest: bool) -> bool:
    """Whether `instr`, the Unshard of a value `made_by` made, has that instruction write
    the value straight into the Unshard's result (matmul.native_matmul_placed; on one
    executor device): where it is a matmul in the native loop (`on_cpu`: the executor's
    devices are CPUs) rounding to nearest even (`nearest`: stochastic rounding numbers its
    sites in program order), whose result nothing else uses (`uses`: of each value in
    `program`), and the Unshard only moves each element (unshard_strides). Unsharding an
    output of tens of MiB is a strided copy that took a fifth of the time of the
    benchmark's matmul that made it; the matmul's own result is then unused, and XLA drops
    it."""
    value = instr.ins[0]
    return isinstance(made_by, isa.Matmul) and nearest and \
        runs_natively(made_by, program, on_cpu) and uses.get(value) == 1 and \
        unshard_strides(instr, program.array_shape(value), program.mesh) is not None
