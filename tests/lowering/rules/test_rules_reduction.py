"""lowering/rules/reduction.py: reduce with a known combiner, or its body as a program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from lowering import UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, only, out_type


@pytest.mark.parametrize("fn, combiner", [(jnp.sum, "add"), (jnp.max, "maximum"),
                                          (jnp.prod, "multiply")])
def test_one_op_body_is_the_reduce_combiner(fn, combiner):
    program = lower_jax(lambda x: fn(x, axis=1), np.ones((3, 4), np.float32))
    reduce = only(program, isa.Reduce)
    assert (reduce.dimensions, reduce.combiner, reduce.body) == ((1,), combiner, None)
    assert out_type(program, reduce).shape == (3,)


def test_other_body_is_kept_as_a_scalar_program():
    def f(x):  # sum of squares in the body itself: no single combiner
        return lax.reduce(x, np.float32(0), lambda acc, v: acc + v * v, (0,))

    reduce = only(lower_jax(f, np.ones(5, np.float32)), isa.Reduce)
    assert reduce.combiner is None
    assert sorted(i.op for i in reduce.body.instructions) == ["add", "multiply"]


def test_init_value_varying_per_chip_is_unsupported():
    mesh = jax.make_mesh((2,), ("x",))

    def body(x):
        init = lax.axis_index("x").astype(jnp.float32)
        return lax.reduce(x, init, lax.add, (0,))[None]

    f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("x"))
    with pytest.raises(UnsupportedOpError, match="init value differs from chip to chip"):
        lower_jax(f, np.ones(4, np.float32))
