"""Workspace values: large matmul results an executable keeps from call to call, for XLA to
write the next call's into (so that they are not fresh memory, page-faulted, every call)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh import executor, isa

RNG = np.random.default_rng(0)


@pytest.fixture
def small_workspace(monkeypatch):
    """Workspace values from 1 KiB, so that small programs have some."""
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)


def weight_gradient_step():
    """Each chip's x^T g (a product over every chip, in the GEMM's own layout), then the
    reduce-scatter of a data-parallel step."""
    mesh = jax_trn2.make_mesh((4,), ("i",))
    body = lambda x, g: jax.lax.psum_scatter(x.T @ g, "i", tiled=True)  # noqa: E731
    return jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")),
                                      out_specs=P("i")))


def tensor_parallel_matmul():
    """Rows split over a, columns over b: the product is transposed into the mesh layout."""
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))
    return jax_trn2.jit(jax.shard_map(lambda x, w: x @ w, mesh=mesh,
                                      in_specs=(P("a"), P(None, "b")), out_specs=P("a", "b")))


def matmul_results(program: isa.Program) -> list[int]:
    return [i.outs[0] for i in program.instructions if isinstance(i, isa.Matmul)]


def test_large_products_in_the_gemms_layout_are_workspace(small_workspace):
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    program = weight_gradient_step().lower(x, g).compile().executable.program
    assert executor.workspace_values(program) == tuple(matmul_results(program))


def test_transposed_small_and_too_many_products_are_not(small_workspace, monkeypatch):
    x, w = (RNG.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
    program = tensor_parallel_matmul().lower(x, w).compile().executable.program
    assert matmul_results(program) and executor.workspace_values(program) == ()

    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    program = weight_gradient_step().lower(x, g).compile().executable.program
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 4 * 32 * 32 * 4 + 1)  # product + 1
    assert executor.workspace_values(program) == ()
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)
    monkeypatch.setattr(executor, "WORKSPACE_LIMIT_BYTES", 4 * 32 * 32 * 4 - 1)
    assert executor.workspace_values(program) == ()


def test_calls_with_a_kept_workspace_give_the_same_bits_and_leave_results_intact(
        monkeypatch):
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    plain = weight_gradient_step().lower(x, g).compile()  # too small for a workspace
    assert not plain.executable._workspace_values
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)
    compiled = weight_gradient_step().lower(x, g).compile()
    assert compiled.executable._workspace_values
    first = np.asarray(compiled(x, g)).copy()
    kept = compiled.executable._workspace
    assert kept is not None
    second = compiled(2 * x, g)  # writes into the buffers the first call left
    assert kept[0].is_deleted()  # donated: XLA took the buffer
    np.testing.assert_array_equal(np.asarray(compiled(x, g)), first)
    np.testing.assert_array_equal(np.asarray(second), np.asarray(plain(2 * x, g)))
    np.testing.assert_array_equal(first, np.asarray(plain(x, g)))


def test_a_workspace_is_donated_to_xla(small_workspace):
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    executable = weight_gradient_step().lower(x, g).compile().executable
    compiled = executable._run_global.compiled
    product = 4 * 32 * 32 * 4  # float32[4, 32, 32]: every chip's x^T g
    assert compiled.memory_analysis().alias_size_in_bytes == product
    with pytest.raises(ValueError, match="workspace"):
        executor.compile_program(executable.program, global_io=False,
                                 workspace=executor.workspace_values(executable.program))


@pytest.mark.parametrize("workspace_from", [1024, executor.WORKSPACE_MIN_BYTES])
def test_calls_after_the_first_compile_nothing(monkeypatch, workspace_from):
    """With and without a workspace, a second call runs what the first compiled."""
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", workspace_from)
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    step = weight_gradient_step()
    step(x, g)
    compiles = []
    backend_compile = jax._src.compiler.backend_compile_and_load
    monkeypatch.setattr(jax._src.compiler, "backend_compile_and_load",
                        lambda *a, **k: compiles.append(a) or backend_compile(*a, **k))
    step(x, g)
    step(2 * x, g)
    assert compiles == []


def test_new_workspaces_come_from_one_compiled_computation(small_workspace):
    """While another call holds the kept workspace, a call makes new buffers: with the
    computation compiled for the first."""
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    executable = weight_gradient_step().lower(x, g).compile().executable
    first, second = executable._take_workspace(), executable._take_workspace()
    assert first and second and first[0] is not second[0]
    assert executable._new_workspace._cache_size() == 1


def test_the_first_workspace_is_made_while_the_executor_compiles(small_workspace):
    """A call's compile starts making its workspace on a thread of its own (its compile and
    page faults then overlap the executor's compile); the first call takes it. A program
    compiled only to be inspected makes none."""
    x, g = (RNG.standard_normal((16, 32)).astype(np.float32) for _ in range(2))
    inspected = weight_gradient_step().lower(x, g).compile().executable
    assert inspected._workspace_made is None and inspected._workspace is None
    lowered = weight_gradient_step().lower(x, g)
    executable = lowered._executable
    lowered.prefetch_workspace()  # as jax_trn2.jit's first call does
    made = executable._workspace_made
    assert made is not None
    lowered.compile()
    assert executable._take_workspace() is made.result()
    assert executable._workspace_made is None
