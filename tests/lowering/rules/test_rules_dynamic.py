"""lowering/rules/dynamic.py: ops with shape operands left after shape refinement (their
shape operand is an argument, or computed from device ids), lowered to their static forms."""

import pytest

from lowering import LoweringError, UnsupportedOpError
from mesh import isa
from rule_lowering import lower_text, only, out_type

# %s: [then] on chip `chip`, [otherwise] elsewhere; known while lowering (elementwise on a
# device id), but not a constant that shape refinement folds.
PICKED_ON_CHIP = """
  %p = stablehlo.partition_id : tensor<ui32>
  %chip = stablehlo.constant dense<{chip}> : tensor<ui32>
  %here = stablehlo.compare EQ, %p, %chip : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
  %then = stablehlo.constant dense<[{then}]> : tensor<1xi64>
  %otherwise = stablehlo.constant dense<[{otherwise}]> : tensor<1xi64>
  %s = stablehlo.select %here, %then, %otherwise
      : (tensor<i1>, tensor<1xi64>, tensor<1xi64>) -> tensor<1xi64>"""


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


def test_dynamic_pad_with_padding_known_while_lowering():
    program = lower_text("""func.func public @main(%x: tensor<3xf32>, %v: tensor<f32>)
        -> tensor<8xf32> {""" + PICKED_ON_CHIP.format(chip=100, then=9, otherwise=2) + """
      %one = stablehlo.constant dense<[1]> : tensor<1xi64>
      %y = stablehlo.dynamic_pad %x, %v, %s, %one, %one : (tensor<3xf32>, tensor<f32>,
          tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<8xf32>
      return %y : tensor<8xf32>
    }""")
    pad = only(program, isa.Pad)
    assert (pad.low, pad.high, pad.interior) == ((2,), (1,), (1,))  # 2 + 3 + 2 + 1 = 8


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
                   + PICKED_ON_CHIP.format(chip=100, then=4, otherwise=5) + """
          %y = stablehlo.dynamic_iota %s, dim = 0 : (tensor<1xi64>) -> tensor<4xi32>
          return %y : tensor<4xi32>
        }""")
