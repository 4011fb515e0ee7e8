"""Mixture-of-experts decoders (Qwen3-MoE, Llama 4) as NxD Inference serves them on
Trainium2: llama.py's decoder (attention, norms, KV cache, tensor-parallel layout,
sequence-parallel prefill) with the MLP of each MoE layer replaced by routed experts (and a
shared expert, and dense layers between the MoE ones, where the model has them).

The experts run as NxD's ExpertMLPsV2 runs them with its default BlockwiseMatmulConfig and
no expert parallelism (neuronx-distributed 0.15, Neuron SDK 2.26,
src/neuronx_distributed/modules/moe/expert_mlps_v2.py, ExpertMLPsV2.forward; optimum-neuron
builds Qwen3-MoE's experts with ExpertMLPs, a subclass with the same forward, and Llama 4's
with ExpertMLPsV2):
- every expert's intermediate dimension split over the tensor-parallel chips, its gate and
  up projections in one weight, the router replicated, the layer's partial sums added over
  the chips (psum) as a dense MLP's are;
- the router as `Moe.router` says (Qwen3: softmax, the top k renormalized; Llama 4: the
  sigmoid of the top 1's logit, which scales the expert's input);
- with T tokens, top k and E experts, "load" = T * k / E (the selective-loading threshold,
  DEFAULT_SELECTIVE_LOADING_THRESHOLD, is 1.0):
  - load < 1 (a decode step of a small batch): selective loading, one token after another
    (NxD's Python loop), each token's k experts' weights gathered and applied to it alone;
  - decode with load >= 1, or a prefill with T * k below the block size: every expert over
    every token, the experts' outputs added into the result one expert after another
    (NxD's Python loop), each weighted by the routing weights (zero for experts not chosen);
  - a prefill otherwise: blockwise, the (token, expert) pairs sorted by expert into
    N = ceil((T*k - (E-1)) / B) + E - 1 blocks of B = 512 rows (DEFAULT_BLOCK_SIZE), each
    expert's rows padded to whole blocks, the blocks' rows through their expert's MLP.
    With a hidden size the blockwise NKI kernel accepts (4096-8192) a `jax.lax.ragged_dot`
    over the N * B rows with each expert's group its blocks; with any other, NxD's torch
    fallback: a loop over the blocks, one after another (`blockwise_kernel_accepts`).
    The kernel's own schedule (its blocks one after another, each loading its rows and its
    expert's weights) is not modelled.

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
    """A decoder whose MoE layers' MLP is `experts` SwiGLU experts of intermediate size
    `d_ff` (moe_intermediate_size), `top_k` of them per token.

    The router (`router`): "softmax" over all experts in FP32, the top k renormalized to
    sum to 1 (Qwen3-MoE: normalize_top_k_affinities); or "sigmoid" of each expert's logit,
    the top k's taken as they are (Llama 4: NxD's RouterTopK with act_fn="sigmoid").
    `early_affinity`: each token's input is scaled by its routing weight before the expert
    and the experts' outputs added unweighted (Llama 4: NxD's
    early_expert_affinity_modulation); otherwise the outputs are weighted. `shared_d_ff`: a
    shared expert of that intermediate size beside the routed ones (0: none). `moe_every`:
    every moe_every-th layer is MoE (the last of each group of that many), the others dense
    with intermediate size `dense_d_ff` (Llama 4 Maverick: interleave_moe_layer_step 2)."""

    experts: int = 1
    top_k: int = 1
    router: str = "softmax"
    early_affinity: bool = False
    shared_d_ff: int = 0
    moe_every: int = 1
    dense_d_ff: int = 0

    def __post_init__(self) -> None:
        if self.router not in ("softmax", "sigmoid"):
            raise ValueError(f"router={self.router!r}: 'softmax' or 'sigmoid'")
        if self.layers % self.moe_every:
            raise ValueError(f"layers={self.layers} is not a whole number of groups of "
                             f"moe_every={self.moe_every}")
        if self.moe_every > 1 and not self.dense_d_ff:
            raise ValueError(f"moe_every={self.moe_every} needs dense_d_ff, the intermediate "
                             "size of the dense layers between the MoE ones")

    @property
    def moe_layers(self) -> int:
        return self.layers // self.moe_every

    def param_count(self) -> int:
        attention_and_norms = dataclasses.replace(self, d_ff=0)
        routed = self.experts * 3 * self.d_model * self.d_ff + self.d_model * self.experts
        shared = 3 * self.d_model * self.shared_d_ff
        dense = 3 * self.d_model * self.dense_d_ff
        return (llama.Llama.param_count(attention_and_norms)
                + self.moe_layers * (routed + shared)
                + (self.layers - self.moe_layers) * dense)


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
# meta-llama/Llama-4-Scout-17B-16E-Instruct (text_config): hidden_size 5120,
# num_hidden_layers 48, num_attention_heads 40, num_key_value_heads 8, head_dim 128,
# num_local_experts 16, num_experts_per_tok 1, intermediate_size 8192 (each expert's and the
# shared expert's), interleave_moe_layer_step 1, vocab_size 202048, rope_theta 5e5.
# Left out (no cost beyond a layer's elementwise work): its NoPE layers (every 4th without
# rotation), the L2 norm of q and k in the others, attention chunked at 8,192 positions.
LLAMA_4_SCOUT = Moe(layers=48, d_model=5120, heads=40, kv_heads=8, d_ff=8192, vocab=202048,
                    experts=16, top_k=1, router="sigmoid", early_affinity=True,
                    shared_d_ff=8192)
# meta-llama/Llama-4-Maverick-17B-128E-Instruct: as Scout with 128 experts on every second
# layer (interleave_moe_layer_step 2) and dense layers of intermediate_size_mlp 16384.
LLAMA_4_MAVERICK = dataclasses.replace(LLAMA_4_SCOUT, experts=128, moe_every=2,
                                       dense_d_ff=16384)

# How the expert weights are split over the TP chips: each expert's intermediate dim.
# The experts' weights as NxD fuses and splits them (ExpertFusedColumnParallelLinear and
# ExpertFusedRowParallelLinear): gate and up projections in one [E, d, 2, d_ff] weight, each
# expert's intermediate dim split over the chips; the shared expert's and the dense layers'
# MLPs as llama.py splits a dense MLP.
EXPERT_SPECS = {"gate_up": P(None, None, None, None, TP), "down": P(None, None, TP, None),
                "router": P(),
                "shared_w1": P(None, None, TP), "shared_w3": P(None, None, TP),
                "shared_w2": P(None, TP, None), "dense_w1": P(None, None, TP),
                "dense_w3": P(None, None, TP), "dense_w2": P(None, TP, None)}


def _mlp_shapes(layers: int, d_model: int, d_ff: int, prefix: str) -> dict[str, tuple]:
    return {f"{prefix}w1": (layers, d_model, d_ff), f"{prefix}w3": (layers, d_model, d_ff),
            f"{prefix}w2": (layers, d_ff, d_model)}


def _weights(split: llama.Split) -> dict[str, jax.ShapeDtypeStruct]:
    """llama.py's weights (attention and norms of every layer) with the MLP's replaced by
    the MoE layers' experts, router and shared expert, and the dense layers' MLPs
    (dense_w1, ...) when MoE layers are interleaved with dense ones."""
    c = split.config
    dt = jnp.dtype(c.dtype)
    weights = {name: v for name, v in llama._weights(split).items()
               if name not in ("w1", "w3", "w2")}
    shapes = {"gate_up": (c.moe_layers, c.experts, c.d_model, 2, c.d_ff),
              "down": (c.moe_layers, c.experts, c.d_ff, c.d_model),
              "router": (c.moe_layers, c.d_model, c.experts)}
    if c.shared_d_ff:
        shapes.update(_mlp_shapes(c.moe_layers, c.d_model, c.shared_d_ff, "shared_"))
    if c.moe_every > 1:
        shapes.update(_mlp_shapes(c.layers - c.moe_layers, c.d_model, c.dense_d_ff, "dense_"))
    weights.update({name: jax.ShapeDtypeStruct(shape, dt) for name, shape in shapes.items()})
    return weights


def _weight_specs(weights) -> dict:
    return {k: EXPERT_SPECS.get(k, llama.WEIGHT_SPECS.get(k)) for k in weights}


def _route(config: Moe, x, router):
    """(routing weights [T, k] in x's dtype, chosen experts [T, k]), in FP32: the softmax
    over all experts with the top k renormalized, or the sigmoid of the top k logits
    (Moe.router)."""
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
    if config.router == "sigmoid":
        top, chosen = jax.lax.top_k(logits, config.top_k)
        return jax.nn.sigmoid(top).astype(x.dtype), chosen
    gates, chosen = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), config.top_k)
    return (gates / jnp.sum(gates, axis=-1, keepdims=True)).astype(x.dtype), chosen


def _swiglu(gate_up):
    """SwiGLU of fused gate and up projections [..., 2, d_ff]."""
    return jax.nn.silu(gate_up[..., 0, :]) * gate_up[..., 1, :]


def _all_experts(x, gates, chosen, w, early: bool):
    """Every expert over every token [T, d], as ExpertMLPsV2.forward_all_experts runs
    them: the experts' outputs [E, T, d], then added into the result one expert after
    another, each weighted by the tokens' routing weights for it (zero if not chosen); or,
    `early` (top 1 only), the input weighted by each token's routing weight and the outputs
    masked by the choice."""
    experts = w["gate_up"].shape[0]
    chosen_mask = jax.nn.one_hot(chosen, experts, dtype=x.dtype)  # [T, k, E]
    weights = jnp.sum(chosen_mask * gates[..., None], axis=1)  # [T, E]
    if early:
        x, weights = x * gates, jnp.sum(chosen_mask, axis=1)
    hidden = _swiglu(jnp.einsum("td,edgf->etgf", x, w["gate_up"]))
    outputs = jnp.einsum("etf,efd->etd", hidden, w["down"])
    out = jnp.zeros_like(x)
    for e in range(experts):  # NxD's Python loop: `output += mlp_output[e] * mask[:, e]`
        out = out + outputs[e] * weights[:, e, None]
    return out


def _selective(x, gates, chosen, w, early: bool):
    """Each token [T, d] through its k experts alone, one token after another as
    ExpertMLPsV2.forward_selective_loading's Python loop runs them: the token's experts'
    weights gathered, its outputs weighted by its routing weights (`early`: its inputs)."""
    outputs = []
    for t in range(x.shape[0]):
        experts, token_gates = chosen[t], gates[t][:, None]  # [k], [k, 1]
        inputs = x[t] * token_gates if early else jnp.broadcast_to(x[t], (len(experts),
                                                                          x.shape[1]))
        hidden = _swiglu(jnp.einsum("kd,kdgf->kgf", inputs, w["gate_up"][experts]))
        y = jnp.einsum("kf,kfd->kd", hidden, w["down"][experts])
        outputs.append(jnp.sum(y if early else y * token_gates, axis=0))
    return jnp.stack(outputs)


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


def _blockwise(x, gates, chosen, w, early: bool, block_size: int = BLOCK_SIZE):
    """The blocks as the blockwise NKI kernel runs them, as one grouped matmul: the
    (token, expert) pairs of x [T, d] scattered into N blocks of `block_size` rows (unused
    rows zero), the rows through their expert's MLP, then each token's k outputs weighted
    (or, `early`, the rows weighted on the way in: the kernel's PRE_SCALE) and added."""
    tokens, top_k = chosen.shape
    experts, d_model, _, d_ff = w["gate_up"].shape
    order, row, sizes, _, row_token = _block_layout(chosen, experts, block_size)
    pair_gates = gates.reshape(-1)[order][:, None]  # [T * k, 1], by expert
    pairs = x[order // top_k] * pair_gates if early else x[order // top_k]
    inputs = jnp.zeros((row_token.shape[0], x.shape[1]), x.dtype).at[row].set(pairs)
    gate_up = w["gate_up"].reshape(experts, d_model, 2 * d_ff)
    hidden = _swiglu(jax.lax.ragged_dot(inputs, gate_up, sizes).reshape(-1, 2, d_ff))
    outputs = jax.lax.ragged_dot(hidden, w["down"], sizes)[row]  # [T * k, d], by expert
    weighted = outputs if early else outputs * pair_gates
    return jnp.zeros_like(x).at[order // top_k].add(weighted)


def _blockwise_loop(x, gates, chosen, w, early: bool, block_size: int = BLOCK_SIZE):
    """The blocks as NxD's torch fallback runs them (ExpertMLPsV2.
    torch_blockwise_matmul_inference), one after another: each block gathers its rows of
    x [T, d] (a zero row for padding), indexes its expert's weights, runs the MLP, gathers
    its rows' routing weights and adds its weighted outputs into the result's rows
    (`early`: weights the rows going in instead)."""
    tokens, top_k = chosen.shape
    experts = w["gate_up"].shape[0]
    _, _, _, block_expert, row_token = _block_layout(chosen, experts, block_size)
    # NxD's expert_affinities_masked [T + 1, E] and the inputs and output with an extra row
    # for the padding rows (augment_inputs_for_padded_blockwise_matmul)
    affinities = jnp.zeros((tokens + 1, experts), x.dtype).at[
        jnp.arange(tokens)[:, None], chosen].set(gates)
    padded_x = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])

    def block(b, out):  # NxD's Python loop, traced one block after another
        token = jax.lax.dynamic_slice_in_dim(row_token, b * block_size, block_size)
        expert = jax.lax.dynamic_slice_in_dim(block_expert, b, 1)
        h, row_gates = padded_x[token], affinities[token, expert][:, None]
        if early:
            h = h * row_gates
        # mlp_op(h, expert_indices=[e]) indexes each weight by a tensor: a gather
        hidden = _swiglu(jnp.einsum("bd,dgf->bgf", h, w["gate_up"][expert][0]))
        y = hidden @ w["down"][expert][0]
        if not early:
            y = y * row_gates
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
    a decode step (`generating`) or a prefill, and its shared expert if it has one: this
    chip's partial sums (its slice of every expert's intermediate dim)."""
    x = h.reshape(-1, h.shape[-1])
    gates, chosen = _route(config, x, w["router"])
    tokens = x.shape[0]
    if tokens * config.top_k / config.experts < SELECTIVE_LOADING_THRESHOLD:
        path = _selective
    elif generating or tokens * config.top_k < BLOCK_SIZE:
        path = _all_experts
    elif blockwise_kernel_accepts(x.shape[1]):
        path = _blockwise
    else:
        path = _blockwise_loop
    out = path(x, gates, chosen, w, config.early_affinity).reshape(h.shape)
    if config.shared_d_ff:
        out = out + llama._mlp(h, _renamed(w, "shared_"))
    return out


def _renamed(w: dict, prefix: str) -> dict:
    """The MLP weights named `prefix`w1, ... as llama._mlp's w1, w3, w2."""
    return {name: w[prefix + name] for name in ("w1", "w3", "w2")}


def _interleaved_scan(config: Moe, generating: bool, layer, carry, stacked):
    """The layers of a model with dense layers between its MoE ones, as a scan over groups
    of moe_every layers: the group's dense layers, then its MoE layer (`layer` and the
    arguments as llama._prefill_body's and _decode_body's `scan`). The per-layer results
    (a prefill's keys and values) come back one per layer, in order."""
    every = config.moe_every
    moe_layer = {n: v for n, v in stacked.items()
                 if n in ("gate_up", "down", "router") or n.startswith("shared_")}
    dense_mlps = {n.removeprefix("dense_"): v.reshape(-1, every - 1, *v.shape[1:])
                  for n, v in stacked.items() if n.startswith("dense_")}
    every_layer = {n: v.reshape(-1, every, *v.shape[1:]) for n, v in stacked.items()
                   if n not in moe_layer and not n.startswith("dense_")}

    def group(carry, w):
        every_layer, dense_mlps, moe_layer = w
        outputs = []
        for k in range(every):
            own = {n: v[k] for n, v in every_layer.items()}
            if k < every - 1:
                own.update({n: v[k] for n, v in dense_mlps.items()})
                carry, out = layer(carry, own, mlp=llama._mlp)
            else:
                carry, out = layer(carry, {**own, **moe_layer},
                                   mlp=partial(experts_mlp, config, generating))
            outputs.append(out)
        return carry, jax.tree.map(lambda *per: jnp.stack(per), *outputs)

    carry, outputs = jax.lax.scan(group, carry, (every_layer, dense_mlps, moe_layer))
    return carry, jax.tree.map(lambda v: v.reshape(-1, *v.shape[2:]), outputs)


def _layers(config: Moe, generating: bool) -> dict:
    """llama's body arguments that run `config`'s layers: its MLP, and its scan when dense
    layers are interleaved with the MoE ones."""
    mlp = partial(experts_mlp, config, generating)
    if config.moe_every == 1:
        return {"mlp": mlp}
    return {"mlp": mlp, "scan": partial(_interleaved_scan, config, generating)}


def decode_function(split: llama.Split, mesh):
    """One decode step as a shard_map over `mesh` (its tp axis), as llama.decode_step's
    (same arguments and results) with the experts as the MLP."""
    cache = P(None, None, None, TP)
    body = partial(llama._decode_body, split, **_layers(split.config, True))
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
    body = partial(llama._prefill_body, split, **_layers(split.config, False))
    specs = (_weight_specs(_weights(split)), P(None, TP))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), cache, cache),
                         check_vma=False)


def prefill(split: llama.Split, mesh, topology=None) -> jax_trn2.Jitted:
    """Prefill, as llama.prefill with the experts as the MLP."""
    return jax_trn2.jit(prefill_function(split, mesh), topology=topology)


def prefill_args(split: llama.Split, batch: int, length: int) -> tuple:
    """Shapes of a prefill's arguments: `length` prompt tokens per sequence."""
    return _weights(split), jax.ShapeDtypeStruct((batch, length), jnp.int32)
