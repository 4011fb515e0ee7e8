"""How jax lowers for the trn2 platform: as for the CPU, with host callbacks by global id.

The simulator runs the StableHLO jax emits for a CPU: the LAPACK custom calls of
`jnp.linalg`, and host callbacks as `xla_ffi_python_cpu_callback` custom calls (lowering
handles both). jax looks lowering rules up by the platform name the client reports, and
has CPU-only rules for those primitives, so the CPU's rules are made the trn2 platform's
(rules registered for it later still take precedence), but dot_general's, which is jax's
own (the CPU's refuses the dot algorithms XLA:CPU lacks).

A host callback's custom call names its Python function by an index into the host
callbacks jax keeps beside the module and passes to the backend's compile, which a PJRT
plugin does not receive. The callback rules here run jax's own rule (which accepts only
the platforms jax knows, so it is told "cpu") with an index into `CALLBACKS`, this
process's list of every callback lowered for trn2: the plugin's compile passes that list to
lowering. jax still sees each callback (it keeps them alive and skips the persistent
compilation cache for such programs, whose callbacks are of this process).

jaxlib serializes a module for a PJRT plugin with CHLO's functions expanded into
StableHLO approximations, except some it keeps as composites named after the op
(`chlo.erf`), which lowering computes as the op, as jax on a CPU computes it. The ones it
would expand (lgamma, digamma, ...) are lowered here as such composites too, so that both
of jax_trn2's front doors give the same bits.

jax lowers `jax.lax.ragged_dot` for the CPU as a dense dot over every group with a masked
[groups, rows, k] operand (groups times the work and the memory of the grouped matmul); the
trn2 platform lowers it as for the TPU, to `chlo.ragged_dot`, which lowering computes as one
matmul per group (mesh.isa.RaggedMatmul), with the CPU's dtype handling of dot_general.
Except where the lhs has several free dims: jaxlib's serialization for a plugin infers a
wrong result shape for such a chlo.ragged_dot (it keeps the rhs group dim) and fails, so
those keep the CPU's rule (a mixture of experts' [rows, d] lhs has one).

This uses jax's private lowering tables (jax._src.interpreters.mlir): there is no public
API to share another platform's rules.
"""

from __future__ import annotations

import collections
import functools
import threading
import types
from typing import Any

import jax
from jax._src import callback, debugging
from jax._src.interpreters import mlir
from jax._src.lax import lax, special

# Every host callback lowered for the trn2 platform in this process, by global id.
CALLBACKS: list[Any] = []
_lock = threading.Lock()  # between appending a callback and reading its id
_CPU = types.SimpleNamespace(platform="cpu")  # the backend jax's callback rule asks for


class _GlobalIds(list):
    """A module's host-callback list as jax's callback rule sees it: what it appends goes
    to CALLBACKS too, and its length is CALLBACKS' (so the index jax takes, len - 1, is the
    callback's global id)."""

    def __init__(self, module_callbacks: list):
        super().__init__()
        self._module_callbacks = module_callbacks

    def append(self, host_callback: Any) -> None:
        CALLBACKS.append(host_callback)
        self._module_callbacks.append(host_callback)

    def __len__(self) -> int:
        return len(CALLBACKS)


def _with_global_ids(cpu_rule):
    def rule(ctx, *args, **params):
        module = ctx.module_context
        as_cpu = module.replace(platforms=("cpu",), backend=_CPU,
                                host_callbacks=_GlobalIds(module.host_callbacks))
        inner = ctx.replace(module_context=as_cpu)
        with _lock:
            results = cpu_rule(inner, *args, **params)
        if inner.tokens_out is not None:  # an ordered callback's token, for the caller
            ctx.set_tokens_out(inner.tokens_out)
        return results
    return rule


# The CHLO functions jaxlib's serialization would expand (the others it keeps as
# composites), by the primitive that lowers to each.
_EXPANDED_CHLO = {special.lgamma_p: "chlo.lgamma", special.digamma_p: "chlo.digamma",
                  special.polygamma_p: "chlo.polygamma", special.zeta_p: "chlo.zeta",
                  special.bessel_i1e_p: "chlo.bessel_i1e", special.erfc_p: "chlo.erfc",
                  special.erf_inv_p: "chlo.erf_inv", lax.nextafter_p: "chlo.next_after"}
_decomposing = threading.local()  # lowering a composite's decomposition: the CPU's rule


def _as_composite(primitive: Any, name: str, cpu_rule: Any):
    def rule(ctx, *args, **params):
        if getattr(_decomposing, "active", False):
            return cpu_rule(ctx, *args, **params)
        _decomposing.active = True
        try:
            op = jax.lax.composite(lambda *xs: primitive.bind(*xs, **params), name=name)
            return mlir.lower_fun(op, multiple_results=False)(ctx, *args)
        finally:
            _decomposing.active = False
    return rule


def _cpu_rule(primitive: Any) -> Any:
    """The lowering rule jax uses for `primitive` on the CPU."""
    tables = mlir._platform_specific_lowerings
    return (tables["cpu"].get(primitive) or mlir._lowerings[primitive]).rule


def _ragged_dot_rule(cpu_rule):
    """ragged_dot_general as chlo.ragged_dot (jax's TPU rule, with the CPU's dtype handling
    of dots), or by `cpu_rule` where the lhs has several free dims (see the module doc)."""
    grouped = functools.partial(lax._ragged_dot_general_lower, platform="cpu")

    def rule(ctx, lhs, rhs, group_sizes, *, ragged_dot_dimension_numbers, **params):
        (lhs_contract, _), (lhs_batch, _) = ragged_dot_dimension_numbers.dot_dimension_numbers
        free = ctx.avals_in[0].ndim - len(lhs_contract) - len(lhs_batch)
        chosen = grouped if free <= 1 else cpu_rule
        return chosen(ctx, lhs, rhs, group_sizes,
                      ragged_dot_dimension_numbers=ragged_dot_dimension_numbers, **params)
    return rule


def register(platform: str) -> None:
    """Lower for `platform` as for the CPU (once per process)."""
    tables = mlir._platform_specific_lowerings
    if isinstance(tables.get(platform), collections.ChainMap):
        return
    tables[platform] = collections.ChainMap(dict(tables.get(platform, {})), tables["cpu"])
    for primitive in (callback.pure_callback_p, callback.io_callback_p,
                      debugging.debug_callback_p, debugging.debug_print_p):
        tables[platform][primitive] = mlir.LoweringRuleEntry(
            _with_global_ids(_cpu_rule(primitive)), True)
    # jax's own dot_general rule, not the CPU's: the CPU's refuses the dot algorithms
    # XLA:CPU cannot compute (TF32, F16_F16_F32, BF16_BF16_F32_X9, FP8 ...), which the
    # Tensor Engine takes; both rules convert the operands to the algorithm's types alike
    tables[platform][lax.dot_general_p] = mlir._lowerings[lax.dot_general_p]
    tables[platform][lax.ragged_dot_general_p] = mlir.LoweringRuleEntry(
        _ragged_dot_rule(_cpu_rule(lax.ragged_dot_general_p)), True)
    for primitive, name in _EXPANDED_CHLO.items():
        tables[platform][primitive] = mlir.LoweringRuleEntry(
            _as_composite(primitive, name, _cpu_rule(primitive)), True)
