"""lowering/rules/indexing.py: gather and scatter with their dimension numbers and
scatter's combiner."""

import jax.numpy as jnp
import numpy as np
import pytest

from mesh import isa
from rule_lowering import lower_jax, only, out_type


def test_take_is_a_gather_of_rows():
    program = lower_jax(lambda x, i: x[i], np.ones((5, 3), np.float32),
                        np.array([4, 0], np.int32))
    gather = only(program, isa.Gather)
    assert gather.collapsed_slice_dims == (0,)
    assert gather.start_index_map == (0,)
    assert gather.offset_dims == (1,)
    assert gather.slice_sizes == (1, 3)
    assert out_type(program, gather).shape == (2, 3)


@pytest.mark.parametrize("update, combiner", [
    (lambda ref, i, v: ref.at[i].set(v), isa.REPLACE),
    (lambda ref, i, v: ref.at[i].add(v), "add"),
    (lambda ref, i, v: ref.at[i].max(v), "maximum")])
def test_scatter_combiner_of_at_updates(update, combiner):
    program = lower_jax(update, np.zeros(6, np.float32), np.array([1, 3], np.int32),
                        np.ones(2, np.float32))
    scatter = only(program, isa.Scatter)
    assert (scatter.combiner, scatter.body) == (combiner, None)
    assert scatter.inserted_window_dims == (0,)
    assert scatter.scatter_dims_to_operand_dims == (0,)


def test_scatter_with_other_update_keeps_its_body():
    # x.at[i].apply(f) updates with a computation that is not one binary op
    program = lower_jax(lambda x, i: x.at[i].apply(lambda v: v * v + 1),
                        np.zeros(6, np.float32), np.array([2], np.int32))
    scatter = only(program, isa.Scatter)
    assert scatter.combiner is None
    assert scatter.body is not None and scatter.body.instructions
