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
    """NxD's torch fallback: one loop over the N = 8 blocks; the kernel's: no loop, three
    grouped matmuls."""
    c = dataclasses.replace(TOY_MOE, d_model=d_model)
    x = jax.ShapeDtypeStruct((256, d_model), jnp.float32)
    w = {"router": jax.ShapeDtypeStruct((d_model, c.experts), jnp.float32),
         "w1": jax.ShapeDtypeStruct((c.experts, d_model, c.d_ff), jnp.float32),
         "w3": jax.ShapeDtypeStruct((c.experts, d_model, c.d_ff), jnp.float32),
         "w2": jax.ShapeDtypeStruct((c.experts, c.d_ff, d_model), jnp.float32)}
    text = str(jax.make_jaxpr(partial(validate.moe.experts_mlp, c, False))(x, w))
    assert text.count("scan[") == loops  # jax's fori_loop of a known trip count
    assert text.count("ragged_dot_general[") == 3 * (1 - loops)


@pytest.mark.parametrize("tokens, generating, d_model",
                         [(256, False, 64), (256, False, 4096), (4, True, 64), (2, True, 64)],
                         ids=["blockwise torch fallback", "blockwise kernel", "all experts",
                              "selective loading"])
def test_moe_layer_equals_each_token_through_its_top_k_experts(tokens, generating, d_model,
                                                               rng):
    c = dataclasses.replace(TOY_MOE, d_model=d_model)
    x = rng.standard_normal((tokens, c.d_model)).astype(np.float32)
    w = {"router": rng.standard_normal((c.d_model, c.experts)).astype(np.float32),
         "w1": rng.standard_normal((c.experts, c.d_model, c.d_ff)).astype(np.float32) / 8,
         "w3": rng.standard_normal((c.experts, c.d_model, c.d_ff)).astype(np.float32) / 8,
         "w2": rng.standard_normal((c.experts, c.d_ff, c.d_model)).astype(np.float32) / 6}
    got = jax.jit(partial(validate.moe.experts_mlp, c, generating))(x, w)
    logits = x @ w["router"]
    want = np.zeros_like(x)
    for t in range(tokens):
        chosen = np.argsort(-logits[t])[:c.top_k]
        gates = np.exp(logits[t, chosen] - logits[t, chosen].max())
        for e, gate in zip(chosen, gates / gates.sum()):
            gate_proj, up = x[t] @ w["w1"][e], x[t] @ w["w3"][e]
            want[t] += gate * ((gate_proj / (1 + np.exp(-gate_proj)) * up) @ w["w2"][e])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
