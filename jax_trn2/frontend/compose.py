"""jax_trn2.jit functions under JAX's transformations: a call primitive.

Called with tracers (inside `jax.grad`, `jax.vjp`, `jax.jvp`, `jax.vmap`, `jax.jit`, or
another `jax_trn2.jit`), a `jax_trn2.jit` function binds `trn2_call_p`, a JAX call primitive
like `core.call_p`. JAX transforms a call primitive by transforming the function it calls
and binding the same primitive again: the JVP of the call is a call of the JVP of the
function, its linearisation a call of the primal part (with the residuals it saves) and a
call of the linear part, its transpose a call of the transposed function, its batched form a
call of the vmapped function. The function a call carries is the `jax.jit` of the user's
function with the `jax_trn2.jit`'s in/out shardings, so the transformed computation checks
and keeps them as jax.jit does (jax.jit's own JVP, transpose and batching rules carry them
along) and the program run on the mesh is partitioned like the untransformed one. When
such a call is finally evaluated (no tracer left, at the top level), its implementation
(jax_trn2.jit's `_run_on_mesh`, which jax_trn2.jit installs: this module knows nothing of
compiling) compiles the function it carries for the simulated mesh and runs it there. So
`jax.grad(jax_trn2.jit(f))(x)` runs the forward pass and the backward pass on the simulated
mesh, each as its own program. Inside a staged computation (`jax.jit`, or an outer
`jax_trn2.jit`) the call is inlined as a `func.call` of the function.

This uses JAX's call-primitive machinery from `jax._src` (there is no public API to define
a call primitive); the rules registered here are the ones `core.call_p` has.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

from jax import tree_util
from jax._src import api_util, core, dtypes
from jax._src import linear_util as lu
from jax._src.interpreters import ad, mlir
from jax._src.interpreters import partial_eval as pe

from jax_trn2.core.options import ProgramOptions


class Trn2CallPrimitive(core.CallPrimitive):
    """A call of a function that runs on the simulated Trainium2 mesh when evaluated."""

    def bind_with_trace(self, trace, args, avals, params, /):
        # jax.linearize passes the primal inputs a function saves for its linear part on
        # to the call of that part as the user gave them (NumPy arrays, Python scalars),
        # and tracing such a call stages them as constants, which must be JAX values.
        args = [arg if isinstance(arg, core.Tracer) else dtypes.canonicalize_value(arg)
                for arg in args]
        return super().bind_with_trace(trace, args, avals, params)


trn2_call_p = Trn2CallPrimitive("trn2_call")


def is_traced(leaves: list[Any]) -> bool:
    """True when a call is being traced by a JAX transformation (not evaluated): an argument
    is a tracer, or a transformation is tracing the code that makes the call with concrete
    arguments closed over (as `checkify.checkify` and `jax.make_jaxpr(lambda: f(x))` do)."""
    return (any(isinstance(leaf, core.Tracer) for leaf in leaves)
            or not isinstance(core.trace_ctx.trace, core.EvalTrace))


def call_traced(fun: Callable, static: dict, leaves: list[Any], in_tree,
                options: ProgramOptions, executor_devices: Sequence[Any] | None) -> Any:
    """`fun` on traced flat dynamic arguments `leaves` (static arguments `static`, by
    position or name), as a trn2_call: returns the output pytree. The call is evaluated
    with `options` on `executor_devices`, as the untransformed function would be."""
    out_tree_store = []

    def flat_fun(*flat_args):
        args, kwargs = tree_util.tree_unflatten(in_tree, flat_args)
        args, kwargs = _with_statics(args, kwargs, static)
        out = fun(*args, **kwargs)
        out_leaves, out_tree = tree_util.tree_flatten(out)
        out_tree_store.append(out_tree)
        return out_leaves

    debug = api_util.debug_info("jax_trn2.jit", flat_fun, tuple(leaves), {})
    wrapped = lu.wrap_init(flat_fun, debug_info=debug)
    outs = trn2_call_p.bind(*leaves, subfuns=(wrapped,), name=getattr(fun, "__name__", "fun"),
                            options=options,
                            executor_devices=None if executor_devices is None
                            else tuple(executor_devices))
    return tree_util.tree_unflatten(out_tree_store[-1], outs)


def _with_statics(args: tuple, kwargs: dict, static: dict) -> tuple[tuple, dict]:
    """Put the static arguments back (positions are in the full argument list)."""
    args = list(args)
    for position in sorted(k for k in static if isinstance(k, int)):
        args.insert(position, static[position])
    kwargs = {**kwargs, **{k: v for k, v in static.items() if isinstance(k, str)}}
    return tuple(args), kwargs


def _lower_inline(ctx, *args, call_jaxpr, name, options, executor_devices):
    del options, executor_devices  # the enclosing program's machine and rounding apply
    return mlir.core_call_lowering(ctx, *args, name=name, call_jaxpr=call_jaxpr)


mlir.register_lowering(trn2_call_p, _lower_inline)
ad.fancy_transposes[trn2_call_p] = partial(ad.call_transpose_fancy, trn2_call_p)
pe.partial_eval_jaxpr_custom_rules[trn2_call_p] = partial(
    pe.call_partial_eval_custom_rule, "call_jaxpr",
    lambda _, __, ___, ____, _____, known, staged: (known, staged))
pe.dce_rules[trn2_call_p] = pe.dce_jaxpr_call_rule
