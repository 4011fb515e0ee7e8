"""Ring attention: causal attention with the sequence split around a torus ring, on the
simulated Trn2-Ultra (4x4x4).

The sequence is split over 'x', whose 4 chips are a physical ring of the torus; the batch is
split over 'y' and the heads over 'z'. Each chip keeps its block of queries and, at every
step of a fori_loop, attends to the key/value block it holds and passes that block to its
ring neighbour (ppermute), so after 4 steps every query block has met every key block.
The softmax is accumulated online (running maximum and denominator, as flash attention
does). With causal masking a block from later in the sequence is not needed: whether a
chip attends at a step depends on its ring position (lax.cond on axis_index). The result is
checked against CPU JAX running the same program and against plain causal attention.

    python examples/ring_attention.py
"""

from support import harness  # noqa: I001  (first: sets up the CPU reference devices)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_trn2

RING, BATCH, HEADS = "x", "y", "z"
RING_SIZE = 4
FULL = dict(batch=4, seq=512, heads=8, d_head=32)
SMALL = dict(batch=4, seq=32, heads=4, d_head=8)
MASKED = -1e30  # a score no query attends to (finite: exp(MASKED - max) is exactly 0)
# FP32 sums in a different order on the two runs (see transformer_train.py).
RTOL = 1e-4
# Against plain attention the online softmax rescales partial sums (a few more roundings of
# FP32 values of order 1, each ~6e-8 relative), and both round differently: 1e-5 of the
# largest output is far below a wrong mask or a missed block, which change outputs by O(1).
PLAIN_RTOL = 1e-5


def ring_attention(q, k, v):
    """q, k, v [batch, seq block, heads, d_head]: this chip's blocks of the sequence."""
    me = jax.lax.axis_index(RING)
    block = q.shape[1]
    causal = jnp.tril(jnp.ones((block, block), bool))
    shift = [(j, (j + 1) % RING_SIZE) for j in range(RING_SIZE)]

    def attend(state, k, v, source):
        running_max, denominator, out = state
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        scores = jnp.where(causal | (source < me), scores, MASKED)
        new_max = jnp.maximum(running_max, scores.max(-1))
        weights = jnp.exp(scores - new_max[..., None])
        rescale = jnp.exp(running_max - new_max)
        return (new_max, denominator * rescale + weights.sum(-1),
                out * rescale[..., None] + jnp.einsum("bhqk,bkhd->bhqd", weights, v))

    def step(i, carry):
        k, v, state = carry
        source = (me - i) % RING_SIZE  # whose block this chip holds at step i
        state = jax.lax.cond(source <= me, attend, lambda state, *_: state, state, k, v,
                             source)
        k, v = jax.lax.ppermute((k, v), RING, shift)
        return k, v, state

    b, _, h, _ = q.shape
    start = (jnp.full((b, h, block), MASKED), jnp.zeros((b, h, block)),
             jnp.zeros((b, h, block, q.shape[-1])))
    start = jax.lax.pcast(start, (RING, BATCH, HEADS), to="varying")
    _, _, (_, denominator, out) = jax.lax.fori_loop(0, RING_SIZE, step, (k, v, start))
    return (out / denominator[..., None]).transpose(0, 2, 1, 3)


def plain_attention(q, k, v):
    s = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, MASKED)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v)


def sharded(mesh):
    spec = P(BATCH, RING, HEADS)
    return jax.shard_map(ring_attention, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)


def run(small: bool = False) -> dict:
    """Run on the simulated mesh and on CPU JAX and check both against each other and
    against plain attention. Returns the estimated cost."""
    c = SMALL if small else FULL
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((c["batch"], c["seq"], c["heads"], c["d_head"])),
                           jnp.float32) for _ in range(3))
    compiled = jax_trn2.jit(sharded(jax_trn2.make_mesh())).lower(q, k, v).compile()
    got = compiled(q, k, v)
    harness.check_close("ring attention", got, jax.jit(sharded(harness.cpu_mesh()))(q, k, v),
                        RTOL)
    harness.check_close("ring attention vs plain attention", got,
                        jax.jit(plain_attention)(q, k, v), PLAIN_RTOL)
    return dict(cost=harness.print_cost(compiled))


def main():
    run()


if __name__ == "__main__":
    main()
