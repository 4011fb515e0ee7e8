"""lowering/rules/windows.py: reduce_window (pooling) and select_and_scatter (max-pool
gradients), with their window attributes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from lowering import UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, only, out_type


def test_max_pool_window_attributes_and_result_shape():
    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 3), (1, 2, 1),
                                 ((0, 0), (1, 0), (1, 1)), window_dilation=(1, 1, 2))

    program = lower_jax(pool, np.ones((1, 5, 6), np.float32))
    window = only(program, isa.ReduceWindow)
    assert (window.window_dimensions, window.window_strides) == ((1, 2, 3), (1, 2, 1))
    assert (window.base_dilations, window.window_dilations) == ((1, 1, 1), (1, 1, 2))
    assert window.padding == ((0, 0), (1, 0), (1, 1))
    assert (window.combiner, window.body) == ("maximum", None)
    # dim 1: 5 + 1 padded, windows of 2 every 2: 3; dim 2: 6 + 2 padded, a window of 3
    # dilated by 2 spans 5: 8 - 5 + 1 = 4
    assert out_type(program, window).shape == (1, 3, 4)


def test_other_reducer_is_kept_as_a_scalar_program():
    program = lower_jax(lambda x: lax.reduce_window(x, 0.0, lambda a, b: a + b * b, (2,),
                                                    (1,), "VALID"),
                        np.ones(5, np.float32))
    window = only(program, isa.ReduceWindow)
    assert window.combiner is None
    assert sorted(i.op for i in window.body.instructions) == ["add", "multiply"]
    assert out_type(program, window).shape == (4,)


def test_max_pool_gradient_is_a_select_and_scatter_add():
    def pooled_sum(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2), (1, 2, 2), "VALID").sum()

    program = lower_jax(jax.grad(pooled_sum), np.ones((1, 4, 6), np.float32))
    scatter = only(program, isa.SelectAndScatter)
    assert (scatter.window_dimensions, scatter.window_strides) == ((1, 2, 2), (1, 2, 2))
    assert scatter.padding == ((0, 0),) * 3
    assert (scatter.scatter_combiner, scatter.scatter_body) == ("add", None)
    (select,) = scatter.select.instructions  # max pooling selects the first largest
    assert (select.op, select.direction) == ("compare", "GE")
    # the pooled gradient (2 x 3 windows) is scattered onto the operand's shape
    source = program.info(scatter.ins[1]).type
    assert (source.shape, out_type(program, scatter).shape) == ((1, 2, 3), (1, 4, 6))


def test_init_value_varying_per_chip_is_unsupported():
    mesh = jax.make_mesh((2,), ("x",))

    def body(x):
        init = lax.axis_index("x").astype(jnp.float32)
        return lax.reduce_window(x, init, lax.add, (2,), (1,), "VALID")

    f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("x"))
    with pytest.raises(UnsupportedOpError, match="(?s)a reduce_window whose init value "
                                                 r"differs from chip to chip"
                                                 r".*\(stablehlo.reduce_window\)"):
        lower_jax(f, np.ones(4, np.float32))
