"""The convolution kernel (mesh.isa.kernels.convolution) called directly: StableHLO's
window (a cross-correlation, no flip unless asked), padding, strides, dilations and feature
groups on small inputs worked by hand, each chip convolving its own data."""

import ml_dtypes
import numpy as np
from kernel_harness import run_kernel

from mesh import isa

X3 = np.arange(9, dtype=np.int32).reshape(1, 1, 1, 3, 3)  # [x=1, N, C, H, W]: 0 .. 8


def conv(spatial: int, out_dtype: str = "int32", **window):
    """A convolution in NCHW / OIHW / NCHW layout (NCW for one spatial dim); `window`
    overrides the identity window (no padding, stride and dilations 1, one group)."""
    spec = tuple(range(2 + spatial))
    params = dict(window_strides=(1,) * spatial, padding=((0, 0),) * spatial,
                  lhs_dilation=(1,) * spatial, rhs_dilation=(1,) * spatial,
                  window_reversal=(False,) * spatial, feature_group_count=1,
                  batch_group_count=1) | window
    return lambda outs, ins: isa.Convolution(outs, ins, lhs_spec=spec, rhs_spec=spec,
                                             out_spec=spec, out_dtype=out_dtype, **params)


def test_2x2_window_over_3x3_is_a_cross_correlation():
    """out[i, j] = sum x[i + a, j + b] w[a, b], w = [[1, 2], [3, 4]]: e.g. out[0, 0] =
    0 + 2 + 9 + 16 = 27."""
    w = np.array([1, 2, 3, 4], np.int32).reshape(1, 1, 1, 2, 2)
    (out,) = run_kernel(conv(2), [X3, w], [((1, 1, 2, 2), "int32", set())], {"x": 1})
    np.testing.assert_array_equal(out[0, 0, 0], [[27, 37], [57, 67]])


def test_padding_and_stride_place_the_windows():
    """x padded by 1 on every side to 5 x 5, 2 x 2 windows of ones at rows and columns 0
    and 2: the first window holds only x[0, 0], the last x[1:, 1:]."""
    ones = np.ones((1, 1, 1, 2, 2), np.int32)
    (out,) = run_kernel(conv(2, window_strides=(2, 2), padding=((1, 1), (1, 1))),
                        [X3, ones], [((1, 1, 2, 2), "int32", set())], {"x": 1})
    np.testing.assert_array_equal(out[0, 0, 0], [[0, 1 + 2], [3 + 6, 4 + 5 + 7 + 8]])


def test_dilations_space_the_window_and_the_input():
    """A 2 x 2 window of ones dilated by 2 takes x's corners: 0 + 2 + 6 + 8. In 1-D,
    [1, 2, 3] dilated by 2 is [1, 0, 2, 0, 3], and a window [1, 1] over it gives
    [1, 2, 2, 3]."""
    ones = np.ones((1, 1, 1, 2, 2), np.int32)
    (out,) = run_kernel(conv(2, rhs_dilation=(2, 2)), [X3, ones],
                        [((1, 1, 1, 1), "int32", set())], {"x": 1})
    assert out.item() == 16
    x = np.array([1, 2, 3], np.int32).reshape(1, 1, 1, 3)
    (out,) = run_kernel(conv(1, lhs_dilation=(2,)), [x, np.ones((1, 1, 1, 2), np.int32)],
                        [((1, 1, 4), "int32", set())], {"x": 1})
    np.testing.assert_array_equal(out.reshape(-1), [1, 2, 2, 3])


def test_window_reversal_flips_the_kernel():
    """[1, 2, 3] against [1, 2]: [5, 8]; reversed to [2, 1]: [4, 7]."""
    x = np.array([1, 2, 3], np.int32).reshape(1, 1, 1, 3)
    w = np.array([1, 2], np.int32).reshape(1, 1, 1, 2)
    outs = [((1, 1, 2), "int32", set())]
    (plain,) = run_kernel(conv(1), [x, w], outs, {"x": 1})
    (flipped,) = run_kernel(conv(1, window_reversal=(True,)), [x, w], outs, {"x": 1})
    np.testing.assert_array_equal(plain.reshape(-1), [5, 8])
    np.testing.assert_array_equal(flipped.reshape(-1), [4, 7])


def test_feature_groups_keep_channels_apart_on_each_chip():
    """Two groups of one channel each: output channel 0 sees only input channel 0 (times
    10), channel 1 only input channel 1 (times -1). Chip 1's input is chip 0's plus 1."""
    x = np.array([[1, 2], [3, 4]], np.int32).reshape(1, 1, 2, 2)  # [N, C=2, W=2]
    x = np.concatenate([x, x + 1])  # [x=2, N, C, W]
    w = np.array([10, -1], np.int32).reshape(1, 2, 1, 1)  # [O=2, I=1, W=1]
    (out,) = run_kernel(conv(1, feature_group_count=2), [x, w],
                        [((1, 2, 2), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out[:, 0], [[[10, 20], [-3, -4]], [[20, 30], [-4, -5]]])


def test_bf16_products_are_summed_in_fp32_and_rounded_once():
    """1 * 1 + 2^-8 * 1 + 2^-8 * 1 = 1 + 2^-7 in FP32, which BF16 holds; a BF16 running
    sum would round each 1 + 2^-8 back to 1."""
    x = np.array([1.0, 2.0 ** -8, 2.0 ** -8], ml_dtypes.bfloat16).reshape(1, 1, 1, 3)
    w = np.ones((1, 1, 1, 3), ml_dtypes.bfloat16)
    (out,) = run_kernel(conv(1, "bfloat16"), [x, w], [((1, 1, 1), "bfloat16", set())],
                        {"x": 1})
    assert float(out.item()) == 1 + 2.0 ** -7
