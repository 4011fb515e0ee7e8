"""The ragged matmul kernel (chlo.ragged_dot, mesh.isa.kernels.ragged_matmul) called
directly: consecutive groups of rows (or of the contraction) each against their own rhs,
an empty group taking no rows (or giving zeros), rows after the last group zeros."""

import numpy as np
from kernel_harness import run_kernel

from mesh import isa

LHS = np.arange(10, dtype=np.float32).reshape(1, 5, 2)  # [x=1, M=5, K=2]: row i = 2i, 2i+1
# [x=1, G=3, K=2, N=2]: group 0 sums the row's two entries and takes the first, group 1
# (empty below) would give 100s, group 2 takes the second and the difference
RHS = np.array([[[1, 1], [1, 0]], [[100, 100], [100, 100]], [[0, -1], [1, 1]]],
               np.float32)[None]


def ragged_rows(outs, ins):
    return isa.RaggedMatmul(outs, ins, lhs_batch=(), rhs_batch=(), lhs_contract=(1,),
                            rhs_contract=(1,), lhs_ragged=0, rhs_group=0, out_dtype="float32")


def test_groups_2_0_3_take_rows_0_1_and_2_to_4():
    """Rows [a, b] = [0, 1] and [2, 3] by group 0: [a + b, a]; rows [4, 5], [6, 7], [8, 9]
    by group 2: [b, b - a]; the empty group 1 takes no row."""
    sizes = np.array([[2, 0, 3]], np.int32)
    (out,) = run_kernel(ragged_rows, [LHS, RHS, sizes], [((5, 2), "float32", set())],
                        {"x": 1})
    np.testing.assert_array_equal(out[0], [[1, 0], [5, 2], [5, 1], [7, 1], [9, 1]])


def test_rows_after_the_last_group_are_zeros():
    """Sizes [1, 0, 2] cover rows 0 to 2: row 0 by group 0, rows 1 and 2 by group 2."""
    sizes = np.array([[1, 0, 2]], np.int32)
    (out,) = run_kernel(ragged_rows, [LHS, RHS, sizes], [((5, 2), "float32", set())],
                        {"x": 1})
    np.testing.assert_array_equal(out[0], [[1, 0], [3, 1], [5, 1], [0, 0], [0, 0]])


def test_rows_in_no_group_are_zeros_whatever_the_rhs_holds():
    """Sizes [2, 0, 0]: rows 2 to 4 are in no group, zeros even though the rhs of the
    groups they are not in holds infinities (no 0 * inf)."""
    rhs = RHS.copy()
    rhs[0, 1:] = np.inf
    sizes = np.array([[2, 0, 0]], np.int32)
    (out,) = run_kernel(ragged_rows, [LHS, rhs, sizes], [((5, 2), "float32", set())],
                        {"x": 1})
    np.testing.assert_array_equal(out[0], [[1, 0], [5, 2], [0, 0], [0, 0], [0, 0]])


def test_each_chip_cuts_its_rows_by_its_own_group_sizes():
    """Chip 0 puts every row in group 0, chip 1 every row in group 1 (all 100 * row sum)."""
    sizes = np.array([[5, 0, 0], [0, 5, 0]], np.int32)
    (out,) = run_kernel(ragged_rows, [LHS, RHS, sizes], [((5, 2), "float32", {0})],
                        {"x": 2})
    row_sums = np.arange(10).reshape(5, 2).sum(1)
    np.testing.assert_array_equal(out[0], np.stack([row_sums, np.arange(0, 10, 2)], 1))
    np.testing.assert_array_equal(out[1], np.stack([100 * row_sums] * 2, 1))


def test_ragged_contraction_gives_one_product_per_group_and_zeros_for_an_empty_one():
    """lhs [2, 5], rhs [5, 1] of ones, sizes [2, 0, 3]: group 0 sums each lhs row's first
    two entries, group 1 nothing (zeros), group 2 the last three."""
    lhs = np.array([[1, 2, 3, 4, 5], [10, 20, 30, 40, 50]], np.float32)[None]
    rhs = np.ones((1, 5, 1), np.float32)
    sizes = np.array([[2, 0, 3]], np.int32)
    make = lambda outs, ins: isa.RaggedMatmul(
        outs, ins, lhs_batch=(), rhs_batch=(), lhs_contract=(1,), rhs_contract=(0,),
        lhs_ragged=1, rhs_group=None, out_dtype="float32")
    (out,) = run_kernel(make, [lhs, rhs, sizes], [((3, 2, 1), "float32", set())], {"x": 1})
    np.testing.assert_array_equal(out[0, ..., 0], [[3, 30], [0, 0], [12, 120]])
