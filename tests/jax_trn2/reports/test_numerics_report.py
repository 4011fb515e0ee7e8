"""jax_trn2.numerics: ulp, report, compare and the `compare` command; rounding options of
jax_trn2.jit and Client.compile."""

import argparse
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2 import cli, numerics
from jax_trn2.cli import commands


# --- ulp ---------------------------------------------------------------------------------

@pytest.mark.parametrize("x, dtype, want", [
    (1.0, ml_dtypes.bfloat16, 2.0 ** -7),
    (1.99, ml_dtypes.bfloat16, 2.0 ** -7),
    (-2.0, ml_dtypes.bfloat16, 2.0 ** -6),
    (0.0, ml_dtypes.float8_e4m3fn, 2.0 ** -9),  # smallest subnormal
    (2.0 ** -8, ml_dtypes.float8_e4m3fn, 2.0 ** -9),  # subnormal range: constant spacing
    (448.0, ml_dtypes.float8_e4m3fn, 32.0),
    (1.0, np.float32, 2.0 ** -23),
    (1000.0, np.float16, 0.5),
    (7, np.int32, 1.0),
])
def test_ulp(x, dtype, want):
    assert numerics.ulp(x, dtype) == want


# --- report ------------------------------------------------------------------------------

def test_report_measures_errors_in_ulps_of_the_result_type():
    want = np.array([1.0, 2.0, 4.0, 0.5], np.float64)
    got = np.array([1.0, 2.0 + 2 * 2.0 ** -6, 4.0, 0.5 - 2.0 ** -8], ml_dtypes.bfloat16)
    (leaf,) = numerics.report(got, want).leaves
    assert (leaf.dtype, leaf.shape) == ("bfloat16", (4,))
    assert leaf.max_abs_error == 2 * 2.0 ** -6
    assert leaf.max_ulp_error == 1.0  # 2**-5 against the ulp at 4, the largest reference
    assert leaf.max_ulp_error_per_element == 2.0  # 2 ulps at 2 (ulp 2**-6); 0.5 is off by 1
    assert (leaf.differing, leaf.exact_fraction) == (2, 0.5)
    assert leaf.worst_index == leaf.worst_index_per_element == (1,)
    assert (leaf.got_at_worst, leaf.want_at_worst) == (2.0 + 2 * 2.0 ** -6, 2.0)


def test_report_is_per_leaf_and_prints_a_table():
    got = {"a": np.array([1, 2, 3], np.int32), "b": np.zeros((2, 3), np.float32)}
    want = {"a": np.array([1, 5, 3], np.int32), "b": np.zeros((2, 3), np.float32)}
    report = numerics.report(got, want, got_label="mine", want_label="theirs")
    a, b = report.leaves
    assert (a.path, a.max_abs_error, a.max_ulp_error, a.worst_index) == ("['a']", 3, 3, (1,))
    assert (b.path, b.exact_fraction, b.worst_index) == ("['b']", 1.0, None)
    text = str(report)
    assert "mine vs theirs" in text
    assert "max ulp err" in text and "bit-exact" in text
    assert "['a']" in text and "int32" in text and "[3]" in text and "66.67%" in text
    assert "1 of 3" in text and "0 of 6" in text  # differing elements
    assert repr(report) == text  # a REPL shows compare(f, x) as the table


