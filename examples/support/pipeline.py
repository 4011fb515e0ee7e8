"""Pipeline-parallel training steps written in JAX with shard_map and ppermute: GPipe and
1F1B, over the `pp` axis of a mesh, for a stack of tanh layers.

The model is `stages x layers` dense layers y = tanh(x @ W) of width `width`; stage s (the
chip at position s of `pp`) holds layers s*layers .. (s+1)*layers - 1. A step takes the
weights [stages, layers, width, width] (split over `pp`) and `microbatches` microbatches
[microbatches, batch, width], and returns the loss (the mean square of the last layer's
output, averaged over microbatches) and its gradient with respect to the weights.

Both schedules run in lockstep ticks, every stage at once (SPMD), each tick ending with a
ppermute to the neighbouring stage; a stage with no microbatch in a tick computes on
nothing (its result masked), as pipelines written this way do: that is the bubble.

- GPipe: every microbatch forward (microbatches + stages - 1 ticks of one stage forward),
  then jax.grad runs the same ticks backward. The scan keeps every tick's activations for
  the backward: memory grows with the microbatch count.
- 1F1B: after a warm-up of stages - 1 forward-only ticks, each tick runs one microbatch
  forward and an earlier one backward (a hand-written backward from the stashed layer
  inputs), then stages - 1 backward-only ticks. A stage stashes the activations of at
  most 2 (stages - stage) - 1 microbatches: memory bounded by the stage count.

Both take (microbatches + stages - 1) x (forward + backward) of time per stage for
microbatches x (forward + backward) of useful work: a bubble of
(stages - 1) / (microbatches + stages - 1).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jax_trn2

PP = "pp"  # the mesh axis the stages are laid along
SCHEDULES = ("gpipe", "1f1b")


@dataclasses.dataclass(frozen=True)
class Stack:
    """The model and the step's shapes."""

    stages: int
    layers: int  # per stage
    width: int
    batch: int  # sequences per microbatch
    microbatches: int
    dtype: str = "bfloat16"

    def args(self) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
        """Shapes of (weights, microbatches)."""
        dt = jnp.dtype(self.dtype)
        return (jax.ShapeDtypeStruct((self.stages, self.layers, self.width, self.width), dt),
                jax.ShapeDtypeStruct((self.microbatches, self.batch, self.width), dt))

    def model_flops(self) -> float:
        """FLOPs of one step by the model's count: each layer's matmul forward (2 batch
        width^2 per microbatch) and two backward (the weights' and the input's gradient)."""
        per_layer = 2 * self.batch * self.width ** 2
        return 3 * per_layer * self.stages * self.layers * self.microbatches


def loss(weights, xs):
    """The unpipelined model's loss (the reference): weights [stages, layers, w, w]."""
    ws = weights.reshape(-1, *weights.shape[2:])
    total = 0.0
    for x in xs:
        for w in ws:
            x = jnp.tanh(x @ w)
        total = total + jnp.mean(jnp.square(x.astype(jnp.float32)))
    return total / xs.shape[0]


def _stage_forward(w, x):
    """The stage's layers on x; returns every layer's input and the output [layers + 1]."""
    acts = [x]
    for layer in range(w.shape[0]):
        acts.append(jnp.tanh(acts[-1] @ w[layer]))
    return jnp.stack(acts)


def _shift(x, stages: int, direction: int):
    """ppermute to the next stage (direction 1) or the previous one (-1); the end stage's
    value goes nowhere and the other end receives zeros."""
    pairs = [(s, s + direction) for s in range(stages) if 0 <= s + direction < stages]
    return jax.lax.ppermute(x, PP, pairs)


def _gpipe(stack: Stack, weights, xs):
    """GPipe's forward: one stage forward per tick, then jax.grad of it."""
    stages, micro = stack.stages, stack.microbatches
    stage = jax.lax.axis_index(PP)
    last = stage == stages - 1

    def forward(w):
        def tick(carry, t):
            arriving, total = carry
            m = t - stage  # the microbatch this stage works on
            valid = (m >= 0) & (m < micro)
            x = jnp.where(stage == 0, xs[jnp.clip(t, 0, micro - 1)], arriving)
            out = _stage_forward(w[0], x)[-1]
            square = jnp.mean(jnp.square(out.astype(jnp.float32)))
            total = total + jnp.where(valid & last, square, 0.0)
            return (_shift(out, stages, 1), total), None

        start = (jnp.zeros(xs.shape[1:], xs.dtype), jnp.zeros((), jnp.float32))
        (_, total), _ = jax.lax.scan(tick, start, jnp.arange(micro + stages - 1))
        return total / micro  # this stage's part of the loss: the last stage's all of it

    # the gradient of the stages' parts summed (jax transposes the ppermutes); summed
    # inside, a psum would be transposed into another psum, counting each stage's
    # gradient once per stage
    local, grads = jax.value_and_grad(forward)(weights)
    return jax.lax.psum(local, PP), grads


