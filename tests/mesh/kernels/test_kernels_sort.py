"""Sort and top-k kernels (mesh.isa.kernels.sort) called directly, chip by chip."""

import numpy as np
from kernel_harness import bits, run_kernel

from mesh import isa


def test_sort_by_key_treats_zeros_as_equal_and_puts_nan_last_stably():
    """Keys 3, NaN, +0, -0, -1 carrying 0..4: -0.0 and +0.0 are equal, so the stable sort
    keeps +0 (payload 2) before -0 (payload 3); a total order would swap them."""
    keys = np.array([[3.0, np.nan, 0.0, -0.0, -1.0]], np.float32)
    payload = np.arange(5, dtype=np.int32).reshape(1, 5)
    make = lambda outs, ins: isa.Sort(outs, ins, dimension=0, is_stable=True, num_keys=1)
    out_keys, out_payload = run_kernel(make, [keys, payload],
                                       [((5,), "float32", set()), ((5,), "int32", set())],
                                       {"x": 1})
    np.testing.assert_array_equal(out_payload, [[4, 2, 3, 0, 1]])
    expected = np.array([[-1.0, 0.0, -0.0, 3.0, np.nan]], np.float32)
    np.testing.assert_array_equal(bits(out_keys), bits(expected))


def test_top_k_per_chip_takes_ties_in_index_order():
    x = np.array([[5, 1, 5, 2], [0, 9, 9, 9]], np.int32)  # [x=2, 4]
    make = lambda outs, ins: isa.TopK(outs, ins, k=2)
    values, indices = run_kernel(make, [x], [((2,), "int32", {0}), ((2,), "int32", {0})],
                                 {"x": 2})
    np.testing.assert_array_equal(values, [[5, 5], [9, 9]])
    np.testing.assert_array_equal(indices, [[0, 2], [1, 2]])
