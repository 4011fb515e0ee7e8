"""dot_general on the Tensor Engine.

Model (nki.isa.nc_matmul; mesh/machine/trn2_facts.md): the PE array multiplies BF16/FP16/FP8
inputs exactly and sums a pass of up to 128 contraction elements in FP32; passes accumulate
into an FP32 PSUM tile one after another; the result is rounded once to the output type.
Here each pass is one host matmul with FP32 accumulation, and passes are added in order.
BF16 and FP8 inputs go to the host as BF16 (every FP8 value is a BF16 value), so that CPUs
with BF16 dot instructions run them at their BF16 rate; a product of two BF16 values fits
FP32's 24-bit significand, so products are exact either way. Other float inputs go as FP32.
(Host BF16 dot instructions flush subnormal products to zero; a product that small is below
FP32's normal range and lost in any FP32 sum with a normal value.) Integer inputs accumulate
exactly in their integer output type.

Mesh dims: a mesh axis along which both operands vary is a batch dim, one along which only
one operand varies is a free dim of that operand, and one along which neither varies is not
computed at all (the product is replicated there).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, isa, numerics
from mesh.isa.kernels import kernel
from mesh.isa.kernels.context import KernelContext


@kernel(isa.Matmul)
def matmul(instr: isa.Matmul, args, ctx: KernelContext):
    lhs, rhs = args
    nm = ctx.nm
    both = [a for a in range(nm) if lhs.shape[a] > 1 and rhs.shape[a] > 1]
    lhs_only = [a for a in range(nm) if lhs.shape[a] > 1 and rhs.shape[a] == 1]
    rhs_only = [a for a in range(nm) if rhs.shape[a] > 1 and lhs.shape[a] == 1]
    lhs3 = _to_batch_free_k(lhs, nm, both, lhs_only, instr.lhs_batch, instr.lhs_contract)
    rhs3 = _to_batch_free_k(rhs, nm, both, rhs_only, instr.rhs_batch, instr.rhs_contract)
    out = _passes(lhs3, rhs3, instr, ctx)

    # out dims: (both mesh, local batch, lhs-only mesh, lhs free, rhs-only mesh, rhs free)
    local_batch = tuple(lhs.shape[nm + d] for d in instr.lhs_batch)
    lhs_free = _free_shape(lhs, nm, instr.lhs_batch, instr.lhs_contract)
    rhs_free = _free_shape(rhs, nm, instr.rhs_batch, instr.rhs_contract)
    mesh_sizes = ctx.mesh.axis_sizes
    out = out.reshape(tuple(mesh_sizes[a] for a in both) + local_batch
                      + tuple(mesh_sizes[a] for a in lhs_only) + lhs_free
                      + tuple(mesh_sizes[a] for a in rhs_only) + rhs_free)
    groups = [both, list(local_batch), lhs_only, list(lhs_free), rhs_only, list(rhs_free)]
    starts = np.cumsum([0] + [len(g) for g in groups])
    mesh_pos = {a: int(starts[0]) + i for i, a in enumerate(both)}
    mesh_pos.update({a: int(starts[2]) + i for i, a in enumerate(lhs_only)})
    mesh_pos.update({a: int(starts[4]) + i for i, a in enumerate(rhs_only)})
    local_order = (list(range(starts[1], starts[2])) + list(range(starts[3], starts[4]))
                   + list(range(starts[5], starts[6])))
    mesh_order = [mesh_pos[a] for a in range(nm) if a in mesh_pos]
    out = lax.transpose(out, tuple(mesh_order + local_order))
    return [out.reshape(ctx.out_shape(instr))]


def _free_shape(x, nm, batch, contract) -> tuple[int, ...]:
    local = x.shape[nm:]
    return tuple(s for d, s in enumerate(local) if d not in batch and d not in contract)


def _to_batch_free_k(x, nm, both, only, batch, contract):
    """x as [B, F, K]: B = (shared mesh dims, local batch dims), F = (own mesh dims, free dims),
    K = contraction dims flattened in the dot's order."""
    local_rank = x.ndim - nm
    free = [d for d in range(local_rank) if d not in batch and d not in contract]
    perm = (both + [nm + d for d in batch] + only + [nm + d for d in free]
            + [nm + d for d in contract])
    dropped = [a for a in range(nm) if a not in both and a not in only]  # size-1 mesh dims
    y = lax.transpose(x, tuple(dropped + perm))
    shape = y.shape[len(dropped):]
    nb = len(both) + len(batch)
    nf = len(only) + len(free)
    return y.reshape((int(np.prod(shape[:nb], dtype=np.int64)),
                      int(np.prod(shape[nb:nb + nf], dtype=np.int64)),
                      int(np.prod(shape[nb + nf:], dtype=np.int64))))


