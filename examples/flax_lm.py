"""Train a small Flax (linen) decoder language model with optax AdamW on simulated Trainium2
chips, written as for any JAX backend: a mesh of `jax.devices("trn2")`, parameters and batch
placed with NamedShardings (data parallel over "data", Megatron-style tensor parallel over
"model"), and plain `jax.jit`; XLA's SPMD partitioner decides each chip's program.

It prints a numerics report of the first step's gradients against CPU JAX's, the step's
estimated time and HBM per chip, and the loss of each step.

    pip install -e '.[examples]' && python examples/flax_lm.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2

VOCAB, D_MODEL, HEADS, D_FF, LAYERS = 256, 64, 4, 256, 2
BATCH, SEQ, STEPS = 8, 32, 4
LEARNING_RATE = 3e-3
# Weights split over "model": q, k, v and the MLP's first layer by columns (heads, hidden
# units), the attention output and the MLP's second layer by rows, the embedding by vocab.
KERNEL_INIT = nn.initializers.lecun_normal()
COLUMNS, HEAD_COLUMNS = (None, "model"), (None, "model", None)
ROWS, HEAD_ROWS = ("model", None), ("model", None, None)


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention, then a GELU MLP."""

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(
            HEADS, name="attn",
            kernel_init=nn.with_partitioning(KERNEL_INIT, HEAD_COLUMNS),
            out_kernel_init=nn.with_partitioning(KERNEL_INIT, HEAD_ROWS))(h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(D_FF, name="mlp_in",
                     kernel_init=nn.with_partitioning(KERNEL_INIT, COLUMNS))(h)
        return x + nn.Dense(D_MODEL, name="mlp_out",
                            kernel_init=nn.with_partitioning(KERNEL_INIT, ROWS))(nn.gelu(h))


class DecoderLM(nn.Module):
    """Token embedding, LAYERS blocks, and logits from the tied embedding."""

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(VOCAB, D_MODEL, name="embed",
                         embedding_init=nn.with_partitioning(nn.initializers.normal(0.02),
                                                             ROWS))
        x = embed(tokens)
        for i in range(LAYERS):
            x = Block(name=f"block{i}")(x)
        return embed.attend(nn.LayerNorm()(x)).astype(jnp.float32)


MODEL = DecoderLM()


def loss_fn(params, tokens):
    """Mean next-token cross-entropy."""
    logits = MODEL.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def train_step(state: train_state.TrainState, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, tokens)
    return state.apply_gradients(grads=grads), loss


def trn2_mesh() -> jax.sharding.Mesh:
    """8 simulated chips as data x model = 2 x 4. jax.make_mesh's axes are Explicit by
    default, and under Explicit axes jax cannot type linen's embedding lookup (a gather from
    a table split over "model" by tokens split over "data"): Auto axes let XLA's partitioner
    choose, as Flax linen expects."""
    return jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices("trn2")[:8],
                         axis_types=(AxisType.Auto,) * 2)


def print_estimate(compiled) -> dict:
    """The step's estimated time and HBM per chip, from jax's own AOT interfaces."""
    cost = compiled.cost_analysis()
    memory = compiled.memory_analysis()
    print(f"estimated step: {cost['trn2.step_seconds'] * 1e6:,.0f} us per chip expected (the "
          f"Neuron runtime's measured costs), {cost['trn2.ideal_step_seconds'] * 1e6:,.0f} us "
          f"ideal (the hardware's limits)")
    print(f"HBM per chip: peak {memory.peak_memory_in_bytes / 2**20:.2f} MiB "
          f"(arguments {memory.argument_size_in_bytes / 2**20:.2f} MiB, "
          f"temporaries {memory.temp_size_in_bytes / 2**20:.2f} MiB)")
    return cost


def run(steps: int = STEPS) -> dict:
    """Compare the first gradients with CPU JAX's, then train `steps` steps on trn2;
    returns the losses, the numerics report and the step's estimated cost."""
    mesh = trn2_mesh()
    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1), dtype=np.int32)
    # Initialised on jax's default device, the CPU, then placed on the chips.
    params = jax.jit(MODEL.init)(jax.random.key(0), tokens[:, :-1])["params"]
    state = train_state.TrainState.create(apply_fn=MODEL.apply, params=params,
                                          tx=optax.adamw(LEARNING_RATE))
    state_sharding = nn.get_sharding(state, mesh)  # from the with_partitioning names
    batch_sharding = NamedSharding(mesh, P("data"))
    trn2_state = jax.device_put(state, state_sharding)
    trn2_tokens = jax.device_put(tokens, batch_sharding)

    grad = jax.jit(jax.grad(loss_fn))
    report = jax_trn2.numerics.report(grad(trn2_state.params, trn2_tokens),
                                      grad(state.params, tokens), want_label="CPU JAX")
    print(f"the first step's gradients on trn2 against CPU JAX:\n{report}\n")

    step = jax.jit(train_step, in_shardings=(state_sharding, batch_sharding),
                   out_shardings=(state_sharding, None), donate_argnums=0)
    compiled = step.lower(trn2_state, trn2_tokens).compile()
    cost = print_estimate(compiled)
    losses = []
    for i in range(steps):
        trn2_state, loss = compiled(trn2_state, trn2_tokens)
        losses.append(float(loss))
        print(f"step {i}: loss {losses[-1]:.4f}")
    return dict(losses=losses, gradients=report, cost=cost)


if __name__ == "__main__":
    run()
