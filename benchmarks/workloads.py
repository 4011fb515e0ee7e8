"""The benchmark workloads: each a shard_map program over a (4,4,4) mesh and its inputs.

A workload is built for a given mesh (jax_trn2.make_mesh() for the simulator, a mesh of 64
CPU host devices for JAX), so the very same program runs on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class Workload:
    name: str
    build: Callable  # build(mesh) -> function of the inputs
    inputs: Callable  # inputs(rng) -> tuple of arrays
    in_specs: tuple  # how the inputs are split over the mesh (for placing JAX's inputs)


def _normal(rng, shape, dtype=jnp.bfloat16, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


# --- tensor-parallel MLP, activations sharded over every axis ------------------------------

MLP_BATCH, MLP_D, MLP_H = 1024, 1024, 4096
MLP_SPECS = (P(("x", "z"), None), P(None, "y"), P("y", None))


def _mlp(mesh):
    def body(x, w1, w2):
        h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32))
        y = jnp.dot(h.astype(jnp.bfloat16), w2, preferred_element_type=jnp.float32)
        return jax.lax.psum(y, "y").astype(jnp.bfloat16)

    return jax.shard_map(body, mesh=mesh, in_specs=MLP_SPECS, out_specs=P(("x", "z"), None))


def _mlp_inputs(rng):
    return (_normal(rng, (MLP_BATCH, MLP_D)), _normal(rng, (MLP_D, MLP_H), scale=MLP_D ** -0.5),
            _normal(rng, (MLP_H, MLP_D), scale=MLP_H ** -0.5))


# --- transformer block: data parallel over x, tensor parallel over y, replicated over z ----

TB_BATCH, TB_SEQ, TB_D, TB_HEADS, TB_FF = 8, 128, 512, 8, 2048


def transformer_block_body(x, wqkv, wo, w1, w2):
    """One decoder block on one chip: heads and the MLP hidden dim are split over 'y'."""
    s = x.shape[1]
    ln = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
    qkv = jnp.einsum("bsd,tdhk->tbhsk", ln.astype(jnp.bfloat16), wqkv,
                     preferred_element_type=jnp.float32)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = jnp.einsum("bhqk,bhsk->bhqs", q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((s, s), bool))
    attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    ctx = jnp.einsum("bhqs,bhsk->bqhk", attn, v).astype(jnp.bfloat16)
    out = jnp.einsum("bqhk,hkd->bqd", ctx, wo, preferred_element_type=jnp.float32)
    x = x + jax.lax.psum(out, "y")
    h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x.astype(jnp.bfloat16), w1,
                               preferred_element_type=jnp.float32))
    y = jnp.einsum("bsf,fd->bsd", h.astype(jnp.bfloat16), w2, preferred_element_type=jnp.float32)
    return x + jax.lax.psum(y, "y")


BLOCK_SPECS = (P("x"), P(None, None, "y"), P("y"), P(None, "y"), P("y", None))


def _transformer(mesh, layers: int = 1):
    def body(x, wqkv, wo, w1, w2):
        for _ in range(layers):
            x = transformer_block_body(x, wqkv, wo, w1, w2)
        return x

    return jax.shard_map(body, mesh=mesh, in_specs=BLOCK_SPECS, out_specs=P("x"))


def _transformer_inputs(rng):
    hk = TB_D // TB_HEADS
    return (jnp.asarray(rng.standard_normal((TB_BATCH, TB_SEQ, TB_D)), jnp.float32),
            _normal(rng, (3, TB_D, TB_HEADS, hk), scale=TB_D ** -0.5),
            _normal(rng, (TB_HEADS, hk, TB_D), scale=TB_D ** -0.5),
            _normal(rng, (TB_D, TB_FF), scale=TB_D ** -0.5),
            _normal(rng, (TB_FF, TB_D), scale=TB_FF ** -0.5))


# --- FSDP step: all_gather weights, reduce_scatter gradients over all 64 chips -------------

FSDP_BATCH, FSDP_D = 512, 1024
ALL_AXES = ("x", "y", "z")
FSDP_SPECS = (P(ALL_AXES), P(ALL_AXES))


def _fsdp(mesh):
    def body(x, w_shard):
        w = jax.lax.all_gather(w_shard, ALL_AXES, axis=0, tiled=True)

        def loss(w):
            return jnp.mean(jnp.tanh(jnp.dot(x, w, preferred_element_type=jnp.float32)) ** 2)

        grad = jax.grad(loss)(w)
        return jax.lax.psum_scatter(grad, ALL_AXES, scatter_dimension=0, tiled=True)

    return jax.shard_map(body, mesh=mesh, in_specs=FSDP_SPECS,
                         out_specs=P(ALL_AXES))


def _fsdp_inputs(rng):
    return (_normal(rng, (FSDP_BATCH, FSDP_D)),
            jnp.asarray(rng.standard_normal((FSDP_D, FSDP_D)) * FSDP_D ** -0.5, jnp.float32))


# --- a ppermute ring loop along x -----------------------------------------------------------

RING_ROWS, RING_COLS, RING_STEPS = 256, 512, 8
RING_SPECS = (P("x", "y"),)


def _ring(mesh):
    shift = [(i, (i + 1) % 4) for i in range(4)]

    def body(x):
        def step(_, carry):
            acc, block = carry
            block = jax.lax.ppermute(block, "x", shift)
            return acc + jnp.tanh(block), block

        acc, _ = jax.lax.fori_loop(0, RING_STEPS, step, (jnp.zeros_like(x), x))
        return acc

    return jax.shard_map(body, mesh=mesh, in_specs=RING_SPECS, out_specs=P("x", "y"))


def _ring_inputs(rng):
    return (jnp.asarray(rng.standard_normal((RING_ROWS, RING_COLS)), jnp.float32),)


# --- mostly replicated: sharded over x only, so every value is the same on 16 chips --------

REP_BATCH, REP_D = 1024, 1024
REP_SPECS = (P("x"), P())


def _replicated(mesh):
    def body(x, w):
        for _ in range(4):
            x = jnp.tanh(jnp.dot(x, w, preferred_element_type=jnp.float32))
        return jax.lax.pmax(x, "x")

    return jax.shard_map(body, mesh=mesh, in_specs=REP_SPECS, out_specs=P())


def _replicated_inputs(rng):
    return (jnp.asarray(rng.standard_normal((REP_BATCH, REP_D)), jnp.float32),
            jnp.asarray(rng.standard_normal((REP_D, REP_D)) * REP_D ** -0.5, jnp.float32))


# --- small per-chip matmuls: a 2D-sharded x @ w, K split over y and summed by a psum -------
# Each chip multiplies a few hundred rows by a K x 512 block (K = 512..1024: 4 to 8 of the
# Tensor Engine's 128-long passes); x varies along x and y, w along y and z, so the 64 chips'
# products are 64 distinct small GEMMs. With the collective, the K-partial products are
# summed over the 4 chips of y (out: rows over x, columns over z); without, each chip's
# partial product is returned.

SMALL_N = 512


def _small_matmul(rows: int, k: int, dtype, psum: bool) -> Workload:
    specs = (P("x", "y"), P("y", "z"))
    out_spec = P("x", "z") if psum else P("x", ("y", "z"))

    def build(mesh):
        def body(x, w):
            y = jnp.dot(x, w, preferred_element_type=jnp.float32)
            return (jax.lax.psum(y, "y") if psum else y).astype(dtype)

        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec)

    def inputs(rng):
        return (_normal(rng, (4 * rows, 4 * k), dtype),
                _normal(rng, (4 * k, 4 * SMALL_N), dtype, scale=(4 * k) ** -0.5))

    short = {"bfloat16": "bf16", "float32": "fp32"}[jnp.dtype(dtype).name]
    name = f"small_mm_{short}_{rows}x{k}" + ("_psum" if psum else "")
    return Workload(name, build, inputs, specs)


WORKLOADS = (
    Workload("tp_mlp_bf16", _mlp, _mlp_inputs, MLP_SPECS),
    Workload("transformer_block", _transformer, _transformer_inputs, BLOCK_SPECS),
    Workload("fsdp_step", _fsdp, _fsdp_inputs, FSDP_SPECS),
    Workload("ppermute_ring_loop", _ring, _ring_inputs, RING_SPECS),
    Workload("mostly_replicated", _replicated, _replicated_inputs, REP_SPECS),
    _small_matmul(256, 512, jnp.bfloat16, psum=True),
    _small_matmul(512, 1024, jnp.bfloat16, psum=True),
    _small_matmul(256, 512, jnp.float32, psum=True),
    _small_matmul(512, 1024, jnp.float32, psum=True),
    _small_matmul(384, 768, jnp.bfloat16, psum=False),
    _small_matmul(384, 768, jnp.float32, psum=False),
)

STACK_LAYERS = 12
TRANSFORMER_STACK = Workload(f"transformer_x{STACK_LAYERS}",
                             lambda mesh: _transformer(mesh, STACK_LAYERS), _transformer_inputs,
                             BLOCK_SPECS)
