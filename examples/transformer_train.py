"""Train a small decoder-only transformer on the simulated 64-chip Trn2-Ultra (4x4x4 torus).

Data parallel over 'x' (each x coordinate holds a quarter of the batch) and Megatron-style
tensor parallel over 'y': attention heads and the MLP's hidden units are split over y, so the
column-parallel projections (q, k, v, the first MLP layer) need no communication and the
row-parallel ones (attention output, second MLP layer) end in a psum over 'y'. The chips
along 'z' are replicas. The layers are stacked and run by lax.scan; jax.grad differentiates
through the shard_map and the scan (the psums' transposes and a reversed loop), and SGD
updates the weights. Every step is checked against the same program run by CPU JAX, and
the loss must fall.

    python examples/transformer_train.py
"""

from support import harness  # noqa: I001  (first: sets up the CPU reference devices)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2

DATA, MODEL = "x", "y"  # the data-parallel and the tensor-parallel mesh axis
FULL = dict(batch=16, seq=32, d_model=64, heads=8, d_head=8, d_ff=256, vocab=128, layers=2,
            steps=6)
SMALL = dict(batch=8, seq=8, d_model=32, heads=4, d_head=8, d_ff=64, vocab=32, layers=2,
             steps=3)
LEARNING_RATE = 0.3
# The simulated and the CPU run add FP32 terms in different orders (PSUM passes of 128 on the
# Tensor Engine, XLA's own blocking on CPU): each reduction may differ by a few ulps (~1e-7
# relative), a few hundred reductions deep and compounded over the SGD steps. 1e-4 leaves
# room for that and still catches a wrong gradient, which is off by O(1).
RTOL = 1e-4

LAYER_SPECS = dict(wq=P(None, None, MODEL), wk=P(None, None, MODEL), wv=P(None, None, MODEL),
                   wo=P(None, MODEL, None), w1=P(None, None, MODEL), w2=P(None, MODEL, None),
                   ln1=P(), ln2=P())
PARAM_SPECS = dict(embed=P(), ln_f=P(), layers=LAYER_SPECS)


def init_params(rng: np.random.Generator, c: dict) -> dict:
    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-2]), jnp.float32)

    n, d, inner = c["layers"], c["d_model"], c["heads"] * c["d_head"]
    layers = dict(wq=normal(n, d, inner), wk=normal(n, d, inner), wv=normal(n, d, inner),
                  wo=normal(n, inner, d), w1=normal(n, d, c["d_ff"]),
                  w2=normal(n, c["d_ff"], d), ln1=jnp.ones((n, d)), ln2=jnp.ones((n, d)))
    return dict(embed=normal(c["vocab"], d), ln_f=jnp.ones(d), layers=layers)


def layer_norm(x, scale):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def decoder_layer(x, layer, d_head: int):
    """One layer on this chip's heads and hidden units; x [batch, seq, d_model] is the same
    on every chip along MODEL."""
    b, s, _ = x.shape
    h = layer_norm(x, layer["ln1"])
    q, k, v = ((h @ layer[w]).reshape(b, s, -1, d_head) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d_head)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v).reshape(b, s, -1)
    x = x + jax.lax.psum(attended @ layer["wo"], MODEL)
    h = layer_norm(x, layer["ln2"])
    return x + jax.lax.psum(jax.nn.gelu(h @ layer["w1"]) @ layer["w2"], MODEL)


def local_loss(params, tokens, d_head: int):
    """Next-token cross-entropy of this chip's share of the batch, averaged over DATA."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    vocab = params["embed"].shape[0]
    x = jax.nn.one_hot(inputs, vocab) @ params["embed"]  # an embedding lookup as a matmul
    x, _ = jax.lax.scan(lambda x, layer: (decoder_layer(x, layer, d_head), None), x,
                        params["layers"])
    logits = layer_norm(x, params["ln_f"]) @ params["embed"].T
    nll = -jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(targets, vocab))
    return jax.lax.pmean(nll / targets.size, DATA)


def make_train_step(mesh, c: dict):
    loss = jax.shard_map(lambda p, t: local_loss(p, t, c["d_head"]), mesh=mesh,
                         in_specs=(PARAM_SPECS, P(DATA)), out_specs=P())

    def train_step(params, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), value
    return train_step


def run(small: bool = False) -> dict:
    """Train for a few steps on the simulated mesh and on CPU JAX; check they agree and the
    loss falls. Returns the losses and the estimated per-chip cost of one step."""
    c = SMALL if small else FULL
    rng = np.random.default_rng(0)
    params = init_params(rng, c)
    tokens = jnp.asarray(rng.integers(0, c["vocab"], (c["batch"], c["seq"] + 1)), jnp.int32)

    step = jax_trn2.jit(make_train_step(jax_trn2.make_mesh(), c)).lower(params, tokens).compile()
    reference = jax.jit(make_train_step(harness.cpu_mesh(), c))
    losses = harness.train_and_check(step, reference, params, (tokens,), c["steps"], RTOL)
    return dict(losses=losses, cost=harness.print_cost(step))


def main():
    run()


if __name__ == "__main__":
    main()
