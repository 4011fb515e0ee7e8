"""Fully sharded data parallel training (FSDP, ZeRO-3) on the simulated Trn2-Ultra (4x4x4).

Every weight matrix is split by rows over all 64 chips, and so is the batch. Each layer
all_gathers its weight just before it is used; jax.grad turns every all_gather into a
reduce_scatter, so each chip receives the gradient summed over all chips for its own rows
only, and updates its shard with SGD: no chip ever holds the whole model's gradients. The
training steps are checked against CPU JAX, and the loss must fall.

    python examples/fsdp.py
"""

from support import harness  # noqa: I001  (first: sets up the CPU reference devices)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2

ALL = ("x", "y", "z")  # the weights and the batch are split over every chip
CHIPS = 64
FULL = dict(batch=512, widths=(64, 256, 256, 64), steps=5)
SMALL = dict(batch=128, widths=(64, 64, 64), steps=3)
LEARNING_RATE = 0.5
# FP32 sums in a different order on the two runs (see transformer_train.py).
RTOL = 1e-4


def local_loss(shards, x, y):
    """Mean squared error of an MLP on this chip's examples; each layer gathers its weight."""
    h = x
    for i, shard in enumerate(shards):
        h = h @ jax.lax.all_gather(shard, ALL, axis=0, tiled=True)
        if i < len(shards) - 1:
            h = jnp.tanh(h)
    return jnp.mean((h - y) ** 2)


def train_step_body(shards, x, y):
    loss, grads = jax.value_and_grad(local_loss)(shards, x, y)
    # grads are reduce_scatters: each shard's gradient summed over the chips' losses, whose
    # mean is the loss of the whole batch.
    shards = [w - LEARNING_RATE * g / CHIPS for w, g in zip(shards, grads)]
    return shards, jax.lax.pmean(loss, ALL)


def make_train_step(mesh):
    return jax.shard_map(train_step_body, mesh=mesh, in_specs=(P(ALL), P(ALL), P(ALL)),
                         out_specs=(P(ALL), P()))


def run(small: bool = False) -> dict:
    """Train for a few steps on the simulated mesh and on CPU JAX; check they agree and the
    loss falls. Returns the losses and the estimated per-chip cost of one step."""
    c = SMALL if small else FULL
    rng = np.random.default_rng(0)
    widths = c["widths"]
    shards = [jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a), jnp.float32)
              for a, b in zip(widths[:-1], widths[1:])]
    x = jnp.asarray(rng.standard_normal((c["batch"], widths[0])), jnp.float32)
    teacher = rng.standard_normal((widths[0], widths[-1])) / np.sqrt(widths[0])
    y = jnp.asarray(np.tanh(np.asarray(x) @ teacher), jnp.float32)

    step = jax_trn2.jit(make_train_step(jax_trn2.make_mesh())).lower(shards, x, y).compile()
    text = step.executable.as_text()
    assert "AllGather" in text and "ReduceScatter" in text
    reference = jax.jit(make_train_step(harness.cpu_mesh()))
    losses = harness.train_and_check(step, reference, shards, (x, y), c["steps"], RTOL)
    return dict(losses=losses, cost=harness.print_cost(step))


def main():
    run()


if __name__ == "__main__":
    main()
