"""Host arguments as users pass them: NumPy's default 64-bit types, 64-bit modules, and the
listing of programs with array constants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2

I64_ADD = """
func.func @main(%a: tensor<2xi64>) -> tensor<2xi64> {
  %0 = stablehlo.add %a, %a : tensor<2xi64>
  return %0 : tensor<2xi64>
}"""

I32_POWER = """
func.func @main(%a: tensor<6xi32>, %b: tensor<6xi32>) -> tensor<6xi32> {
  %0 = stablehlo.power %a, %b : tensor<6xi32>
  return %0 : tensor<6xi32>
}"""


def test_numpy_float64_and_int64_arguments_are_taken_as_jax_jit_takes_them():
    got_int = jax_trn2.jit(lambda a: a + 1)(np.arange(4))
    got_float = jax_trn2.jit(lambda a: a * 2)(np.linspace(0, 1, 5))
    np.testing.assert_array_equal(got_int, jax.jit(lambda a: a + 1)(np.arange(4)))
    np.testing.assert_array_equal(got_float, jax.jit(lambda a: a * 2)(np.linspace(0, 1, 5)))


def test_a_64_bit_module_keeps_its_64_bit_values():
    (out,) = jax_trn2.client().compile(I64_ADD).execute([np.array([2**40, 3])])
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [2**41, 6])


def test_integer_power_follows_xla():
    (out,) = jax_trn2.client().compile(I32_POWER).execute(
        [np.array([2, 3, -2, 1, -1, 5], np.int32), np.array([10, 3, 3, -4, -3, -1], np.int32)])
    np.testing.assert_array_equal(out, [1024, 27, -8, 1, -1, 0])


def test_float64_matmul_is_computed_in_float64(rng):
    a, b = rng.standard_normal((50, 300)), rng.standard_normal((300, 7))
    with jax.enable_x64(True):
        got = np.asarray(jax_trn2.jit(lambda a, b: a @ b)(a, b))
    assert got.dtype == np.float64
    # FP64 sums of 300 terms in any order: within 300 * 2**-53 of the sum of |products|.
    bound = 300 * 2.0**-53 * (np.abs(a) @ np.abs(b)).max()
    np.testing.assert_allclose(got, a @ b, rtol=0, atol=bound)


def test_listing_shows_programs_with_array_constants():
    mesh = jax_trn2.make_mesh()
    fun = jax.shard_map(lambda a: a + jnp.array([1.0, 2.0]) + jax.lax.axis_index("x"),
                        mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    lowered = jax_trn2.jit(fun).lower(np.zeros((4, 2), np.float32))
    text = lowered.as_text()
    assert "Constant" in text and "value=[1.0, 2.0]" in text
    assert "Constant" in lowered.compile().as_text()


@pytest.mark.parametrize("dtype, value", [
    (np.int32, 3.7), (np.int32, -2.5), (np.int32, 2 ** 40), (np.uint8, -1),
    (np.bool_, 0.5), (np.bool_, 2), (np.float32, 1j)])
def test_python_scalars_that_do_not_fit_the_parameter_are_errors(dtype, value):
    """Never a silently different number: 3.7 is not 3 (jax's compiled function raises)."""
    compiled = jax_trn2.jit(lambda x, n: x * n).lower(np.ones(3, np.float32),
                                                       np.asarray(1, dtype)).compile()
    with pytest.raises(TypeError, match=r"argument 'n'.*does not fit"):
        compiled(np.ones(3, np.float32), value)


@pytest.mark.parametrize("dtype, value, want", [
    (np.int32, 3.0, 3), (np.int32, True, 1), (np.bool_, 1, True), (np.float32, 3, 3.0),
    (np.float32, 1e300, np.inf), (np.float32, -1e39, -np.inf)])  # overflow: inf, as in jax
def test_python_scalars_that_fit_go_through(dtype, value, want):
    compiled = jax_trn2.jit(lambda x, n: x * n).lower(np.ones(3, np.float32),
                                                       np.asarray(1, dtype)).compile()
    np.testing.assert_array_equal(compiled(np.ones(3, np.float32), value),
                                  np.full(3, want, np.float32))


def test_execute_checks_python_scalars_too():
    executable = jax_trn2.client().compile(I32_POWER)
    with pytest.raises(TypeError, match="argument 1.*does not fit"):
        executable.execute([np.arange(6, dtype=np.int32), 2.5])


@pytest.mark.parametrize("dtype, value", [
    (np.int32, np.array(2**40)), (np.int32, np.int64(2**40)), (np.int32, np.int64(-3)),
    (np.float32, np.float64(2.5)), (np.float32, np.array(1e300)), (np.int32, np.array(2.0)),
    (np.float32, np.array(2)), (np.int32, np.uint32(3))])
def test_numpy_64_bit_values_are_taken_or_refused_as_jax_jit_does(dtype, value):
    """Without x64 jax converts int64 to int32 (wrapping: 2**40 is 0) and float64 to float32
    (1e300 is inf), and refuses a value whose converted type is not the parameter's."""
    args = (np.ones(3, np.float32), np.asarray(1, dtype))
    mine = jax_trn2.jit(lambda x, n: x * n).lower(*args).compile()
    theirs = jax.jit(lambda x, n: x * n).lower(*args).compile()
    try:
        want = theirs(np.ones(3, np.float32), value)
    except TypeError:
        with pytest.raises(TypeError, match="argument 'n'"):
            mine(np.ones(3, np.float32), value)
    else:
        np.testing.assert_array_equal(mine(np.ones(3, np.float32), value), want)


def test_a_refused_numpy_value_is_named_by_the_type_passed():
    compiled = jax_trn2.jit(lambda x: x * 2).lower(np.ones(3, np.float32)).compile()
    with pytest.raises(TypeError, match=r"argument 'x': expected float32\[3\], got "
                                        r"float64\[\] \(which jax takes as float32\[\]"):
        compiled(np.array(2.0))