def _one_f_one_b(stack: Stack, weights, xs):
    """1F1B: warm-up forwards, then a forward and a backward per tick, then the last
    backwards; the backward by hand from the stashed layer inputs."""
    stages, micro = stack.stages, stack.microbatches
    stage = jax.lax.axis_index(PP)
    last = stage == stages - 1
    w = weights[0]
    slots = 2 * stages - 1  # microbatches a stage has in flight, at most
    scale = 2.0 / (micro * xs.shape[1] * xs.shape[2])  # d(loss)/d(out) = scale * out

    def forward(t, carry):
        arriving, returning, stash, grads, total = carry
        m = t - stage
        valid = (m >= 0) & (m < micro)
        x = jnp.where(stage == 0, xs[jnp.clip(m, 0, micro - 1)], arriving)
        acts = _stage_forward(w, x)
        # written in place even with no microbatch: that slot's microbatch, 2 stages - 1
        # earlier, has finished its backward on this stage
        stash = jax.lax.dynamic_update_index_in_dim(stash, acts, jnp.mod(m, slots), 0)
        square = jnp.mean(jnp.square(acts[-1].astype(jnp.float32)))
        total = total + jnp.where(valid & last, square, 0.0)
        return _shift(acts[-1], stages, 1), returning, stash, grads, total

    def backward(t, carry):
        arriving, returning, stash, grads, total = carry
        m = t - (2 * stages - 2 - stage)
        valid = (m >= 0) & (m < micro)
        acts = jax.lax.dynamic_index_in_dim(stash, jnp.mod(m, slots), 0, keepdims=False)
        dy = jnp.where(last, (scale * acts[-1].astype(jnp.float32)).astype(acts.dtype),
                       returning)
        layer_grads = []
        for layer in reversed(range(w.shape[0])):
            dz = dy * (1 - jnp.square(acts[layer + 1]))
            layer_grads.append(acts[layer].T @ dz)
            dy = dz @ w[layer].T
        step_grads = jnp.stack(layer_grads[::-1]).astype(jnp.float32)
        grads = grads + jnp.where(valid, step_grads, 0.0)
        return arriving, _shift(dy, stages, -1), stash, grads, total

    def both(t, carry):
        return backward(t, forward(t, carry))

    zeros = jnp.zeros(xs.shape[1:], xs.dtype)
    carry = (zeros, zeros, jnp.zeros((slots, w.shape[0] + 1, *xs.shape[1:]), xs.dtype),
             jnp.zeros(w.shape, jnp.float32), jnp.zeros((), jnp.float32))
    carry = jax.lax.fori_loop(0, stages - 1, forward, carry)
    carry = jax.lax.fori_loop(stages - 1, micro + stages - 1, both, carry)
    carry = jax.lax.fori_loop(micro + stages - 1, micro + 2 * stages - 2, backward, carry)
    _, _, _, grads, total = carry
    return jax.lax.psum(total, PP) / micro, grads[None].astype(weights.dtype)


def train_step(stack: Stack, mesh, schedule: str, topology=None) -> jax_trn2.Jitted:
    """(weights, microbatches) -> (loss, weight gradients) under `schedule` ("gpipe" or
    "1f1b") on `mesh`, whose axis `pp` has `stack.stages` chips."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if mesh.shape[PP] != stack.stages:
        raise ValueError(f"the mesh's {PP!r} axis has {mesh.shape[PP]} chips, the stack "
                         f"{stack.stages} stages")
    body = _gpipe if schedule == "gpipe" else _one_f_one_b
    f = jax.shard_map(lambda w, xs: body(stack, w, xs), mesh=mesh,
                      in_specs=(P(PP), P()), out_specs=(P(), P(PP)), check_vma=False)
    return jax_trn2.jit(f, topology=topology)