def _passes(lhs3, rhs3, instr: isa.Matmul, ctx: KernelContext, out_dtype: str | None = None):
    """[B,M,K] x [B,N,K] -> [B,M,N], K cut into passes accumulated in FP32 in order."""
    out_dtype = out_dtype or instr.out_dtype
    if out_dtype in dtypes.COMPLEX_PARTS:
        return _complex_passes(lhs3, rhs3, instr, ctx, dtypes.COMPLEX_PARTS[out_dtype])
    dims = (((2,), (2,)), ((0,), (0,)))
    if not dtypes.is_float(out_dtype):
        acc = dtypes.numpy_dtype(out_dtype)
        return lax.dot_general(lhs3.astype(acc), rhs3.astype(acc), dims,
                               preferred_element_type=acc)
    host = _host_dtype(lhs3.dtype, rhs3.dtype)
    lhs3, rhs3 = lhs3.astype(host), rhs3.astype(host)
    batch, k = lhs3.shape[0], lhs3.shape[2]
    if batch == 1:  # a plain GEMM is faster on the host than a batch of one
        lhs3, rhs3, dims = lhs3[0], rhs3[0], (((1,), (1,)), ((), ()))
    accumulate = jnp.float64 if host == jnp.float64 else jnp.float32  # PSUM: FP32

    def product(lhs, rhs):  # one pass: a host GEMM accumulating in `accumulate`
        return lax.dot_general(lhs, rhs, dims, precision=lax.Precision.HIGHEST,
                               preferred_element_type=accumulate)

    size = instr.pass_size
    whole, rest = divmod(k, size)
    if whole == 0:
        acc = product(lhs3, rhs3)
    else:
        # The whole passes as contiguous [pass, ..., size] blocks, added one after another
        # by a scan (one host GEMM in the program, each pass's operands read contiguously).
        # The scan carries the blocks as raw bits: XLA:CPU would otherwise widen BF16 loop
        # operands to FP32 before the loop (a copy of both operands at twice the size).
        lhs_passes, rhs_passes = (_split_passes(x, whole, size) for x in (lhs3, rhs3))
        acc, _ = lax.scan(lambda acc, bits: (acc + product(*map(_from_bits, bits, (host,) * 2)),
                                             None),
                          product(lhs_passes[0], rhs_passes[0]),
                          (_to_bits(lhs_passes[1:]), _to_bits(rhs_passes[1:])))
        if rest:
            acc = acc + product(lhs3[..., whole * size:], rhs3[..., whole * size:])
    if batch == 1:
        acc = acc[None]
    return numerics.round_to(acc, out_dtype, ctx.rounding)


def _complex_passes(lhs3, rhs3, instr: isa.Matmul, ctx: KernelContext, part: str):
    """A complex product as 4 real ones on the Tensor Engine (the "4M" method, as BLAS's
    CGEMM): Re = Ar Br - Ai Bi, Im = Ar Bi + Ai Br, each real product accumulated in passes
    like any real matmul and the two combined on the Vector Engine. Gauss's 3-product
    method saves a product but its Im = (Ar + Ai)(Br + Bi) - Ar Br - Ai Bi cancels large
    terms, so its imaginary parts lose accuracy when Ar Br and Ai Bi are large."""
    def product(a, b):
        return _passes(a, b, instr, ctx, out_dtype=part)

    ar, ai, br, bi = lax.real(lhs3), lax.imag(lhs3), lax.real(rhs3), lax.imag(rhs3)
    return lax.complex(product(ar, br) - product(ai, bi), product(ar, bi) + product(ai, br))


def _split_passes(x, whole: int, size: int):
    """[..., K] -> [whole, ..., size]: the first whole * size contraction elements by pass."""
    x = x[..., :whole * size].reshape(x.shape[:-1] + (whole, size))
    return jnp.moveaxis(x, -2, 0)


def _to_bits(x):
    """x's bits as unsigned integers of its width (bitcast, no conversion)."""
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{jnp.dtype(x.dtype).itemsize * 8}"))


def _from_bits(bits, dtype):
    return lax.bitcast_convert_type(bits, dtype)


_BF16_EXACT = dtypes.FP8_TYPES | {"bfloat16"}


def _host_dtype(lhs_dtype, rhs_dtype):
    """BF16 when both operands are exactly BF16 values (BF16 or FP8); FP64 for FP64 inputs
    (not a Trainium2 type: computed as the program says); FP32 otherwise."""
    names = {np.dtype(lhs_dtype).name, np.dtype(rhs_dtype).name}
    if names <= _BF16_EXACT:
        return jnp.bfloat16
    return jnp.float64 if "float64" in names else jnp.float32
