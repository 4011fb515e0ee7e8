"""Where Shard and Unshard put elements (mesh.isa.kernels.views), which kernels use to read
or write elements in place of the movement's copy: the strides worked by hand, and checked
against what the Shard and Unshard kernels (mesh.isa.kernels.movement) make."""

import numpy as np
from kernel_harness import kernel_call, run_kernel

from mesh import isa
from mesh.isa.kernels import views


def shard_view(source: np.ndarray, dim_axes, local, varying, mesh, manual=None):
    """(shard_strides of a Shard of `source`, the Shard kernel's result)."""
    make = lambda outs, ins: isa.Shard(outs, ins, dim_axes=dim_axes, manual_axes=manual)
    outs = [(local, "int32", varying)]
    instr, ctx = kernel_call(make, [source], outs, mesh)
    (made,) = run_kernel(make, [source], outs, mesh)
    return views.shard_strides(instr, source.shape, ctx), made


def strided(source: np.ndarray, strides, shape) -> np.ndarray:
    """`source`'s elements read at `strides` (in elements) into an array of `shape`."""
    return np.lib.stride_tricks.as_strided(
        source, shape, tuple(s * source.itemsize for s in strides))


def test_shard_over_one_axis_steps_over_blocks_of_rows():
    """[4, 2] over x=2 by rows: chip i holds rows 2i, 2i + 1, so its block starts 4
    elements on, rows 2 apart, columns 1."""
    source = np.arange(8, dtype=np.int32).reshape(1, 4, 2)
    strides, made = shard_view(source, ((0,), ()), (2, 2), {0}, {"x": 2})
    assert strides == (4, 2, 1)
    np.testing.assert_array_equal(strided(source, strides, made.shape), made)


def test_shard_over_two_axes_takes_the_major_axis_first():
    """[8] over (y, x), y major: chip (x, y) holds block 2y + x of 2 elements, so x steps
    2 elements and y 4."""
    source = np.arange(8, dtype=np.int32).reshape(1, 1, 8)
    strides, made = shard_view(source, ((1, 0),), (2,), {0, 1}, {"x": 2, "y": 2})
    assert strides == (2, 4, 1)
    np.testing.assert_array_equal(strided(source, strides, made.shape), made)
    np.testing.assert_array_equal(made[1, 0], [2, 3])


def test_shard_keeps_the_layout_along_axes_that_are_not_manual():
    """A shard_map over x only: along y the input keeps its layout, each y its own row of
    4 (stride 4), or, replicated along y, one row read by every chip (stride 0)."""
    varying = np.arange(8, dtype=np.int32).reshape(1, 2, 4)
    strides, made = shard_view(varying, ((0,),), (2,), {0, 1}, {"x": 2, "y": 2}, manual=(0,))
    assert strides == (2, 4, 1)
    np.testing.assert_array_equal(strided(varying, strides, made.shape), made)
    replicated = np.arange(4, dtype=np.int32).reshape(1, 1, 4)
    strides, made = shard_view(replicated, ((0,),), (2,), {0}, {"x": 2, "y": 2},
                               manual=(0,))
    assert strides == (2, 0, 1)


def unshard(dim_axes, manual=None):
    return lambda outs, ins: isa.Unshard(outs, ins, dim_axes=dim_axes, manual_axes=manual)


def test_unshard_strides_put_each_chips_piece_where_unshard_does():
    """Chips of x=2 holding [2, 3] pieces of a [2, 6] split by columns: chip i's block
    starts 3 columns on, rows are 6 apart."""
    pieces = np.arange(12, dtype=np.int32).reshape(2, 2, 3)
    mesh = isa.MeshSpec(("x",), (2,))
    strides = views.unshard_strides(unshard(((), (0,)))((1,), (0,)), pieces.shape, mesh)
    assert strides == (3, 6, 1)
    placed = np.zeros(12, np.int32)
    positions = sum(i * s for i, s in zip(np.indices(pieces.shape), strides))
    placed[positions] = pieces
    (made,) = run_kernel(unshard(((), (0,))), [pieces], [((2, 6), "int32", set())],
                         {"x": 2})
    np.testing.assert_array_equal(placed.reshape(made.shape), made)


def test_unshard_that_copies_or_drops_pieces_has_no_strides():
    """A piece the same on every chip but unsharded over x is copied; a piece along a
    manual axis no dim is split over is taken from chip 0 and the others dropped. Where
    the piece is the same along that axis (size 1 there) it is only moved, x stepping 3
    (y's stride is that of a dim of size 1)."""
    mesh = isa.MeshSpec(("x", "y"), (2, 2))
    by_rows = unshard(((0,),))((1,), (0,))  # [6] from pieces of 3 over x
    assert views.unshard_strides(by_rows, (1, 1, 3), mesh) is None  # copied
    assert views.unshard_strides(by_rows, (2, 2, 3), mesh) is None  # y's pieces dropped
    assert views.unshard_strides(by_rows, (2, 1, 3), mesh)[0::2] == (3, 1)
