"""How a global array maps onto per-chip pieces: sdy-style dimension shardings.

`dim_axes[d]` lists the logical mesh axes dim d is split over, major first; the piece of
the chip at mesh coordinates c holds, along dim d, block (c[a1], c[a2], ...) of the dim.
Host-side split/assemble for PJRT-style per-device buffers; the executor's Shard/Unshard
kernels use the same block order.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

DimAxes = tuple[tuple[int, ...], ...]


def split_order(dim_axes: DimAxes, axis_sizes: Sequence[int], local: Sequence[int]):
    """The global array's shape with each dim split as (axis blocks..., local size), and for
    each of those dims the array dim it becomes: a mesh axis a, or nm + d for local dim d."""
    nm = len(axis_sizes)
    split_shape: list[int] = []
    order: list[int] = []
    for d, axes in enumerate(dim_axes):
        for a in axes:
            split_shape.append(axis_sizes[a])
            order.append(a)
        split_shape.append(local[d])
        order.append(nm + d)
    return tuple(split_shape), order


def equivalent(a: DimAxes, b: DimAxes, axis_sizes: Sequence[int]) -> bool:
    """Whether two dim_axes lay a global array out over the mesh alike (axes of size 1
    split nothing)."""
    def split(dim_axes):
        return tuple(tuple(x for x in axes if axis_sizes[x] > 1) for axes in dim_axes)
    return len(a) == len(b) and split(a) == split(b)


def local_shape(global_shape: Sequence[int], dim_axes: DimAxes,
                axis_sizes: Sequence[int]) -> tuple[int, ...]:
    """Per-chip shape of a global shape under a sharding; ValueError if a dim does not divide."""
    shape = []
    for d, (size, axes) in enumerate(zip(global_shape, dim_axes)):
        parts = int(np.prod([axis_sizes[a] for a in axes], dtype=np.int64))
        if size % parts:
            raise ValueError(f"dim {d} of size {size} does not split into {parts} pieces")
        shape.append(size // parts)
    return tuple(shape)


def global_shape(local: Sequence[int], dim_axes: DimAxes,
                 axis_sizes: Sequence[int]) -> tuple[int, ...]:
    """The global shape of pieces of shape `local` under a sharding (local_shape's inverse)."""
    return tuple(size * int(np.prod([axis_sizes[a] for a in axes], dtype=np.int64))
                 for size, axes in zip(local, dim_axes))


def assemble(pieces: Sequence[np.ndarray], dim_axes: DimAxes,
             axis_sizes: Sequence[int]) -> np.ndarray:
    """The global array from per-device pieces (logical device order). Along mesh axes no
    dim is split over, the pieces must be equal copies (one array object given for several
    devices is not compared with itself); ValueError otherwise."""
    if len(pieces) == 1:  # one device's piece is the array (a program on one device)
        return np.asarray(pieces[0])
    nm = len(axis_sizes)
    grid = np.empty(len(pieces), dtype=object)
    for d, piece in enumerate(pieces):  # (a list of arrays would be read as one array)
        grid[d] = piece
    grid = grid.reshape(tuple(axis_sizes))
    used = {a for axes in dim_axes for a in axes}
    unused = [a for a in range(nm) if a not in used]
    first = grid[tuple(slice(None) if a in used else slice(0, 1) for a in range(nm))]
    for piece, copy_of in zip(grid.flat, np.broadcast_to(first, grid.shape).flat):
        piece, copy_of = np.asarray(piece), np.asarray(copy_of)
        if piece is not copy_of and not same_bits(piece, copy_of) and \
                not np.array_equal(piece, copy_of, equal_nan=True):
            raise ValueError("per-device buffers differ along mesh axes the array is "
                             f"replicated over ({unused}); the program expects equal copies")
    blocks = {coords: np.asarray(first[coords]) for coords in np.ndindex(*first.shape)}
    local = next(iter(blocks.values())).shape
    if any(block.shape != local for block in blocks.values()):
        raise ValueError(f"per-device buffers of different shapes "
                         f"{sorted({block.shape for block in blocks.values()})}")
    whole = np.empty(global_shape(local, dim_axes, axis_sizes), np.result_type(*blocks.values()))
    for coords, block in blocks.items():  # each block once, written where it goes
        whole[_block_slices(coords, dim_axes, axis_sizes, local)] = block
    return whole


class PerChip:
    """A value in the executor's layout `shape` (mesh dims, of size 1 along axes its pieces
    do not vary, then a piece's dims) held as one array per chip (`arrays`, row-major over
    the mesh dims), each a buffer of its own, as each chip's HBM holds its piece. Indexed
    by a chip's index along the mesh dims (then `...`), it is that chip's array, on the
    host; as a NumPy array, the whole (a copy)."""

    def __init__(self, arrays: Sequence, shape: Sequence[int]):
        self.arrays, self.shape = list(arrays), tuple(shape)
        self._mesh = self.shape[:len(self.shape) - np.ndim(self.arrays[0])]
        if len(self.arrays) != int(np.prod(self._mesh, dtype=np.int64)):
            raise ValueError(f"{len(self.arrays)} arrays for the chips of {self.shape}")

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.arrays[0].dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index: tuple) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        chip, rest = index[:len(self._mesh)], index[len(self._mesh):]
        if len(chip) != len(self._mesh) or rest not in ((), (Ellipsis,)):
            raise IndexError(f"PerChip takes a chip's index along {len(self._mesh)} mesh "
                             f"dims, then ...; got {index}")
        return np.asarray(self.arrays[int(np.ravel_multi_index(chip, self._mesh))])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if copy is False:
            raise ValueError("a PerChip is a NumPy array only as a copy of its arrays")
        whole = np.stack([np.asarray(a) for a in self.arrays]).reshape(self.shape)
        return whole if dtype is None else whole.astype(dtype)


