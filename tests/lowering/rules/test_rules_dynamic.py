"""lowering/rules/dynamic.py: ops with shape operands left after shape refinement (their
shape operand is an argument, or computed from device ids), lowered to their static forms."""

import pytest

from lowering import LoweringError, UnsupportedOpError
from mesh import isa
from rule_lowering import lower_text, only, out_type

# %s = `value` of type `type_`, known while lowering (elementwise on a device id: no chip is
# 100) but not a constant that shape refinement folds.
KNOWN_WHILE_LOWERING = """
  %p = stablehlo.partition_id : tensor<ui32>
  %chip = stablehlo.constant dense<100> : tensor<ui32>
  %here = stablehlo.compare EQ, %p, %chip : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
  %never = stablehlo.constant dense<0> : {type}
  %value = stablehlo.constant dense<{value}> : {type}
  %s = stablehlo.select %here, %never, %value : (tensor<i1>, {type}, {type}) -> {type}"""


def known_while_lowering(value: str, type_: str) -> str:
    return KNOWN_WHILE_LOWERING.format(value=value, type=type_)


def test_shape_operand_from_an_argument_gives_way_to_the_result_type():
    program = lower_text("""func.func public @main(%x: tensor<3xf32>, %shape: tensor<2xi64>)
        -> (tensor<2x3xi32>, tensor<3x4xf32>) {
      %i = stablehlo.dynamic_iota %shape, dim = 1 : (tensor<2xi64>) -> tensor<2x3xi32>
      %b = stablehlo.dynamic_broadcast_in_dim %x, %shape, dims = [0]
          : (tensor<3xf32>, tensor<2xi64>) -> tensor<3x4xf32>
      return %i, %b : tensor<2x3xi32>, tensor<3x4xf32>
    }""")
    iota = only(program, isa.Iota)
    assert (iota.dimension, out_type(program, iota).shape) == (1, (2, 3))
    broadcast = only(program, isa.BroadcastInDim)
    assert (broadcast.dimensions, broadcast.shape) == ((0,), (3, 4))


def test_dynamic_gather_slice_sizes_come_from_its_result():
    program = lower_text("""func.func public @main(%x: tensor<5x4x3xf32>, %i: tensor<2x1xi32>,
        %sizes: tensor<3xi64>) -> tensor<2x4x2xf32> {
      %y = "stablehlo.dynamic_gather"(%x, %i, %sizes) {dimension_numbers = #stablehlo.gather<
          offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0],
          index_vector_dim = 1>} : (tensor<5x4x3xf32>, tensor<2x1xi32>, tensor<3xi64>)
          -> tensor<2x4x2xf32>
      return %y : tensor<2x4x2xf32>
    }""")
    gather = only(program, isa.Gather)
    # dim 0 collapsed (1); dims 1, 2 are the result's offset dims 1, 2 (sizes 4, 2)
    assert gather.slice_sizes == (1, 4, 2)
    assert (gather.offset_dims, gather.collapsed_slice_dims) == ((1, 2), (0,))


def pad_to_8(low: int) -> str:
    """A dynamic_pad of 3 elements to 8, its low padding `low` (known while lowering)
    and 1 of interior and high padding."""
    return """func.func public @main(%x: tensor<3xf32>, %v: tensor<f32>)
        -> tensor<8xf32> {""" + known_while_lowering(f"[{low}]", "tensor<1xi64>") + """
      %one = stablehlo.constant dense<[1]> : tensor<1xi64>
      %y = stablehlo.dynamic_pad %x, %v, %s, %one, %one : (tensor<3xf32>, tensor<f32>,
          tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<8xf32>
      return %y : tensor<8xf32>
    }"""


def test_dynamic_pad_with_padding_known_while_lowering():
    pad = only(lower_text(pad_to_8(low=2)), isa.Pad)
    assert (pad.low, pad.high, pad.interior) == ((2,), (1,), (1,))  # 2 + 3 + 2 + 1 = 8


def test_dynamic_pad_to_other_than_the_result_shape_is_an_error():
    # 5 + 3 + 2 * 1 + 1 = 11 elements, in a result of 8
    with pytest.raises(LoweringError, match=r"(?s)pad shape \[3\] to \[11\], but the "
                                            r"result's shape is \[8\].*stablehlo.dynamic_pad"):
        lower_text(pad_to_8(low=5))


def test_dynamic_pad_with_padding_from_an_argument_is_unsupported():
    with pytest.raises(UnsupportedOpError, match=r"(?s)operand 2 \(edge_padding_low\) of "
                                                 "stablehlo.dynamic_pad is not known"):
        lower_text("""func.func public @main(%x: tensor<3xf32>, %v: tensor<f32>,
            %low: tensor<1xi64>) -> tensor<7xf32> {
          %one = stablehlo.constant dense<[1]> : tensor<1xi64>
          %y = stablehlo.dynamic_pad %x, %v, %low, %one, %one : (tensor<3xf32>, tensor<f32>,
              tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<7xf32>
          return %y : tensor<7xf32>
        }""")


def test_known_shape_operand_other_than_the_result_shape_is_an_error():
    with pytest.raises(LoweringError, match=r"(?s)operand 0 \(output_shape\) is \[\[5\]\], "
                                            r"but the result's shape is \[4\]"
                                            r".*\(stablehlo.dynamic_iota\)"):
        lower_text("""func.func public @main() -> tensor<4xi32> {"""
                   + known_while_lowering("[5]", "tensor<1xi64>") + """
          %y = stablehlo.dynamic_iota %s, dim = 0 : (tensor<1xi64>) -> tensor<4xi32>
          return %y : tensor<4xi32>
        }""")


def conv_of_8_by_3(out: int) -> str:
    """A dynamic_conv of 8 elements by a window of 3 dilated by 2, every 2, padded by
    (2, 1) known while lowering, to `out` elements."""
    return ("""func.func public @main(%x: tensor<1x1x8xf32>, %w: tensor<1x1x3xf32>)
        -> tensor<1x1xOUTxf32> {""" + known_while_lowering("[[2, 1]]", "tensor<1x2xi64>") + """
      %y = "stablehlo.dynamic_conv"(%x, %w, %s) {
          dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>,
          window_strides = array<i64: 2>, rhs_dilation = array<i64: 2>,
          feature_group_count = 1 : i64, batch_group_count = 1 : i64}
          : (tensor<1x1x8xf32>, tensor<1x1x3xf32>, tensor<1x2xi64>) -> tensor<1x1xOUTxf32>
      return %y : tensor<1x1xOUTxf32>
    }""").replace("OUT", str(out))


def test_dynamic_conv_with_padding_known_while_lowering():
    # 2 + 8 + 1 = 11 padded, a window spanning (3 - 1) * 2 + 1 = 5: (11 - 5) // 2 + 1 = 4
    program = lower_text(conv_of_8_by_3(out=4))
    conv = only(program, isa.Convolution)
    assert (conv.padding, conv.window_strides, conv.rhs_dilation) == (((2, 1),), (2,), (2,))
    assert out_type(program, conv).shape == (1, 1, 4)


def test_dynamic_conv_padded_to_other_than_the_result_shape_is_an_error():
    with pytest.raises(LoweringError, match=r"(?s)operand 2 \(padding\) is \[\[2, 1\]\], "
                                            r"which gives spatial dims \[4\], but the "
                                            r"result's are \[5\].*stablehlo.dynamic_conv"):
        lower_text(conv_of_8_by_3(out=5))
