"""lowering.mlir.parse_module: text, bytecode and StableHLO portable artifacts (what jaxlib
hands a PJRT plugin, and jax.export serializes), read into the shared context."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir as jax_mlir

from lowering import mlir


def _exported():
    return jax.export.export(jax.jit(lambda x: jnp.sin(x) * 2 + x))(
        np.zeros((3, 4), np.float32))


def test_a_portable_artifact_is_read_as_stablehlo_in_the_shared_context():
    artifact = _exported().mlir_module_serialized
    assert mlir.is_portable_artifact(artifact)
    module = mlir.parse_module(artifact)
    text = str(module)
    assert "vhlo." not in text and "stablehlo.sine" in text
    assert module.context is mlir._context  # the one shared_context gave last
    # the same module as reading the bytecode as VHLO first, then upgrading it
    two_steps = mlir.parse(artifact)
    assert any(op.operation.name.startswith("vhlo.") for op in two_steps.body)
    assert text == str(mlir.parse_module(two_steps))


def test_text_and_plain_bytecode_are_not_portable_artifacts():
    module = _exported().mlir_module()
    bytecode = jax_mlir.module_to_bytecode(mlir.parse_module(module))
    assert not mlir.is_portable_artifact(module)
    assert not mlir.is_portable_artifact(bytecode)
    assert str(mlir.parse_module(bytecode)) == str(mlir.parse_module(module))


def test_a_damaged_artifact_is_refused_by_name():
    artifact = _exported().mlir_module_serialized
    with pytest.raises(ValueError, match="not a StableHLO module"):
        mlir.parse_module(artifact[:len(artifact) // 2])
