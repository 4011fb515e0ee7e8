"""Reductions over local dims (the Vector engine's reduce).

Narrow floats are widened to FP32, reduced, combined with the init value and rounded once
to the output type; XLA's reduction order (pairwise, vectorised) is used within a chip.
"""

from __future__ import annotations

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


@kernel(isa.Reduce)
def reduce(instr: isa.Reduce, args, ctx: KernelContext):
    n = len(args) // 2
    operands, inits = args[:n], args[n:]
    axes = tuple(ctx.nm + d for d in instr.dimensions)
    if instr.combiner is not None and n == 1:
        return [_monoid_reduce(instr, operands[0], inits[0], axes, ctx)]
    return _general_reduce(instr, operands, inits, axes, ctx)


def _monoid_reduce(instr, x, init, axes, ctx):
    whole, combine = MONOIDS[boolean_equivalent(instr.combiner, x.dtype)]
    out_dtype = ctx.out_info(instr).type.dtype
    reduced = whole(numerics.widen(x), axes)
    init = numerics.widen(init).reshape(init.shape[:ctx.nm] + (1,) * (reduced.ndim - ctx.nm))
    return numerics.round_to(combine(reduced, init), out_dtype, ctx.rounding)


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
