"""The native kernels (built by `pip install`): the pass loop (pass_matmul.cc), a
matmul's passes summed and accumulated in the order of the executor's XLA loop
(mesh.isa.kernels.matmul), one tile of the result at a time in registers and L1 rather than
one whole pass product at a time in memory; and the reduce's float sums and products in
their fixed order (fixed_order_reduce.cc, mesh.isa.kernels.reduction), reading a BF16
operand as it is, where XLA:CPU would first copy all of it to FP32.

Each is an XLA FFI custom call on the CPU, registered with jax when this module is imported
(so that an executable that calls it can run however it was made: traced here, or read
from a compilation cache made on another host). The pass loop takes BF16 and FP32 operands
(`runs`) and writes FP32 sums or their rounding to BF16 (`OUT_DTYPES`), on any CPU, and
gives the same bits on every one: its AVX-512 code where the CPU has the instructions
(`avx512`), else a portable path of the same operations in the same order. The reduce takes
BF16 and FP32 operands (`reduces`) and writes FP32, its operations the same in any vector
width the CPU has.
The results depend on them (the executor's XLA loop sums in other orders), so importing this
module without the built libraries is an error rather than a fallback.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

TARGET = "jax_trn2_pass_matmul"
REDUCE_TARGET = "jax_trn2_fixed_order_reduce"
HOST_DTYPES = (jnp.bfloat16, jnp.float32)
OUT_DTYPES = (jnp.float32, jnp.bfloat16)  # the sums, or the sums rounded to nearest even


def _load(stem: str, symbol: str, target: str) -> ctypes.CDLL:
    """The built library `stem` (of mesh/isa/kernels/{stem without its _}.cc), its FFI
    handler `symbol` registered with jax as `target`."""
    here = os.path.dirname(os.path.abspath(__file__))
    source = f"mesh/isa/kernels/{stem.lstrip('_')}.cc"
    paths = [os.path.join(here, stem + suffix)
             for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    for path in filter(os.path.exists, paths):
        try:
            library = ctypes.CDLL(path)
        except OSError as error:
            raise ImportError(f"the native kernel {path} does not load ({error}); "
                              "rebuild it: pip install -e . in the repository") from error
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                    platform="cpu")
        return library
    raise ImportError(f"the native kernel {source} is not built in {here}: build it with "
                      "pip install -e . in the repository")


_LIBRARY = _load("_pass_matmul", "PassMatmul", TARGET)
_load("_fixed_order_reduce", "FixedOrderReduce", REDUCE_TARGET)


# The columns of one tile of the result (pass_matmul.cc's kTileCols): a part of a result
# in parts (pass_matmul's `parts`) must hold each of its tiles' rows whole.
TILE_COLUMNS = int(_LIBRARY.TileColumns())


def round_to_bf16(x: np.ndarray, portable: bool = False) -> np.ndarray:
    """FP32 values (a NumPy array) rounded to BF16 as the loop rounds a BF16 result (its
    AVX-512 code where this CPU runs it, or the `portable` path): for checks against
    XLA:CPU's conversion."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, jnp.bfloat16)
    _LIBRARY.RoundToBf16(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                         ctypes.c_int64(x.size), ctypes.c_int(bool(portable)))
    return out


def runs(host_dtype) -> bool:
    """Whether the native loop takes operands of `host_dtype` (on any CPU)."""
    return jnp.dtype(host_dtype) in HOST_DTYPES


def avx512(host_dtype) -> bool:
    """Whether the native loop runs its AVX-512 code for operands of `host_dtype` on this
    CPU (else its portable path, which gives the same bits)."""
    return bool(_LIBRARY.Avx512(int(jnp.dtype(host_dtype) == jnp.bfloat16)))


class Strided(NamedTuple):
    """An operand read as an array of `shape` whose dim d steps `strides[d]` elements
    through `array` (row-major, of any shape): a view, where a data movement made the
    operand from `array` by only rearranging its elements."""

    array: jax.Array
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @classmethod
    def of(cls, x: jax.Array) -> "Strided":
        """x as it is."""
        return cls(x, tuple(x.shape), row_major(x.shape))

    def is_run(self, dims: Sequence[int]) -> bool:
        """Whether the elements along `dims` are one contiguous run, row-major in their
        order (dims of size 1 aside: they add nothing to an offset)."""
        long = [d for d in dims if self.shape[d] > 1]
        return all(self.strides[d] == s
                   for d, s in zip(long, row_major([self.shape[d] for d in long])))


