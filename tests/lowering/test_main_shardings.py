"""The shardings of main's arguments: one that splits no dim (jax's on an array committed
to one device, over an empty mesh) is replicated (None), as no sharding is, so that the
program is the one an uncommitted array's lowering makes."""

import lowering

_MODULE = """
module @jit_add attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @empty_mesh = <[]>
  func.func public @main(%arg0: tensor<3xf32>{attributes}) -> (tensor<3xf32>) {{
    %0 = stablehlo.add %arg0, %arg0 : tensor<3xf32>
    return %0 : tensor<3xf32>
  }}
}}"""


def test_a_sharding_that_splits_no_dim_is_replicated():
    committed = lowering.lower(lowering.parse_module(_MODULE.format(
        attributes=" {sdy.sharding = #sdy.sharding<@empty_mesh, [{}]>}")))
    uncommitted = lowering.lower(lowering.parse_module(_MODULE.format(attributes="")))
    assert committed.input_shardings == uncommitted.input_shardings == (None,)
