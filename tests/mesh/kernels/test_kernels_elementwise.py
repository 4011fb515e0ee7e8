"""The elementwise kernel (mesh.isa.kernels.elementwise) called directly: operands in
different mesh layouts, narrow floats computed in FP32 and rounded once, and the total
order of floats in comparisons."""

import ml_dtypes
import numpy as np
from kernel_harness import bits, run_kernel

from mesh import isa


def elementwise(op: str, **params):
    return lambda outs, ins: isa.Elementwise(outs, ins, op=op, **params)


def test_an_operand_replicated_along_the_mesh_meets_each_chips_own():
    x = np.array([[1, 2], [3, 4], [5, 6]], np.int32)  # [x=3, 2]: each chip's own
    y = np.array([[10, 20]], np.int32)  # the same on every chip
    (out,) = run_kernel(elementwise("subtract"), [x, y], [((2,), "int32", {0})], {"x": 3})
    np.testing.assert_array_equal(out, [[-9, -18], [-7, -16], [-5, -14]])


def test_bf16_multiply_add_chain_rounds_each_instruction_once():
    """(1 + 2^-7) * (1 + 2^-7) = 1 + 2^-6 + 2^-14 in FP32, rounded once to BF16: 1 + 2^-6
    (the 2^-14 is below half of BF16's step of 2^-7)."""
    x = np.full((1, 1), 1 + 2.0 ** -7, ml_dtypes.bfloat16)
    (out,) = run_kernel(elementwise("multiply"), [x, x], [((1,), "bfloat16", set())],
                        {"x": 2})
    assert out.dtype == ml_dtypes.bfloat16
    assert float(out.item()) == 1 + 2.0 ** -6


def test_totalorder_compare_puts_negative_zero_below_zero_and_nan_above_infinity():
    lhs = np.array([[-0.0, 0.0, np.nan, np.inf]], np.float32)
    rhs = np.array([[0.0, -0.0, np.inf, np.nan]], np.float32)
    outs = [((4,), "bool", set())]
    (total,) = run_kernel(elementwise("compare", direction="LT", compare_type="TOTALORDER"),
                          [lhs, rhs], outs, {"x": 1})
    np.testing.assert_array_equal(total, [[True, False, False, True]])
    (plain,) = run_kernel(elementwise("compare", direction="LT", compare_type="FLOAT"),
                          [lhs, rhs], outs, {"x": 1})
    np.testing.assert_array_equal(plain, [[False, False, False, False]])


def test_convert_to_bf16_rounds_to_nearest_even():
    """FP32 values halfway between BF16 neighbours go to the even one: 1 + 2^-8 to 1,
    1 + 3 * 2^-8 to 1 + 2^-6; -0.0 keeps its sign."""
    x = np.array([[1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -0.0]], np.float32)
    (out,) = run_kernel(elementwise("convert"), [x], [((3,), "bfloat16", set())], {"x": 1})
    expected = np.array([[1.0, 1 + 2.0 ** -6, -0.0]], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(bits(out), bits(expected))
