"""What the Tensor Engine's pass order changes: the simulator's matmul (128-long
contraction passes, each summed in FP32, added into PSUM one after another) against one
full-length FP32-accumulating GEMM (XLA on the host), and what each costs on this host.

    python benchmarks/pass_order.py

For BF16 inputs and K from 128 to 16384: the fraction of output elements that differ and
by how many ulps, for FP32 outputs and for outputs rounded to BF16, and the time of each.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax_trn2  # noqa: E402

M = N = 512
KS = (128, 512, 2048, 8192, 16384)


def matmul(out_dtype):
    def f(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(out_dtype)
    return f


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in units in the last place (same-sign values; integer views)."""
    bits = {2: np.int16, 4: np.int32}[got.dtype.itemsize]
    return np.abs(got.view(bits).astype(np.int64) - want.view(bits).astype(np.int64))


def seconds(fn, *args, calls: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    print("| K | output | differ | max ulps | mean ulps (differing) | passes ms | one GEMM ms |")
    print("|---|---|---|---|---|---|---|")
    for k in KS:
        a = jnp.asarray(rng.standard_normal((M, k)), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal((k, N)), jnp.bfloat16)
        for out in (jnp.float32, jnp.bfloat16):
            passes, gemm = jax_trn2.jit(matmul(out)), jax.jit(matmul(out))
            got, want = np.asarray(passes(a, b)), np.asarray(gemm(a, b))
            same_sign = np.sign(got) == np.sign(want)
            distance = np.where(same_sign, ulps(got, want), np.iinfo(np.int64).max)
            differ = distance > 0
            mean = float(distance[differ].mean()) if differ.any() else 0.0
            print(f"| {k} | {np.dtype(out).name} | {differ.mean():.2%} | "
                  f"{int(distance.max())} | {mean:.2f} | {seconds(passes, a, b) * 1e3:.1f} | "
                  f"{seconds(gemm, a, b) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
