"""A tensor-parallel MLP in BF16 on the simulated 64-chip Trn2-Ultra (4x4x4 torus).

Megatron-style: the first weight is split by columns and the second by rows over the
tensor-parallel axis 'y', the batch over the data-parallel axis 'x'; one psum over 'y' joins
the partial products. The result is checked against the same program run by JAX on CPU.
"""

import jax

jax.config.update("jax_num_cpu_devices", 64)  # for the CPU reference run only

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, PartitionSpec as P  # noqa: E402

import jax_trn2  # noqa: E402
from jax_trn2 import numerics  # noqa: E402

BATCH, D_MODEL, D_HIDDEN = 256, 512, 2048


def mlp_block(x, w1, w2):
    """One chip's share: x[b, d] @ w1[d, h/4] -> gelu -> @ w2[h/4, d], summed over 'y'."""
    h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)
    partial = jnp.dot(h, w2, preferred_element_type=jnp.float32)
    return jax.lax.psum(partial, "y").astype(jnp.bfloat16)


def tensor_parallel_mlp(mesh):
    return jax.shard_map(mlp_block, mesh=mesh,
                         in_specs=(P("x", None), P(None, "y"), P("y", None)),
                         out_specs=P("x", None))


def main():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((BATCH, D_MODEL)), jnp.bfloat16)
    w1 = jnp.asarray(rng.standard_normal((D_MODEL, D_HIDDEN)) / np.sqrt(D_MODEL), jnp.bfloat16)
    w2 = jnp.asarray(rng.standard_normal((D_HIDDEN, D_MODEL)) / np.sqrt(D_HIDDEN), jnp.bfloat16)

    mesh = jax_trn2.make_mesh()  # ('x', 'y', 'z') = (4, 4, 4) on the 3D torus
    step = jax_trn2.jit(tensor_parallel_mlp(mesh))
    out = step(x, w1, w2)

    cpu_mesh = jax.make_mesh((4, 4, 4), ("x", "y", "z"), axis_types=(AxisType.Auto,) * 3)
    want = jax.jit(tensor_parallel_mlp(cpu_mesh))(x, w1, w2)

    print(step.lower(x, w1, w2).as_text())
    print(f"\nresult {out.dtype}{list(out.shape)} on {len(jax_trn2.client().devices())} "
          f"simulated Trainium2 chips")
    report = numerics.report(out, want, want_label="CPU JAX")
    print(report)
    # The two runs add the same BF16 products in different orders (PSUM passes of 128 here,
    # XLA's own blocking on CPU) and round to BF16 once: results may land on neighbouring
    # BF16 values, so they must agree within 2 ulps at the output's scale.
    (leaf,) = report.leaves
    assert leaf.max_ulp_error <= 2, "simulated result differs from CPU JAX"
    print("OK: matches CPU JAX within 2 BF16 ulps")


if __name__ == "__main__":
    main()
