"""Complex numbers and Fourier transforms against CPU JAX.

Elementwise ops, reductions, data movement and collectives on complex values are computed
by the same XLA operations as on CPU JAX (ELEMENTWISE_RTOL allows for XLA fusing them
differently). A complex matmul runs as 4 real products of the parts (the 4M method, each
real product accumulated in passes of 128 in FP32) and a transform as DFT matrix products:
their roundings differ from XLA's complex dot and FFT, by at most a few units of FP32's
epsilon times the contraction length relative to the largest result (MATMUL_TOL).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh.isa.kernels import fft as fft_kernel

ELEMENTWISE_RTOL = 1e-6
MATMUL_TOL = 1e-5  # relative to the largest |result|: K <= 300 FP32 roundings of ~1e-7


@pytest.fixture(scope="module")
def z():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4, 8)) + 1j * rng.standard_normal((4, 8))).astype(np.complex64)


ELEMENTWISE = {
    "add": lambda z: z + z * 2j, "subtract": lambda z: z - 1j, "multiply": lambda z: z * z,
    "divide": lambda z: z / (z + 1), "negate": lambda z: -z, "exp": jnp.exp, "log": jnp.log,
    "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt, "sin": jnp.sin, "cos": jnp.cos,
    "tan": jnp.tan, "tanh": jnp.tanh, "expm1": jnp.expm1, "power": lambda z: z ** (0.5 + 1j),
    "abs": jnp.abs, "real": jnp.real, "imag": jnp.imag, "conj": jnp.conj, "sign": jnp.sign,
    "complex": lambda z: lax.complex(jnp.real(z), jnp.imag(z) * 2),
    "eq_ne": lambda z: (z == z * 1, z != jnp.conj(z)),
    "convert": lambda z: jnp.real(z).astype(jnp.complex64) + 1,
    "sum": lambda z: z.sum(0), "prod": lambda z: z.prod(1),
    "movement": lambda z: (z.T, jnp.concatenate([z, z]), jnp.pad(z, 1), z[jnp.array([2, 0])],
                           lax.dynamic_update_slice(z, z[:1], (2, 0))),
    "select": lambda z: jnp.where(jnp.abs(z) > 1, z, 0),
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_complex_ops_match_cpu_jax(name, z):
    f = ELEMENTWISE[name]
    for got, want in zip(jax.tree.leaves(jax_trn2.jit(f)(z)), jax.tree.leaves(jax.jit(f)(z))):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=ELEMENTWISE_RTOL, atol=1e-7)


def assert_close_to_largest(got, want, tol=MATMUL_TOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


def test_complex_matmul_is_four_real_products():
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((16, 300)) + 1j * rng.standard_normal((16, 300))).astype(np.complex64)
    b = (rng.standard_normal((300, 8)) + 1j * rng.standard_normal((300, 8))).astype(np.complex64)
    f = lambda a, b: a @ b  # noqa: E731
    assert_close_to_largest(jax_trn2.jit(f)(a, b), jax.jit(f)(a, b))
    lowered = jax_trn2.jit(f).lower(a, b)
    assert "complex as 4 real matmuls" in lowered.as_text()
    real = jax_trn2.jit(f).lower(a.real, b.real).compile().cost_analysis()["flops"]
    assert lowered.compile().cost_analysis()["flops"] == 4 * real


def test_complex_matmul_and_collectives_in_shard_map(z):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    w = (np.arange(16).reshape(8, 2) * (1 - 0.5j)).astype(np.complex64)

    def body(x, w):
        y = lax.psum(x @ w, "b")
        return y, lax.all_gather(x, "b", tiled=True), lax.ppermute(x, "b", [(0, 1), (1, 0)])

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("a", "b"), P("b", None)),
                      out_specs=(P("a"), P("a"), P("a", "b")), check_vma=False)
    got, want = jax_trn2.jit(f)(z, w), jax.jit(f)(z, w)
    assert_close_to_largest(got[0], want[0])
    for g, r in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(g, r)


FFTS = {
    "fft": jnp.fft.fft, "ifft": jnp.fft.ifft, "fft2": jnp.fft.fft2,
    "fftn": lambda z: jnp.fft.fftn(z, s=(4, 8)), "ifft2": jnp.fft.ifft2,
    "rfft": lambda z: jnp.fft.rfft(jnp.real(z)), "irfft": lambda z: jnp.fft.irfft(z),
    "irfft_odd": lambda z: jnp.fft.irfft(z, n=7), "rfft2": lambda z: jnp.fft.rfft2(jnp.real(z)),
    "irfft2": lambda z: jnp.fft.irfft2(z),
}


@pytest.mark.parametrize("name", FFTS)
def test_fourier_transforms_match_cpu_jax(name, z):
    f = FFTS[name]
    assert_close_to_largest(jax_trn2.jit(f)(z), jax.jit(f)(z))


@pytest.mark.parametrize("name", FFTS)
def test_large_transform_matrices_are_made_in_blocks_with_the_same_entries(name, z,
                                                                           monkeypatch):
    """A matrix too large to be a constant is made in the program a block of columns at a
    time (here 5 columns, the last block partly past the end): the same entries, so the
    same results bit for bit."""
    f = FFTS[name]
    want = np.asarray(jax_trn2.jit(f)(z))
    monkeypatch.setattr(fft_kernel, "CONSTANT_MAX_ENTRIES", 0)
    monkeypatch.setattr(fft_kernel, "BLOCK_ENTRIES", 40)
    got = np.asarray(jax_trn2.jit(f)(z))
    assert got.dtype == want.dtype and (got.view(np.uint8) == want.view(np.uint8)).all()


def test_a_long_transform_compiles_without_an_n_squared_constant():
    """N = 32768: a constant matrix would be 2^30 entries per part; made in blocks, the
    program compiles and runs in seconds (it took minutes and 20 GiB)."""
    x = np.random.default_rng(1).standard_normal(1 << 15).astype(np.float32)
    got = np.asarray(jax_trn2.jit(jnp.fft.rfft)(x))
    # an FP32 DFT sum of N terms: within N x FP32's epsilon of the largest element (the
    # model's bound, mesh/isa/kernels/fft.py)
    want = np.fft.rfft(x.astype(np.float64)).astype(np.complex64)
    assert_close_to_largest(got, want, (1 << 15) * 2.0 ** -23)


def test_fft_is_listed_and_costed_as_dft_matmuls(z):
    compiled = jax_trn2.jit(jnp.fft.fft).lower(z).compile()
    assert "Tensor.Fft(%" in compiled.as_text() and "fft_type=FFT" in compiled.as_text()
    assert compiled.cost_analysis()["flops"] == 8 * 8 * 8 * 4  # 8 N^2 per row, 4 rows


def test_complex_cbrt_is_the_principal_cube_root(z):
    """StableHLO's cbrt takes complex operands (jax's and XLA's do not): the principal root,
    whose cube is the operand and whose argument is a third of the operand's."""
    text = """
func.func public @main(%z: tensor<4x8xcomplex<f32>>) -> tensor<4x8xcomplex<f32>> {
  %r = stablehlo.cbrt %z : tensor<4x8xcomplex<f32>>
  return %r : tensor<4x8xcomplex<f32>>
}"""
    (got,) = jax_trn2.client().compile(text).execute([z])
    got = np.asarray(got)
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, z.astype(np.complex128) ** (1 / 3), rtol=ELEMENTWISE_RTOL)
    np.testing.assert_allclose(np.angle(got), np.angle(z) / 3, rtol=ELEMENTWISE_RTOL)


