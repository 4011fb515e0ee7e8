"""Llama-style inference as it is served on Trainium2: prefill and one decode step, tensor
parallel over the chips of a mesh axis, written with shard_map.

The layout is the one NxD Inference uses on Trn2: attention heads and the MLP's hidden units
split over the tensor-parallel chips (column-parallel q, k, v and gate/up projections,
row-parallel output and down projections ending in a psum), key/value heads replicated when
there are fewer of them than chips, layers run by a scan over stacked weights, a KV cache
per layer. Prefill runs sequence-parallel between layers (activations split along the
sequence: an all-gather before each block, a reduce-scatter after it) and attention as the
fused flash-attention kernel (jax_trn2.flash_attention); decode reads the whole cache
bucket (a compiled graph's fixed length) with plain attention, masked past the position.

Only shapes matter for planning: `decode_args` and `prefill_args` give
jax.ShapeDtypeStructs of a configuration, so a 405B model is planned without allocating it.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2

TP = "tp"  # the mesh axis the model is split over


@dataclasses.dataclass(frozen=True)
class Llama:
    """A Llama-architecture decoder (grouped-query attention with rotary position
    embeddings, SwiGLU MLP, RMSNorm); `qk_norm` adds Qwen3's RMSNorm of each query and key
    head before the rotation."""

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    head_dim: int = 128
    rope_theta: float = 500000.0
    qk_norm: bool = False
    dtype: str = "bfloat16"

    def param_count(self) -> int:
        attention = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.d_model * self.d_ff
        norms = 2 * self.d_model + (2 * self.head_dim if self.qk_norm else 0)
        return self.layers * (attention + mlp + norms) + \
            2 * self.vocab * self.d_model + self.d_model


# Published architectures (the models' config.json files).
LLAMA_3_8B = Llama(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336, vocab=128256)
LLAMA_3_70B = Llama(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672, vocab=128256)
LLAMA_3_405B = Llama(layers=126, d_model=16384, heads=128, kv_heads=8, d_ff=53248,
                     vocab=128256)
QWEN_3_32B = Llama(layers=64, d_model=5120, heads=64, kv_heads=8, d_ff=25600, vocab=151936,
                   rope_theta=1000000.0, qk_norm=True)


@dataclasses.dataclass(frozen=True)
class Split:
    """How a configuration is cut over `chips` tensor-parallel chips."""

    config: Llama
    chips: int

    def __post_init__(self) -> None:
        c = self.config
        for name, n in (("d_ff", c.d_ff), ("vocab", c.vocab)):
            if n % self.chips:
                raise ValueError(f"{name}={n} does not split over {self.chips} chips")
        if max(c.kv_heads, self.chips) % min(c.kv_heads, self.chips):
            raise ValueError(f"kv_heads={c.kv_heads} and {self.chips} chips: one must divide "
                             "the other")

    @property
    def heads(self) -> int:
        """Query heads per chip: the heads padded with zero heads to a multiple of the chips
        when they do not split evenly, as NxD Inference pads them (attention/gqa.py,
        get_shardable_head_counts: Llama 4's 40 heads run as 64 at TP64)."""
        return -(-self.config.heads // self.chips)

    @property
    def kv_heads(self) -> int:
        """Key/value heads per chip: replicated, one per chip, when there are fewer than
        chips."""
        return max(1, self.config.kv_heads // self.chips)


def _weights(split: Split, *, stacked: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
    """Global shapes of the weights (one mesh-sized slice per chip along dim 1 or 2)."""
    c, n = split.config, split.chips
    dt = jnp.dtype(c.dtype)
    layer = {
        "wq": (c.d_model, n * split.heads * c.head_dim),
        "wk": (c.d_model, n * split.kv_heads * c.head_dim),
        "wv": (c.d_model, n * split.kv_heads * c.head_dim),
        "wo": (n * split.heads * c.head_dim, c.d_model),
        "w1": (c.d_model, c.d_ff), "w3": (c.d_model, c.d_ff), "w2": (c.d_ff, c.d_model),
        "norm1": (c.d_model,), "norm2": (c.d_model,),
    }
    if c.qk_norm:
        layer.update(q_norm=(c.head_dim,), k_norm=(c.head_dim,))
    weights = {k: jax.ShapeDtypeStruct((c.layers, *shape), dt) for k, shape in layer.items()}
    weights["embed"] = jax.ShapeDtypeStruct((c.vocab, c.d_model), dt)
    weights["head"] = jax.ShapeDtypeStruct((c.d_model, c.vocab), dt)
    weights["norm"] = jax.ShapeDtypeStruct((c.d_model,), dt)
    return weights


# How each weight is split over the TP chips (None: replicated).
WEIGHT_SPECS = {
    "wq": P(None, None, TP), "wk": P(None, None, TP), "wv": P(None, None, TP),
    "wo": P(None, TP, None), "w1": P(None, None, TP), "w3": P(None, None, TP),
    "w2": P(None, TP, None), "norm1": P(), "norm2": P(), "q_norm": P(), "k_norm": P(), "embed": P(), "head": P(None, TP),
    "norm": P(),
}


def _rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5)
    return (x32 * scale.astype(jnp.float32)).astype(x.dtype)


def _rotation(positions, config: Llama):
    """The rotary embedding's (cos, sin) [positions, 1, head_dim / 2] (Llama's and Qwen's: the
    two halves of each head turned by position / theta^(2i / head_dim)), computed once per
    step and shared by every layer, as Hugging Face's and NxD's models do."""
    half = config.head_dim // 2
    inverse_frequencies = config.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * inverse_frequencies
    return jnp.cos(angles)[:, None], jnp.sin(angles)[:, None]  # broadcast over the heads


def _rotary(x, rotation):
    """x [..., positions, heads, head_dim] rotated by `rotation` (_rotation's)."""
    cos, sin = rotation
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def _queries_and_keys(split: Split, h, w, rotation):
    """This chip's query and key heads of h [batch, positions, d], normalised (Qwen3) and
    rotated: ([batch, positions, heads, head_dim], [batch, positions, kv heads, head_dim])."""
    c = split.config
    batch, length = h.shape[:2]
    q = (h @ w["wq"]).reshape(batch, length, split.heads, c.head_dim)
    k = (h @ w["wk"]).reshape(batch, length, split.kv_heads, c.head_dim)
    if c.qk_norm:
        q, k = _rms_norm(q, w["q_norm"]), _rms_norm(k, w["k_norm"])
    return _rotary(q, rotation), _rotary(k, rotation)


def _mlp(h, layer):
    return (jax.nn.silu(h @ layer["w1"]) * (h @ layer["w3"])) @ layer["w2"]


def _next_token(x_last, weights):
    """Greedy sampling on the device: each chip's best token of its vocabulary slice, then
    the best of those."""
    logits = (_rms_norm(x_last, weights["norm"]) @ weights["head"]).astype(jnp.float32)
    best = jnp.max(logits, axis=-1)
    token = jnp.argmax(logits, axis=-1) + jax.lax.axis_index(TP) * logits.shape[-1]
    bests, tokens = jax.lax.all_gather(best, TP), jax.lax.all_gather(token, TP)
    return jnp.take_along_axis(tokens, jnp.argmax(bests, axis=0)[None], axis=0)[0]


def _decode_body(split: Split, weights, cache_k, cache_v, tokens, position, mlp=_mlp,
                 scan=jax.lax.scan):
    """One decode step; `scan(layer, carry, stacked)` runs the layers over the stacked
    weights (a model whose layers differ runs them in groups: moe.py), `layer(carry, w,
    mlp=...)` one layer with its MLP."""
    c = split.config
    x = weights["embed"][tokens]  # [B, d]
    batch = x.shape[0]
    group = split.heads // split.kv_heads
    visible = jnp.arange(cache_k.shape[2]) <= position  # the cache bucket, masked
    rotation = _rotation(position[None], c)

    def layer(carry, w, mlp=mlp):
        x, index, cache_k, cache_v = carry  # the caches carried: updated in place
        h = _rms_norm(x, w["norm1"])[:, None]  # [B, 1, d]: one new position
        q, k = _queries_and_keys(split, h, w, rotation)
        q = q.reshape(batch, split.kv_heads, group, c.head_dim)
        k = k.reshape(1, batch, 1, split.kv_heads, c.head_dim)
        v = (h @ w["wv"]).reshape(1, batch, 1, split.kv_heads, c.head_dim)
        cache_k = jax.lax.dynamic_update_slice(cache_k, k, (index, 0, position, 0, 0))
        cache_v = jax.lax.dynamic_update_slice(cache_v, v, (index, 0, position, 0, 0))
        keys, values = cache_k[index], cache_v[index]
        scores = jnp.einsum("bkgd,bskd->bkgs", q, keys,
                            preferred_element_type=jnp.float32) / np.sqrt(c.head_dim)
        probs = jax.nn.softmax(jnp.where(visible, scores, -1e30), axis=-1)
        attended = jnp.einsum("bkgs,bskd->bkgd", probs.astype(x.dtype), values)
        x = x + jax.lax.psum(attended.reshape(batch, -1) @ w["wo"], TP)
        x = x + jax.lax.psum(mlp(_rms_norm(x, w["norm2"]), w), TP)
        return (x, index + 1, cache_k, cache_v), None

    stacked = {k: v for k, v in weights.items() if k not in ("embed", "head", "norm")}
    (x, _, cache_k, cache_v), _ = scan(layer, (x, 0, cache_k, cache_v), stacked)
    return _next_token(x, weights), cache_k, cache_v


def _prefill_body(split: Split, weights, tokens, mlp=_mlp, scan=jax.lax.scan):
    """The prefill; `scan` and `layer` as _decode_body's (`layer(x, w, mlp=...)` returns the
    layer's keys and values beside x)."""
    c = split.config
    x = weights["embed"][tokens]  # [B, T/chips, d]: this chip's part of the sequence
    batch = x.shape[0]
    rotation = _rotation(jnp.arange(x.shape[1] * split.chips), c)  # the whole sequence's

    def gathered(h):  # the whole sequence, for a block
        return jax.lax.all_gather(h, TP, axis=1, tiled=True)

    def scattered(y):  # the block's sums, each chip keeping its part of the sequence
        return jax.lax.psum_scatter(y, TP, scatter_dimension=1, tiled=True)

    def layer(x, w, mlp=mlp):
        h = gathered(_rms_norm(x, w["norm1"]))
        length = h.shape[1]
        q, k = _queries_and_keys(split, h, w, rotation)
        v = (h @ w["wv"]).reshape(batch, length, split.kv_heads, c.head_dim)
        attended = jax_trn2.flash_attention(q, k, v, causal=True)
        x = x + scattered(attended.reshape(batch, length, -1) @ w["wo"])
        x = x + scattered(mlp(gathered(_rms_norm(x, w["norm2"])), w))
        return x, (k, v)

    stacked = {k: v for k, v in weights.items() if k not in ("embed", "head", "norm")}
    x, (cache_k, cache_v) = scan(layer, x, stacked)
    last = gathered(x)[:, -1]
    return _next_token(last, weights), cache_k, cache_v


def _weight_specs(weights) -> dict:
    return {k: WEIGHT_SPECS[k] for k in weights}


def decode_step(split: Split, mesh, topology=None) -> jax_trn2.Jitted:
    """One decode step: (weights, k cache, v cache, tokens [B], position) -> (next tokens,
    k cache, v cache), the caches [layers, B, bucket, chips x kv heads per chip, head_dim]
    split over the chips along their heads, donated and updated in place. `topology`: the
    machine (default: the one the mesh was made for; a mesh of one chip has none)."""
    cache = P(None, None, None, TP)
    body = partial(_decode_body, split)
    specs = (_weight_specs(_weights(split)), cache, cache, P(), P())
    f = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), cache, cache),
                      check_vma=False)
    return jax_trn2.jit(f, donate_argnums=(1, 2), topology=topology)


def decode_args(split: Split, batch: int, bucket: int) -> tuple:
    """Shapes of a decode step's arguments: a cache of `bucket` positions."""
    c = split.config
    cache = jax.ShapeDtypeStruct(
        (c.layers, batch, bucket, split.chips * split.kv_heads, c.head_dim), jnp.dtype(c.dtype))
    return (_weights(split), cache, cache, jax.ShapeDtypeStruct((batch,), jnp.int32),
            jax.ShapeDtypeStruct((), jnp.int32))


def prefill(split: Split, mesh, topology=None) -> jax_trn2.Jitted:
    """Prefill: (weights, tokens [B, T]) -> (first generated tokens [B], k cache, v cache),
    T a multiple of the chip count (a context bucket). `topology` as for decode_step."""
    cache = P(None, None, None, TP)
    body = partial(_prefill_body, split)
    specs = (_weight_specs(_weights(split)), P(None, TP))
    f = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), cache, cache),
                      check_vma=False)
    return jax_trn2.jit(f, topology=topology)


def prefill_args(split: Split, batch: int, length: int) -> tuple:
    """Shapes of a prefill's arguments: `length` prompt tokens per sequence."""
    return _weights(split), jax.ShapeDtypeStruct((batch, length), jnp.int32)
