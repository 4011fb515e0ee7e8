"""benchmarks/validate.py: published figures rebuilt with the public API; the ideal time
never above a measurement, the expected never below the ideal."""

import dataclasses
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import jax_trn2

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import validate  # noqa: E402
from support import llama  # noqa: E402  (validate put examples/ on the path)

# The quick rows: collectives, the one-core matmul, and a decode of Llama-3 8B on 2 chips.
QUICK = [c for c in validate.CASES if c.kind == "calibration"] + \
    [c for c in validate.CASES if c.name == "Llama-3.1-8B TPOT"]


@pytest.mark.parametrize("case", QUICK, ids=lambda c: f"{c.kind} {c.name}")
def test_ideal_below_the_measurement_and_expected_above_the_ideal(case):
    expected, ideal = validate.estimate(case)
    assert ideal <= case.measured_seconds
    assert ideal <= expected


def test_the_markdown_table_has_a_row_per_case_and_the_summary():
    rows = [(c, 2 * c.measured_seconds, c.measured_seconds / 2) for c in QUICK[:2]]
    text = validate.markdown(rows)
    assert text.count("\n| calibration |") == 2 and "2.00" in text and "0.50" in text
    assert "calibration: 2 figures; expected/measured median 2.00, 0 within +-25%, 2 within " \
           "2x; ideal above the measurement in 0" in text


# A mixture-of-experts decoder at toy sizes (examples/support/moe.py, the MoE rows' model):
# 8 experts, top 2, 2 chips. A 256-token prefill takes NxD's blockwise path (256 x 2 rows
# reach the 512-row block); a decode step of 4 rows every expert (4 x 2 / 8 = 1), of 2
# rows selective loading.
TOY_MOE = validate.moe.Moe(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=32, vocab=256,
                           head_dim=16, dtype="float32", experts=8, top_k=2)


def random_arguments(shapes, rng, tokens_high):
    """Values for a tree of ShapeDtypeStructs: weights scaled by 1/sqrt(fan-in), token ids
    below the vocabulary, a decode position of 300."""
    def value(s):
        if s.dtype == jnp.int32:
            return np.full(s.shape, 300, np.int32) if s.shape == () else \
                rng.integers(0, tokens_high, s.shape).astype(np.int32)
        fan_in = s.shape[-2] if len(s.shape) > 2 else 1
        return (rng.standard_normal(s.shape) / np.sqrt(fan_in)).astype(s.dtype)
    return jax.tree.map(value, shapes)


def compare_with_cpu(function, args, sim_mesh, cpu_mesh):
    got = jax_trn2.jit(function(sim_mesh))(*args)
    want = jax.jit(function(cpu_mesh))(*args)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))  # the tokens
    for g, w in zip(got[1:], want[1:]):  # the caches
        w = np.asarray(w)
        np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=2.0 ** -14 * np.abs(w).max())


def meshes():
    return (jax_trn2.make_mesh((2,), (llama.TP,)),
            jax.make_mesh((2,), (llama.TP,), axis_types=(AxisType.Auto,),
                          devices=jax.devices("cpu")[:2]))


def test_moe_prefill_runs_blockwise_on_trn2_as_on_cpu_jax(rng):
    split = llama.Split(TOY_MOE, 2)
    assert validate.moe.blocks(256, 2, 8) == 8  # ceil((512 - 7) / 512) + 7
    args = random_arguments(validate.moe.prefill_args(split, 1, 256), rng, TOY_MOE.vocab)
    compare_with_cpu(partial(validate.moe.prefill_function, split), args, *meshes())


@pytest.mark.parametrize("batch", [4, 2], ids=["all experts", "selective loading"])
def test_moe_decode_runs_on_trn2_as_on_cpu_jax(batch, rng):
    split = llama.Split(TOY_MOE, 2)
    args = random_arguments(validate.moe.decode_args(split, batch, 512), rng, TOY_MOE.vocab)
    compare_with_cpu(partial(validate.moe.decode_function, split), args, *meshes())


