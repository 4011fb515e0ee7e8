"""Algebraic simplification: a transpose of a matmul result folds into the matmul."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_trn2
import lowering
from mesh import isa


def _program(fun, *args) -> isa.Program:
    return lowering.lower(jax.jit(fun).lower(*args).compiler_ir("stablehlo"))


def _kinds(program: isa.Program) -> list[type]:
    return [type(i) for i in program.instructions]


def test_transposed_matmul_is_a_swapped_matmul(rng):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 7)).astype(np.float32)
    program = _program(lambda a, b: (a @ b).T, a, b)
    assert isa.Transpose not in _kinds(program)
    np.testing.assert_allclose(jax_trn2.jit(lambda a, b: (a @ b).T)(a, b), (a @ b).T,
                               rtol=1e-6)


def test_batched_transpose_that_swaps_free_dims_folds(rng):
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 6)).astype(np.float32)
    fun = lambda a, b: jnp.swapaxes(jnp.einsum("bik,bkj->bij", a, b), 1, 2)  # noqa: E731
    assert isa.Transpose not in _kinds(_program(fun, a, b))
    np.testing.assert_allclose(jax_trn2.jit(fun)(a, b), fun(a, b), rtol=1e-6)


def test_matmul_used_twice_keeps_its_transpose(rng):
    a = rng.standard_normal((4, 4)).astype(np.float32)
    def fun(a):
        product = a @ a
        return product + product.T

    kinds = _kinds(_program(fun, a))
    assert isa.Transpose in kinds
    np.testing.assert_allclose(jax_trn2.jit(fun)(a), fun(a), rtol=1e-6)


def test_transpose_moving_batch_dims_is_kept(rng):
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 6)).astype(np.float32)
    fun = lambda a, b: jnp.transpose(jnp.einsum("bik,bkj->bij", a, b), (1, 0, 2))  # noqa: E731
    assert isa.Transpose in _kinds(_program(fun, a, b))
    np.testing.assert_allclose(jax_trn2.jit(fun)(a, b), fun(a, b), rtol=1e-6)


def test_device_ids_folded_by_lowering_leave_no_instructions():
    from jax.sharding import PartitionSpec as P

    mesh = jax_trn2.make_mesh()
    fun = jax.shard_map(lambda a: a + jax.lax.axis_index("x"), mesh=mesh, in_specs=P("x"),
                        out_specs=P("x"))
    program = _program(fun, np.ones(8, np.int32))
    assert isa.DeviceId not in _kinds(program)  # folded to a constant varying along x only
    np.testing.assert_array_equal(jax_trn2.jit(fun)(np.ones(8, np.int32)),
                                  1 + np.arange(8) // 2)
