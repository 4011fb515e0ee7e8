"""Modules the lowering parses share an MLIR context (making one costs more than parsing a
small program), a new one after CONTEXT_MODULES modules or CONTEXT_BYTES of their code."""

import pytest

from lowering import mlir

TEXT = """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %x, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


@pytest.fixture
def fresh_context(monkeypatch):
    """The next parse starts a new shared context."""
    monkeypatch.setattr(mlir, "_context", None)


def test_modules_share_a_context_up_to_the_count(fresh_context, monkeypatch):
    monkeypatch.setattr(mlir, "CONTEXT_MODULES", 3)
    modules = [mlir.parse_module(TEXT) for _ in range(4)]
    contexts = [m.context for m in modules]
    assert contexts[0] == contexts[1] == contexts[2]
    assert contexts[3] != contexts[0]


def test_a_module_beyond_the_bytes_starts_a_new_context(fresh_context, monkeypatch):
    monkeypatch.setattr(mlir, "CONTEXT_BYTES", 2 * len(TEXT))
    first, second, third = (mlir.parse_module(TEXT) for _ in range(3))
    assert first.context == second.context
    assert third.context != first.context


def test_a_shared_module_keeps_its_ops(fresh_context):
    first, second = mlir.parse_module(TEXT), mlir.parse_module(TEXT.replace("add", "multiply"))
    assert "stablehlo.add" in str(first) and "stablehlo.multiply" in str(second)