def on_host(chips) -> np.ndarray | PerChip:
    """The executor's chips' pieces of a value (an array on the host or on a CPU device,
    or a PerChip) as the host reads them, without a copy: a NumPy view, or the PerChip."""
    return chips if isinstance(chips, PerChip) else np.asarray(chips)


def unshard(chips: np.ndarray | PerChip, dim_axes: DimAxes,
            axis_sizes: Sequence[int]) -> np.ndarray:
    """The global array of the chips' pieces `chips` (the executor's layout: mesh dims, of
    size 1 along axes the pieces do not vary, then a piece's dims), as the executor's
    Unshard assembles it: along mesh axes no dim is split over, the piece of the chip at
    coordinate 0."""
    chips = np.asarray(chips)
    nm = len(axis_sizes)
    local = chips.shape[nm:]
    used = {a for axes in dim_axes for a in axes}
    unused = [a for a in range(nm) if a not in used]
    x = chips[tuple(slice(None) if a in used else slice(0, 1) for a in range(nm))]
    x = np.broadcast_to(x, tuple(axis_sizes[a] if a in used else 1 for a in range(nm)) + local)
    _, order = split_order(dim_axes, axis_sizes, local)
    return np.transpose(x, unused + order).reshape(global_shape(local, dim_axes, axis_sizes))


def chip_index(block: Sequence[int], dim_axes: DimAxes, axis_sizes: Sequence[int],
               layout_shape: Sequence[int]) -> tuple[int, ...]:
    """Where, in an array of the chips' pieces of `layout_shape` (as `unshard` takes), the
    piece is that `unshard` puts at `block` (per dim, the index of the block among the
    dim's blocks) of the global array."""
    coords = [0] * len(axis_sizes)  # along axes no dim is split over: chip 0's
    for b, axes in zip(block, dim_axes):
        for a in reversed(axes):  # the block's coordinates, the last axis minor
            b, coords[a] = divmod(b, axis_sizes[a])
    return tuple(min(c, layout_shape[a] - 1) for a, c in enumerate(coords))


