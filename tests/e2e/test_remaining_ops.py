"""The remaining StableHLO and CHLO ops: dynamic-shape ops whose shapes are known while
lowering, chlo.mulhi, chlo.scan, chlo.ragged_dot, stablehlo.composite and stablehlo.map.
Written as StableHLO where jax does not emit the op, run through the PJRT-style client and
compared with the StableHLO spec's own examples (its interpreter tests) and numpy renderings
of the spec; compared with CPU JAX where jax emits the op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2
from lowering import UnsupportedOpError


def run(text: str, *args) -> list[np.ndarray]:
    return [np.asarray(r) for r in jax_trn2.client().compile(text).execute(list(args))]


def module(arguments: str, results: str, body: str, functions: str = "") -> str:
    return (f"module @m {{\n{functions}\n  func.func public @main({arguments}) -> ({results}) "
            f"{{\n{body}\n  }}\n}}")


# --- dynamic shapes ------------------------------------------------------------------------

def test_dynamic_ops_with_constant_shapes_as_the_spec_examples():
    """The interpreter tests' dynamic_iota (a dynamic result type), dynamic_reshape,
    dynamic_broadcast_in_dim, dynamic_gather, dynamic_conv and get_dimension_size of a
    dynamically shaped value."""
    text = module("", "tensor<?x?xi64>, tensor<6xi64>, tensor<2x3x2xi64>, tensor<i32>, "
                  "tensor<2x3x2x2xi64>, tensor<1x2x2x1xi64>", """
    %output_shape = stablehlo.constant dense<[3, 4]> : tensor<2xi64>
    %0 = stablehlo.dynamic_iota %output_shape, dim = 0 : (tensor<2xi64>) -> tensor<?x?xi64>
    %c = stablehlo.constant dense<[[1, 2, 3, 4, 5, 6]]> : tensor<1x6xi64>
    %shape = stablehlo.constant dense<[6]> : tensor<1xi64>
    %1 = stablehlo.dynamic_reshape %c, %shape : (tensor<1x6xi64>, tensor<1xi64>) -> tensor<6xi64>
    %b = stablehlo.constant dense<[[1, 2, 3]]> : tensor<1x3xi64>
    %dims = stablehlo.constant dense<[2, 3, 2]> : tensor<3xi64>
    %2 = "stablehlo.dynamic_broadcast_in_dim"(%b, %dims) {
      broadcast_dimensions = array<i64: 2, 1>, known_expanding_dimensions = array<i64: 0>,
      known_non_expanding_dimensions = array<i64: 1>
    } : (tensor<1x3xi64>, tensor<3xi64>) -> tensor<2x3x2xi64>
    %3 = stablehlo.get_dimension_size %0, dim = 1 : (tensor<?x?xi64>) -> tensor<i32>
    %operand = stablehlo.constant dense<[[[1, 2], [3, 4], [5, 6], [7, 8]],
      [[9, 10], [11, 12], [13, 14], [15, 16]], [[17, 18], [19, 20], [21, 22], [23, 24]]]>
      : tensor<3x4x2xi64>
    %start = stablehlo.constant dense<[[[0, 0], [1, 0], [2, 1]], [[0, 1], [1, 1], [0, 9]]]>
      : tensor<2x3x2xi64>
    %sizes = stablehlo.constant dense<[1, 2, 2]> : tensor<3xi32>
    %4 = "stablehlo.dynamic_gather"(%operand, %start, %sizes) {
      dimension_numbers = #stablehlo.gather<offset_dims = [2, 3], collapsed_slice_dims = [0],
        start_index_map = [1, 0], index_vector_dim = 2>, indices_are_sorted = false
    } : (tensor<3x4x2xi64>, tensor<2x3x2xi64>, tensor<3xi32>) -> tensor<2x3x2x2xi64>
    %lhs = stablehlo.constant dense<[[[[1], [2], [5], [6]], [[3], [4], [7], [8]],
      [[10], [11], [14], [15]], [[12], [13], [16], [17]]]]> : tensor<1x4x4x1xi64>
    %rhs = stablehlo.constant dense<1> : tensor<3x3x1x1xi64>
    %padding = stablehlo.constant dense<0> : tensor<2x2xi64>
    %5 = "stablehlo.dynamic_conv"(%lhs, %rhs, %padding) {
      dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>,
      window_strides = array<i64: 4, 4>, lhs_dilation = array<i64: 2, 2>,
      batch_group_count = 1 : i64, feature_group_count = 1 : i64
    } : (tensor<1x4x4x1xi64>, tensor<3x3x1x1xi64>, tensor<2x2xi64>) -> tensor<1x2x2x1xi64>
    return %0, %1, %2, %3, %4, %5 : tensor<?x?xi64>, tensor<6xi64>, tensor<2x3x2xi64>,
      tensor<i32>, tensor<2x3x2x2xi64>, tensor<1x2x2x1xi64>""")
    iota, reshaped, broadcast, size, gathered, conv = run(text)
    np.testing.assert_array_equal(iota, np.repeat(np.arange(3)[:, None], 4, axis=1))
    np.testing.assert_array_equal(reshaped, [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(broadcast, [[[1, 1], [2, 2], [3, 3]]] * 2)
    assert size == 4 and size.dtype == np.int32
    np.testing.assert_array_equal(gathered, [
        [[[1, 2], [3, 4]], [[3, 4], [5, 6]], [[13, 14], [15, 16]]],
        [[[9, 10], [11, 12]], [[11, 12], [13, 14]], [[17, 18], [19, 20]]]])
    np.testing.assert_array_equal(conv, [[[[10], [26]], [[46], [62]]]])


def test_dynamic_ops_with_shape_operands_from_arguments():
    """A static result type needs no known shape operand (dynamic_reshape, dynamic_iota,
    dynamic_gather's slice sizes come from it); dynamic_pad with constant and computed
    padding; padding from an argument is an error naming the operand."""
    text = module("%n: tensor<2xi64>, %x: tensor<6xf32>, %s: tensor<2xi64>",
                  "tensor<2x3xf32>, tensor<2x3xi64>, tensor<10xf32>, tensor<2x1x2xf32>", """
    %0 = stablehlo.dynamic_reshape %x, %n : (tensor<6xf32>, tensor<2xi64>) -> tensor<2x3xf32>
    %i = stablehlo.constant dense<[[2], [0]]> : tensor<2x1xi32>
    %g = "stablehlo.dynamic_gather"(%0, %i, %s) {
      dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], start_index_map = [1],
        index_vector_dim = 1>} : (tensor<2x3xf32>, tensor<2x1xi32>, tensor<2xi64>)
      -> tensor<2x1x2xf32>
    %1 = stablehlo.dynamic_iota %n, dim = 1 : (tensor<2xi64>) -> tensor<2x3xi64>
    %z = stablehlo.constant dense<-1.0> : tensor<f32>
    %one = stablehlo.constant dense<1> : tensor<1xi64>
    %two = stablehlo.add %one, %one : tensor<1xi64>
    %none = stablehlo.constant dense<0> : tensor<1xi64>
    %2 = stablehlo.dynamic_pad %x, %z, %one, %two, %none
      : (tensor<6xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<9xf32>
    %3 = stablehlo.dynamic_pad %2, %z, %none, %one, %none
      : (tensor<9xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<10xf32>
    return %0, %1, %3, %g : tensor<2x3xf32>, tensor<2x3xi64>, tensor<10xf32>,
      tensor<2x1x2xf32>""")
    x = np.arange(6, dtype=np.float32)
    # The gather's slice sizes (an argument) are [1, 2]: the first row's two columns from
    # the start column (2 clamped to 1, then 0).
    reshaped, iota, padded, gathered = run(text, np.array([2, 3]), x, np.array([1, 2]))
    np.testing.assert_array_equal(gathered, [x.reshape(2, 3)[:1, 1:], x.reshape(2, 3)[:1, :2]])
    np.testing.assert_array_equal(reshaped, x.reshape(2, 3))
    np.testing.assert_array_equal(iota, [[0, 1, 2]] * 2)
    np.testing.assert_array_equal(padded, np.pad(x, (1, 3), constant_values=-1))

    text = module("%p: tensor<1xi64>, %x: tensor<6xf32>", "tensor<8xf32>", """
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.dynamic_pad %x, %z, %p, %p, %p
      : (tensor<6xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<8xf32>
    return %0 : tensor<8xf32>""")
    with pytest.raises(UnsupportedOpError, match=r"operand 2 \(edge_padding_low\) of "
                       r"stablehlo.dynamic_pad is not known while lowering"):
        jax_trn2.client().compile(text)


def test_dynamic_shape_from_an_argument_is_an_error_naming_the_operand():
    text = module("%n: tensor<1xi64>", "tensor<?xi64>", """
    %0 = stablehlo.dynamic_iota %n, dim = 0 : (tensor<1xi64>) -> tensor<?xi64>
    return %0 : tensor<?xi64>""")
    with pytest.raises(UnsupportedOpError, match=r"operand 0 \(output_shape\), which is not a "
                       r"constant.*stablehlo.dynamic_iota"):
        jax_trn2.client().compile(text)


# --- chlo.mulhi ----------------------------------------------------------------------------

MULHI_TYPES = {"i8": np.int8, "ui8": np.uint8, "i16": np.int16, "ui16": np.uint16,
               "i32": np.int32, "ui32": np.uint32, "i64": np.int64, "ui64": np.uint64}


@pytest.mark.parametrize("spelling", MULHI_TYPES)
def test_mulhi_is_the_high_half_of_the_full_product(spelling):
    """The type's extremes and random operands, against the high half of Python's exact
    integer product."""
    dtype = np.dtype(MULHI_TYPES[spelling])
    info = np.iinfo(dtype)
    bits = 8 * dtype.itemsize
    rng = np.random.default_rng(bits)
    extremes = np.array([info.min, info.min + 1, -1 if info.min else 1, 0, 1, info.max - 1,
                         info.max], dtype)
    x = np.concatenate([np.repeat(extremes, extremes.size),
                        rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)])
    y = np.concatenate([np.tile(extremes, extremes.size),
                        rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)])
    t = f"tensor<{x.size}x{spelling}>"
    text = module(f"%x: {t}, %y: {t}", t, f"""
    %0 = "chlo.mulhi"(%x, %y) : ({t}, {t}) -> {t}
    return %0 : {t}""")
    (got,) = run(text, x, y)
    want = np.array([(int(a) * int(b)) >> bits for a, b in zip(x, y)], dtype=object)
    np.testing.assert_array_equal(got.astype(object), want)
    assert got.dtype == dtype


def test_mulhi_spec_examples():
    """The interpreter's chlo/mulhi tests for 8- and 64-bit operands."""
    text = module("", "tensor<3xi8>, tensor<2xui8>, tensor<2xi64>, tensor<2xui64>", """
    %a = stablehlo.constant dense<[64, -64, -64]> : tensor<3xi8>
    %b = stablehlo.constant dense<[4, 4, -4]> : tensor<3xi8>
    %0 = "chlo.mulhi"(%a, %b) : (tensor<3xi8>, tensor<3xi8>) -> tensor<3xi8>
    %c = stablehlo.constant dense<[240, 128]> : tensor<2xui8>
    %d = stablehlo.constant dense<[16, 2]> : tensor<2xui8>
    %1 = "chlo.mulhi"(%c, %d) : (tensor<2xui8>, tensor<2xui8>) -> tensor<2xui8>
    %e = stablehlo.constant dense<[1152921504606846976, -1152921504606846976]> : tensor<2xi64>
    %f = stablehlo.constant dense<[16, 16]> : tensor<2xi64>
    %2 = "chlo.mulhi"(%e, %f) : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
    %g = stablehlo.constant dense<[17293822569102704640, 9223372036854775808]> : tensor<2xui64>
    %h = stablehlo.constant dense<[16, 2]> : tensor<2xui64>
    %3 = "chlo.mulhi"(%g, %h) : (tensor<2xui64>, tensor<2xui64>) -> tensor<2xui64>
    return %0, %1, %2, %3 : tensor<3xi8>, tensor<2xui8>, tensor<2xi64>, tensor<2xui64>""")
    i8, u8, i64, u64 = run(text)
    np.testing.assert_array_equal(i8, [1, -1, 1])
    np.testing.assert_array_equal(u8, [15, 1])
    np.testing.assert_array_equal(i64, [1, -1])
    np.testing.assert_array_equal(u64, [15, 1])
