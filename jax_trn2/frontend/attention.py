"""Attention the way Trainium2 runs it: one fused kernel (NKI's flash attention).

`flash_attention(q, k, v)` computes exactly `jax.nn.dot_product_attention(q, k, v)`, on the
simulated chips and on any other backend, but marks it (a `stablehlo.composite`) so that
the cost model and the HBM accounting treat it as the fused kernel Trainium2 users run:
scores kept in SBUF, never in HBM (mesh.perf.attention). Its gradient is marked the same
way, as the kernel's backward pass. Naive attention, written out, is costed op by op and
materialises its scores: at long sequence lengths its time and HBM are the scores'.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from mesh.fused_kernels import FLASH_ATTENTION, FLASH_ATTENTION_GRAD


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
                    scale: float | None = None) -> jax.Array:
    """Scaled dot-product attention as one fused kernel.

    q: [batch, queries, heads, head_dim]; k, v: [batch, keys, kv_heads, head_dim], with
    heads a multiple of kv_heads (grouped-query attention), as jax.nn.dot_product_attention
    takes them. `causal` masks keys after each query (query i of T sees the keys up to
    S - T + i); `scale` multiplies the scores (default 1/sqrt(head_dim)). Differentiable.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if np.ndim(x) != 4:
            raise ValueError(f"flash_attention: {name} must be [batch, length, heads, "
                             f"head_dim], got shape {np.shape(x)}")
    if scale is None:
        scale = 1.0 / float(np.sqrt(np.shape(q)[-1]))
    return _attention(q, k, v, bool(causal), float(scale))


def _reference(q, k, v, *, causal: bool, scale: float):
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attention(q, k, v, causal: bool, scale: float):
    return jax.lax.composite(_reference, name=FLASH_ATTENTION)(q, k, v, causal=causal,
                                                                scale=scale)


def _forward(q, k, v, causal: bool, scale: float):
    return _attention(q, k, v, causal, scale), (q, k, v)


def _gradient(q, k, v, g, *, causal: bool, scale: float):
    _, vjp = jax.vjp(functools.partial(_reference, causal=causal, scale=scale), q, k, v)
    return vjp(g)


def _backward(causal: bool, scale: float, residuals, g):
    q, k, v = residuals
    return jax.lax.composite(_gradient, name=FLASH_ATTENTION_GRAD)(q, k, v, g, causal=causal,
                                                                    scale=scale)


_attention.defvjp(_forward, _backward)
