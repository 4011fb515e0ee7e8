"""Inspect a transformer block on the simulated 64-chip Trn2-Ultra (4x4x4 torus).

Data parallel over 'x' (the batch), Megatron tensor parallel over 'y' (attention heads and
the MLP's hidden units; one psum over 'y' after the attention output projection and one
after the MLP), replicated over 'z'. BF16 weights and activations, FP32 accumulation and
softmax. Nothing is run: the arguments are shapes, and the program is lowered, mapped onto
the machine and estimated.

    python examples/inspect_program.py [trace.json]

prints the Trn2 listing with an estimated time on every instruction, the cost summary, and
writes the timeline for Perfetto (ui.perfetto.dev) or chrome://tracing.
"""

import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jax_trn2

BATCH, SEQ, D_MODEL, HEADS, D_HEAD, D_FF = 16, 1024, 4096, 32, 128, 16384
TRACE_CHIPS = range(4)  # a few chips keep the file small; every chip has the same timeline


def layer_norm(x, scale):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-5) * scale).astype(jnp.bfloat16)


def dense(x, w):
    return jnp.einsum("bsd,df->bsf", x, w, preferred_element_type=jnp.float32)


def attention(h, wq, wk, wv):
    """Causal multi-head attention over this chip's heads."""
    b, s, _ = h.shape
    heads = wq.shape[1] // D_HEAD
    q, k, v = (dense(h, w).astype(jnp.bfloat16).reshape(b, s, heads, D_HEAD)
               for w in (wq, wk, wv))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores / jnp.sqrt(D_HEAD).astype(jnp.float32), -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(jnp.bfloat16)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v, preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16).reshape(b, s, heads * D_HEAD)


def block(x, ln1, wq, wk, wv, wo, ln2, w1, w2):
    """One chip's share: its batch rows (x) and its heads and hidden units (y)."""
    h = attention(layer_norm(x, ln1), wq, wk, wv)
    x = x + jax.lax.psum(dense(h, wo).astype(jnp.bfloat16), "y")  # partial sums in BF16
    u = jax.nn.gelu(dense(layer_norm(x, ln2), w1)).astype(jnp.bfloat16)
    return x + jax.lax.psum(dense(u, w2).astype(jnp.bfloat16), "y")


def main(trace_path: str = "transformer_block_trace.json") -> None:
    mesh = jax_trn2.make_mesh()  # ('x', 'y', 'z') = (4, 4, 4) on the 3D torus
    cols, rows = P(None, "y"), P("y", None)
    step = jax_trn2.jit(jax.shard_map(
        block, mesh=mesh,
        in_specs=(P("x"), P(), cols, cols, cols, rows, P(), cols, rows),
        out_specs=P("x")))
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    args = (bf16(BATCH, SEQ, D_MODEL), jax.ShapeDtypeStruct((D_MODEL,), jnp.float32),
            bf16(D_MODEL, HEADS * D_HEAD), bf16(D_MODEL, HEADS * D_HEAD),
            bf16(D_MODEL, HEADS * D_HEAD), bf16(HEADS * D_HEAD, D_MODEL),
            jax.ShapeDtypeStruct((D_MODEL,), jnp.float32), bf16(D_MODEL, D_FF), bf16(D_FF, D_MODEL))

    compiled = step.lower(*args).compile()
    print(compiled.as_text())
    cost = compiled.cost_analysis()
    print(f"\ncost_analysis (per chip): flops {cost['flops']:.4g}, bytes accessed "
          f"{cost['bytes accessed']:.4g}, transcendentals {cost['transcendentals']:.4g}, "
          f"optimal_seconds {cost['optimal_seconds']:.4g}; MFU {cost['trn2']['mfu']:.1%}")
    compiled.save_trace(trace_path, chips=TRACE_CHIPS)
    print(f"timeline of chips {list(TRACE_CHIPS)} written to {trace_path} "
          "(open in ui.perfetto.dev or chrome://tracing)")


if __name__ == "__main__":
    main(*sys.argv[1:])
