"""Lowering rules, one module per op family; importing them fills lowering.registry.RULES."""

from lowering.rules import (  # noqa: F401
    collectives,
    dot,
    elementwise,
    movement,
    reduction,
    structure,
)
