"""Loops and conditionals over the whole mesh.

Sub-programs run on the executor's arrays directly (leading mesh dims), so collectives in a
loop body or a branch see every chip. A condition the same on every chip becomes one
lax.while_loop / lax.switch; one that differs from chip to chip is handled with masks:
a loop runs while any chip goes on and freezes the state of chips that are done, and a
conditional runs every branch and keeps, on each chip, the results of its own branch.

A collective in a branch or loop body that only some members of its group reach is not
defined by StableHLO (the hardware would wait for the others forever): the run ends with an
error naming it (mesh.isa.kernels.participation).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh.isa.control import Case, Composite, Scan, While
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.elementwise import select


def _is_replicated(x: jnp.ndarray, nm: int) -> bool:
    return all(d == 1 for d in x.shape[:nm])


def _per_chip(flag: jnp.ndarray, like: jnp.ndarray, nm: int) -> jnp.ndarray:
    """A per-chip scalar [mesh...] shaped to broadcast against `like` [mesh..., local...]."""
    return flag.reshape(flag.shape[:nm] + (1,) * (like.ndim - nm))


@kernel(While)
def while_(instr: While, args, ctx: KernelContext):
    n = len(instr.outs)
    shapes = [ctx.out_shape(instr, i) for i in range(n)]
    state = tuple(jnp.broadcast_to(a, s) for a, s in zip(args[:n], shapes))
    captured = list(args[n:])

    def cond(state, reached=None) -> jnp.ndarray:
        args = list(state) + captured
        (go,) = ctx.run(instr.cond, args) if reached is None else \
            ctx.run_on(instr.cond, args, reached)
        return go

    def body(state) -> tuple:
        outs = ctx.run(instr.body, list(state) + captured)
        return tuple(jnp.broadcast_to(o, s) for o, s in zip(outs, shapes))

    if not instr.cond.info(instr.cond.outputs[0]).varying:
        return list(lax.while_loop(lambda s: cond(s).reshape(()), body, state))

    # The condition differs between chips: every state value varies along its axes (the
    # lowering widened their layouts), so each chip's state can be frozen on its own. A chip
    # that left the loop runs neither its body nor its condition again (the condition's
    # collectives are checked against the chips still in it).
    def masked_body(carry):
        go, state = carry
        new = tuple(jnp.broadcast_to(o, s) for o, s in
                    zip(ctx.run_on(instr.body, list(state) + captured, go), shapes))
        state = tuple(select(_per_chip(go, old, ctx.nm), upd, old)
                      for upd, old in zip(new, state))
        return go & cond(state, go), state

    _, final = lax.while_loop(lambda carry: jnp.any(carry[0]), masked_body,
                              (cond(state), state))
    return list(final)


def _branch_index(index: jnp.ndarray, n: int) -> jnp.ndarray:
    """The branch each chip takes: bool true -> 0, false -> 1 (stablehlo.if); an int index
    out of [0, n) -> n - 1 (stablehlo.case)."""
    if index.dtype == jnp.bool_:
        return jnp.where(index, 0, 1).astype(jnp.int32)
    index = index.astype(jnp.int32)
    return jnp.where((index < 0) | (index >= n), n - 1, index)


@kernel(Case)
def case(instr: Case, args, ctx: KernelContext):
    n = len(instr.branches)
    index, captured = _branch_index(args[0], n), list(args[1:])
    shapes = [ctx.out_shape(instr, i) for i in range(len(instr.outs))]

    def run(branch, reached=None):
        def call(*c):
            outs = ctx.run(branch, list(c)) if reached is None else \
                ctx.run_on(branch, list(c), reached)
            return [jnp.broadcast_to(o, s) for o, s in zip(outs, shapes)]
        return call

    if _is_replicated(index, ctx.nm):
        return lax.switch(index.reshape(()), [run(b) for b in instr.branches], *captured)
    results = [run(branch, index == b)(*captured) for b, branch in enumerate(instr.branches)]
    chosen = results[-1]
    for b in reversed(range(n - 1)):
        chosen = [select(_per_chip(index == b, r, ctx.nm), r, c)
                  for r, c in zip(results[b], chosen)]
    return chosen


@kernel(Composite)
def composite(instr: Composite, args, ctx: KernelContext):
    return [jnp.broadcast_to(o, ctx.out_shape(instr, i))
            for i, o in enumerate(ctx.run(instr.decomposition, list(args)))]


@kernel(Scan)
def scan(instr: Scan, args, ctx: KernelContext):
    nm, n_in, n_carry = ctx.nm, instr.num_inputs, instr.num_carries
    n_out = len(instr.outs) - n_carry
    axis = nm + instr.dimension
    inputs = [jnp.moveaxis(x, axis, 0) for x in args[:n_in]]
    carry_shapes = [ctx.out_shape(instr, n_out + i) for i in range(n_carry)]
    carries = tuple(jnp.broadcast_to(c, s) for c, s in zip(args[n_in:n_in + n_carry],
                                                            carry_shapes))
    captured = list(args[n_in + n_carry:])
    out_shapes = [_without(ctx.out_shape(instr, i), axis) for i in range(n_out)]

    def step(carry, slices):
        results = ctx.run(instr.body, list(slices) + list(carry) + captured)
        return (tuple(jnp.broadcast_to(c, s) for c, s in zip(results[n_out:], carry_shapes)),
                tuple(jnp.broadcast_to(o, s) for o, s in zip(results[:n_out], out_shapes)))

    final, outputs = lax.scan(step, carries, tuple(inputs), length=instr.trip_count,
                              reverse=instr.is_reverse)
    return [jnp.moveaxis(o, 0, axis) for o in outputs] + list(final)


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1:]
