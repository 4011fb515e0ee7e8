"""lowering/rules/gspmd.py: the Sharding, SPMDFullToShardShape and SPMDShardToFullShape
custom calls around shard_map bodies in programs jax emits without Shardy."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lowering import LoweringError
from mesh import isa
from rule_lowering import lower_jax, lower_text, only, out_type

MESH = jax.make_mesh((2, 2), ("x", "y"))


def double_in_shard_map(in_spec, out_spec):
    """A shard_map body over MESH, lowered at a 4x6 argument laid out as it takes it."""
    body = jax.shard_map(lambda a: a * 2, mesh=MESH, in_specs=in_spec, out_specs=out_spec)
    return lower_jax(body, jax.ShapeDtypeStruct((4, 6), np.float32,
                                                sharding=NamedSharding(MESH, in_spec)))


def test_body_boundaries_split_each_dim_over_its_axis(gspmd):
    program = double_in_shard_map(P("x", "y"), P("x", "y"))
    shard, unshard = only(program, isa.Shard), only(program, isa.Unshard)
    assert shard.dim_axes == unshard.dim_axes == ((0,), (1,))
    assert shard.manual_axes is None  # fully manual: every axis
    assert out_type(program, shard).shape == (2, 3)
    assert out_type(program, unshard).shape == (4, 6)


def test_body_boundaries_in_transposed_axis_order(gspmd):
    program = double_in_shard_map(P("y", "x"), P(("y", "x")))
    assert only(program, isa.Shard).dim_axes == ((1,), (0,))
    unshard = only(program, isa.Unshard)
    assert unshard.dim_axes == ((1, 0), ())  # dim 0 over y, then x within it
    assert out_type(program, unshard).shape == (8, 3)


def gspmd_text(body: str, result: str) -> str:
    return f"""func.func public @main(%x: tensor<4x6xf32>) -> {result} {{
      {body}
    }}"""


def test_entering_a_body_of_an_unannotated_value_is_an_error():
    text = gspmd_text("""
      %1 = stablehlo.custom_call @SPMDFullToShardShape(%x) {mhlo.sharding = "{manual}"}
          : (tensor<4x6xf32>) -> tensor<2x6xf32>
      return %1 : tensor<2x6xf32>""", "tensor<2x6xf32>")
    with pytest.raises(LoweringError, match="(?s)SPMDFullToShardShape of a value no Sharding "
                                            r"custom call annotates.*\(stablehlo.custom_call\)"):
        lower_text(text)


def test_sharding_that_changes_the_type_is_an_error():
    text = gspmd_text("""
      %0 = stablehlo.custom_call @Sharding(%x) {mhlo.sharding = "{replicated}"}
          : (tensor<4x6xf32>) -> tensor<4x6xf16>
      return %0 : tensor<4x6xf16>""", "tensor<4x6xf16>")
    with pytest.raises(LoweringError, match="(?s)Sharding custom call that changes its "
                                            r"operand's type.*\(stablehlo.custom_call\)"):
        lower_text(text)
