"""Mixture-of-experts decoders (Qwen3-MoE) as NxD Inference serves them on Trainium2:
llama.py's decoder (attention, norms, KV cache, tensor-parallel layout, sequence-parallel
prefill) with each layer's MLP replaced by routed experts.

The experts run as NxD's ExpertMLPsV2 runs them with its default BlockwiseMatmulConfig and
no expert parallelism (neuronx-distributed 0.15, Neuron SDK 2.26,
src/neuronx_distributed/modules/moe/expert_mlps_v2.py, ExpertMLPsV2.forward; optimum-neuron
builds Qwen3-MoE's experts with ExpertMLPs, a subclass with the same forward):
- every expert's intermediate dimension split over the tensor-parallel chips, the router
  replicated, the layer's partial sums added over the chips (psum) as a dense MLP's are;
- the router: softmax over all experts in FP32, the top k, renormalized to sum to 1
  (normalize_top_k_affinities; Qwen3's norm_topk_prob);
- with T tokens, top k and E experts, "load" = T * k / E (the selective-loading threshold,
  DEFAULT_SELECTIVE_LOADING_THRESHOLD, is 1.0):
  - load < 1 (a decode step of a small batch): selective loading, each token's k experts'
    weights gathered and applied to it alone;
  - decode with load >= 1, or a prefill with T * k below the block size: every expert over
    every token, combined with the routing weights (zero for experts not chosen);
  - a prefill otherwise: blockwise, the (token, expert) pairs sorted by expert into
    N = ceil((T*k - (E-1)) / B) + E - 1 blocks of B = 512 rows (DEFAULT_BLOCK_SIZE), each
    expert's rows padded to whole blocks, the blocks' rows through their expert's MLP.
    With a hidden size the blockwise NKI kernel accepts (4096-8192) a `jax.lax.ragged_dot`
    over the N * B rows with each expert's group its blocks; with any other, NxD's torch
    fallback: a loop over the blocks, one after another (`blockwise_kernel_accepts`).

Only shapes matter for planning: `decode_args` and `prefill_args` give
jax.ShapeDtypeStructs, as llama.py's do.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jax_trn2
from support import llama
from support.llama import TP

BLOCK_SIZE = 512  # NxD's DEFAULT_BLOCK_SIZE (modules/moe/model_utils.py): rows a block
SELECTIVE_LOADING_THRESHOLD = 1.0  # NxD's DEFAULT_SELECTIVE_LOADING_THRESHOLD


@dataclasses.dataclass(frozen=True)
class Moe(llama.Llama):
    """A decoder whose every layer's MLP is `experts` SwiGLU experts of intermediate size
    `d_ff` (moe_intermediate_size), `top_k` of them per token."""

    experts: int = 1
    top_k: int = 1

    def param_count(self) -> int:
        dense = llama.Llama.param_count(self)
        mlp = 3 * self.d_model * self.d_ff
        return dense + self.layers * ((self.experts - 1) * mlp + self.d_model * self.experts)


# Published architectures (the models' config.json files on Hugging Face).
# Qwen/Qwen3-30B-A3B-Instruct-2507: hidden_size 2048, num_hidden_layers 48,
# num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128,
# num_experts_per_tok 8, moe_intermediate_size 768, vocab_size 151936, norm_topk_prob true.
# Both have Qwen3's q/k norm; rope_theta is Qwen3's 1e6 (a rotation's angle changes no cost).
QWEN_3_30B_A3B = Moe(layers=48, d_model=2048, heads=32, kv_heads=4, d_ff=768, vocab=151936,
                     experts=128, top_k=8, rope_theta=1000000.0, qk_norm=True)
# Qwen/Qwen3-235B-A22B-Instruct-2507: hidden_size 4096, num_hidden_layers 94,
# num_attention_heads 64, num_key_value_heads 4, head_dim 128, num_experts 128,
# num_experts_per_tok 8, moe_intermediate_size 1536, vocab_size 151936, norm_topk_prob true.
QWEN_3_235B_A22B = Moe(layers=94, d_model=4096, heads=64, kv_heads=4, d_ff=1536,
                       vocab=151936, experts=128, top_k=8, rope_theta=1000000.0, qk_norm=True)

# How the expert weights are split over the TP chips: each expert's intermediate dim.
EXPERT_SPECS = {"w1": P(None, None, None, TP), "w3": P(None, None, None, TP),
                "w2": P(None, None, TP, None), "router": P()}


def _weights(split: llama.Split) -> dict[str, jax.ShapeDtypeStruct]:
    """llama.py's weights with the MLP's replaced by the experts' and the router's."""
    c = split.config
    dt = jnp.dtype(c.dtype)
    weights = llama._weights(split)
    weights.update({
        "w1": jax.ShapeDtypeStruct((c.layers, c.experts, c.d_model, c.d_ff), dt),
        "w3": jax.ShapeDtypeStruct((c.layers, c.experts, c.d_model, c.d_ff), dt),
        "w2": jax.ShapeDtypeStruct((c.layers, c.experts, c.d_ff, c.d_model), dt),
        "router": jax.ShapeDtypeStruct((c.layers, c.d_model, c.experts), dt),
    })
    return weights


def _weight_specs(weights) -> dict:
    return {k: EXPERT_SPECS.get(k, llama.WEIGHT_SPECS.get(k)) for k in weights}


def _route(x, router, top_k: int):
    """(routing weights [T, k] in x's dtype, chosen experts [T, k]): softmax over all
    experts in FP32, the top k renormalized."""
    probs = jax.nn.softmax(jnp.dot(x, router, preferred_element_type=jnp.float32), axis=-1)
    gates, chosen = jax.lax.top_k(probs, top_k)
    return (gates / jnp.sum(gates, axis=-1, keepdims=True)).astype(x.dtype), chosen


def _swiglu(gate, up):
    return jax.nn.silu(gate) * up


def _all_experts(x, gates, chosen, w):
    """Every expert over every token [T, d], each output weighted by the token's routing
    weight for it (zero if not chosen)."""
    dense = jnp.sum(jax.nn.one_hot(chosen, w["w1"].shape[0], dtype=x.dtype)
                    * gates[..., None], axis=1)  # [T, E]
    hidden = _swiglu(jnp.einsum("td,edf->etf", x, w["w1"]),
                     jnp.einsum("td,edf->etf", x, w["w3"]))
    return jnp.einsum("etd,te->td", jnp.einsum("etf,efd->etd", hidden, w["w2"]), dense)


def _selective(x, gates, chosen, w):
    """Each token [T, d] through its k experts alone, their weights gathered per token."""
    hidden = _swiglu(jnp.einsum("td,tkdf->tkf", x, w["w1"][chosen]),
                     jnp.einsum("td,tkdf->tkf", x, w["w3"][chosen]))
    return jnp.einsum("tkd,tk->td", jnp.einsum("tkf,tkfd->tkd", hidden, w["w2"][chosen]),
                      gates)


def blocks(tokens: int, top_k: int, experts: int, block_size: int = BLOCK_SIZE) -> int:
    """NxD's block count N for `tokens` tokens: enough for the worst spread of them over
    the experts (E - 1 experts one row each, the rest on one expert), at most T * k."""
    worst = math.ceil((tokens * top_k - (experts - 1)) / block_size) + experts - 1
    return min(worst, tokens * top_k)


def _block_layout(chosen, experts: int, block_size: int):
    """NxD's mapping of the (token, expert) pairs of chosen [T, k] to blocks
    (get_blockwise_expert_and_token_mapping): each expert's pairs, in token order, on rows of
    its own whole blocks. Returns the pairs by expert (`order`), each of their rows, each
    expert's rows (whole blocks) [E], each block's expert [N], and each row's token
    [N * B] (T on the padding rows)."""
    tokens, top_k = chosen.shape
    n = blocks(tokens, top_k, experts, block_size)
    flat = chosen.reshape(-1)  # the expert of each (token, choice) pair
    counts = jnp.bincount(flat, length=experts)
    padded = (counts + block_size - 1) // block_size * block_size  # each expert's rows
    order = jnp.argsort(flat, stable=True)  # the pairs by expert
    first_pair = jnp.cumsum(counts) - counts  # of each expert, in `order`
    first_row = jnp.cumsum(padded) - padded  # of each expert's first block
    expert = flat[order]
    row = first_row[expert] + jnp.arange(flat.shape[0]) - first_pair[expert]
    ends = jnp.cumsum(padded) // block_size  # one past each expert's last block
    # the experts whose blocks end at or before each block (NxD's formula: the unused
    # blocks at the end go to the last expert)
    block_expert = jnp.sum(jnp.arange(n)[:, None] >= ends[None, :-1], axis=1)
    row_token = jnp.full((n * block_size,), tokens, jnp.int32).at[row].set(order // top_k)
    return order, row, padded.astype(jnp.int32), block_expert, row_token


def _blockwise(x, gates, chosen, w, block_size: int = BLOCK_SIZE):
    """The blocks as the blockwise NKI kernel runs them, as one grouped matmul: the
    (token, expert) pairs of x [T, d] scattered into N blocks of `block_size` rows (unused
    rows zero), the rows through their expert's MLP, then each token's k outputs weighted
    and added."""
    tokens, top_k = chosen.shape
    experts = w["w1"].shape[0]
    order, row, sizes, _, row_token = _block_layout(chosen, experts, block_size)
    inputs = jnp.zeros((row_token.shape[0], x.shape[1]), x.dtype).at[row].set(
        x[order // top_k])
    hidden = _swiglu(jax.lax.ragged_dot(inputs, w["w1"], sizes),
                     jax.lax.ragged_dot(inputs, w["w3"], sizes))
    outputs = jax.lax.ragged_dot(hidden, w["w2"], sizes)[row]  # [T * k, d], by expert
    weighted = outputs * gates.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[order // top_k].add(weighted)


def _blockwise_loop(x, gates, chosen, w, block_size: int = BLOCK_SIZE):
    """The blocks as NxD's torch fallback runs them (ExpertMLPsV2.
    torch_blockwise_matmul_inference), one after another: each block gathers its rows of
    x [T, d] (a zero row for padding), indexes its expert's weights, runs the MLP, gathers
    its rows' routing weights and adds its weighted outputs into the result's rows."""
    tokens, top_k = chosen.shape
    experts = w["w1"].shape[0]
    _, _, _, block_expert, row_token = _block_layout(chosen, experts, block_size)
    # NxD's expert_affinities_masked [T + 1, E] and the inputs and output with an extra row
    # for the padding rows (augment_inputs_for_padded_blockwise_matmul)
    affinities = jnp.zeros((tokens + 1, experts), x.dtype).at[
        jnp.arange(tokens)[:, None], chosen].set(gates)
    padded_x = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])

    def block(b, out):  # NxD's Python loop, traced one block after another
        token = jax.lax.dynamic_slice_in_dim(row_token, b * block_size, block_size)
        expert = jax.lax.dynamic_slice_in_dim(block_expert, b, 1)
        h = padded_x[token]
        # mlp_op(h, expert_indices=[e]) indexes each weight by a tensor: a gather
        hidden = _swiglu(h @ w["w1"][expert][0], h @ w["w3"][expert][0])
        y = (hidden @ w["w2"][expert][0]) * affinities[token, expert][:, None]
        return out.at[token].set(out[token] + y)  # torch's output[token] += y

    out = jax.lax.fori_loop(0, block_expert.shape[0], block, jnp.zeros_like(padded_x))
    return out[:tokens]


def blockwise_kernel_accepts(d_model: int, block_size: int = BLOCK_SIZE) -> bool:
    """Whether NxD 0.15 runs the blockwise NKI kernel for this hidden size, as the Neuron
    compiler's check_blockwise_mm_kernel_compatibility (SDK 2.26) allows: block sizes
    128-1024, a hidden size of 4096-8192 in whole 512s; otherwise NxD falls back to its
    torch loop over the blocks (can_use_blockwise_matmul_nki; NxD 0.15's
    test_can_use_blockwise_nki.py: "unsupported hidden_size [4096, 8192]")."""
    return (block_size in (128, 256, 512, 1024) and 4096 <= d_model <= 8192
            and d_model % 512 == 0)


def experts_mlp(config: Moe, generating: bool, h, w):
    """The layer's routed experts over h [..., d], as ExpertMLPsV2.forward chooses them for
    a decode step (`generating`) or a prefill: this chip's partial sums (its slice of every
    expert's intermediate dim)."""
    x = h.reshape(-1, h.shape[-1])
    gates, chosen = _route(x, w["router"], config.top_k)
    tokens = x.shape[0]
    if tokens * config.top_k / config.experts < SELECTIVE_LOADING_THRESHOLD:
        out = _selective(x, gates, chosen, w)
    elif generating or tokens * config.top_k < BLOCK_SIZE:
        out = _all_experts(x, gates, chosen, w)
    elif blockwise_kernel_accepts(x.shape[1]):
        out = _blockwise(x, gates, chosen, w)
    else:
        out = _blockwise_loop(x, gates, chosen, w)
    return out.reshape(h.shape)


