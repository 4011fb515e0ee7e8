"""jax's test-event counters (jax._src.test_util: device puts, compilations, lowerings)
count the caller's work on trn2 as on any backend, never the simulator's own jax
computations on the host."""

import jax
import numpy as np
from jax._src import test_util as jtu


def test_a_call_counts_only_the_callers_device_puts():
    device = jax.devices("trn2")[0]
    add_two = jax.jit(lambda unused, x: x + np.array(2))  # `unused` is pruned: never put
    with jtu.count_device_put() as count:
        x = jax.device_put(np.int32(1), device)
        np.testing.assert_array_equal(np.asarray(add_two(0, x)), 3)
        np.testing.assert_array_equal(np.asarray(add_two(0, x)), 3)
    assert count() == 1  # the caller's one device_put; the simulator's on the host unseen



def test_a_cached_call_counts_only_the_callers_internal_device_put():
    """jaxlib's own count of device puts (jtu.count_internal_device_puts): a NumPy argument
    of a cached call is one put onto the trn2 device; the simulator's copy of it onto its
    host device is not the caller's."""
    add_one = jax.jit(lambda x: x + 1)
    with jax.default_device(jax.devices("trn2")[0]):
        add_one(np.arange(8))
        with jtu.count_internal_device_puts() as counts:
            result = add_one(np.arange(8))
    np.testing.assert_array_equal(np.asarray(result), np.arange(1, 9))
    assert counts() == {"device_put_with_device": 1}
