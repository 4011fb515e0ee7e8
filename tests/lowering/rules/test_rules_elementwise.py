"""lowering/rules/elementwise.py: elementwise ops, compare, constants, iota and map."""

import numpy as np
from mesh import isa
from rule_lowering import lower_jax, lower_text, only


def test_binary_op_and_compare_carry_their_op_and_direction():
    program = lower_jax(lambda a, b: (a * b, a < b), np.ones(4, np.float32),
                        np.ones(4, np.float32))
    multiply, compare = [i for i in program.instructions if isinstance(i, isa.Elementwise)]
    assert multiply.op == "multiply"
    assert (compare.op, compare.direction, compare.compare_type) == ("compare", "LT", "FLOAT")
    assert program.info(compare.outs[0]).type.dtype == "bool"


def test_iota_keeps_its_dimension():
    program = lower_text("""func.func public @main() -> tensor<2x3xi32> {
      %i = stablehlo.iota dim = 1 : tensor<2x3xi32>
      return %i : tensor<2x3xi32>
    }""")
    iota = only(program, isa.Iota)
    assert iota.dimension == 1
    assert program.info(iota.outs[0]).type.shape == (2, 3)


def test_map_body_is_a_scalar_program():
    program = lower_text("""func.func public @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
      %y = "stablehlo.map"(%x) ({
        ^bb0(%a: tensor<f32>):
          %e = stablehlo.exponential %a : tensor<f32>
          stablehlo.return %e : tensor<f32>
      }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
      return %y : tensor<2x3xf32>
    }""")
    body = only(program, isa.Map).body
    assert [i.op for i in body.instructions] == ["exponential"]
