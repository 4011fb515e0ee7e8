"""Registries of lowering rules: one keyed by StableHLO op name, one keyed by the target
name of stablehlo.custom_call (sharding annotations, LAPACK, host callbacks...)."""

from __future__ import annotations

from typing import Callable

RULES: dict[str, Callable] = {}
CUSTOM_CALL_RULES: dict[str, Callable] = {}
# Op names and custom call targets that pass their operands on wherever they are held
# (sharding hints, tuples, memory placements): the walker gives them values held in host
# memory as they are, and reloads such values into HBM for every other op.
MEMORY_NEUTRAL: set[str] = set()


def _register(table: dict[str, Callable], names: tuple[str, ...], what: str) -> Callable:
    def register(fn: Callable) -> Callable:
        for name in names:
            if name in table:
                raise ValueError(f"two lowering rules for {what} {name}")
            table[name] = fn
        return fn

    return register


def rule(*op_names: str) -> Callable:
    """Register the decorated `rule(ctx, op) -> result value ids` for these op names."""
    return _register(RULES, op_names, "op")


def custom_call_rule(*targets: str) -> Callable:
    """Register the decorated `rule(ctx, op) -> result value ids` for stablehlo.custom_call
    ops with these call_target_name values."""
    return _register(CUSTOM_CALL_RULES, targets, "custom call target")
