"""Where data movements put elements: a Shard's or an Unshard's result as strides over its
operand or into its result, so that a kernel can read or write the elements where the
movement would have put them, without the movement's copy."""

from __future__ import annotations

from mesh import isa
from mesh.isa.kernels import native
from mesh.isa.kernels.context import KernelContext
from mesh.sharding import split_order


def manual_axes(instr: isa.Shard | isa.Unshard, nm: int) -> tuple[int, ...]:
    """The mesh axes along which a Shard or Unshard works chip by chip (all by default)."""
    return tuple(range(nm)) if instr.manual_axes is None else instr.manual_axes


def shard_strides(instr: isa.Shard, source_shape: tuple[int, ...],
                  ctx: KernelContext) -> tuple[int, ...]:
    """The shard's result (in its value's executor layout) as a view of its input, a
    row-major array of `source_shape`: the stride of each result dim in elements of the
    input (0 where the result is broadcast). The result is only the input's elements
    rearranged, so a kernel may read them where the input holds them rather than from a
    copy laid out as `shard` lays it out."""
    nm, sizes = ctx.nm, ctx.mesh.axis_sizes
    manual = manual_axes(instr, nm)
    source = native.row_major(source_shape)
    local = ctx.out_info(instr).type.shape
    stride = {a: source[a] if a not in manual and source_shape[a] > 1 else 0
              for a in range(nm)}  # mesh axes no dim is split over: as in the input
    for d, axes in enumerate(instr.dim_axes):
        # dim d split as (axis blocks, major first..., local piece): the piece steps as the
        # input's dim, each block over all the pieces after it
        step = source[nm + d]
        for part, size in reversed(list(zip(list(axes) + [nm + d],
                                            [sizes[a] for a in axes] + [local[d]]))):
            stride[part] = step
            step *= size
    return tuple(stride[i] for i in range(nm + len(local)))


def unshard_strides(instr: isa.Unshard, shape: tuple[int, ...],
                    mesh: isa.MeshSpec) -> tuple[int, ...] | None:
    """Where `unshard` puts each element of its operand (of executor layout `shape`): the
    stride of each of its dims in the result, in elements; None where `unshard` does more
    than move each element once (it takes one chip's piece along a manual axis no dim is
    split over, or copies a piece along an axis the operand does not vary on)."""
    nm, sizes = mesh.rank, mesh.axis_sizes
    manual = manual_axes(instr, nm)
    split_shape, order = split_order(instr.dim_axes, sizes, shape[nm:])
    used = set(order) - set(range(nm, len(shape)))
    unused = [a for a in range(nm) if a not in used]
    if any(shape[a] != sizes[a] for a in used) or any(a in manual and shape[a] > 1
                                                      for a in unused):
        return None
    dims = unused + order  # the result's dims (unshard's transpose), row-major
    strides = native.row_major([shape[a] for a in unused] + list(split_shape))
    return tuple(strides[dims.index(d)] for d in range(len(shape)))