def test_nan_matches_nan_and_not_a_number():
    got = np.array([np.nan, np.nan, 1.0, 0.0], np.float32)
    want = np.array([np.nan, 1.0, 1.0, -0.0], np.float32)
    (leaf,) = numerics.report(got, want).leaves
    assert leaf.max_abs_error == np.inf and leaf.worst_index == (1,)
    # -0 and +0 are equal values but not the same bits: not exact, no error.
    assert leaf.exact_fraction == 0.5


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_report_compares_both_parts_of_complex_values(dtype):
    got = np.array([1 + 1j, 2 + 2j, 4 + 0j], dtype)
    want = np.array([1 + 1j, 2 + 2.5j, 4 + 0j], dtype)
    (leaf,) = numerics.report(got, want).leaves
    # Only the imaginary part of element 1 differs, by 0.5 = 0.5 / ulp(|2 + 2.5j|) ulps of
    # the parts' type (|2 + 2.5j| is in [2, 4): ulp 2**-22 in float32, 2**-51 in float64).
    parts_ulp = 2.0 ** (1 - np.finfo(dtype).nmant)
    assert leaf.max_abs_error == 0.5 and leaf.max_ulp_error_per_element == 0.5 / parts_ulp
    assert leaf.max_ulp_error == 0.5 / 2 ** (2 - np.finfo(dtype).nmant)  # at |4|, in [4, 8)
    assert leaf.exact_fraction == pytest.approx(2 / 3) and leaf.worst_index == (1,)
    assert (leaf.got_at_worst, leaf.want_at_worst) == (2 + 2j, 2 + 2.5j)


def test_report_gives_64_bit_integers_their_exact_difference():
    # 2**62 and 2**62 + 1 are the same float64: the error must still be 1, not 0.
    (leaf,) = numerics.report(np.array([2 ** 62 + 1, 7], np.int64),
                              np.array([2 ** 62, 7], np.int64)).leaves
    assert (leaf.max_abs_error, leaf.max_ulp_error, leaf.worst_index) == (1.0, 1.0, (0,))


def test_percentages_are_never_rounded_to_all_or_none():
    # gelu(x @ w) in BF16 once differed from CPU JAX in 1 of 32,768 elements: "100.00%".
    want = np.ones(32768, ml_dtypes.bfloat16)
    got = want.copy()
    got[7] = 2
    (leaf,) = numerics.report(got, want).leaves
    assert leaf.differing == 1
    text = str(numerics.report(got, want))
    assert "99.997%" in text and "1 of 32,768" in text and "100.00%" not in text
    assert numerics.percent(1, 32768) == "0.003%"
    assert numerics.percent(32768, 32768) == "100.00%" and numerics.percent(0, 7) == "0.00%"
    assert numerics.percent(1, 3) == "33.33%"


def test_the_headline_ulp_error_is_at_the_outputs_scale():
    """Against a reference of 0 the ULP is BF16's smallest subnormal (2**-133): an error of
    2**-7 there is 2**126 such ULPs; at the output's scale (largest |reference| 64, ULP
    2**-1) it is 2**-6, and the element of the largest absolute error is the worst."""
    want = np.array([64.0, 0.0, 1.0], np.float32)
    got = np.array([64.0, 2.0 ** -7, 1.0 + 2.0 ** -6], ml_dtypes.bfloat16)
    report = numerics.report(got, want, want_label="CPU JAX")
    (leaf,) = report.leaves
    assert leaf.max_abs_error == 2.0 ** -6 and leaf.max_ulp_error == 2.0 ** -5
    assert leaf.worst_index == (2,) and leaf.got_at_worst == 1.0 + 2.0 ** -6
    assert leaf.max_ulp_error_per_element == 2.0 ** 126
    assert leaf.worst_index_per_element == (1,)
    text = str(report)
    assert "max ulp err: |error| in ulps of the output's dtype at its largest |CPU JAX|" in text
    assert "per element, in ulps at each element's own |CPU JAX| value" in text
    assert "out up to 8.507e+37 at (1,)" in text


def test_report_rejects_different_structures_and_shapes():
    with pytest.raises(ValueError, match="structure"):
        numerics.report((np.zeros(2),), [np.zeros(2)])
    with pytest.raises(ValueError, match=r"shape \(2,\) differs .* \(3,\)"):
        numerics.report(np.zeros(2), np.zeros(3))


# --- compare -----------------------------------------------------------------------------