@pytest.mark.parametrize("d_model, block_size, accepted", [
    (2048, 512, False),  # Qwen3-30B-A3B: below the kernel's 4096
    (4096, 512, True),  # Qwen3-235B-A22B
    (8192, 1024, True), (4608, 128, True),  # whole 512s up to 8192
    (10240, 512, False), (4352, 512, False),  # above 8192; not a multiple of 512
    (4096, 16, False)])  # block sizes 128-1024 only
def test_the_blockwise_kernel_takes_nxd_015s_hidden_sizes(d_model, block_size, accepted):
    assert validate.moe.blockwise_kernel_accepts(d_model, block_size) is accepted


def test_blocks_are_laid_out_as_nxd_documents():
    """The NxD Inference MoE deep dive's example: 6 tokens to experts [0, 1, 0, 2, 1, 0],
    blocks of 4: block 0 -> expert 0 [T0, T2, T5, pad], block 1 -> expert 1 [T1, T4, pad,
    pad], block 2 -> expert 2 [T3, pad, pad, pad]; padding rows take token T = 6."""
    chosen = jnp.array([[0], [1], [0], [2], [1], [0]])
    _, _, sizes, block_expert, row_token = validate.moe._block_layout(chosen, 3, 4)
    np.testing.assert_array_equal(sizes, [4, 4, 4])
    np.testing.assert_array_equal(block_expert, [0, 1, 2])
    np.testing.assert_array_equal(row_token, [0, 2, 5, 6, 1, 4, 6, 6, 3, 6, 6, 6])


@pytest.mark.parametrize("d_model, loops", [(64, 1), (4096, 0)],
                         ids=["torch fallback", "NKI kernel"])
def test_a_prefill_outside_the_kernels_hidden_sizes_runs_the_blocks_in_a_loop(d_model, loops):
    """NxD's torch fallback: one loop over the N = 8 blocks; the kernel's: no loop, two
    grouped matmuls (the fused gate and up projections, the down projection)."""
    c = dataclasses.replace(TOY_MOE, d_model=d_model)
    x = jax.ShapeDtypeStruct((256, d_model), jnp.float32)
    w = {"router": jax.ShapeDtypeStruct((d_model, c.experts), jnp.float32),
         "gate_up": jax.ShapeDtypeStruct((c.experts, d_model, 2, c.d_ff), jnp.float32),
         "down": jax.ShapeDtypeStruct((c.experts, c.d_ff, d_model), jnp.float32)}
    text = str(jax.make_jaxpr(partial(validate.moe.experts_mlp, c, False))(x, w))
    assert text.count("scan[") == loops  # jax's fori_loop of a known trip count
    assert text.count("ragged_dot_general[") == 2 * (1 - loops)


# Llama 4's MoE at toy sizes: sigmoid routing of the top 1, inputs weighted before the
# expert (early affinity modulation), a shared expert beside the routed ones.
TOY_LLAMA_4 = dataclasses.replace(TOY_MOE, top_k=1, router="sigmoid", early_affinity=True,
                                  shared_d_ff=16)


def swiglu_mlp(x, w1, w3, w2):
    gate_proj, up = x @ w1, x @ w3
    return (gate_proj / (1 + np.exp(-gate_proj)) * up) @ w2


def routed_by_hand(c, x_t, logits_t):
    """(expert, its weight, the expert's input) of each of a token's top k, as Qwen3-MoE
    (softmax, renormalized, outputs weighted) or Llama 4 (sigmoid, inputs weighted)
    route it."""
    chosen = np.argsort(-logits_t)[:c.top_k]
    if c.router == "sigmoid":
        gates = 1 / (1 + np.exp(-logits_t[chosen]))
    else:
        gates = np.exp(logits_t[chosen] - logits_t[chosen].max())
        gates = gates / gates.sum()
    return [(e, g, g * x_t if c.early_affinity else x_t) for e, g in zip(chosen, gates)]


