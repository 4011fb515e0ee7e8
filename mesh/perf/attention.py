"""Attention as Trainium2 users run it: a fused flash-attention kernel (NKI's), costed as one.

`jax_trn2.flash_attention` marks attention as a `stablehlo.composite` named FLASH_ATTENTION
(and its gradient FLASH_ATTENTION_GRAD); the simulator computes it by its decomposition
(jax.nn.dot_product_attention), and the cost model costs it as the kernel runs:

- the scores and probabilities never reach HBM: each 128-query block of a head streams the
  head's keys and values through SBUF, so HBM traffic is the inputs read once (keys and
  values again for each group of query blocks when a head's keys and values do not fit in
  half a core's SBUF) and the outputs written once;
- the Tensor Engine computes Q K^T and P V (4 E H FLOPs for E scores of head size H; a causal
  mask skips the blocks above the diagonal), the Scalar Engine one exp per score and the
  Vector Engine one pass per score for the running row maximum, all at once, on tiles in
  SBUF: the kernel takes as long as its busiest engine (or HBM);
- the gradient recomputes the scores and probabilities (one exp per score), runs five
  matmuls (S, dP, dV, dQ, dK: 10 E H FLOPs) and two Vector passes per score (dS = P (dP -
  rowsum(dO O))).
Engine rates and per-instruction costs are mesh.perf.cost's (engine_op, the chip's peak).
"""

from __future__ import annotations

import math

import numpy as np

from mesh import dtypes, isa
from mesh.fused_kernels import FLASH_ATTENTION, FLASH_ATTENTION_GRAD
from mesh.perf.cost import Cost, CostContext, _peak, engine_op, fused_kernel

# (matmul FLOPs per score per head dimension, Scalar passes per score, Vector passes per
# score) of the forward and backward kernels (module doc).
FORWARD = (4, 1, 1)
BACKWARD = (10, 1, 2)


def _causal(instr: isa.Instruction) -> bool:
    return "causal=True" in instr.attributes


def scores(q: isa.TensorType, k: isa.TensorType, causal: bool) -> float:
    """Scores a chip computes for q [B, T, N, H] against k [B, S, K, H]: B N T S, and under a
    causal mask (query i sees the keys up to S - T + i) only those on or below the diagonal."""
    batch, t, heads, _ = q.shape
    s = k.shape[1]
    seen = np.clip(s - t + np.arange(t) + 1, 0, s).sum() if causal else t * s
    return float(batch * heads * seen)


def _kernel_cost(instr: isa.Instruction, ctx: CostContext, passes: tuple[int, int, int],
                 reads: tuple[int, ...], writes: tuple[int, ...]) -> Cost:
    q, k = ctx.type(instr.ins[0]), ctx.type(instr.ins[1])
    flops_per, exps_per, vector_per = passes
    e = scores(q, k, _causal(instr))
    head = q.shape[-1]
    flops = flops_per * e * head
    tensor = flops / _peak(q.dtype, ctx.chip)
    # a head's keys and values stay in half a core's SBUF while its queries stream past
    kv_bytes = 2 * math.prod(k.shape[1:2] + k.shape[3:]) * dtypes.itemsize(k.dtype)
    rereads = max(1, math.ceil(kv_bytes / (ctx.chip.sbuf_bytes_per_core / 2)))
    nbytes = ctx.nbytes([instr.ins[i] for i in reads]) + \
        (rereads - 1) * ctx.nbytes(instr.ins[1:3]) + ctx.nbytes([instr.outs[i] for i in writes])
    exps = engine_op(isa.SCALAR, int(e), 0, ctx, transcendentals=e, passes=exps_per)
    vector = engine_op(isa.VECTOR, int(e), 0, ctx, passes=vector_per)
    hbm = ctx.hbm_seconds(nbytes)
    busy = {isa.TENSOR: ctx.runtime.warm_compute_seconds(tensor), isa.SCALAR: exps.seconds,
            isa.VECTOR: vector.seconds}
    seconds = max(max(busy.values()), hbm) + ctx.dma_latency(nbytes)
    engines = {name: t for name, t in busy.items()}
    engines[isa.TENSOR] = seconds  # the kernel holds the Tensor Engine's queue throughout
    if hbm:
        engines[isa.DMA] = hbm
    return Cost(flops=flops, transcendentals=e * exps_per, bytes_accessed=nbytes,
                seconds=seconds, engine_seconds=engines, peak_seconds=tensor)


@fused_kernel(FLASH_ATTENTION, isa.TENSOR)
def _flash_attention(instr, ctx: CostContext) -> Cost:
    """ins (q, k, v) -> (o,)."""
    return _kernel_cost(instr, ctx, FORWARD, reads=(0, 1, 2), writes=(0,))


@fused_kernel(FLASH_ATTENTION_GRAD, isa.TENSOR)
def _flash_attention_grad(instr, ctx: CostContext) -> Cost:
    """ins (q, k, v, do) -> (dq, dk, dv)."""
    return _kernel_cost(instr, ctx, BACKWARD, reads=(0, 1, 2, 3), writes=(0, 1, 2))
