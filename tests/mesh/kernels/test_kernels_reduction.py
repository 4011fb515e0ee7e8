"""The Vector engine's reduce kernel (mesh.isa.kernels.reduction) called directly: narrow
floats widened to FP32, reduced, combined with the init value and rounded once."""

import ml_dtypes
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