@pytest.mark.parametrize("config", [TOY_MOE, TOY_LLAMA_4], ids=["Qwen3-MoE", "Llama 4"])
@pytest.mark.parametrize("tokens, generating, d_model",
                         [(256, False, 64), (256, False, 4096), (4, True, 64), (2, True, 64)],
                         ids=["blockwise torch fallback", "blockwise kernel", "all experts",
                              "selective loading"])
def test_moe_layer_equals_each_token_through_its_top_k_experts(config, tokens, generating,
                                                               d_model, rng):
    c = dataclasses.replace(config, d_model=d_model)
    if c.top_k == 1 and tokens == 256:  # 256 x 1 rows: at least one 512-row block
        tokens = 512
    x = rng.standard_normal((tokens, c.d_model)).astype(np.float32)
    w = {"router": rng.standard_normal((c.d_model, c.experts)).astype(np.float32),
         "gate_up": rng.standard_normal((c.experts, c.d_model, 2, c.d_ff)).astype(np.float32) / 8,
         "down": rng.standard_normal((c.experts, c.d_ff, c.d_model)).astype(np.float32) / 6}
    if c.shared_d_ff:
        w.update(shared_w1=rng.standard_normal((c.d_model, c.shared_d_ff)).astype(np.float32) / 8,
                 shared_w3=rng.standard_normal((c.d_model, c.shared_d_ff)).astype(np.float32) / 8,
                 shared_w2=rng.standard_normal((c.shared_d_ff, c.d_model)).astype(np.float32) / 4)
    got = jax.jit(partial(validate.moe.experts_mlp, c, generating))(x, w)
    logits = x @ w["router"]
    want = np.zeros_like(x)
    for t in range(tokens):
        for e, gate, x_in in routed_by_hand(c, x[t], logits[t]):
            y = swiglu_mlp(x_in, w["gate_up"][e, :, 0], w["gate_up"][e, :, 1], w["down"][e])
            want[t] += y if c.early_affinity else gate * y
        if c.shared_d_ff:
            want[t] += swiglu_mlp(x[t], w["shared_w1"], w["shared_w3"], w["shared_w2"])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_llama_4_maverick_interleaves_dense_and_moe_layers():
    """Maverick's 48 layers: 24 dense (intermediate 16,384) and 24 MoE, each of 128 routed
    experts and a shared one; 40 query heads padded to 64 at TP64 as NxD pads them; 400B
    parameters, Scout 108B (the text models of the published 400B and 109B)."""
    c = validate.moe.LLAMA_4_MAVERICK
    weights = validate.moe._weights(llama.Split(c, 64))
    assert weights["dense_w1"].shape == (24, 5120, 16384)
    assert weights["gate_up"].shape == (24, 128, 5120, 2, 8192)
    assert weights["shared_w2"].shape == (24, 8192, 5120)
    assert weights["wq"].shape == (48, 5120, 64 * 128)
    assert round(c.param_count() / 1e9) == 401
    assert round(validate.moe.LLAMA_4_SCOUT.param_count() / 1e9) == 108


def test_an_interleaved_moe_decoder_runs_on_trn2_as_on_cpu_jax(rng):
    """Groups of a dense and an MoE layer (Llama 4 Maverick's pattern) at toy sizes, 3
    query heads padded to 4 over 2 chips: prefill and decode as on CPU JAX."""
    c = dataclasses.replace(TOY_LLAMA_4, layers=4, heads=3, kv_heads=1, moe_every=2,
                            dense_d_ff=48)
    split = llama.Split(c, 2)
    args = random_arguments(validate.moe.prefill_args(split, 1, 1024), rng, c.vocab)
    compare_with_cpu(partial(validate.moe.prefill_function, split), args, *meshes())
    args = random_arguments(validate.moe.decode_args(split, 4, 512), rng, c.vocab)
    compare_with_cpu(partial(validate.moe.decode_function, split), args, *meshes())
