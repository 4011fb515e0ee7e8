"""Bit-level kernels (mesh.isa.kernels.bits) called directly: bitcasts between widths
(low bits first), reduce_precision's rounding and overflow, stablehlo.rng's range and
rng_bit_generator's per-chip states."""

import jax
import ml_dtypes
import numpy as np
from jax import lax
from kernel_harness import bits, run_kernel

from mesh import isa


def bitcast(outs, ins):
    return isa.Elementwise(outs, ins, op="bitcast_convert")


def test_bitcast_splits_a_wide_element_low_bits_first_and_combines_back():
    """0x04030201 as bytes is [1, 2, 3, 4]; 0x21 as two 4-bit elements is [1, 2]; bools
    [1, 0, 1, 0, 0, 0, 0, 0] as a byte are 0b101 = 5."""
    word = np.array([[0x04030201]], np.uint32)
    (split,) = run_kernel(bitcast, [word], [((1, 4), "uint8", set())], {"x": 1})
    np.testing.assert_array_equal(split, [[[1, 2, 3, 4]]])
    (joined,) = run_kernel(bitcast, [split], [((1,), "uint32", set())], {"x": 1})
    np.testing.assert_array_equal(joined, word)
    (nibbles,) = run_kernel(bitcast, [np.array([[0x21]], np.uint8)],
                            [((1, 2), "uint4", set())], {"x": 1})
    np.testing.assert_array_equal(nibbles.astype(np.uint8), [[[1, 2]]])
    flags = np.array([[1, 0, 1, 0, 0, 0, 0, 0]], bool)
    (byte,) = run_kernel(bitcast, [flags], [((), "uint8", set())], {"x": 1})
    assert byte.item() == 5


def test_reduce_precision_rounds_to_nearest_even_and_overflows_to_infinity():
    """To BF16's format (8 exponent, 7 mantissa bits): 1 + 2^-8 ties down to 1,
    1 + 3 * 2^-8 up to 1 + 2^-6. To FP16's range (5 exponent bits) 1e5 is infinite; NaN
    stays NaN and -0.0 keeps its sign."""
    x = np.array([[1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -0.0, np.nan]], np.float32)
    make = lambda outs, ins: isa.ReducePrecision(outs, ins, exponent_bits=8, mantissa_bits=7)
    (out,) = run_kernel(make, [x], [((4,), "float32", set())], {"x": 1})
    np.testing.assert_array_equal(bits(out[0, :3]),
                                  bits(np.array([1, 1 + 2.0 ** -6, -0.0], np.float32)))
    assert np.isnan(out[0, 3])
    make = lambda outs, ins: isa.ReducePrecision(outs, ins, exponent_bits=5, mantissa_bits=10)
    (out,) = run_kernel(make, [np.array([[1e5, -1e5]], np.float32)],
                        [((2,), "float32", set())], {"x": 1})
    np.testing.assert_array_equal(out, [[np.inf, -np.inf]])


def uniform(outs, ins):
    return isa.Rng(outs, ins, distribution="UNIFORM")


def test_rng_uniform_stays_below_b_where_rounding_would_reach_it():
    """BF16 on [1, 1 + 2^-7): every draw in FP32 rounds to 1 or to b, and one at b
    becomes the largest BF16 below it, 1. Integers on [3, 4) are all 3."""
    a = np.array([1], ml_dtypes.bfloat16)
    b = np.array([1 + 2.0 ** -7], ml_dtypes.bfloat16)
    (out,) = run_kernel(uniform, [a, b], [((64,), "bfloat16", set())], {"x": 1})
    np.testing.assert_array_equal(out.astype(np.float32), np.ones((1, 64)))
    (out,) = run_kernel(uniform, [np.array([3], np.int32), np.array([4], np.int32)],
                        [((16,), "int32", set())], {"x": 1})
    np.testing.assert_array_equal(out, np.full((1, 16), 3))


def test_rng_is_the_same_on_every_call_and_each_chip_draws_in_its_own_range():
    """Chip 0 draws on [0, 1), chip 1 on [10, 11), the same numbers on a second call."""
    a, b = np.array([0, 10], np.float32), np.array([1, 11], np.float32)
    outs = [((8,), "float32", {0})]
    (first,) = run_kernel(uniform, [a, b], outs, {"x": 2})
    (again,) = run_kernel(uniform, [a, b], outs, {"x": 2})
    np.testing.assert_array_equal(first, again)
    for chip, low in enumerate((0, 10)):
        assert ((first[chip] >= low) & (first[chip] < low + 1)).all()
        assert len(set(first[chip])) == 8


def test_rng_bit_generator_draws_each_chips_bits_from_its_own_state():
    """As lax.rng_bit_generator on each chip's state: chip 1's bits are not chip 0's."""
    states = np.array([[1, 2], [3, 4]], np.uint64)
    make = lambda outs, ins: isa.RngBitGenerator(outs, ins, algorithm="THREE_FRY")
    new_states, drawn = run_kernel(make, [states], [((2,), "uint64", {0}),
                                                    ((4,), "uint32", {0})], {"x": 2})
    for chip in range(2):
        with jax.enable_x64(True):  # the state keeps its 64-bit type, as in the executor
            want_state, want_bits = lax.rng_bit_generator(states[chip], (4,), np.uint32,
                                                          lax.RandomAlgorithm.RNG_THREE_FRY)
        np.testing.assert_array_equal(drawn[chip], want_bits)
        np.testing.assert_array_equal(new_states[chip], want_state)
    assert (drawn[0] != drawn[1]).any()
