"""Gather and scatter kernels (mesh.isa.kernels.indexing) called directly, chip by chip:
start indices clamped into the operand, as the spec says."""

import numpy as np
from kernel_harness import run_kernel

from mesh import isa


def test_gather_rows_clamps_out_of_range_starts_per_chip():
    """Rows of a [3, 2] operand at indices 2, 7, -1: 7 clamps to 2 and -1 to 0. Chip 1's
    operand is chip 0's plus 100; the indices are the same on both chips."""
    operand = np.stack([np.arange(6).reshape(3, 2), np.arange(6).reshape(3, 2) + 100]
                       ).astype(np.int32)
    indices = np.array([[[2], [7], [-1]]], np.int32)  # [x=1, 3, 1]
    make = lambda outs, ins: isa.Gather(
        outs, ins, offset_dims=(1,), collapsed_slice_dims=(0,), operand_batching_dims=(),
        start_indices_batching_dims=(), start_index_map=(0,), index_vector_dim=1,
        slice_sizes=(1, 2))
    (out,) = run_kernel(make, [operand, indices], [((3, 2), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, [[[4, 5], [4, 5], [0, 1]],
                                        [[104, 105], [104, 105], [100, 101]]])


def test_scatter_add_accumulates_repeated_indices():
    operand = np.zeros((1, 4), np.int32)
    indices = np.array([[[1], [3], [1]]], np.int32)
    updates = np.array([[10, 20, 30]], np.int32)
    make = lambda outs, ins: isa.Scatter(
        outs, ins, update_window_dims=(), inserted_window_dims=(0,), input_batching_dims=(),
        scatter_indices_batching_dims=(), scatter_dims_to_operand_dims=(0,),
        index_vector_dim=1, combiner="add")
    (out,) = run_kernel(make, [operand, indices, updates], [((4,), "int32", set())],
                        {"x": 1})
    np.testing.assert_array_equal(out, [[0, 40, 0, 20]])
