"""The Tensor Engine's matmul kernel (mesh.isa.kernels.matmul) called directly: FP32 sums
in passes of 128 contraction elements, added in order, and mesh dims as batch dims."""

import ml_dtypes
import numpy as np
from kernel_harness import run_kernel

from mesh import isa


def matmul(k_lhs: int = 1, pass_size: int = 128, out_dtype: str = "float32"):
    return lambda outs, ins: isa.Matmul(outs, ins, lhs_batch=(), rhs_batch=(),
                                        lhs_contract=(k_lhs,), rhs_contract=(0,),
                                        out_dtype=out_dtype, pass_size=pass_size)


def test_fp32_contraction_is_summed_in_passes_of_128():
    """Chip 0's row is 2^24 then 255 ones: the first pass (2^24 and 127 ones) loses every
    one (2^24 + 1 rounds to 2^24), the second sums its 128 ones exactly from zero, then the
    passes are added: 2^24 + 128. One FP32 chain over all 256 would give 2^24; summing the
    ones first 2^24 + 255. Chip 1's row of ones sums exactly to 256."""
    lhs = np.ones((2, 1, 256), np.float32)  # [x, M, K]: each chip its own row
    lhs[0, 0, 0] = 2.0 ** 24
    rhs = np.ones((1, 256, 1), np.float32)  # replicated along x
    (out,) = run_kernel(matmul(), [lhs, rhs], [((1, 1), "float32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, np.array([[[2.0 ** 24 + 128]], [[256.0]]], np.float32))


def test_a_pass_size_other_than_128_cuts_the_passes_there():
    """The same row with passes of 4: ones 1..3 are lost to 2^24, then 252 ones in 63 exact
    passes of 4, each added to 2^24 (an FP32 step of 2 there, so each +4 is exact)."""
    lhs = np.ones((1, 1, 256), np.float32)
    lhs[0, 0, 0] = 2.0 ** 24
    rhs = np.ones((1, 256, 1), np.float32)
    (out,) = run_kernel(matmul(pass_size=4), [lhs, rhs], [((1, 1), "float32", set())],
                        {"x": 2})
    assert out.shape == (1, 1, 1)
    assert out.item() == 2.0 ** 24 + 252


def test_operands_varying_along_the_mesh_multiply_chip_by_chip():
    """Both operands vary along x: chip c computes its own lhs[c] @ rhs[c] (integers, so
    exact in any order)."""
    lhs = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)
    rhs = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) - 5
    (out,) = run_kernel(matmul(), [lhs, rhs], [((2, 2), "float32", {0})], {"x": 2})
    expected = np.array([[[-5, -2], [-32, -20]], [[67, 88], [94, 124]]], np.float32)
    np.testing.assert_array_equal(out, expected)


def test_bf16_result_is_rounded_once_from_the_fp32_sum():
    """1 + 2^-8 + 2^-8 in BF16 (8 significand bits, a step of 2^-7 at 1): summed in FP32 it
    is 1 + 2^-7, which BF16 holds; a BF16 running sum would round each 1 + 2^-8 (a tie)
    back to 1."""
    lhs = np.array([[[1.0, 2.0 ** -8, 2.0 ** -8]]], ml_dtypes.bfloat16)
    rhs = np.ones((1, 3, 1), ml_dtypes.bfloat16)
    (out,) = run_kernel(matmul(out_dtype="bfloat16"), [lhs, rhs],
                        [((1, 1), "bfloat16", set())], {"x": 1})
    assert out.dtype == ml_dtypes.bfloat16
    assert float(out.item()) == 1.0 + 2.0 ** -7
