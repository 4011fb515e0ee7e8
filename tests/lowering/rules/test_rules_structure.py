"""lowering/rules/structure.py: shard_map bodies (sdy.manual_computation), calls, tuples,
composites, and custom calls without a rule."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lowering import UnsupportedOpError
from mesh import isa
from mesh.isa.control import Composite
from rule_lowering import lower_jax, lower_text, only, out_type


def test_shard_map_splits_and_assembles_along_its_specs():
    mesh = jax.make_mesh((2, 2), ("x", "y"))
    body = jax.shard_map(lambda a: a * 2, mesh=mesh, in_specs=P("y", "x"),
                         out_specs=P(("y", "x")))
    program = lower_jax(body, jax.ShapeDtypeStruct((4, 6), np.float32,
                                                   sharding=NamedSharding(mesh, P("y", "x"))))
    shard, unshard = only(program, isa.Shard), only(program, isa.Unshard)
    assert shard.dim_axes == ((1,), (0,))  # dim 0 over y (axis 1), dim 1 over x
    assert out_type(program, shard).shape == (2, 3)
    assert unshard.dim_axes == ((1, 0), ())
    assert out_type(program, unshard).shape == (8, 3)
    assert shard.manual_axes is None  # every axis manual


def test_calls_and_barriers_are_inlined():
    program = lower_jax(lambda x: jax.jit(lambda v: v * 3)(jax.lax.optimization_barrier(x)),
                        np.ones(3, np.float32))
    (multiply,) = [i for i in program.instructions if isinstance(i, isa.Elementwise)]
    assert multiply.op == "multiply" and multiply.ins[0] == program.inputs[0]


def test_tuple_element_is_the_element_itself():
    program = lower_text("""func.func public @main(%x: tensor<3xf32>, %i: tensor<2xi32>)
        -> tensor<2xi32> {
      %t = stablehlo.tuple %x, %i : tuple<tensor<3xf32>, tensor<2xi32>>
      %y = stablehlo.get_tuple_element %t[1] : (tuple<tensor<3xf32>, tensor<2xi32>>)
          -> tensor<2xi32>
      return %y : tensor<2xi32>
    }""")
    assert program.instructions == ()
    assert program.outputs == program.inputs[1:]


COMPOSITE = """func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
  %y = stablehlo.composite "{name}" %x {{composite_attributes = {{factor = 2 : i64}},
      decomposition = @twice, version = 3 : i32}} : (tensor<3xf32>) -> tensor<3xf32>
  return %y : tensor<3xf32>
}}
func.func private @twice(%a: tensor<3xf32>) -> tensor<3xf32> {{
  %s = stablehlo.add %a, %a : tensor<3xf32>
  return %s : tensor<3xf32>
}}"""


def test_composite_keeps_its_name_and_decomposition():
    composite = only(lower_text(COMPOSITE.format(name="my.twice")), Composite)
    assert (composite.name, composite.version, composite.attributes) == \
        ("my.twice", 3, "{factor=2}")
    assert [i.op for i in composite.decomposition.instructions] == ["add"]


def test_composite_named_after_a_chlo_op_is_that_op():
    program = lower_text(COMPOSITE.format(name="chlo.erf"))
    assert only(program, isa.Elementwise).op == "erf"  # not the decomposition's add


@pytest.mark.parametrize("target, message", [
    ("my_kernel", "stablehlo.custom_call @my_kernel is not supported by jax-trn2"),
    ("CustomSPMDPartitioning", "custom_partitioning partitions with a Python callback")])
def test_custom_call_without_a_rule_is_unsupported(target, message):
    with pytest.raises(UnsupportedOpError, match=rf"(?s){message}.*\(stablehlo.custom_call\)"):
        lower_text(f"""func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
          %y = stablehlo.custom_call @{target}(%x) : (tensor<3xf32>) -> tensor<3xf32>
          return %y : tensor<3xf32>
        }}""")


def test_dce_sink_computes_nothing():
    """jax.lax.dce_sink(prevent_mlir_dce=True) is a custom call without results; the
    program returns its input and leaves out what only the sink reads."""
    def f(x):
        jax.lax.dce_sink(x + 1, prevent_mlir_dce=True)
        return x
    program = lower_jax(f, np.ones(3, np.float32))
    assert program.instructions == ()
    assert program.outputs == program.inputs
