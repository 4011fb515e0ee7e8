"""lowering/rules/sort.py: sort (lax.sort's comparator recognised), top_k and approx_max_k."""

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa
from rule_lowering import lower_jax, only, out_type


def test_lax_sort_comparator_is_recognised_with_its_num_keys():
    program = lower_jax(lambda k, v: lax.sort((k, v), dimension=0, num_keys=1),
                        np.ones((4, 2), np.float32), np.ones((4, 2), np.int32))
    sort = only(program, isa.Sort)
    assert (sort.dimension, sort.num_keys, sort.comparator) == (0, 1, None)


def test_jnp_sort_along_last_axis():
    program = lower_jax(lambda x: jnp.sort(x, axis=-1), np.ones((3, 5), np.int32))
    sort = only(program, isa.Sort)
    assert (sort.dimension, sort.num_keys) == (1, 1)


def test_top_k_keeps_k():
    program = lower_jax(lambda x: lax.top_k(x, 3), np.ones((2, 7), np.float32))
    top_k = only(program, isa.TopK)
    assert top_k.k == 3
    assert out_type(program, top_k).shape == (2, 3)


def test_approx_max_k_is_one_instruction_of_the_values():
    program = lower_jax(lambda x: lax.approx_min_k(x, 3, reduction_dimension=0),
                        np.ones((9, 2), np.float32))
    top = only(program, isa.ApproxTopK)
    assert (top.k, top.dimension, top.largest) == (3, 0, False)
    assert len(top.ins) == 1 and out_type(program, top).shape == (3, 2)
