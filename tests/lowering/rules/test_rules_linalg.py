"""lowering/rules/linalg.py: LAPACK custom calls, cholesky and triangular_solve as
LinearAlgebra instructions with LAPACK's options; fft as an Fft instruction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering import UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, lower_text, only, out_type

EYE = np.eye(3, dtype=np.float32)


def routines(program):
    return [(i.routine, i.options) for i in program.instructions
            if isinstance(i, isa.LinearAlgebra)]


def test_qr_is_geqrf_then_orgqr():
    assert routines(lower_jax(jnp.linalg.qr, EYE)) == [("geqrf", ()), ("orgqr", ())]


def test_cholesky_op_is_potrf_of_its_triangle_with_an_info_result():
    program = lower_text("""func.func public @main(%a: tensor<2x3x3xf32>) -> tensor<2x3x3xf32> {
      %y = stablehlo.cholesky %a, lower = true : tensor<2x3x3xf32>
      return %y : tensor<2x3x3xf32>
    }""")
    potrf = only(program, isa.LinearAlgebra)
    assert (potrf.routine, potrf.options) == ("potrf", (("uplo", "L"),))
    factor, info = (program.info(v).type for v in potrf.outs)
    assert (factor.shape, info) == ((2, 3, 3), isa.TensorType((2,), "int32"))  # one per matrix


def test_lapack_options_are_decoded_from_their_character_codes():
    # jax's lapack_strsm_ffi: solves a^T x = b with a lower triangular, its options given
    # as ASCII codes: side L, uplo L, trans T, diag N
    program = lower_jax(lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True,
                                                                      trans=1),
                        EYE, np.ones((3, 2), np.float32))
    assert routines(program) == [
        ("trsm", (("diag", "N"), ("side", "L"), ("trans", "T"), ("uplo", "L")))]


def test_triangular_solve_op_options():
    # x a^H = b with a upper triangular of unit diagonal: side R, uplo U, trans C, diag U
    program = lower_text("""func.func public @main(%a: tensor<3x3xf32>, %b: tensor<2x3xf32>)
        -> tensor<2x3xf32> {
      %x = "stablehlo.triangular_solve"(%a, %b) {left_side = false, lower = false,
          unit_diagonal = true, transpose_a = #stablehlo<transpose ADJOINT>}
          : (tensor<3x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
      return %x : tensor<2x3xf32>
    }""")
    assert routines(program) == [
        ("trsm", (("diag", "U"), ("side", "R"), ("trans", "C"), ("uplo", "U")))]


@pytest.mark.parametrize("fn, x, fft_type, fft_length, shape", [
    (jnp.fft.rfft, np.ones((2, 8), np.float32), "RFFT", (8,), (2, 5)),
    (jnp.fft.ifft2, np.ones((4, 8), np.complex64), "IFFT", (4, 8), (4, 8)),
    (lambda x: jnp.fft.irfft(x, n=6), np.ones(4, np.complex64), "IRFFT", (6,), (6,))])
def test_fft_type_and_lengths(fn, x, fft_type, fft_length, shape):
    program = lower_jax(fn, x)
    fft = only(program, isa.Fft)
    assert (fft.fft_type, fft.fft_length) == (fft_type, fft_length)
    assert out_type(program, fft).shape == shape  # rfft of 8: 8 // 2 + 1 frequencies


def test_hessenberg_of_part_of_the_matrix_is_unsupported():
    with pytest.raises(UnsupportedOpError, match=r"(?s)gehrd of rows/columns 1\.\.3 of 4 "
                                                 r"\(only the whole matrix\)"
                                                 r".*@lapack_sgehrd_ffi"):
        lower_text("""func.func public @main(%a: tensor<4x4xf32>)
            -> (tensor<4x4xf32>, tensor<3xf32>, tensor<i32>) {
          %h:3 = stablehlo.custom_call @lapack_sgehrd_ffi(%a)
              {mhlo.backend_config = {high = 3 : i32, low = 1 : i32}}
              : (tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<3xf32>, tensor<i32>)
          return %h#0, %h#1, %h#2 : tensor<4x4xf32>, tensor<3xf32>, tensor<i32>
        }""")
