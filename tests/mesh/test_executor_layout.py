"""The executor's layout: a value is stored with size-1 mesh dims where it is replicated,
so replicated work is done once; results must fit their declared layout."""

from __future__ import annotations

import numpy as np
import pytest

from mesh import isa
from mesh.executor import ExecutionError, run_program

MESH = isa.MeshSpec(("x", "y", "z"), (4, 4, 4))
X_AXIS, Z_AXIS = 0, 2


def f32(*shape):
    return isa.TensorType(shape, "float32")


def line_groups(axis: int) -> isa.Groups:
    ids = np.moveaxis(np.arange(64).reshape(4, 4, 4), axis, -1).reshape(-1, 4)
    return isa.Groups(tuple(map(tuple, ids.tolist())), (axis,))


def data_parallel_matmul() -> isa.Program:
    """x rows split over the mesh's x axis, the weight replicated on every chip, then sums
    of the product over z (along which it does not vary) and over x (along which it does)."""
    values = {
        0: isa.ValueInfo(f32(16, 8)), 1: isa.ValueInfo(f32(8, 4)),
        2: isa.ValueInfo(f32(4, 8), frozenset({X_AXIS})),
        3: isa.ValueInfo(f32(8, 4)),
        4: isa.ValueInfo(f32(4, 4), frozenset({X_AXIS})),
        5: isa.ValueInfo(f32(4, 4), frozenset({X_AXIS})),
        6: isa.ValueInfo(f32(4, 4)),
    }
    instructions = (
        isa.Shard((2,), (0,), dim_axes=((X_AXIS,), ())),
        isa.Shard((3,), (1,), dim_axes=((), ())),
        isa.Matmul((4,), (2, 3), lhs_batch=(), rhs_batch=(), lhs_contract=(1,),
                   rhs_contract=(0,), out_dtype="float32"),
        isa.AllReduce((5,), (4,), groups=line_groups(Z_AXIS), reduction="add"),
        isa.AllReduce((6,), (4,), groups=line_groups(X_AXIS), reduction="add"),
    )
    return isa.Program(MESH, instructions, (0, 1), (3, 4, 5, 6), values)


def test_replicated_values_keep_size_one_mesh_dims():
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 4, (16, 8)).astype(np.float32)  # small integers: sums are exact
    w = rng.integers(-4, 4, (8, 4)).astype(np.float32)
    weight, product, sum_z, sum_x = run_program(data_parallel_matmul(),
                                                [x[None, None, None], w[None, None, None]])
    assert weight.shape == (1, 1, 1, 8, 4)  # stored once for all 64 chips
    assert product.shape == (4, 1, 1, 4, 4)  # computed once per x coordinate
    assert sum_z.shape == (4, 1, 1, 4, 4)  # 4 equal copies summed: still one per x
    assert sum_x.shape == (1, 1, 1, 4, 4)
    blocks = (x @ w).reshape(4, 1, 1, 4, 4)
    np.testing.assert_array_equal(product, blocks)
    np.testing.assert_array_equal(sum_z, 4 * blocks)
    np.testing.assert_array_equal(sum_x, blocks.sum(0, keepdims=True))


def test_result_that_varies_where_its_layout_says_replicated_is_an_error():
    """A lowering bug (a value declared replicated where it is not) fails loudly: a sum of
    values varying along x and along y declared to vary along x only."""
    values = {0: isa.ValueInfo(f32(4, 2), frozenset({0})),
              1: isa.ValueInfo(f32(4, 2), frozenset({1})),
              2: isa.ValueInfo(f32(4, 2), frozenset({0}))}
    add = isa.Elementwise((2,), (0, 1), op="add", loc="test.py:1:1")
    program = isa.Program(MESH, (add,), (0, 1), (2,), values)
    ones = np.ones((4, 2), np.float32)
    with pytest.raises(ExecutionError, match="add at test.py:1:1.*does not fit its layout"):
        run_program(program, [ones[None, None, None].repeat(4, 0),
                              ones[None, None, None].repeat(4, 1)])
