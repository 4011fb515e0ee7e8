"""lowering/rules/dot.py: dot_general, dot and ragged_dot onto Matmul instructions."""

import jax.numpy as jnp
import numpy as np

from mesh import isa
from rule_lowering import lower_jax, lower_text, only, out_type


def test_batched_dot_general_keeps_dimension_numbers():
    a, b = np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32)
    program = lower_jax(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), a, b)
    matmul = only(program, isa.Matmul)
    assert (matmul.lhs_batch, matmul.rhs_batch) == ((0,), (0,))
    assert (matmul.lhs_contract, matmul.rhs_contract) == ((2,), (1,))
    assert matmul.out_dtype == "float32"
    assert out_type(program, matmul).shape == (2, 3, 5)


def test_dot_contracts_last_lhs_dim_with_first_rhs_dim():
    program = lower_text("""func.func public @main(%a: tensor<3x4xbf16>, %b: tensor<4x6xbf16>)
        -> tensor<3x6xf32> {
      %y = stablehlo.dot %a, %b : (tensor<3x4xbf16>, tensor<4x6xbf16>) -> tensor<3x6xf32>
      return %y : tensor<3x6xf32>
    }""")
    matmul = only(program, isa.Matmul)
    assert (matmul.lhs_contract, matmul.rhs_contract) == ((1,), (0,))
    assert (matmul.lhs_batch, matmul.rhs_batch) == ((), ())
    assert matmul.out_dtype == "float32"



RAGGED_DOT = """func.func public @main(%a: tensor<6x4xf32>, %b: tensor<3x4x5xf32>,
    %g: tensor<3xi32>) -> tensor<6x5xf32> {{
  %y = "chlo.ragged_dot"(%a, %b, %g) {{ragged_dot_dimension_numbers = #chlo.ragged_dot<
      lhs_batching_dimensions = [], rhs_batching_dimensions = [],
      lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1],
      lhs_ragged_dimensions = [{ragged}], rhs_group_dimensions = [{group}]>}}
    : (tensor<6x4xf32>, tensor<3x4x5xf32>, tensor<3xi32>) -> tensor<6x5xf32>
  return %y : tensor<6x5xf32>
}}"""

def test_ragged_dot_over_free_dim_is_a_ragged_matmul_with_a_group_dim():
    program = lower_text(RAGGED_DOT.format(ragged=0, group=0))
    matmul = only(program, isa.RaggedMatmul)
    assert matmul.lhs_ragged == 0
    assert matmul.rhs_group == 0
    assert (matmul.lhs_contract, matmul.rhs_contract) == ((1,), (1,))
    assert out_type(program, matmul).shape == (6, 5)



def test_ragged_dot_as_the_spmd_partitioner_leaves_it():
    """mhlo.ragged_dot (XLA's SPMD partitioner's output for a sharded ragged_dot), whose
    dimension numbers reach the rule as the attribute's text, empty lists left out."""
    program = lower_text("""func.func public @main(%a: tensor<6x4xf32>, %b: tensor<3x4x5xf32>,
        %g: tensor<3xi32>) -> tensor<6x5xf32> {
      %y = "mhlo.ragged_dot"(%a, %b, %g) <{precision_config = [#mhlo<precision DEFAULT>,
          #mhlo<precision DEFAULT>], ragged_dot_dimension_numbers = #mhlo.ragged_dot<
          dot_dimension_numbers = #mhlo.dot<lhs_contracting_dimensions = [1],
          rhs_contracting_dimensions = [1]>, lhs_ragged_dimensions = [0],
          rhs_group_dimensions = [0]>}>
        : (tensor<6x4xf32>, tensor<3x4x5xf32>, tensor<3xi32>) -> tensor<6x5xf32>
      return %y : tensor<6x5xf32>
    }""")
    matmul = only(program, isa.RaggedMatmul)
    assert (matmul.lhs_ragged, matmul.rhs_group) == (0, 0)
    assert (matmul.lhs_contract, matmul.rhs_contract) == ((1,), (1,))
    assert (matmul.lhs_batch, matmul.rhs_batch) == ((), ())
    assert out_type(program, matmul).shape == (6, 5)
