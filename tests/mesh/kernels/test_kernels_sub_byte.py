"""Sub-byte integers (mesh.isa.kernels.sub_byte) through the kernels that carry them as
bytes: the values and their order are unchanged, results come back in the narrow type."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from kernel_harness import run_kernel

from mesh import isa
from mesh.isa.kernels.sub_byte import from_bytes, to_bytes


def test_int4_and_uint2_go_to_bytes_of_their_signedness_and_back():
    signed = jnp.asarray(np.array([-8, -1, 0, 7], ml_dtypes.int4))
    wide = to_bytes(signed)
    assert wide.dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(wide), [-8, -1, 0, 7])
    assert from_bytes(wide, signed.dtype).dtype == signed.dtype
    unsigned = to_bytes(jnp.asarray(np.array([0, 3], ml_dtypes.uint2)))
    assert unsigned.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(unsigned), [0, 3])
    same = jnp.zeros(2, jnp.int8)
    assert to_bytes(same) is same


def test_top_k_of_int4_orders_negative_values_below_positive_ones():
    """-8 is the smallest int4 (bit pattern 1000, which as unsigned bits would be the
    largest)."""
    x = np.array([[-8, 3, -1, 7]], ml_dtypes.int4)
    make = lambda outs, ins: isa.TopK(outs, ins, k=3)
    values, indices = run_kernel(make, [x], [((3,), "int4", set()), ((3,), "int32", set())],
                                 {"x": 1})
    assert values.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(values.astype(np.int8), [[7, 3, -1]])
    np.testing.assert_array_equal(indices, [[3, 1, 2]])


def test_sort_of_uint4_keys_with_an_int32_payload():
    keys = np.array([[15, 0, 8, 1]], ml_dtypes.uint4)
    payload = np.array([[0, 1, 2, 3]], np.int32)
    make = lambda outs, ins: isa.Sort(outs, ins, dimension=0, is_stable=True, num_keys=1)
    out_keys, out_payload = run_kernel(make, [keys, payload],
                                       [((4,), "uint4", set()), ((4,), "int32", set())],
                                       {"x": 1})
    assert out_keys.dtype == ml_dtypes.uint4
    np.testing.assert_array_equal(out_keys.astype(np.uint8), [[0, 1, 8, 15]])
    np.testing.assert_array_equal(out_payload, [[1, 3, 2, 0]])
