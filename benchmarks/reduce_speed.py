"""The simulator's reduce kernel timed in two versions of the simulator, on one machine.

    python benchmarks/reduce_speed.py TREE_A TREE_B [REPEATS]

TREE_A and TREE_B are checkouts of this repository with their native kernels built (say
`git archive main | tar -x -C /tmp/old`, then `pip install -e /tmp/old` or a copy of the
built .so files). For each case (a float sum of BF16 or FP32 operands over the minor dim, a
non-minor dim or several, at the sizes of a training step's reductions), each tree's
`mesh.isa.kernels.reduction.reduce` runs as one jax.jit-compiled kernel on one chip, in a
subprocess of its own; the trees take turns, REPEATS (default 3) times each, and the table
gives each tree's fastest call in ms, their ratio, and whether their results are
bit-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# (name, per-chip operand shape, reduced dims)
CASES = [
    ("[4096,4096] over 1", (4096, 4096), (1,)),
    ("[4096,4096] over 0", (4096, 4096), (0,)),
    ("[8,2048,1024] over 2", (8, 2048, 1024), (2,)),
    ("[8,2048,1024] over 1", (8, 2048, 1024), (1,)),
    ("[8,2048,1024] over 0", (8, 2048, 1024), (0,)),
    ("[8,2048,1024] over 1,2", (8, 2048, 1024), (1, 2)),
    ("[4096,4096] over 0,1", (4096, 4096), (0, 1)),
]
DTYPES = ("bfloat16", "float32")


def time_case(tree: str, shape: tuple[int, ...], dims: tuple[int, ...], dtype: str,
              calls: int = 5) -> tuple[float, str]:
    """The fastest of `calls` runs (ms) of TREE's reduce kernel summing a [1, *shape]
    operand (one chip) of `dtype` over `dims`, and a hash of its result's bits."""
    sys.path.insert(0, tree)
    import hashlib
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    from mesh import dtypes, isa
    from mesh.executor import EXECUTOR_COMPILER_OPTIONS
    from mesh.isa.kernels import kernel_for
    from mesh.isa.kernels.context import KernelContext

    spec = isa.MeshSpec(("x",), (1,))
    kept = tuple(n for d, n in enumerate(shape) if d not in dims)
    values = {0: isa.ValueInfo(isa.TensorType(shape, dtype), frozenset()),
              1: isa.ValueInfo(isa.TensorType((), dtype), frozenset()),
              2: isa.ValueInfo(isa.TensorType(kept, dtype), frozenset())}
    instr = isa.Reduce((2,), (0, 1), dimensions=dims, combiner="add")
    ctx = KernelContext(isa.Program(spec, (instr,), (0, 1), (2,), values), run=None)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1,) + shape, np.float32)
         * np.exp2(rng.integers(-12, 12, (1,) + shape)).astype(np.float32))
    with jax.enable_x64(True):
        x = jnp.asarray(x.astype(dtypes.numpy_dtype(dtype)))
        init = jnp.zeros((1,), x.dtype)
        kernel = jax.jit(lambda x, init: kernel_for(instr)(instr, [x, init], ctx)[0],
                         compiler_options=EXECUTOR_COMPILER_OPTIONS)
        out = kernel(x, init).block_until_ready()
        best = float("inf")
        for _ in range(calls):
            start = time.perf_counter()
            kernel(x, init).block_until_ready()
            best = min(best, time.perf_counter() - start)
    digest = hashlib.sha256(np.asarray(out).tobytes()).hexdigest()[:16]
    return best * 1e3, digest


def time_in_subprocess(tree: str, shape, dims, dtype) -> tuple[float, str]:
    """time_case of TREE in a fresh Python process, TREE alone on its import path."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import json, sys; sys.path.insert(0, {here!r}); "
            f"import reduce_speed; print(json.dumps(reduce_speed.time_case("
            f"{tree!r}, {shape!r}, {dims!r}, {dtype!r})))")
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    ms, digest = json.loads(out.strip().splitlines()[-1])
    return ms, digest


def compare(tree_a: str, tree_b: str, repeats: int = 3) -> None:
    """The table: per case, each tree's fastest time (ms), B / A, and bit-identity."""
    print(f"A = {tree_a}\nB = {tree_b}")
    print(f"{'case':<26} {'dtype':<9} {'A ms':>8} {'B ms':>8} {'B/A':>6}  same bits")
    for name, shape, dims in CASES:
        for dtype in DTYPES:
            best = {tree_a: float("inf"), tree_b: float("inf")}
            digests = {}
            for _ in range(repeats):
                for tree in (tree_a, tree_b):
                    ms, digests[tree] = time_in_subprocess(tree, shape, dims, dtype)
                    best[tree] = min(best[tree], ms)
            a, b = best[tree_a], best[tree_b]
            same = "yes" if digests[tree_a] == digests[tree_b] else "no"
            print(f"{name:<26} {dtype:<9} {a:8.1f} {b:8.1f} {b / a:6.2f}  {same}", flush=True)


if __name__ == "__main__":
    compare(sys.argv[1], sys.argv[2], *(int(r) for r in sys.argv[3:4]))
