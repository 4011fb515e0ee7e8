"""What jax-trn2 does not run gives an UnsupportedOpError naming what is wrong and where:
library custom calls without a rule, op forms outside the instruction set."""

from __future__ import annotations

import jax
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


def test_library_custom_call_names_its_target():
    def f(x):  # a kernel from a library jax-trn2 does not know
        return jax.ffi.ffi_call("vendor_fused_kernel", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    message = lowering_error(f, np.eye(3, dtype=np.float32))
    assert "custom_call @vendor_fused_kernel is not supported" in message


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
