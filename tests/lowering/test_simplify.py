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


def _assert_close(got, want, k: int, scale: float) -> None:
    """Two FP32 sums of k products, each in any order, are each within (k - 1) * 2**-24 of
    the sum of |products| (bounded here by `scale`) of the exact sum: 2k * 2**-24 apart."""
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2 * k * 2.0**-24 * scale)


def test_transposed_matmul_is_a_swapped_matmul(rng):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 7)).astype(np.float32)
    program = _program(lambda a, b: (a @ b).T, a, b)
    assert isa.Transpose not in _kinds(program)
    _assert_close(jax_trn2.jit(lambda a, b: (a @ b).T)(a, b), (a @ b).T, 3,
                  (np.abs(a) @ np.abs(b)).max())


def test_batched_transpose_that_swaps_free_dims_folds(rng):
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 6)).astype(np.float32)
    fun = lambda a, b: jnp.swapaxes(jnp.einsum("bik,bkj->bij", a, b), 1, 2)  # noqa: E731
    assert isa.Transpose not in _kinds(_program(fun, a, b))
    _assert_close(jax_trn2.jit(fun)(a, b), fun(a, b), 3, 9.0 * np.abs(a).max() * np.abs(b).max())


def test_matmul_used_twice_keeps_its_transpose(rng):
    a = rng.standard_normal((4, 4)).astype(np.float32)
    def fun(a):
        product = a @ a
        return product + product.T

    kinds = _kinds(_program(fun, a))
    assert isa.Transpose in kinds
    _assert_close(jax_trn2.jit(fun)(a), fun(a), 5, 8.0 * np.abs(a).max() ** 2)  # + the add


def test_transpose_moving_batch_dims_is_kept(rng):
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 6)).astype(np.float32)
    fun = lambda a, b: jnp.transpose(jnp.einsum("bik,bkj->bij", a, b), (1, 0, 2))  # noqa: E731
    assert isa.Transpose in _kinds(_program(fun, a, b))
    _assert_close(jax_trn2.jit(fun)(a, b), fun(a, b), 3, 9.0 * np.abs(a).max() * np.abs(b).max())


def test_device_ids_folded_by_lowering_leave_no_instructions():
    from jax.sharding import PartitionSpec as P

    mesh = jax_trn2.make_mesh()
    fun = jax.shard_map(lambda a: a + jax.lax.axis_index("x"), mesh=mesh, in_specs=P("x"),
                        out_specs=P("x"))
    program = _program(fun, np.ones(8, np.int32))
    assert isa.DeviceId not in _kinds(program)  # folded to a constant varying along x only
    np.testing.assert_array_equal(jax_trn2.jit(fun)(np.ones(8, np.int32)),
                                  1 + np.arange(8) // 2)
