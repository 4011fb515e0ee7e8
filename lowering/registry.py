"""One registry of lowering rules, keyed by StableHLO op name."""

from __future__ import annotations

from typing import Callable

RULES: dict[str, Callable] = {}


def rule(*op_names: str) -> Callable:
    """Register the decorated `rule(ctx, op) -> result value ids` for these op names."""

    def register(fn: Callable) -> Callable:
        for name in op_names:
            if name in RULES:
                raise ValueError(f"two lowering rules for {name}")
            RULES[name] = fn
        return fn

    return register