def matmul_psum(mesh):
    def step(a, b):
        body = lambda a, b: jax.lax.psum(jnp.matmul(a, b, preferred_element_type=jnp.float32),
                                         "y").astype(jnp.bfloat16)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("y", None)),
                             out_specs=P("x", None))(a, b)
    return step


def test_compare_runs_a_shard_map_on_the_mesh_and_on_cpu(rng):
    a = jnp.asarray(rng.standard_normal((16, 64)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((64, 8)), jnp.bfloat16)
    report = numerics.compare(lambda a, b: (matmul_psum(jax_trn2.make_mesh())(a, b), a * 2),
                              a, b)
    product, doubled = report.leaves
    assert (product.dtype, product.shape) == ("bfloat16", (16, 8))
    # FP32 partials added in different orders, rounded once to BF16: mostly the same value.
    assert product.exact_fraction > 0.5
    assert doubled.exact_fraction == 1.0
    assert "vs XLA:CPU" in str(report) and "rounding nearest" in str(report)


def test_compare_keeps_a_jitted_functions_statics_and_rounding(rng):
    x = rng.random((8, 8)).astype(np.float32) + 1

    def scale(x, factor):
        return (x * factor).astype(jnp.bfloat16)

    stochastic = jax_trn2.jit(scale, static_argnums=1, rounding="stochastic", seed=5)
    (leaf,) = numerics.compare(stochastic, x, 3.0).leaves
    assert leaf.exact_fraction < 1.0  # stochastic rounding against CPU's round-to-nearest
    assert leaf.max_ulp_error_per_element <= 1.0  # but always to a neighbour of the exact value
    (nearest,) = numerics.compare(jax_trn2.jit(scale, static_argnums=1), x, 3.0).leaves
    assert nearest.exact_fraction == 1.0


def test_compare_needs_no_host_device_setup():
    """The mesh brings its own host devices: 256 chips while jax has 64 CPU devices."""
    mesh = jax_trn2.make_mesh(topology="trn2-ultra-max")
    fun = jax.shard_map(lambda a: a + 1, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    (leaf,) = numerics.compare(fun, np.zeros((4,), np.float32)).leaves
    assert leaf.exact_fraction == 1.0


def long_fp32_matmul(rng):
    """A product whose 2,048-term FP32 sums the simulator adds in another order than XLA:CPU:
    most of its elements differ in their last bits, so a report of 0 differing elements
    would be the simulator compared with itself."""
    a = rng.standard_normal((64, 2048)).astype(np.float32)
    b = rng.standard_normal((2048, 64)).astype(np.float32)
    return a, b


def test_compare_of_arguments_on_trn2_devices_computes_its_reference_on_the_cpu(rng):
    a, b = long_fp32_matmul(rng)
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("trn2")[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))
    on_mesh = (jax.device_put(a, jax.sharding.NamedSharding(mesh, P("d"))),
               jax.device_put(b, jax.sharding.NamedSharding(mesh, P())))
    on_one_device = (jax.device_put(a, jax.devices("trn2")[3]), b)

    def matmul(a, b):
        return a @ b

    (on_host,) = numerics.compare(matmul, a, b).leaves
    assert on_host.differing > on_host.size // 2
    for args in (on_mesh, on_one_device):
        report = numerics.compare(matmul, *args)
        assert report.leaves == (on_host,)
        assert "XLA:CPU: jax on" in str(report) and "host CPU device" in str(report)


def test_compare_moves_a_trn2_mesh_the_function_closes_over_to_the_cpu(rng):
    """A shard_map over a mesh of trn2 devices: XLA:CPU runs it on host devices."""
    a, b = long_fp32_matmul(rng)
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("trn2")[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))

    def matmul_psum(a, b):
        return jax.shard_map(lambda a, b: jax.lax.psum(a @ b, "d"), mesh=mesh,
                             in_specs=(P(None, "d"), P("d")), out_specs=P())(a, b)

    report = numerics.compare(matmul_psum, a, b)
    (leaf,) = report.leaves
    assert leaf.differing > leaf.size // 2
    assert "8 simulated devices" in str(report) and "8 host CPU devices" in str(report)


