"""examples/support/llama.py, the model behind the serving example and the validation
table, run with values on one simulated Trn2 chip (TP4): a prompt's prefill and the same
tokens fed one decode step at a time must fill the same KV cache (keys rotated at the same
positions) and choose the same next token."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from support import llama  # noqa: E402

# float32 so the two paths (the fused flash-attention kernel over the prompt, plain
# attention over the cache) differ only by summation order; Qwen3's q/k norm on.
TINY = llama.Llama(layers=2, d_model=64, heads=8, kv_heads=4, d_ff=128, vocab=256,
                   head_dim=16, rope_theta=10000.0, qk_norm=True, dtype="float32")
PROMPT = 8
# The same keys from the same matmuls: only the attention's summation order differs between
# the paths, a few float32 ulps of values of order 1.
ATOL = 1e-5


def _values(shapes, rng):
    return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape) * 0.3, s.dtype),
                        shapes)


@pytest.fixture(scope="module")
def runs():
    split = llama.Split(TINY, 4)
    mesh = jax_trn2.make_mesh((4,), (llama.TP,), topology="trn2.3xlarge")
    rng = np.random.default_rng(0)
    weights, _ = _values(llama.prefill_args(split, 1, PROMPT), rng)
    tokens = jnp.asarray(rng.integers(0, TINY.vocab, (1, PROMPT)), jnp.int32)
    prefilled = llama.prefill(split, mesh)(weights, tokens)

    _, cache_k, cache_v, _, _ = llama.decode_args(split, 1, PROMPT)
    cache_k, cache_v = (jnp.zeros(cache_k.shape, cache_k.dtype) for _ in range(2))
    step = llama.decode_step(split, mesh)
    for position in range(PROMPT):
        token, cache_k, cache_v = step(weights, cache_k, cache_v, tokens[:, position],
                                       jnp.int32(position))
    return prefilled, (token, cache_k, cache_v)


def test_prefill_and_decode_fill_the_same_cache(runs):
    (_, prefill_k, prefill_v), (_, decode_k, decode_v) = runs
    assert prefill_k.shape == decode_k.shape
    np.testing.assert_allclose(np.asarray(decode_k), np.asarray(prefill_k), atol=ATOL)
    np.testing.assert_allclose(np.asarray(decode_v), np.asarray(prefill_v), atol=ATOL)


def test_prefill_and_decode_choose_the_same_next_token(runs):
    (prefill_token, _, _), (decode_token, _, _) = runs
    assert int(prefill_token[0]) == int(decode_token[0])


def test_keys_are_rotated_by_position():
    """The rotation turns each pair (x_i, x_{i+half}) by position / theta^(i / half): at
    position 0 nothing moves, and a rotation keeps each pair's length."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 2, 8)), jnp.float32)
    config = llama.Llama(layers=1, d_model=16, heads=2, kv_heads=2, d_ff=16, vocab=8,
                         head_dim=8, rope_theta=10000.0)
    rotated = llama._rotary(x, llama._rotation(jnp.arange(3), config))
    np.testing.assert_array_equal(rotated[0], x[0])
    pair_length = lambda v: v[..., :4] ** 2 + v[..., 4:] ** 2  # noqa: E731
    np.testing.assert_allclose(pair_length(rotated), pair_length(x), rtol=1e-6)
    # position 1, pair 0: turned by exactly 1 radian (theta^0 = 1)
    expected = x[1, :, 0] * np.cos(1.0) - x[1, :, 4] * np.sin(1.0)
    np.testing.assert_allclose(rotated[1, :, 0], expected, rtol=1e-6)
