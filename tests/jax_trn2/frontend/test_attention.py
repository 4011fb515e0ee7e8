"""jax_trn2.flash_attention: jax.nn.dot_product_attention's results, costed as the fused
kernel Trainium2 runs (no scores in HBM)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2
from mesh import isa
from mesh.perf.attention import scores

BF16 = jnp.bfloat16


@pytest.mark.parametrize("causal", [False, True])
def test_results_and_gradients_are_dot_product_attentions(rng, causal):
    q = jnp.asarray(rng.standard_normal((2, 48, 4, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 64, 2, 16)), jnp.float32)  # grouped-query
    v = jnp.asarray(rng.standard_normal((2, 64, 2, 16)), jnp.float32)

    def loss(attention):
        return lambda q, k, v: (attention(q, k, v) ** 2).sum()

    fused = lambda q, k, v: jax_trn2.flash_attention(q, k, v, causal=causal)  # noqa: E731
    plain = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    # FP32 throughout; the simulator's matmuls add their 128-long passes in another order
    # than XLA:CPU's: a few ulps of FP32 (1e-5 relative covers 16-element sums of products
    # and a softmax over 64 keys)
    np.testing.assert_allclose(jax_trn2.jit(fused)(q, k, v), plain(q, k, v), rtol=1e-5,
                               atol=1e-6)
    got = jax_trn2.jit(jax.grad(loss(fused), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_the_fused_kernel_keeps_the_scores_out_of_hbm():
    q = jax.ShapeDtypeStruct((1, 4096, 8, 128), BF16)
    kv = jax.ShapeDtypeStruct((1, 4096, 2, 128), BF16)
    fused = jax_trn2.jit(lambda q, k, v: jax_trn2.flash_attention(q, k, v, causal=True),
                         topology="trn2").lower(q, kv, kv).compile()
    naive = jax_trn2.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
                         topology="trn2").lower(q, kv, kv).compile()
    q_bytes, kv_bytes = 4096 * 8 * 128 * 2, 4096 * 2 * 128 * 2
    # q, k, v read once, the output written once
    assert fused.cost_analysis()["bytes accessed"] == 2 * q_bytes + 2 * kv_bytes
    assert fused.memory_analysis().temp_size_in_bytes == 0
    assert naive.memory_analysis().temp_size_in_bytes > 8 * 4096 * 4096  # the scores
    assert fused.cost_analysis()["trn2"]["step_seconds"] < \
        naive.cost_analysis()["trn2"]["step_seconds"] / 10
    # 4 E H FLOPs for E = 8 heads x the causal half of 4096 x 4096 scores
    assert fused.cost_analysis()["flops"] == 4 * 8 * 4096 * 4097 / 2 * 128


def test_causal_scores_count_the_keys_each_query_sees():
    q, k = isa.TensorType((1, 4, 1, 8), "bfloat16"), isa.TensorType((1, 6, 1, 8), "bfloat16")
    assert scores(q, k, causal=False) == 24
    assert scores(q, k, causal=True) == 3 + 4 + 5 + 6  # query i sees keys up to 6 - 4 + i


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match=r"k must be \[batch, length, heads, head_dim\]"):
        jax_trn2.flash_attention(jnp.ones((1, 4, 2, 8)), jnp.ones((4, 2, 8)), jnp.ones((1, 4, 2, 8)))


def test_the_kernel_survives_xlas_partitioner(rng):
    """With NamedShardings (no shard_map) XLA's partitioner makes each chip's program; the
    kernel crosses it as a call XLA keeps, is partitioned like any function, and comes
    back as the kernel: costed as one, computing the same values."""
    mesh = jax_trn2.make_mesh((8,), ("d",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    q = jnp.asarray(rng.standard_normal((8, 64, 4, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((8, 64, 2, 16)), jnp.float32)

    def loss(attention):
        return lambda q, k, v: (attention(q, k, v) ** 2).sum()

    fused = lambda q, k, v: jax_trn2.flash_attention(q, k, v, causal=True)  # noqa: E731
    plain = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    step = jax_trn2.jit(jax.grad(loss(fused), argnums=(0, 1, 2)), in_shardings=(split,) * 3)
    listing = step.lower(q, k, k).compile().as_text()
    assert "name=jax_trn2.flash_attention_grad" in listing
    assert "float32[1,64,4,16]" in listing  # each chip's part of the batch
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, k)
    for g, w in zip(step(q, k, k), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)  # as in the test above
