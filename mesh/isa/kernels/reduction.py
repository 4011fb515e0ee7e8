"""Reductions over local dims (the Vector engine's reduce).

Narrow floats are widened to FP32, reduced, combined with the init value and rounded once
to the output type. A float sum or product is taken in a fixed pairwise tree along each
reduced dim (`pairwise`), so a chip's result does not depend on how many chips one executor
device computes: XLA:CPU's own reduce sums in another order where it keeps 1 or 2 rows than
where it keeps 4 or more.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh import isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import broadcast_mesh
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
        reduced = pairwise(x, axes, op)
    else:  # exact in any order (integers, bools, max, min), or empty (the identity)
        reduced = whole(numerics.widen(x), axes)
    init = numerics.widen(init).reshape(init.shape[:ctx.nm] + (1,) * (reduced.ndim - ctx.nm))
    return numerics.round_to(combine(reduced, init), out_dtype, ctx.rounding)


def pairwise(x: jnp.ndarray, axes: tuple[int, ...], op: str) -> jnp.ndarray:
    """x combined by `op` (a key of IDENTITIES) along `axes` (dropped) in a fixed order,
    in x's compute type: along each axis in turn, padded with op's identity to a power of
    two, the second half combined into the first until one element is left. Each step is
    an elementwise combine of two slices, so every element of the result is computed in the
    same order whatever the sizes of the other dims."""
    combine = MONOIDS[op][1]
    for axis in axes:
        n = x.shape[axis]
        p = 1 << (n - 1).bit_length()  # the smallest power of two from n
        padding = [(0, 0, 0)] * x.ndim
        padding[axis] = (0, p - n, 0)
        x = lax.pad(x, IDENTITIES[op](x.dtype), padding)
        while p > 1:
            p //= 2  # (each half widened: a narrow x is converted as it is read)
            x = combine(numerics.widen(lax.slice_in_dim(x, 0, p, axis=axis)),
                        numerics.widen(lax.slice_in_dim(x, p, 2 * p, axis=axis)))
    return lax.squeeze(numerics.widen(x), axes)


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
