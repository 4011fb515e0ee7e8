"""Data movement kernels (mesh.isa.kernels.movement) called directly: the mesh dims stay
in front, and Shard / Unshard cut a global value into chips' pieces and back."""

import numpy as np
from kernel_harness import run_kernel

from mesh import isa


def test_shard_gives_chip_i_block_i_along_its_axis_major_first():
    """A global [4, 2] split over a 2x2 mesh: dim 0 over (x, y), x major, so chip (i, j)
    gets row 2i + j; dim 1 is whole."""
    x = np.arange(8, dtype=np.int32).reshape(1, 1, 4, 2)
    make = lambda outs, ins: isa.Shard(outs, ins, dim_axes=((0, 1), ()))
    (out,) = run_kernel(make, [x], [((1, 2), "int32", {0, 1})], {"x": 2, "y": 2})
    np.testing.assert_array_equal(out, [[[[0, 1]], [[2, 3]]], [[[4, 5]], [[6, 7]]]])


def test_unshard_puts_the_pieces_back_in_place():
    pieces = np.array([[[10, 11]], [[12, 13]]], np.int32)  # [x=2, 1, 2]
    make = lambda outs, ins: isa.Unshard(outs, ins, dim_axes=((), (0,)))
    (out,) = run_kernel(make, [pieces], [((1, 4), "int32", set())], {"x": 2})
    np.testing.assert_array_equal(out, [[[10, 11, 12, 13]]])


def test_transpose_and_slice_work_on_the_local_dims_only():
    x = np.arange(12, dtype=np.int32).reshape(2, 2, 3)  # [x=2, 2, 3]
    make = lambda outs, ins: isa.Transpose(outs, ins, permutation=(1, 0))
    (out,) = run_kernel(make, [x], [((3, 2), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, [[[0, 3], [1, 4], [2, 5]], [[6, 9], [7, 10], [8, 11]]])
    make = lambda outs, ins: isa.Slice(outs, ins, start=(0, 1), limit=(2, 3), strides=(1, 2))
    (out,) = run_kernel(make, [x], [((2, 1), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, [[[1], [4]], [[7], [10]]])


def test_dynamic_slice_clamps_each_chips_start_into_range():
    """Chip 0 asks for start 1, chip 1 for start 5 of a length-4 dim: a slice of 2 can
    start at most at 2."""
    x = np.array([[0, 1, 2, 3], [10, 11, 12, 13]], np.int32)
    start = np.array([1, 5], np.int32).reshape(2)  # [x=2] scalars
    make = lambda outs, ins: isa.DynamicSlice(outs, ins, sizes=(2,))
    (out,) = run_kernel(make, [x, start], [((2,), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, [[1, 2], [12, 13]])
