"""The FFT kernel (mesh.isa.kernels.fft) called directly: the four transform types on
4-point signals worked by hand, and a 2-D transform axis by axis. The DFT matrix holds
cos and sin rounded once to FP32, so results are within a few FP32 steps of exact."""

import numpy as np
from kernel_harness import run_kernel

from mesh import isa

SPECTRUM = [10, -2 + 2j, -2, -2 - 2j]  # of [1, 2, 3, 4]: X_k = sum x_j (-i)^(jk)


def fft(kind: str, *length: int):
    return lambda outs, ins: isa.Fft(outs, ins, fft_type=kind, fft_length=length)


def transform(kind: str, x, out_shape, out_dtype, *length) -> np.ndarray:
    (out,) = run_kernel(fft(kind, *length), [x], [(out_shape, out_dtype, set())], {"x": 1})
    assert out.dtype == np.dtype(out_dtype)
    return out[0]


def test_4_point_fft_and_its_inverse():
    x = np.array([[1, 2, 3, 4]], np.complex64)
    spectrum = transform("FFT", x, (4,), "complex64", 4)
    np.testing.assert_allclose(spectrum, SPECTRUM, atol=1e-5)
    back = transform("IFFT", np.array([SPECTRUM], np.complex64), (4,), "complex64", 4)
    np.testing.assert_allclose(back, [1, 2, 3, 4], atol=1e-6)


def test_rfft_keeps_the_first_n_over_2_plus_1_coefficients():
    x = np.array([[1, 2, 3, 4]], np.float32)
    np.testing.assert_allclose(transform("RFFT", x, (3,), "complex64", 4), SPECTRUM[:3],
                               atol=1e-5)


def test_irfft_ignores_the_imaginary_parts_at_zero_and_n_over_2():
    """X_0 and X_2 of a real signal are real; what their imaginary parts hold (here 5 and
    7) does not count, as in numpy's irfft."""
    half = np.array([[10 + 5j, -2 + 2j, -2 + 7j]], np.complex64)
    np.testing.assert_allclose(transform("IRFFT", half, (4,), "float32", 4), [1, 2, 3, 4],
                               atol=1e-6)


def test_irfft_of_odd_length_doubles_every_coefficient_after_the_first():
    """n = 3 has no n/2 coefficient: [1, 2, 3] comes back from its two coefficients
    6 and -1.5 + (sqrt(3) / 2) i, the latter's imaginary part counting."""
    half = np.array([[6, -1.5 + np.sqrt(3) / 2 * 1j]], np.complex64)
    np.testing.assert_allclose(transform("IRFFT", half, (3,), "float32", 3), [1, 2, 3],
                               atol=1e-6)


def test_2d_fft_transforms_both_axes():
    """[[1, 2], [3, 4]]: X[0, 0] = 10, X[0, 1] = (1 - 2) + (3 - 4) = -2,
    X[1, 0] = (1 + 2) - (3 + 4) = -4, X[1, 1] = 1 - 2 - 3 + 4 = 0."""
    x = np.array([[[1, 2], [3, 4]]], np.complex64)
    np.testing.assert_allclose(transform("FFT", x, (2, 2), "complex64", 2, 2),
                               [[10, -2], [-4, 0]], atol=1e-6)