def decode_function(split: llama.Split, mesh):
    """One decode step as a shard_map over `mesh` (its tp axis), as llama.decode_step's
    (same arguments and results) with the experts as the MLP."""
    cache = P(None, None, None, TP)
    body = partial(llama._decode_body, split, mlp=partial(experts_mlp, split.config, True))
    specs = (_weight_specs(_weights(split)), cache, cache, P(), P())
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), cache, cache),
                         check_vma=False)


def decode_step(split: llama.Split, mesh, topology=None) -> jax_trn2.Jitted:
    """One decode step, as llama.decode_step with the experts as the MLP (the caches
    donated)."""
    return jax_trn2.jit(decode_function(split, mesh), donate_argnums=(1, 2),
                        topology=topology)


def decode_args(split: llama.Split, batch: int, bucket: int) -> tuple:
    """Shapes of a decode step's arguments: a cache of `bucket` positions."""
    return (_weights(split), *llama.decode_args(split, batch, bucket)[1:])


def prefill_function(split: llama.Split, mesh):
    """The prefill as a shard_map over `mesh` (its tp axis): (weights, tokens [B, T]) ->
    (first generated tokens [B], k cache, v cache), as llama.prefill's."""
    cache = P(None, None, None, TP)
    body = partial(llama._prefill_body, split, mlp=partial(experts_mlp, split.config, False))
    specs = (_weight_specs(_weights(split)), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), cache, cache),
                         check_vma=False)


def prefill(split: llama.Split, mesh, topology=None) -> jax_trn2.Jitted:
    """Prefill, as llama.prefill with the experts as the MLP."""
    return jax_trn2.jit(prefill_function(split, mesh), topology=topology)


def prefill_args(split: llama.Split, batch: int, length: int) -> tuple:
    """Shapes of a prefill's arguments: `length` prompt tokens per sequence."""
    return _weights(split), jax.ShapeDtypeStruct((batch, length), jnp.int32)
