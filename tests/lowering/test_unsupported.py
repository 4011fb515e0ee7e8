"""What jax-trn2 does not run gives an UnsupportedOpError naming what is wrong and where:
complex numbers (no complex arithmetic is modelled), library custom calls, op forms
outside the instruction set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowering
from lowering import UnsupportedOpError


def lower_jax(fn, *args):
    return lowering.lower(jax.jit(fn).lower(*args).compiler_ir("stablehlo"))


def lowering_error(fn, *args) -> str:
    with pytest.raises(UnsupportedOpError) as raised:
        lower_jax(fn, *args)
    return str(raised.value)


def test_complex_argument_names_the_argument_and_type():
    message = lowering_error(lambda x: x * 2, np.ones(3, np.complex64))
    assert "argument 0 of @main" in message and "complex<f32>" in message


def test_complex_value_names_the_op_and_source_line():
    message = lowering_error(lambda x: jnp.abs(x.astype(jnp.complex64) * 1j),  # complex here
                             np.ones(3, np.float32))
    assert "complex<f32>" in message and "stablehlo.convert" in message
    assert "# complex here" in message  # the user's source line
    assert __file__ in message


def test_fft_is_unsupported():
    assert "complex<f32>" in lowering_error(jnp.fft.fft, np.ones(4, np.float32))


def test_library_custom_call_names_its_target():
    message = lowering_error(jax.lax.linalg.hessenberg, np.eye(3, dtype=np.float32))
    assert "custom_call @lapack_sgehrd_ffi is not supported" in message


@pytest.mark.parametrize("text, fragments", [
    ("""func.func public @main(%s: tensor<2xui32>) -> tensor<3xui32> {
      %n, %bits = stablehlo.rng_bit_generator %s, algorithm = DEFAULT
        : (tensor<2xui32>) -> (tensor<2xui32>, tensor<3xui32>)
      return %bits : tensor<3xui32>
    }""", ["rng_bit_generator with a uint32[2] state", "uint64[2]"]),
])
def test_unsupported_forms_in_stablehlo(text, fragments):
    with pytest.raises(UnsupportedOpError) as raised:
        lowering.lower(f"module @m {{\n{text}\n}}")
    for fragment in fragments:
        assert fragment in str(raised.value)
