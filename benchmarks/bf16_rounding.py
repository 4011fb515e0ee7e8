"""The native matmul loop's rounding to BF16 against XLA:CPU's, over every FP32 value.

    python benchmarks/bf16_rounding.py

The loop rounds a BF16 result's FP32 sums itself, tile by tile (mesh/isa/kernels/
pass_matmul.cc), where the executor would otherwise round them with an XLA conversion; its
results are bit-identical only if the two roundings are. This feeds all 2^32 FP32 bit
patterns (NaNs with every payload, subnormals, ties, the values that round past BF16's
largest) through both of the loop's codes, its AVX-512 one (where this CPU runs it) and its
portable one, and through XLA:CPU's convert, and counts the values where they differ. It
takes a few minutes; the tests check a few thousand chosen values.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mesh.isa.kernels import native  # noqa: E402

CHUNK = 1 << 26  # FP32 values per step: 256 MiB of them


@jax.jit
def xla_rounding(bits: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(bits, jnp.float32).astype(jnp.bfloat16)


def main() -> int:
    start = time.perf_counter()
    differ = {"avx512": 0, "portable": 0}
    examples = []
    for first in range(0, 1 << 32, CHUNK):
        bits = np.arange(first, first + CHUNK, dtype=np.uint64).astype(np.uint32)
        want = np.asarray(xla_rounding(bits)).view(np.uint16)
        for code in differ:
            got = native.round_to_bf16(bits.view(np.float32),
                                       portable=code == "portable").view(np.uint16)
            wrong = np.flatnonzero(got != want)
            differ[code] += wrong.size
            examples += [(code, f"{bits[i]:#010x}", f"{got[i]:#06x}", f"{want[i]:#06x}")
                         for i in wrong[:max(0, 3 - len(examples))]]
    print(f"every FP32 value rounded to BF16 ({time.perf_counter() - start:.0f} s); "
          f"AVX-512 code run: {native.avx512(jnp.float32)}")
    for code, count in differ.items():
        print(f"  {code:8s} differs from XLA:CPU's convert on {count:,} of {1 << 32:,} values")
    for code, value, got, want in examples:
        print(f"  e.g. {code}: {value} -> {got}, XLA:CPU {want}")
    return 0 if not any(differ.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