class Placement(NamedTuple):
    """Where a result of executor layout `layout` goes: its element at index i at element
    sum(i[d] * strides[d]) of an array of `shape`, every element of which it writes."""

    layout: tuple[int, ...]
    strides: tuple[int, ...]
    shape: tuple[int, ...]


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides, in elements, of a row-major array of `shape`."""
    return tuple(int(s) for s in
                 np.cumprod((tuple(shape[1:]) + (1,))[::-1], dtype=np.int64)[::-1])


class Offsets(NamedTuple):
    """Where the elements along some dims of an array are, in elements from its first: one
    offset per index of those dims (of `sizes`), enumerated row-major, index i at
    sum(i[j] * strides[j]). The native loop makes its tables of offsets from these when it
    runs (an array of them would be a constant of the program, which XLA compiles into
    kernels of its own)."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def offsets(shape: Sequence[int], dims: Sequence[int],
            strides: Sequence[int] | None = None) -> Offsets:
    """Where the elements along `dims` of an array of `shape` are, dim d stepping
    `strides[d]` elements (default: row-major), enumerated row-major in the order given (a
    dim not given is at index 0)."""
    strides = row_major(shape) if strides is None else strides
    return Offsets(tuple(int(shape[d]) for d in dims), tuple(int(strides[d]) for d in dims))


def _offsets_attribute(tables: Sequence[Offsets]) -> np.ndarray:
    """The tables as pass_matmul.cc's `offsets` attribute: each table's count of dims, then
    each dim's size and stride."""
    return np.array([x for at in tables for x in (len(at.sizes), *(
        v for dim in zip(at.sizes, at.strides) for v in dim))], np.int64)


def pass_matmul(lhs: jax.Array, rhs: jax.Array, pass_size: int, lhs_at: Sequence[Offsets],
                rhs_at: Sequence[Offsets], out_at: Sequence[Offsets],
                out_shape: Sequence[int], portable: bool = False,
                parts: int = 1, out_dtype=jnp.float32) -> list[jax.Array]:
    """The array of `out_shape` whose element (b, m, n) is the sum over k of
    lhs(b, m, k) rhs(b, k, n), K cut into passes of `pass_size`, each summed in FP32, added
    in order (traceable, for CPU executor devices only): the FP32 sums, or (`out_dtype`
    BF16) those sums rounded to nearest even as XLA:CPU converts them (no FP32 array made
    for it), as `parts` arrays of its leading dims' blocks (out_shape[:d] of `parts`
    elements; each of shape out_shape[d:]), each a buffer of its own. Operands of one host
    type, BF16 or FP32, in any layout the offsets (`offsets`) describe: lhs(b, m, k)
    is lhs's element lhs_at[0][b] + lhs_at[1][m] + k (its contraction contiguous; at[i]
    the offset of index i), rhs(b, k, n) is rhs_at[0][b] + rhs_at[1][k] + rhs_at[2][n],
    and the result's (b, m, n) out_at[0][b] + out_at[1][m] + out_at[2][n] of the whole
    array, where each row of a result tile (TILE_COLUMNS consecutive column offsets) must
    lie in one part (else the call fails). `portable` runs the portable path even where
    the AVX-512 code would run (for tests: the same bits)."""
    lead = next((d for d in range(len(out_shape) + 1)
                 if int(np.prod(out_shape[:d], dtype=np.int64)) == parts), None)
    if lead is None:
        raise ValueError(f"pass_matmul: {parts} parts are not blocks of the leading dims of "
                         f"{tuple(out_shape)}")
    if jnp.dtype(out_dtype) not in OUT_DTYPES:
        raise ValueError(f"pass_matmul: a result of FP32 or BF16, not {jnp.dtype(out_dtype)}")
    if (len(lhs_at), len(rhs_at), len(out_at)) != (2, 3, 3):
        raise ValueError("pass_matmul: offsets of lhs's batch and rows, of rhs's batch, "
                         "contraction and columns, and of the result's batch, rows and "
                         f"columns, not {len(lhs_at)}, {len(rhs_at)} and {len(out_at)}")
    part = jax.ShapeDtypeStruct(tuple(out_shape[lead:]), out_dtype)
    call = jax.ffi.ffi_call(TARGET, [part] * parts)
    return call(lhs, rhs, offsets=_offsets_attribute((*lhs_at, *rhs_at, *out_at)),
                pass_size=np.int64(pass_size), portable=bool(portable))


def reduces(dtype) -> bool:
    """Whether the native reduce (fixed_order_reduce) takes operands of `dtype`."""
    return jnp.dtype(dtype) in HOST_DTYPES


def fixed_order_reduce(x: jax.Array, axis: int, product: bool = False) -> jax.Array:
    """x (BF16 or FP32) summed (or multiplied, `product`) along `axis`, which the result
    drops, in FP32 in the reduce's fixed order (traceable, for CPU executor devices only):
    element k of the n along it to lane k % L of L = max(8, the smallest power of two from
    n / 32) lanes, each lane combined in sequence, then lane i with lane i + L/2 until one
    is left (mesh.isa.kernels.reduction.in_fixed_order)."""
    if not reduces(x.dtype):
        raise ValueError(f"fixed_order_reduce: a BF16 or FP32 operand, not {x.dtype}")
    shape = tuple(x.shape)
    out = jax.ShapeDtypeStruct(shape[:axis] + shape[axis + 1:], jnp.float32)
    return jax.ffi.ffi_call(REDUCE_TARGET, out)(
        x, outer=np.int64(np.prod(shape[:axis], dtype=np.int64)), n=np.int64(shape[axis]),
        inner=np.int64(np.prod(shape[axis + 1:], dtype=np.int64)), product=bool(product))
