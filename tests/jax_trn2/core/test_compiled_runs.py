"""A program jax compiles again where only what the simulator does not see differs (keyword
arguments for positional ones, an argument committed to the device it would be on) runs
the executor's computation of the first: the simulator traces, lowers and compiles nothing
of its own, so jax's lowering caches count the caller's lowerings alone, as on any
backend."""

import jax
import numpy as np
from jax._src.interpreters import pxla
from jax._src.pjit import _pjit_lower


def _lowerings() -> tuple[int, int, int, int]:
    """The hits and misses of jax's two lowering caches."""
    jit, hlo = _pjit_lower.cache_info(), pxla._cached_lowering_to_hlo.cache_info()
    return jit.hits, jit.misses, hlo.hits, hlo.misses


def test_keyword_arguments_lower_only_the_callers_program():
    device = jax.devices("trn2")[0]
    a, b = (jax.device_put(np.arange(4, dtype=np.float32) * k, device) for k in (1, 2))

    @jax.jit
    def f(x, y):  # no constant: jax puts one at the call's line, which differs below
        return x * y - x

    np.testing.assert_array_equal(f(a, y=b), [0, 1, 6, 15])
    hits, misses, hlo_hits, hlo_misses = _lowerings()
    np.testing.assert_array_equal(f(x=a, y=b), [0, 1, 6, 15])  # jax lowers it again
    assert _lowerings() == (hits, misses + 1, hlo_hits, hlo_misses + 1)


def test_a_committed_argument_lowers_only_the_callers_program():
    device = jax.devices("trn2")[0]
    a = np.arange(3, dtype=np.float32)

    @jax.jit
    def add(x, y):
        return x + y

    with jax.default_device(device):
        out = add(a, a)  # uncommitted: on the default device, trn2's first
    assert out.devices() == {device} and not out.committed
    hits, misses, hlo_hits, hlo_misses = _lowerings()
    c = jax.device_put(a, device)
    np.testing.assert_array_equal(add(c, c), 2 * a)  # committed: jax lowers it again
    assert _lowerings() == (hits, misses + 1, hlo_hits, hlo_misses + 1)
