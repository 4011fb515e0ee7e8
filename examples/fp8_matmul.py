"""An FP8 (E4M3) matmul with per-tensor scaling on the simulated 64-chip Trn2-Ultra (4x4x4),
with its numerics report against the same matmul in BF16 and against CPU JAX.

Per-tensor scaling: each operand is divided by amax / 448 (448 is E4M3's largest value), so
that its largest element lands at the top of E4M3's range, and cast to float8_e4m3fn; the
Tensor Engine multiplies the FP8 values exactly and accumulates in FP32
(preferred_element_type=float32); the product is multiplied back by both scales. Layout:
batch over 'x', the contraction over 'y' (a psum of FP32 partials), output features over 'z'.

    python examples/fp8_matmul.py
    jax-trn2 compare examples/fp8_matmul.py:fp8_matmul    # the report against CPU JAX only
"""

import jax

jax.config.update("jax_num_cpu_devices", 64)  # for the CPU JAX reference run only

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_trn2  # noqa: E402
from jax_trn2 import numerics  # noqa: E402

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(E4M3).max)
BATCH, D_IN, D_OUT = 128, 1024, 256

mesh = jax_trn2.make_mesh()  # ('x', 'y', 'z') = (4, 4, 4) on the 3D torus


def sharded_matmul(a, b):
    """a[B, K] @ b[K, N] in FP32: each chip multiplies its [B/4, K/4] x [K/4, N/4] blocks on
    the Tensor Engine, and the psum over 'y' adds the partial products."""
    body = lambda a, b: jax.lax.psum(jnp.matmul(a, b, preferred_element_type=jnp.float32), "y")
    return jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("y", "z")),
                         out_specs=P("x", "z"))(a, b)


def quantize(x):
    """(x / scale as E4M3, scale) with scale = amax(x) / 448."""
    scale = jnp.max(jnp.abs(x)).astype(jnp.float32) / E4M3_MAX
    return (x.astype(jnp.float32) / scale).astype(E4M3), scale


def fp8_matmul(x, w):
    x8, x_scale = quantize(x)
    w8, w_scale = quantize(w)
    return (sharded_matmul(x8, w8) * (x_scale * w_scale)).astype(jnp.bfloat16)


def bf16_matmul(x, w):
    return sharded_matmul(x, w).astype(jnp.bfloat16)


def example_args():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((BATCH, D_IN)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN), jnp.bfloat16)
    return x, w


def main():
    x, w = example_args()
    fp8 = jax_trn2.jit(fp8_matmul)(x, w)
    bf16 = jax_trn2.jit(bf16_matmul)(x, w)
    print(numerics.report(fp8, bf16, got_label="FP8 E4M3 on trn2", want_label="BF16 on trn2"))
    f, b = np.asarray(fp8, np.float64), np.asarray(bf16, np.float64)
    relative = np.sqrt(np.mean((f - b) ** 2) / np.mean(b ** 2))
    print(f"relative RMS error of FP8 against BF16: {relative:.4f}\n")
    # E4M3 keeps 3 mantissa bits: each scaled input is off by up to 2**-4 of itself
    # (RMS ~2**-4/sqrt(3) = 0.036), so a product is off by ~0.051 RMS, and a sum of
    # independent errors keeps that relative size. Twice that flags a broken pipeline.
    assert relative < 0.1, "FP8 result is further from BF16 than E4M3 rounding explains"

    report = numerics.compare(fp8_matmul, x, w)
    print(report)
    # Both runs multiply the same E4M3 values; the FP32 sums differ only in order, and the
    # BF16 outputs may then land on neighbouring values: 2 ulps at the output's scale.
    assert all(leaf.max_ulp_error <= 2 for leaf in report.leaves), \
        "differs from CPU JAX"
    print("OK: FP8 matmul within E4M3's error of BF16, and within 2 BF16 ulps of CPU JAX")


if __name__ == "__main__":
    main()
