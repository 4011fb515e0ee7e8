"""A decoder-only transformer written the MaxText way, shared by the examples that shard it
with NamedShardings (auto_sharding.py, plan_llama.py).

One `Decoder` configuration covers a GPT-style block (multi-head attention, GELU MLP, tied
embedding) and a Llama-3-style one (grouped-query attention with `kv_heads`, rotary
position embedding, SwiGLU MLP, separate output head). Parameters carry MaxText's logical
axis names; a layout maps them onto mesh axes. With `scan_layers` the layers are stacked
on a leading axis and run by `jax.lax.scan` (one loop body, as MaxText's scan_layers);
with `remat` each layer's activations are recomputed in the backward pass
(jax.checkpoint, MaxText's remat_policy "full").
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_trn2


@dataclass(frozen=True)
class Decoder:
    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int
    kv_heads: int | None = None  # grouped-query attention; None: as many as `heads`
    mlp: str = "gelu"  # "gelu" (two matrices) or "swiglu" (gate, up, down)
    tied_embedding: bool = True  # the output head is the embedding's transpose
    rope: bool = False  # rotary position embedding on q and k
    rope_theta: float = 500_000.0  # Llama 3
    scan_layers: bool = False
    remat: bool = False
    param_dtype: str = "bfloat16"  # float32 keeps master weights; compute is in bfloat16
    # "plain": attention written out (its scores in HBM); "flash": jax_trn2.flash_attention,
    # the fused kernel Trainium2 training runs (NKI's flash attention: scores in SBUF)
    attention: str = "plain"
    # Sharding of the [batch, seq, d_model] activations between layers (MaxText's
    # activation_batch/activation_embed constraints), so the partitioner keeps the batch
    # split; None leaves it to sharding propagation.
    activation_sharding: NamedSharding | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads

    def layer_shapes(self) -> dict:
        d, kv = self.d_model, self.n_kv * self.head_dim
        shapes = {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d),
                  "norm1": (d,), "norm2": (d,)}
        if self.mlp == "swiglu":
            shapes.update(w_gate=(d, self.d_ff), w_up=(d, self.d_ff), w_down=(self.d_ff, d))
        else:
            shapes.update(w_in=(d, self.d_ff), w_out=(self.d_ff, d))
        return shapes

    def param_count(self) -> int:
        per_layer = sum(int(np.prod(s)) for s in self.layer_shapes().values())
        head = 0 if self.tied_embedding else self.vocab * self.d_model
        return self.layers * per_layer + self.vocab * self.d_model + head + self.d_model


# Logical axes of each parameter, as MaxText names them; stacked layers add "layers" first.
PARAM_AXES = {"embedding": ("vocab", "embed"), "lm_head": ("embed", "vocab"),
              "wq": ("embed", "heads"), "wk": ("embed", "kv_heads"),
              "wv": ("embed", "kv_heads"), "wo": ("heads", "embed"),
              "w_in": ("embed", "mlp"), "w_out": ("mlp", "embed"),
              "w_gate": ("embed", "mlp"), "w_up": ("embed", "mlp"), "w_down": ("mlp", "embed"),
              "norm1": ("embed",), "norm2": ("embed",), "final_norm": ("embed",)}


def param_shapes(config: Decoder) -> dict:
    """The parameter pytree's shapes."""
    d = config.d_model
    shapes: dict = {"embedding": (config.vocab, d), "final_norm": (d,)}
    if not config.tied_embedding:
        shapes["lm_head"] = (d, config.vocab)
    layer = config.layer_shapes()
    shapes["layers"] = ({k: (config.layers,) + s for k, s in layer.items()}
                        if config.scan_layers else [dict(layer) for _ in range(config.layers)])
    return shapes


def init_params(config: Decoder, rng: np.random.Generator | None) -> dict:
    """Parameters: arrays from `rng`, or jax.ShapeDtypeStructs when rng is None."""
    dtype = jnp.dtype(config.param_dtype)

    def make(shape):
        if rng is None:
            return jax.ShapeDtypeStruct(shape, dtype)
        if len(shape) == 1 or (config.scan_layers and len(shape) == 2 and
                               shape[0] == config.layers and shape[1] == config.d_model):
            return jnp.ones(shape, dtype)
        return jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-2]), dtype)

    return jax.tree.map(make, param_shapes(config), is_leaf=lambda s: isinstance(s, tuple))


