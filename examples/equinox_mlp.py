"""Fit an Equinox MLP to a 2-D function with optax Adam, data parallel over 8 simulated
Trainium2 chips, as the Equinox documentation shards a training step: the batch split
over a mesh of `jax.devices("trn2")`, the model and optimiser state replicated, each
pinned with `eqx.filter_shard` inside `eqx.filter_jit`.

The same steps run on CPU JAX from the same initial model; it prints both losses, the
step's estimate, and a numerics report of the trained weights against CPU JAX's.

    pip install -e '.[examples]' && python examples/equinox_mlp.py
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2

WIDTH, DEPTH, BATCH, STEPS = 64, 2, 512, 20
OPTIMIZER = optax.adam(1e-2)


def loss_fn(model: eqx.nn.MLP, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def train_step(batch_sharding: NamedSharding, model: eqx.nn.MLP, opt_state, x, y):
    """One Adam step; the batch split as `batch_sharding`, the rest replicated on its mesh."""
    replicated = NamedSharding(batch_sharding.mesh, P())
    model, opt_state = eqx.filter_shard((model, opt_state), replicated)
    x, y = eqx.filter_shard((x, y), batch_sharding)
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    model, opt_state = eqx.filter_shard((model, opt_state), replicated)
    return model, opt_state, loss


def batch_sharding(devices: list) -> NamedSharding:
    """The batch split over `devices`. Auto axes: eqx.filter_shard constrains shardings with
    jax.lax.with_sharding_constraint, which refuses the Explicit axes jax.make_mesh gives
    by default."""
    mesh = jax.make_mesh((len(devices),), ("batch",), devices=devices,
                         axis_types=(AxisType.Auto,))
    return NamedSharding(mesh, P("batch"))


def run(steps: int = STEPS) -> dict:
    """Train on 8 trn2 chips and on the CPU; returns both losses, the numerics report of
    the trained weights and the step's estimated cost."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (BATCH, 2)).astype(np.float32)
    y = np.sin(3 * x[:, :1]) * x[:, 1:]  # the function to fit
    model = eqx.nn.MLP(2, 1, WIDTH, DEPTH, key=jax.random.key(0))
    opt_state = OPTIMIZER.init(eqx.filter(model, eqx.is_array))

    trn2, cpu = batch_sharding(jax.devices("trn2")[:8]), batch_sharding(jax.devices("cpu")[:1])
    compiled = train_step.lower(trn2, model, opt_state, x, y).compile()
    cost = compiled.compiled.cost_analysis()  # the jax.stages.Compiled inside equinox's
    print(f"estimated step: {cost['trn2.step_seconds'] * 1e6:,.1f} us per chip")

    trn2_state, cpu_state = (model, opt_state), (model, opt_state)
    losses, cpu_losses = [], []
    for i in range(steps):
        *trn2_state, loss = train_step(trn2, *trn2_state, x, y)
        *cpu_state, cpu_loss = train_step(cpu, *cpu_state, x, y)
        losses.append(float(loss))
        cpu_losses.append(float(cpu_loss))
        if i % 5 == 0 or i == steps - 1:
            print(f"step {i}: loss {losses[-1]:.6f} on trn2, {cpu_losses[-1]:.6f} on CPU JAX")
    report = jax_trn2.numerics.report(eqx.filter(trn2_state[0], eqx.is_array),
                                      eqx.filter(cpu_state[0], eqx.is_array),
                                      want_label="CPU JAX")
    print(f"\nthe trained weights on trn2 against CPU JAX:\n{report}")
    return dict(losses=losses, cpu_losses=cpu_losses, weights=report, cost=cost)


if __name__ == "__main__":
    run()
