"""Windowed reduction kernels (mesh.isa.kernels.windows) called directly: reduce_window's
padding (filled with the init value), strides and dilations, a reducer body, and
select_and_scatter, max pooling's gradient."""

import ml_dtypes
import numpy as np
from kernel_harness import run_kernel, sub_program

from mesh import isa


def reduce_window(size, combiner="add", body=None, stride=1, padding=(0, 0),
                  base_dilation=1, window_dilation=1):
    """A 1-D reduce_window."""
    return lambda outs, ins: isa.ReduceWindow(
        outs, ins, window_dimensions=(size,), window_strides=(stride,),
        base_dilations=(base_dilation,), window_dilations=(window_dilation,),
        padding=(padding,), combiner=combiner, body=body)


def windows_1d(make, x, init, n: int) -> np.ndarray:
    (out,) = run_kernel(make, [np.array([x], np.int32), np.array([init], np.int32)],
                        [((n,), "int32", set())], {"x": 1})
    return out[0]


def test_2x2_max_pool_with_stride_2_per_chip():
    """Each chip's 4 x 4 pooled to the max of each 2 x 2 block; chip 1's is chip 0's
    negated, so its maxima are the blocks' minima negated."""
    x = np.array([[1, 5, 2, 0], [3, 4, 8, 7], [6, 1, 0, 2], [9, 2, 3, 1]], np.int32)
    make = lambda outs, ins: isa.ReduceWindow(
        outs, ins, window_dimensions=(2, 2), window_strides=(2, 2), base_dilations=(1, 1),
        window_dilations=(1, 1), padding=((0, 0), (0, 0)), combiner="maximum")
    init = np.array([np.iinfo(np.int32).min], np.int32)
    (out,) = run_kernel(make, [np.stack([x, -x]), init], [((2, 2), "int32", {0})], {"x": 2})
    np.testing.assert_array_equal(out, [[[5, 8], [9, 3]], [[-1, 0], [-1, 0]]])


def test_padding_holds_the_init_value():
    """Windows of 3 over [1, 2, 3] padded by one on each side: the padding counts as the
    init value, 0 for a sum, 100 for a max (which then wins every window)."""
    np.testing.assert_array_equal(windows_1d(reduce_window(3, padding=(1, 1)),
                                             [1, 2, 3], 0, 3), [3, 6, 5])
    np.testing.assert_array_equal(windows_1d(reduce_window(3, "maximum", padding=(1, 1)),
                                             [1, 2, 3], 100, 3), [100, 100, 100])


def test_base_and_window_dilation():
    """Base dilation 2 makes [1, 2, 3] into [1, _, 2, _, 3] (holes of the init value):
    sums of 2 are [1, 2, 2, 3]. Window dilation 2 over [1, 2, 3, 4] sums elements two
    apart: [1 + 3, 2 + 4]. Stride 2 with windows of 1 takes every other element."""
    np.testing.assert_array_equal(windows_1d(reduce_window(2, base_dilation=2),
                                             [1, 2, 3], 0, 4), [1, 2, 2, 3])
    np.testing.assert_array_equal(windows_1d(reduce_window(2, window_dilation=2),
                                             [1, 2, 3, 4], 0, 2), [4, 6])
    np.testing.assert_array_equal(windows_1d(reduce_window(1, stride=2),
                                             [1, 2, 3, 4, 5], 0, 3), [1, 3, 5])


def test_a_reducer_body_runs_on_each_window():
    """A body multiplying its two scalars, init 1: products of pairs of [1, 2, 3, 4]. A
    reducer body is a program over scalars, with no mesh dims."""
    scalar = ((), "int32", set())
    body = sub_program({}, [isa.Elementwise((2,), (0, 1), op="multiply")], (0, 1), (2,),
                       {0: scalar, 1: scalar, 2: scalar})
    np.testing.assert_array_equal(windows_1d(reduce_window(2, combiner=None, body=body),
                                             [1, 2, 3, 4], 1, 3), [2, 6, 12])


def test_bf16_window_sum_is_taken_in_fp32_and_rounded_once():
    """1 + 2^-8 + 2^-8 in FP32 is 1 + 2^-7, which BF16 holds; summed in BF16 each
    1 + 2^-8 would tie back to 1."""
    x = np.array([[1.0, 2.0 ** -8, 2.0 ** -8]], ml_dtypes.bfloat16)
    init = np.zeros((1,), ml_dtypes.bfloat16)
    (out,) = run_kernel(reduce_window(3), [x, init], [((1,), "bfloat16", set())], {"x": 1})
    assert float(out.item()) == 1 + 2.0 ** -7


def max_pool_gradient(size, stride, padding=(0, 0)):
    """select_and_scatter of max pooling: select keeps the kept element where it is >=
    (so the first of equal maxima), the source elements are added."""
    scalar = ((), "float32", set())
    select = sub_program({}, [isa.Elementwise((2,), (0, 1), op="compare", direction="GE",
                                                compare_type="FLOAT")],
                         (0, 1), (2,), {0: scalar, 1: scalar, 2: ((), "bool", set())})
    return lambda outs, ins: isa.SelectAndScatter(
        outs, ins, window_dimensions=(size,), window_strides=(stride,), padding=(padding,),
        select=select, scatter_combiner="add")


def scatter_1d(make, operand, source) -> np.ndarray:
    args = [np.array([operand], np.float32), np.array([source], np.float32),
            np.zeros((1,), np.float32)]
    (out,) = run_kernel(make, args, [((len(operand),), "float32", set())], {"x": 1})
    return out[0]


def test_select_and_scatter_sends_each_source_element_to_its_windows_max():
    """Windows [1, 5] and [3, 2]: 10 goes to 5, 20 to 3."""
    np.testing.assert_array_equal(scatter_1d(max_pool_gradient(2, 2), [1, 5, 3, 2],
                                             [10, 20]), [0, 10, 20, 0])


def test_select_and_scatter_adds_where_windows_overlap_and_takes_the_first_tie():
    """Stride 1 over [1, 5, 3]: both windows pick 5, which gets 10 + 20. Over [4, 4]
    the one window picks the first 4."""
    np.testing.assert_array_equal(scatter_1d(max_pool_gradient(2, 1), [1, 5, 3],
                                             [10, 20]), [0, 30, 0])
    np.testing.assert_array_equal(scatter_1d(max_pool_gradient(2, 1), [4, 4], [7]), [7, 0])


def test_select_and_scatter_skips_padding_and_a_window_wholly_in_it():
    """[-1, -2] padded by 2 on the left, windows of 2 at stride 1: the first lies in the
    padding and scatters nothing, the second holds only -1 (the padding is never picked,
    though -1 is below the result's init 0), the third picks -1 of [-1, -2]."""
    np.testing.assert_array_equal(scatter_1d(max_pool_gradient(2, 1, (2, 0)), [-1, -2],
                                             [100, 10, 1]), [11, 0])