def chip_pieces(chips: np.ndarray | PerChip, dim_axes: DimAxes,
                axis_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-device pieces (logical device order) of the global array unshard(chips, ...):
    views of `chips` (of its arrays), without assembling it."""
    return [chips[chip_index(_block(coords, dim_axes, axis_sizes), dim_axes, axis_sizes,
                             chips.shape) + (...,)]
            for coords in np.ndindex(*axis_sizes)]


def device_pieces(chips: np.ndarray | PerChip,
                  axis_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-device pieces (logical device order) of the chips' pieces `chips`, each the
    device's own chip's: views, the same as `chip_pieces` gives, except where the value
    varies along an axis no dim is split over (a shard_map result that check_vma=False
    lets differ along an axis its out_specs replicate it over). There each device keeps the
    piece its chip computed, as XLA's devices keep their buffers, where `unshard` (and
    `chip_pieces`) take chip 0's."""
    return [chips[tuple(min(c, chips.shape[a] - 1) for a, c in enumerate(coords)) + (...,)]
            for coords in np.ndindex(*axis_sizes)]


def device_blocks(dim_axes: DimAxes, axis_sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Per device (logical device order), the block of the global array its piece is (per
    dim, the block's index among the dim's blocks): devices with the same block hold copies
    of one piece."""
    return [tuple(_block(coords, dim_axes, axis_sizes)) for coords in np.ndindex(*axis_sizes)]


def _block(coords: Sequence[int], dim_axes: DimAxes, axis_sizes: Sequence[int]) -> list[int]:
    """Per dim, the index of the block of the global array that the chip at mesh
    coordinates `coords` holds (its dim's axes major first)."""
    blocks = []
    for axes in dim_axes:
        b = 0
        for a in axes:
            b = b * axis_sizes[a] + coords[a]
        blocks.append(b)
    return blocks


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays have the same dtype, shape and bits (compared as the widest
    unsigned words their size allows: at memory speed, where comparing values of a narrow
    float type element by element is 100 times slower)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = (np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in (a, b))
    word = next(n for n in (8, 4, 2, 1) if a.size % n == 0)
    return bool(np.array_equal(a.view(f"uint{8 * word}"), b.view(f"uint{8 * word}")))


def pieces(array: np.ndarray, dim_axes: DimAxes, axis_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-device pieces (logical device order) of a global array: views of it (the same
    array for every device where it is replicated)."""
    count = math.prod(axis_sizes)
    if not any(dim_axes):
        return [array] * count
    return [array[region] for region in block_regions(array.shape, dim_axes, axis_sizes)]


# Where a part of an array lies in it: per dim, a slice of step 1 (None ends: the whole dim).
Region = tuple[slice, ...]


def block_regions(shape: Sequence[int], dim_axes: DimAxes,
                  axis_sizes: Sequence[int]) -> list[Region]:
    """Per device (logical device order), where its piece lies in a global array of
    `shape` laid out by `dim_axes`."""
    local = local_shape(shape, dim_axes, axis_sizes)
    return [_block_slices(coords, dim_axes, axis_sizes, local)
            for coords in np.ndindex(*axis_sizes)]


def chip_regions(layout_shape: Sequence[int], axis_sizes: Sequence[int]) -> list[Region]:
    """Per device (logical device order), where its own chip's piece lies in an array of
    the chips' pieces of `layout_shape` (the piece device_pieces gives it)."""
    rest = (slice(None),) * (len(layout_shape) - len(axis_sizes))
    return [tuple(slice(min(c, n - 1), min(c, n - 1) + 1) for c, n in zip(coords, layout_shape))
            + rest for coords in np.ndindex(*axis_sizes)]


def bounds(region: Region, shape: Sequence[int]) -> list[tuple[int, int]]:
    """Per dim, the (start, stop) of `region` in an array of `shape`."""
    return [s.indices(n)[:2] for s, n in zip(region, shape)]


def contains(outer: Region, inner: Region, shape: Sequence[int]) -> bool:
    """Whether `inner` lies within `outer` (regions of an array of `shape`)."""
    return all(o0 <= i0 and i1 <= o1 for (o0, o1), (i0, i1) in
               zip(bounds(outer, shape), bounds(inner, shape)))


def overlap(a: Region, b: Region, shape: Sequence[int]) -> Region | None:
    """The part two regions of an array of `shape` share, or None."""
    common = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in
              zip(bounds(a, shape), bounds(b, shape))]
    if any(start >= stop for start, stop in common):
        return None
    return tuple(slice(start, stop) for start, stop in common)


def region_size(region: Region, shape: Sequence[int]) -> int:
    """How many elements `region` of an array of `shape` holds."""
    return math.prod(stop - start for start, stop in bounds(region, shape))


def relative(region: Region, within: Region, shape: Sequence[int]) -> Region:
    """`region` of an array of `shape` as slices into the part `within` holds of it."""
    return tuple(slice(r0 - w0, r1 - w0) for (r0, r1), (w0, _) in
                 zip(bounds(region, shape), bounds(within, shape)))


def _block_slices(coords: Sequence[int], dim_axes: DimAxes, axis_sizes: Sequence[int],
                  local: Sequence[int]) -> tuple[slice, ...]:
    """Where in the global array the piece (of shape `local`) of the chip at mesh
    coordinates `coords` is."""
    return tuple(slice(b * size, (b + 1) * size)
                 for b, size in zip(_block(coords, dim_axes, axis_sizes), local))


def split(array: np.ndarray, dim_axes: DimAxes, axis_sizes: Sequence[int]) -> list[np.ndarray]:
    """Per-device pieces (logical device order) of a global array, each its own copy."""
    return [np.array(p) for p in pieces(np.asarray(array), dim_axes, axis_sizes)]
