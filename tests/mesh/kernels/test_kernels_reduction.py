"""The Vector engine's reduce kernel (mesh.isa.kernels.reduction) called directly: narrow
floats widened to FP32, reduced, combined with the init value and rounded once."""

import ml_dtypes
import pytest
import numpy as np
from kernel_harness import run_kernel

from mesh import isa


def reduce(dimensions, combiner):
    return lambda outs, ins: isa.Reduce(outs, ins, dimensions=dimensions, combiner=combiner)


def test_bf16_sum_is_taken_in_fp32_and_rounded_once():
    """1 + 2^-8 + 2^-8 + init 0: in FP32 1 + 2^-7, which BF16 holds; a BF16 running sum
    would tie each 1 + 2^-8 back to 1."""
    x = np.array([[1.0, 2.0 ** -8, 2.0 ** -8]], ml_dtypes.bfloat16)
    init = np.zeros((1,), ml_dtypes.bfloat16)
    (out,) = run_kernel(reduce((0,), "add"), [x, init], [((), "bfloat16", set())], {"x": 1})
    assert float(out.item()) == 1 + 2.0 ** -7


def test_each_chip_reduces_its_own_rows_with_the_init_value():
    """max over dim 1 of each chip's [2, 3], with init 4: chip 0's rows peak at 2 and 9,
    chip 1's at 7 and -1; the init lifts what is below 4."""
    x = np.array([[[0, 2, 1], [9, 3, 3]], [[7, 7, -5], [-1, -2, -3]]], np.int32)
    init = np.array([4], np.int32)  # [x=1] + scalar: the same on every chip
    (out,) = run_kernel(reduce((1,), "maximum"), [x, init], [((2,), "int32", {0})],
                        {"x": 2})
    np.testing.assert_array_equal(out, [[4, 9], [7, 4]])


def test_add_of_bools_is_or():
    x = np.array([[[True, True], [False, False]]])
    init = np.array([False])
    (out,) = run_kernel(reduce((1,), "add"), [x, init], [((2,), "bool", set())], {"x": 1})
    np.testing.assert_array_equal(out, [[True, False]])


def lanes_then_tree(values):
    """The documented order of a float sum along one dim, in NumPy FP32: element k to lane
    k % L of L = max(8, the smallest power of two from K / 32) lanes, each lane summed in
    sequence, then lane i added to lane i + L/2 until one is left."""
    k = len(values)
    lanes = max(8, 1 << (-(-k // 32) - 1).bit_length())
    acc = np.full(lanes, -0.0, np.float32)
    for i, v in enumerate(values.astype(np.float32)):
        acc[i % lanes] = acc[i % lanes] + v
    while lanes > 1:
        lanes //= 2
        acc = acc[:lanes] + acc[lanes:2 * lanes]
    return acc[0]


@pytest.mark.parametrize("width", [7, 1000, 4096])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_float_sum_is_taken_in_lanes_then_a_tree(width, dtype):
    """Each of 3 chips' 5 rows of wide-ranging values summed along the row: the same bits
    as the documented order (XLA's own reduce, or a tree over all K, differ)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, width)) * 2.0 ** rng.integers(-20, 20, (3, 5, width)))
    x = x.astype(dtype)
    init = np.zeros((1,), np.float32)
    (out,) = run_kernel(reduce((1,), "add"), [x, init],
                        [((5,), "float32", {0})], {"x": 3})
    want = np.array([[lanes_then_tree(row) for row in chip] for chip in x], np.float32)
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32), want.view(np.uint32))


def test_a_sum_over_two_dims_takes_the_lower_dim_first():
    """[40, 50] per chip summed over both dims: each column in lanes-then-tree order, then
    the 50 column sums the same way."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 40, 50)) * 2.0 ** rng.integers(-20, 20, (2, 40, 50)))
    x = x.astype(np.float32)
    init = np.zeros((1,), np.float32)
    (out,) = run_kernel(reduce((0, 1), "add"), [x, init], [((), "float32", {0})], {"x": 2})
    want = np.array([lanes_then_tree(np.array([lanes_then_tree(col) for col in chip.T]))
                     for chip in x], np.float32)
    np.testing.assert_array_equal(np.asarray(out).reshape(-1).view(np.uint32),
                                  want.view(np.uint32))
