"""lowering/rules/bits.py: rng_bit_generator, rng and reduce_precision."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lowering import UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, lower_text, only, out_type


@pytest.mark.parametrize("algorithm, name", [(lax.RandomAlgorithm.RNG_DEFAULT, "DEFAULT"),
                                             (lax.RandomAlgorithm.RNG_THREE_FRY, "THREE_FRY"),
                                             (lax.RandomAlgorithm.RNG_PHILOX, "PHILOX")])
def test_rng_bit_generator_keeps_its_algorithm_and_state(algorithm, name):
    program = lower_jax(lambda key: lax.rng_bit_generator(key, (2, 3), dtype=jnp.uint32,
                                                          algorithm=algorithm),
                        np.zeros(4, np.uint32))
    generator = only(program, isa.RngBitGenerator)
    assert generator.algorithm == name
    # jax passes its u32[4] key as XLA's u64[2] state; the new state has the same type
    state, bits = (program.info(v).type for v in generator.outs)
    assert program.info(generator.ins[0]).type == state == isa.TensorType((2,), "uint64")
    assert bits == isa.TensorType((2, 3), "uint32")


@pytest.mark.parametrize("distribution", ["UNIFORM", "NORMAL"])
def test_rng_takes_its_bounds_and_result_shape(distribution):
    program = lower_text(f"""func.func public @main(%a: tensor<f32>, %b: tensor<f32>)
        -> tensor<2x3xf32> {{
      %shape = stablehlo.constant dense<[2, 3]> : tensor<2xi64>
      %y = stablehlo.rng %a, %b, %shape, distribution = {distribution}
          : (tensor<f32>, tensor<f32>, tensor<2xi64>) -> tensor<2x3xf32>
      return %y : tensor<2x3xf32>
    }}""")
    rng = only(program, isa.Rng)
    assert rng.distribution == distribution
    assert rng.ins == program.inputs  # a and b, not the shape operand
    assert out_type(program, rng).shape == (2, 3)


def test_reduce_precision_keeps_exponent_and_mantissa_bits():
    program = lower_jax(lambda x: lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10),
                        np.ones(3, np.float32))
    rounding = only(program, isa.ReducePrecision)
    assert (rounding.exponent_bits, rounding.mantissa_bits) == (5, 10)


def test_rng_bit_generator_with_other_state_is_unsupported():
    with pytest.raises(UnsupportedOpError, match=r"(?s)rng_bit_generator with a uint32\[3\] "
                                                 r"state.*\(stablehlo.rng_bit_generator\)"):
        lower_text("""func.func public @main(%k: tensor<3xui32>)
            -> (tensor<3xui32>, tensor<2xui32>) {
          %s, %y = stablehlo.rng_bit_generator %k, algorithm = DEFAULT
              : (tensor<3xui32>) -> (tensor<3xui32>, tensor<2xui32>)
          return %s, %y : tensor<3xui32>, tensor<2xui32>
        }""")
