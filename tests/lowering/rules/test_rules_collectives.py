"""lowering/rules/collectives.py: collectives inside shard_map, their replica groups
decoded into mesh axes."""

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import lowering
from lowering import UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, only, out_type

MESH = jax.make_mesh((4,), ("x",))
# 8 float32 split over the 4 chips of axis x
X = jax.ShapeDtypeStruct((8,), np.float32, sharding=jax.sharding.NamedSharding(MESH, P("x")))


def sharded(body, out_specs):
    return jax.shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=out_specs,
                         check_vma=False)  # all_gather's result is the same on every chip


@pytest.mark.parametrize("reduce, reduction", [(lax.psum, "add"), (lax.pmax, "maximum")])
def test_all_reduce_over_the_mesh_axis(reduce, reduction):
    program = lower_jax(sharded(lambda x: reduce(x, "x"), P()), X)
    all_reduce = only(program, isa.AllReduce)
    assert all_reduce.reduction == reduction
    assert all_reduce.groups.axes == (0,) and all_reduce.groups.group_size == 4


def test_all_gather_along_its_dimension():
    program = lower_jax(sharded(lambda x: lax.all_gather(x, "x", tiled=True), P(None)),
                        X)
    gather = only(program, isa.AllGather)
    assert gather.dimension == 0
    assert out_type(program, gather).shape == (8,)


def test_all_reduce_with_other_body_is_unsupported():
    text = """module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {
      %y = "stablehlo.all_reduce"(%x) ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %s = stablehlo.subtract %a, %b : tensor<f32>
          stablehlo.return %s : tensor<f32>
      }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>,
          channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
          use_global_device_ids} : (tensor<2xf32>) -> tensor<2xf32>
      return %y : tensor<2xf32>
    }}"""
    with pytest.raises(UnsupportedOpError, match="reduction body other than one of add"):
        lowering.lower(text)