def param_shardings(params: dict, mesh, layout: dict) -> dict:
    """NamedShardings of the parameters: `layout` maps logical axes to mesh axes (None:
    replicated); "kv_heads" follows "heads" unless the layout names it."""
    def spec(path, leaf):
        axes = PARAM_AXES[path[-1].key]
        mapped = [layout.get(a, layout.get("heads")) if a == "kv_heads" else layout.get(a)
                  for a in axes]
        if len(leaf.shape) == len(axes) + 1:  # stacked layers
            mapped = [None] + mapped
        return NamedSharding(mesh, P(*mapped))
    return jax.tree_util.tree_map_with_path(spec, params)


def rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, -1, keepdims=True) + 1e-6)
            ).astype(x.dtype) * scale.astype(x.dtype)


def rotary(x, theta: float):
    """Rotary position embedding of x[b, s, h, d] (rotate-half form, as Llama)."""
    s, d = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float32) / d)
    angles = np.arange(s, dtype=np.float32)[:, None] * freqs[None, :]
    cos = jnp.asarray(np.cos(angles), x.dtype)[None, :, None, :]
    sin = jnp.asarray(np.sin(angles), x.dtype)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def constrain(x, config: Decoder):
    """x with the configured activation sharding, if any."""
    if config.activation_sharding is None:
        return x
    return jax.lax.with_sharding_constraint(x, config.activation_sharding)


def decoder_layer(x, p, config: Decoder):
    x = constrain(x, config)
    b, s, d = x.shape
    heads, kv, hd = config.heads, config.n_kv, config.head_dim
    p = jax.tree.map(lambda w: w.astype(x.dtype), p)
    h = rms_norm(x, p["norm1"])
    q = (h @ p["wq"]).reshape(b, s, heads, hd)
    k = (h @ p["wk"]).reshape(b, s, kv, hd)
    v = (h @ p["wv"]).reshape(b, s, kv, hd)
    if config.rope:
        q, k = rotary(q, config.rope_theta), rotary(k, config.rope_theta)
    if config.attention == "flash":
        attention = jax_trn2.flash_attention(q, k, v, causal=True).reshape(b, s, d)
    else:
        q = q.reshape(b, s, kv, heads // kv, hd)  # query groups share a key/value head
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32) / np.sqrt(hd)
        causal = jnp.tril(jnp.ones((s, s), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1).astype(x.dtype)
        attention = jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, d)
    x = constrain(x + attention @ p["wo"], config)
    h = rms_norm(x, p["norm2"])
    if config.mlp == "swiglu":
        return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
    return x + jax.nn.gelu(h @ p["w_in"]) @ p["w_out"]


def loss_fn(params, tokens, config: Decoder):
    compute = jnp.bfloat16
    x = constrain(params["embedding"][tokens[:, :-1]].astype(compute), config)
    layer = (lambda x, p: decoder_layer(x, p, config))
    if config.remat:
        layer = jax.checkpoint(layer)
    if config.scan_layers:
        x, _ = jax.lax.scan(lambda x, p: (layer(x, p), None), x, params["layers"])
    else:
        for p in params["layers"]:
            x = layer(x, p)
    x = constrain(x, config)
    head = params["embedding"].T if config.tied_embedding else params["lm_head"]
    logits = (rms_norm(x, params["final_norm"]) @ head.astype(compute)).astype(jnp.float32)
    labels = jax.nn.one_hot(tokens[:, 1:], logits.shape[-1], dtype=jnp.float32)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))


def make_step(config: Decoder, learning_rate: float = 0.01):
    """One SGD training step: (params, tokens) -> (new params, loss)."""
    def train_step(params, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, config)
        return jax.tree.map(lambda p, g: p - learning_rate * g.astype(p.dtype),
                            params, grads), loss
    return train_step


def make_adam_step(config: Decoder, learning_rate: float = 3e-4, b1: float = 0.9,
                   b2: float = 0.95, eps: float = 1e-8):
    """One AdamW-style training step (no weight decay, no bias correction: they change no
    shapes): (params, (m, v), tokens) -> (new params, (m, v), loss); moments in float32."""
    def train_step(params, moments, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, config)
        m, v = moments
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        params = jax.tree.map(
            lambda p, m, v: (p.astype(jnp.float32) - learning_rate * m / (jnp.sqrt(v) + eps)
                             ).astype(p.dtype), params, m, v)
        return params, (m, v), loss
    return train_step