def test_real_and_imag_of_a_real_operand_are_it_and_zero():
    """StableHLO's real and imag also take real operands (lax's imag does not)."""
    text = """
func.func public @main(%x: tensor<3xf32>, %b: tensor<2xbf16>)
    -> (tensor<3xf32>, tensor<3xf32>, tensor<2xbf16>, tensor<2xbf16>) {
  %re = stablehlo.real %x : tensor<3xf32>
  %im = stablehlo.imag %x : tensor<3xf32>
  %bre = stablehlo.real %b : tensor<2xbf16>
  %bim = stablehlo.imag %b : tensor<2xbf16>
  return %re, %im, %bre, %bim : tensor<3xf32>, tensor<3xf32>, tensor<2xbf16>, tensor<2xbf16>
}"""
    x = np.array([1.5, -2.0, np.inf], np.float32)
    b = np.array([0.25, -3.0], jnp.bfloat16)
    re, im, bre, bim = (np.asarray(r) for r in jax_trn2.client().compile(text).execute([x, b]))
    np.testing.assert_array_equal(re, x)
    np.testing.assert_array_equal(im, np.zeros(3, np.float32))
    assert bre.dtype == jnp.bfloat16 and bim.dtype == jnp.bfloat16
    np.testing.assert_array_equal(bre.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(bim.astype(np.float32), np.zeros(2, np.float32))
