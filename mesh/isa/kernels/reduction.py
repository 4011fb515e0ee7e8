"""Reductions over local dims (the Vector engine's reduce).

Narrow floats are widened to FP32, reduced, combined with the init value and rounded once
to the output type. A float sum or product is taken in a fixed order along each reduced
dim, as a SIMD engine would: lanes that each add up to 32 elements one after another, then a
pairwise tree across the lanes (`in_fixed_order`). So a chip's result does not depend on how
many chips one executor device computes: XLA:CPU's own reduce sums in an order that changes
with the sizes of the kept dims (with 1 or 2 rows other than with 4 or more). On CPU
executor devices the native kernel (mesh.isa.kernels.native.fixed_order_reduce) takes these
steps, reading a BF16 operand as it is; elsewhere (and for FP64 or complex operands) XLA
does, as elementwise combines of slices (`_along_lanes`), the same operations in the same
order.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh import isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels import native
from mesh.isa.kernels.devices import broadcast_mesh, on_executor_devices
from mesh.isa.kernels.elementwise import boolean_equivalent
from mesh.isa.kernels.sub_byte import from_bytes, to_bytes

# combiner -> (reduction over axes, binary op); each handles bools and empty axes (giving
# the identity of the combiner).
MONOIDS = {
    "add": (lax.reduce_sum, lax.add),
    "multiply": (lax.reduce_prod, lax.mul),
    "maximum": (lax.reduce_max, lax.max),
    "minimum": (lax.reduce_min, lax.min),
    "and": (lax.reduce_and, lax.bitwise_and),
    "or": (lax.reduce_or, lax.bitwise_or),
    "xor": (lax.reduce_xor, lax.bitwise_xor),
}
# The combiners whose float result depends on the order of the elements (their rounding),
# with their exact identities: x + -0 is x for every x, +0 and -0 included (x + +0 is not).
IDENTITIES = {"add": lambda dtype: jnp.array(-0.0, dtype),
              "multiply": lambda dtype: jnp.array(1, dtype)}
# The order of a float sum or product (`_along_lanes`): at least 8 lanes, each combining at
# most 32 elements in sequence (each of the 32 steps is an op of its own in the program).
MIN_LANES = 8
MAX_RUN = 32


@kernel(isa.Reduce)
def reduce(instr: isa.Reduce, args, ctx: KernelContext):
    n = len(args) // 2
    operands, inits = args[:n], args[n:]
    axes = tuple(ctx.nm + d for d in instr.dimensions)
    if instr.combiner is not None and n == 1:
        return [_monoid_reduce(instr, operands[0], inits[0], axes, ctx)]
    return _general_reduce(instr, operands, inits, axes, ctx)


def _monoid_reduce(instr, x, init, axes, ctx):
    op = boolean_equivalent(instr.combiner, x.dtype)
    whole, combine = MONOIDS[op]
    out_dtype = ctx.out_info(instr).type.dtype
    if op in IDENTITIES and jnp.issubdtype(x.dtype, jnp.inexact) and 0 not in x.shape:
        reduced = in_fixed_order(x, axes, op, ctx)
    else:  # exact in any order (integers, bools, max, min), or empty (the identity)
        reduced = whole(numerics.widen(x), axes)
    init = numerics.widen(init).reshape(init.shape[:ctx.nm] + (1,) * (reduced.ndim - ctx.nm))
    return numerics.round_to(combine(reduced, init), out_dtype, ctx.rounding)


def in_fixed_order(x: jnp.ndarray, axes: tuple[int, ...], op: str,
                   ctx: KernelContext) -> jnp.ndarray:
    """x combined by `op` (a key of IDENTITIES) along `axes` (dropped) in x's compute type
    (FP32 for narrow floats), in an order fixed by the reduced dims' sizes alone: one
    reduced dim after another, lowest first, each as `_along_lanes` says. The order does not
    depend on the sizes of the other dims, so neither on how many chips an executor device
    computes. In the native kernel on CPU executor devices (`ctx.on_cpu`) where it takes
    the operand (BF16 as it is, other narrow floats widened to FP32) and there is a dim to
    reduce, else in XLA."""
    operand = x if native.reduces(x.dtype) else numerics.widen(x)
    # Over no dims the native kernel would make no pass, leaving BF16 in BF16.
    if ctx.on_cpu and native.reduces(operand.dtype) and axes:
        def along_each(x):  # (each pass drops its dim: the later ones move down by one)
            for done, axis in enumerate(sorted(axes)):
                x = native.fixed_order_reduce(x, axis - done, product=op == "multiply")
            return x
        return on_executor_devices(along_each, operand, ctx.nm, ctx.executor)
    x = numerics.widen(x)  # (XLA widens a narrow x in full ahead of the slices either way)
    for axis in sorted(axes):
        x = _along_lanes(x, axis, op)
    return lax.squeeze(x, axes)


def _along_lanes(x: jnp.ndarray, axis: int, op: str) -> jnp.ndarray:
    """x combined along `axis` (kept, size 1) like a SIMD engine: element k of the n goes to
    lane k % L of L = max(8, the smallest power of two from n / 32) lanes; each lane
    combines its (at most 32) elements one after another; then lane i is combined with lane
    i + L/2, halving until one is left. Each step is an elementwise combine of slices, which
    XLA keeps in order; its own reduce does not (XLA:CPU's order changes with the sizes of
    the kept dims, even along a dim of 32)."""
    combine = MONOIDS[op][1]
    n = x.shape[axis]
    lanes = max(MIN_LANES, 1 << (-(-n // MAX_RUN) - 1).bit_length())
    acc = None
    for start in range(0, n, lanes):  # the runs of `lanes` elements, the last padded
        run = lax.slice_in_dim(x, start, min(start + lanes, n), axis=axis)
        padding = [(0, 0, 0)] * x.ndim
        padding[axis] = (0, lanes - run.shape[axis], 0)
        run = lax.pad(run, IDENTITIES[op](x.dtype), padding)
        acc = run if acc is None else combine(acc, run)
    while lanes > 1:
        lanes //= 2
        acc = combine(lax.slice_in_dim(acc, 0, lanes, axis=axis),
                      lax.slice_in_dim(acc, lanes, 2 * lanes, axis=axis))
    return acc


def _general_reduce(instr, operands, inits, axes, ctx):
    """lax.reduce with the op's own reducer body, run as a scalar sub-program whose block
    arguments are the accumulators followed by the new elements."""
    nm = ctx.nm
    if any(i.shape[:nm] != (1,) * nm for i in inits):
        raise NotImplementedError("a reduce whose init value differs from chip to chip")
    types = [i.dtype for i in inits]
    operands = [to_bytes(x) for x in broadcast_mesh(operands, nm)]
    scalar_inits = tuple(to_bytes(i.reshape(())) for i in inits)

    def body(acc, x):
        narrow = [from_bytes(v, t) for v, t in zip(list(acc) + list(x), types + types)]
        return tuple(to_bytes(r) for r in ctx.run(instr.body, narrow))

    results = lax.reduce(tuple(operands), scalar_inits, body, axes)
    return [from_bytes(r, t) for r, t in zip(results, types)]
