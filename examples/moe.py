"""A mixture-of-experts layer with expert parallelism on the simulated Trn2-Ultra (4x4x4).

Tokens are split over ('x', 'y') (data parallel) and the experts over 'x' (expert
parallel: each x coordinate holds a quarter of them); the chips along 'z' are replicas.
Each chip routes its tokens to their top-1 expert, with room for `capacity` tokens per
expert (later tokens are dropped), and packs them into per-expert slots. An all_to_all over
'x' sends every expert's slots to the chip that holds it, the experts' MLPs run there, and a
second all_to_all sends the results back; each token then takes its expert's output scaled
by its router probability. The layer's output and the gradients of a loss (where the
all_to_alls run in reverse) are checked against CPU JAX.

    python examples/moe.py
"""

from support import harness  # noqa: I001  (first: sets up the CPU reference devices)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2

EXPERT, TOKENS = "x", ("x", "y")  # the expert-parallel axis; the axes the tokens are split over
FULL = dict(tokens=1024, d_model=64, d_ff=128, experts=8, capacity=10)
SMALL = dict(tokens=256, d_model=16, d_ff=32, experts=4, capacity=5)
# FP32 sums in a different order on the two runs (see transformer_train.py); routing is
# discrete, so a token whose two best experts tie within rounding could go either way: the
# data are random normals, where such ties do not occur.
RTOL = 1e-4


def route(x, w_router, capacity: int):
    """(slots [tokens, experts, capacity]: where each kept token goes, gate [tokens])."""
    probs = jax.nn.softmax(x @ w_router)
    chosen = jax.nn.one_hot(jnp.argmax(probs, axis=-1), w_router.shape[1])
    # A token's place in its expert's queue: how many earlier tokens chose that expert.
    earlier = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), x.dtype), -1)
    place = earlier @ chosen
    # A place past the capacity has no slot: the token is dropped.
    slots = jax.nn.one_hot(place.astype(jnp.int32), capacity) * chosen[..., None]
    return slots, jnp.max(probs, axis=-1)


def moe_layer(x, w_router, w1, w2, capacity: int):
    """x [tokens, d_model] are this chip's tokens; w1 [experts/4, d_model, d_ff] and
    w2 [experts/4, d_ff, d_model] the experts this chip holds."""
    slots, gate = route(x, w_router, capacity)
    packed = jnp.einsum("tec,td->ecd", slots, x)  # [experts, capacity, d_model], by owner
    # Expert e's slots go to the chip holding it; received: [local experts, sources*cap, d].
    received = jax.lax.all_to_all(packed, EXPERT, 0, 1, tiled=True)
    hidden = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", received, w1))
    done = jnp.einsum("ecf,efd->ecd", hidden, w2)
    returned = jax.lax.all_to_all(done, EXPERT, 1, 0, tiled=True)  # [experts, capacity, d]
    return x + jnp.einsum("tec,ecd->td", slots * gate[:, None, None], returned)


def make_step(mesh, capacity: int):
    """(layer output, loss, gradients of the loss with respect to the weights)."""
    def local_loss(weights, x, target):
        y = moe_layer(x, *weights, capacity)
        return jax.lax.pmean(jnp.mean((y - target) ** 2), TOKENS), y

    layer = jax.shard_map(local_loss, mesh=mesh,
                          in_specs=((P(), P(EXPERT), P(EXPERT)), P(TOKENS), P(TOKENS)),
                          out_specs=(P(), P(TOKENS)))

    def step(weights, x, target):
        (loss, y), grads = jax.value_and_grad(layer, has_aux=True)(weights, x, target)
        return y, loss, grads
    return step


def run(small: bool = False) -> dict:
    """Run the layer and its gradients on the simulated mesh and on CPU JAX and check
    they agree. Returns the loss, the share of tokens dropped and the estimated cost."""
    c = SMALL if small else FULL
    rng = np.random.default_rng(0)
    d, f, e = c["d_model"], c["d_ff"], c["experts"]
    weights = (jnp.asarray(rng.standard_normal((d, e)), jnp.float32),
               jnp.asarray(rng.standard_normal((e, d, f)) / np.sqrt(d), jnp.float32),
               jnp.asarray(rng.standard_normal((e, f, d)) / np.sqrt(f), jnp.float32))
    x = jnp.asarray(rng.standard_normal((c["tokens"], d)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((c["tokens"], d)), jnp.float32)

    step = jax_trn2.jit(make_step(jax_trn2.make_mesh(), c["capacity"]))
    compiled = step.lower(weights, x, target).compile()
    got = compiled(weights, x, target)
    want = jax.jit(make_step(harness.cpu_mesh(), c["capacity"]))(weights, x, target)
    harness.check_close("layer output", got[0], want[0], RTOL)
    harness.check_close("loss and gradients", got[1:], want[1:], RTOL)
    per_chip = c["tokens"] // 16
    slots, _ = jax.vmap(lambda t: route(t, weights[0], c["capacity"]))(
        x.reshape(16, per_chip, d))
    dropped = 1.0 - float(slots.sum()) / c["tokens"]
    print(f"loss {float(got[1]):.4f}; {dropped:.1%} of tokens over their expert's capacity")
    return dict(loss=float(got[1]), dropped=dropped, cost=harness.print_cost(compiled))


def main():
    run()


if __name__ == "__main__":
    main()
