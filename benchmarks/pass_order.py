"""What the Tensor Engine's pass order changes: the simulator's matmul (128-long
contraction passes, each summed in FP32, added into PSUM one after another) against one
full-length FP32-accumulating GEMM (XLA on the host), and what each costs on this host.

    python benchmarks/pass_order.py

For BF16 inputs and K from 128 to 16384: how many output elements differ and by how much
(jax_trn2.numerics.report: the largest error in ulps of the output type at the output's
scale, its largest magnitude), for FP32 outputs and for outputs rounded to BF16, and the
time of each. At K = 128 there is one pass, summed by the native loop as a chain of BF16 dot
instructions, which on an AMD Zen 4 is also the host GEMM's order: nothing differs there.
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
from jax_trn2 import numerics  # noqa: E402

M = N = 512
KS = (128, 512, 2048, 8192, 16384)


def matmul(out_dtype):
    def f(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(out_dtype)
    return f


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
    print("| K | output | differ | max ulp err | passes ms | one GEMM ms |")
    print("|---|---|---|---|---|---|")
    for k in KS:
        a = jnp.asarray(rng.standard_normal((M, k)), jnp.bfloat16)
        b = jnp.asarray(rng.standard_normal((k, N)), jnp.bfloat16)
        for out in (jnp.float32, jnp.bfloat16):
            passes, gemm = jax_trn2.jit(matmul(out)), jax.jit(matmul(out))
            (leaf,) = numerics.report(passes(a, b), gemm(a, b)).leaves
            print(f"| {k} | {np.dtype(out).name} | "
                  f"{numerics.percent(leaf.differing, leaf.size)} | "
                  f"{leaf.max_ulp_error:.3g} | {seconds(passes, a, b) * 1e3:.1f} | "
                  f"{seconds(gemm, a, b) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
