"""The executor's computation is lowered in lowering.mlir's shared MLIR context; jax lowers
the caller's programs in contexts of their own, as it does without the simulator."""

import jax
import numpy as np
from jax._src.interpreters import mlir as jax_mlir

from jax_trn2.core import executable
from lowering import mlir


def _program() -> executable.LoadedExecutable:
    return executable.LoadedExecutable.from_stablehlo("trn2", """
func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %0 = stablehlo.add %x, %c : tensor<4xf32>
  return %0 : tensor<4xf32>
}
""")


def test_the_executor_lowers_in_the_shared_context(monkeypatch):
    loaded = _program()
    monkeypatch.setattr(mlir, "_context", None)  # a new one, far from its module count
    with executable._lowered_in_shared_context(loaded.program):
        inside = jax_mlir.make_ir_context()
    assert inside == mlir.shared_context(0)
    np.testing.assert_array_equal(loaded.execute([np.zeros(4, np.float32)])[0], [1, 2, 3, 4])


def test_the_callers_lowerings_get_contexts_of_their_own():
    _program().execute([np.zeros(4, np.float32)])  # the executor has lowered a computation
    assert jax_mlir.make_ir_context() != jax_mlir.make_ir_context()
    first, second = (jax.jit(lambda x, k=k: x + k).lower(np.float32(1)).compiler_ir()
                     for k in (1, 2))
    assert first.context != second.context


def test_a_programs_constants_count_toward_its_context():
    assert executable._constant_bytes(_program().program) == 4 * 4