def test_compare_runs_host_callbacks_on_the_cpu_too(rng):
    """jax.export holds no host callbacks: such a function's reference is jax.jit's on
    the arguments moved to a host CPU device."""
    a, b = long_fp32_matmul(rng)

    def with_callback(a, b):
        doubled = jax.pure_callback(lambda v: 2 * v, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
        return doubled @ b

    (leaf,) = numerics.compare(with_callback, jax.device_put(a, jax.devices("trn2")[0]),
                               b).leaves
    assert leaf.differing > leaf.size // 2


def test_compare_command_loads_a_script(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(textwrap.dedent("""
        import jax.numpy as jnp
        import numpy as np

        def double(x):
            return jnp.asarray(x, jnp.bfloat16) * 2

        def example_args():
            return (np.arange(6, dtype=np.float32),)
    """))
    assert cli.main(["compare", f"{script}:double"]) == 0
    out = capsys.readouterr().out
    assert "vs XLA:CPU" in out and "bfloat16" in out and "100.00%" in out
    assert cli.main(["compare", f"{script}:double", "--rounding", "stochastic"]) == 0
    assert "rounding stochastic(seed=0)" in capsys.readouterr().out


def test_compare_command_names_what_is_missing(tmp_path):
    script = tmp_path / "model.py"
    script.write_text("def f(x):\n    return x\n")
    args = argparse.Namespace(target=f"{script}:f", args_function="example_args",
                              rounding=None, seed=0)
    with pytest.raises(ValueError, match="define example_args"):
        commands.compare_command(args)
    args.target = f"{script}:g"
    with pytest.raises(ValueError, match="no function 'g'"):
        commands.compare_command(args)
    # The arguments as a value rather than a function that returns them.
    script.write_text("def f(x):\n    return x\nexample_args = (1.0,)\n")
    args.target = f"{script}:f"
    with pytest.raises(ValueError, match=r"example_args in .*model.py is a tuple, not a "
                                         r"function: define example_args\(\)"):
        commands.compare_command(args)


# --- rounding options --------------------------------------------------------------------

def test_jit_rejects_an_unknown_rounding_mode():
    with pytest.raises(ValueError, match="'nearest', 'stochastic'"):
        jax_trn2.jit(lambda x: x, rounding="truncate")


def test_stochastic_jit_is_reproducible_for_a_seed(rng):
    x = (1 + rng.random((32, 32)) * 2.0 ** -7).astype(np.float32)  # inexact in BF16
    to_bf16 = lambda x: x.astype(jnp.bfloat16)
    first = np.asarray(jax_trn2.jit(to_bf16, rounding="stochastic", seed=7)(x))
    again = jax_trn2.jit(to_bf16, rounding="stochastic", seed=7)
    np.testing.assert_array_equal(first, np.asarray(again(x)))
    np.testing.assert_array_equal(first, np.asarray(again(x)))  # call after call
    other = np.asarray(jax_trn2.jit(to_bf16, rounding="stochastic", seed=8)(x))
    assert (first != other).any()


def test_client_compile_takes_a_rounding_mode(rng):
    x = (1 + rng.random((16,)) * 2.0 ** -7).astype(np.float32)
    text = jax.jit(lambda x: x.astype(jnp.bfloat16)).lower(x).as_text()
    client = jax_trn2.client()
    nearest = client.compile(text).execute([x])[0]
    np.testing.assert_array_equal(np.asarray(nearest), x.astype(ml_dtypes.bfloat16))
    stochastic = client.compile(text, rounding="stochastic", seed=1)
    assert str(stochastic.rounding) == "stochastic(seed=1)"
    assert (np.asarray(stochastic.execute([x])[0]) != np.asarray(nearest)).any()
    with pytest.raises(ValueError, match="rounding mode"):
        client.compile(text, rounding="up")
