"""Lowering rules, one module per op family; importing them fills lowering.registry.RULES."""

from lowering.rules import (  # noqa: F401
    batch_norm,
    bits,
    callbacks,
    collectives,
    control_flow,
    convolution,
    dot,
    dynamic,
    elementwise,
    gspmd,
    indexing,
    linalg,
    movement,
    reduction,
    sort,
    structure,
    windows,
)
