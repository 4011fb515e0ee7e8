"""Matmul results of two versions of the simulator, bit for bit.

    python benchmarks/bit_identity.py run TREE OUT.npz    # results of the code in TREE
    python benchmarks/bit_identity.py compare A.npz B.npz

`run` puts TREE (a checkout of this repository, say `git worktree add /tmp/old <commit>`)
first on the import path and runs 1,062 matmul programs through its `jax_trn2.jit`: BF16,
FP32, FP16, FP8 (E4M3, E5M2), BF16 x FP32, FP8 x BF16, complex64 and int8 operands; K from 1
to 1100 (one pass to nine); transposed operands; batch and multi-dim contractions; products
converted to BF16; inputs of normal values and of exponents spread over 2^-12..2^12; and
shard_map programs whose operands vary along different mesh axes, with and without a psum,
in FP32 or converted to BF16. `compare` counts the
results that are bit-identical, those that differ only in the bits of a NaN, and those that
differ in value, by kind.
"""

from __future__ import annotations

import collections
import sys


def run(tree: str, out: str) -> None:
    sys.path.insert(0, tree)
    import jax

    jax.config.update("jax_num_cpu_devices", 64)
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_trn2

    rng = np.random.default_rng(27)
    results = {}

    def data(shape, dtype, wide=False):
        if jnp.issubdtype(dtype, jnp.integer):
            return rng.integers(-8, 8, shape).astype(dtype)
        x = rng.standard_normal(shape)
        if wide:
            x = x * np.exp2(rng.integers(-12, 12, shape))
        if jnp.issubdtype(dtype, jnp.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)

    def record(name, fn, *args):
        result = np.asarray(jax_trn2.jit(fn)(*args))
        results[name] = result.view(f"u{result.dtype.itemsize}")
        results[name + "__dtype"] = np.array(result.dtype.name)

    def dot(dims, preferred=None):
        return lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=preferred)

    e4m3, e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    kinds = [("bf16", jnp.bfloat16, jnp.bfloat16), ("f32", jnp.float32, jnp.float32),
             ("f16", jnp.float16, jnp.float16), ("e4m3", e4m3, e4m3), ("e5m2", e5m2, e5m2),
             ("bf16xf32", jnp.bfloat16, jnp.float32), ("e4m3xbf16", e4m3, jnp.bfloat16),
             ("c64", jnp.complex64, jnp.complex64), ("i8", jnp.int8, jnp.int8)]
    matmul = (((1,), (0,)), ((), ()))
    for kind, da, db in kinds:
        preferred = jnp.float32 if jnp.issubdtype(da, jnp.floating) else None
        for k in (1, 64, 127, 128, 129, 200, 255, 256, 257, 300, 384, 511, 512, 640, 768, 1000,
                  1024, 1100):
            for wide in (False, True):
                m, n = int(rng.integers(1, 40)), int(rng.integers(1, 70))
                a, b = data((m, k), da, wide), data((k, n), db, wide)
                name = f"{kind}_k{k}_w{wide}"
                record(f"{name}_ab", dot(matmul, preferred), a, b)
                if kind in ("bf16", "f32", "e4m3", "f16"):
                    record(f"{name}_aTb", lambda a, b: jnp.dot(a.T, b, preferred_element_type=
                                                               preferred), a.T.copy(), b)
                    record(f"{name}_abT", lambda a, b: jnp.dot(a, b.T), a, b.T.copy())
                    record(f"{name}_out16", lambda a, b: jnp.dot(a, b), a, b)
                    record(f"{name}_tobf16", lambda a, b: jnp.dot(
                        a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16), a, b)
        for k in (96, 300, 640):
            record(f"{kind}_bmk_bkn_{k}", dot((((2,), (1,)), ((0,), (0,)))),
                   data((3, 17, k), da), data((3, k, 33), db))
            record(f"{kind}_multi_{k}", dot((((1, 2), (0, 1)), ((), ()))),
                   data((5, 4, k // 4, 9), da), data((4, k // 4, 7), db))

    mesh = jax_trn2.make_mesh()
    for kind, dtype in (("bf16", jnp.bfloat16), ("f32", jnp.float32), ("e5m2", e5m2)):
        for rows, k, n in ((8, 256, 40), (16, 520, 64), (24, 1000, 33), (5, 130, 96)):
            x, w = data((4 * rows, 4 * k), dtype), data((4 * k, 4 * n), dtype)
            for w_spec, summed, partial in ((P("y", "z"), P("x", "z"), P("x", ("y", "z"))),
                                            (P("y", None), P("x", None), P("x", "y"))):
                for psum, out_type in ((True, jnp.float32), (False, jnp.float32),
                                       (True, jnp.bfloat16), (False, jnp.bfloat16)):
                    def body(x, w, psum=psum, out_type=out_type):
                        y = jnp.dot(x, w, preferred_element_type=jnp.float32)
                        return (jax.lax.psum(y, "y") if psum else y).astype(out_type)

                    record(f"smap_{kind}_{rows}_{k}_{n}_{w_spec}_{psum}_"
                           f"{jnp.dtype(out_type).name}",
                           jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), w_spec),
                                         out_specs=summed if psum else partial), x, w)
            record(f"smap_{kind}_{rows}_{k}_{n}_xTg",
                   jax.shard_map(lambda x, g: jnp.dot(x.T, g, preferred_element_type=jnp.float32),
                                 mesh=mesh, in_specs=(P(None, ("x", "y", "z")), P()),
                                 out_specs=P(None, ("x", "y", "z"))),
                   data((k, 64 * rows), dtype), data((k, 4 * n), dtype))
    np.savez(out, **results)
    print(f"{len(results) // 2} results in {out}")


def compare(before: str, after: str) -> None:
    import ml_dtypes
    import numpy as np

    a, b = np.load(before), np.load(after)

    def load(results, name):
        dtype = str(results[name + "__dtype"])
        return results[name].view(getattr(ml_dtypes, dtype, None) or np.dtype(dtype))

    names = [n for n in a.files if not n.endswith("__dtype")]
    kinds, differ, nan_bits = collections.Counter(), collections.defaultdict(list), 0
    for name in names:
        kind = "_".join(name.split("_")[:2]) if name.startswith("smap") else name.split("_")[0]
        kinds[kind] += 1
        x, y = load(a, name), load(b, name)
        if np.array_equal(a[name], b[name]):
            continue
        wide = np.complex128 if np.iscomplexobj(x) else np.float64
        xw, yw = x.astype(wide), y.astype(wide)
        if ((xw == yw) | (np.isnan(xw) & np.isnan(yw))).all():
            nan_bits += 1
        else:
            differ[kind].append(name)
    changed = sum(map(len, differ.values()))
    print(f"{len(names)} results: {len(names) - nan_bits - changed} bit-identical, {nan_bits} "
          f"differ only in NaN bits, {changed} in value")
    for kind, count in kinds.items():
        print(f"  {kind}: {len(differ[kind])} of {count} differ in value"
              + (f" (first: {differ[kind][0]})" if differ[kind] else ""))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("run", "compare"):
        raise SystemExit(__doc__)
    (run if sys.argv[1] == "run" else compare)(sys.argv[2], sys.argv[3])
