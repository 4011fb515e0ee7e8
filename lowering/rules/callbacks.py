"""Host callbacks (jax.debug.print, jax.debug.callback, jax.pure_callback, io_callback) and
the tokens that order effects.

jax lowers a callback for CPU to `stablehlo.custom_call @xla_ffi_python_cpu_callback` with
`mhlo.backend_config = {index = i}` (StableHLO's `backend_config` once XLA has partitioned
the module); the Python function is entry i of the host callbacks jax keeps beside the
module (jax_trn2.jit passes them on). It becomes an isa.HostCallback,
run on the host once per chip (mesh.isa.kernels.callbacks).
"""

from __future__ import annotations

import jax

import numpy as np

from lowering.registry import custom_call_rule, rule
from lowering.walker import LoweringContext, Op
from mesh import isa

CALLBACK_TARGETS = ("xla_ffi_python_cpu_callback", "xla_ffi_partitioned_python_cpu_callback",
                    "xla_python_cpu_callback")

# What the user wrote, by the jax primitive in the op's scope (its location's name stack).
KINDS = {"debug_print": "jax.debug.print", "debug_callback": "jax.debug.callback",
         "pure_callback": "jax.pure_callback", "io_callback": "io_callback"}


@custom_call_rule(*CALLBACK_TARGETS)
def host_callback(ctx: LoweringContext, op: Op):
    kind = next((k for primitive, k in KINDS.items() if primitive in op.scope),
                "a host callback (jax.debug.print, jax.debug.callback, jax.pure_callback or "
                "io_callback)")
    callbacks = ctx.walker.host_callbacks
    index = op.backend_config.get("index")
    if index is None:
        raise ValueError(f"{kind}: the custom call's backend config names no callback index")
    index = int(index)
    if callbacks is None or index >= len(callbacks):
        raise NotImplementedError(
            f"{kind} needs its Python function, which this module was given without: "
            "call the function through jax_trn2.jit, which passes jax's host callbacks "
            "along (a StableHLO file or text given to Client.compile does not carry them)")
    every_axis = frozenset(range(ctx.walker.mesh.rank))
    return ctx.emit(isa.HostCallback, op, varying=every_axis, callback=callbacks[index],
                    kind=kind, has_side_effect=bool(op.attr("has_side_effect", False)),
                    x64=bool(jax.config.jax_enable_x64))


@rule("stablehlo.create_token", "stablehlo.after_all")
def token(ctx: LoweringContext, op: Op):
    """A token that orders what follows after its operands (lowering.mlir.TOKEN_TYPE): a
    value that depends on all of them."""
    if not op.operands:
        return ctx.emit(isa.Constant, op, varying=frozenset(), value=np.zeros((), bool))
    joined = op.operands[0]
    for other in op.operands[1:]:
        (joined,) = ctx.emit(isa.Elementwise, op, ins=(joined, other), op="and")
    return (joined,)
