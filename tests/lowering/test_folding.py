"""Folding integer arithmetic while lowering: NumPy's result is the executor kernel's."""

import itertools

import jax
import numpy as np
import pytest

from lowering import folding
from mesh import dtypes, isa
from mesh.executor import run_program

MESH = isa.MeshSpec(("x",), (2,))
# each dtype's edges: wrap-around on add, subtract, multiply and negate
EDGES = {"int8": [-128, -1, 0, 1, 127], "uint8": [0, 1, 128, 255, 7],
         "int32": [-2**31, -1, 0, 1, 2**31 - 1], "int64": [-2**63, -3, 0, 5, 2**63 - 1],
         "bool": [True, False, True, True, False]}


def _kernel(instr: isa.Instruction, args: list[np.ndarray], result: str) -> np.ndarray:
    values = {v: isa.ValueInfo(isa.TensorType((5,), dtype), frozenset({0}))
              for v, dtype in zip(instr.ins, [a.dtype.name for a in args])}
    values[-1] = isa.ValueInfo(isa.TensorType((5,), result), frozenset({0}))
    program = isa.Program(MESH, (instr,), tuple(instr.ins), (-1,), values)
    with jax.enable_x64(True):
        return np.asarray(run_program(program, args)[0])


def _operands(dtype: str, count: int) -> list[np.ndarray]:
    edges = np.array(EDGES[dtype], dtype=dtypes.storage_dtype(dtype))
    # two chips along x, each with its own five elements, operands in other orders
    return [np.stack([np.roll(edges, k), np.roll(edges[::-1], k + 1)]) for k in range(count)]


CASES = [(op, 2) for op in ("add", "subtract", "multiply", "and", "or", "xor", "maximum",
                            "minimum")] + [("not", 1), ("negate", 1)]


@pytest.mark.parametrize("dtype", list(EDGES))
@pytest.mark.parametrize("op, count", CASES, ids=[op for op, _ in CASES])
def test_numpy_folds_an_op_to_the_kernels_bits_or_leaves_it(op, count, dtype):
    args = _operands(dtype, count)
    instr = isa.Elementwise((-1,), tuple(range(count)), op=op)
    folded = folding._on_host(instr, args, (2, 5), dtypes.storage_dtype(dtype))
    if dtype == "bool" and op in ("subtract", "negate"):
        assert folded is None  # NumPy has no such op on booleans: the kernel computes it
    else:
        np.testing.assert_array_equal(folded, _kernel(instr, args, dtype), strict=True)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "bool"])
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_numpy_folds_comparisons_and_selects_to_the_kernels_bits(direction, dtype):
    lhs, rhs = _operands(dtype, 2)
    compare = isa.Elementwise((-1,), (0, 1), op="compare", direction=direction,
                              compare_type="UNSIGNED" if dtype == "uint8" else "SIGNED")
    pred = folding._on_host(compare, [lhs, rhs], (2, 5), np.dtype(bool))
    np.testing.assert_array_equal(pred, _kernel(compare, [lhs, rhs], "bool"), strict=True)
    select = isa.Elementwise((-1,), (0, 1, 2), op="select")
    chosen = folding._on_host(select, [pred, lhs, rhs], (2, 5), lhs.dtype)
    np.testing.assert_array_equal(chosen, _kernel(select, [pred, lhs, rhs], dtype),
                                  strict=True)


def test_ops_numpy_may_not_match_are_left_to_the_kernel():
    args = _operands("int32", 2)
    for op in ("divide", "remainder", "shift_left", "shift_right_arithmetic", "power"):
        instr = isa.Elementwise((-1,), (0, 1), op=op)
        assert folding._on_host(instr, args, (2, 5), np.dtype(np.int32)) is None
    # a select whose predicate is one per chip broadcasts from the left: the kernel's job
    select = isa.Elementwise((-1,), (0, 1, 2), op="select")
    assert folding._on_host(select, [np.array([[True], [False]])[..., 0], *args], (2, 5),
                            np.dtype(np.int32)) is None


def test_folds_run_on_the_simulators_cpu_device_not_on_jaxs_default(monkeypatch):
    """With the trn2 plugin as jax's default device, a fold the kernel computes (jax's
    axis_index is a division and remainder of the partition id) compiles nothing for trn2
    (it would be a trn2 program of its own, lowered and compiled twice) and folds right."""
    from jax._src import compiler
    from jax.sharding import PartitionSpec as P

    import lowering

    platforms = []
    compile_and_load = compiler.backend_compile_and_load

    def spied(backend, *args, **kwargs):
        platforms.append(backend.platform)
        return compile_and_load(backend, *args, **kwargs)

    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("x", "y"))
    index = jax.shard_map(lambda: (jax.lax.axis_index("x") * 7 + jax.lax.axis_index("y"))
                          .reshape(1, 1), mesh=mesh, in_specs=(), out_specs=P("x", "y"))
    text = jax.jit(index).lower().as_text()
    monkeypatch.setattr(compiler, "backend_compile_and_load", spied)
    with jax.default_device(jax.devices("trn2")[0]):
        program = lowering.lower(text)
    assert "neuron" not in platforms
    chip = np.arange(8)  # device d is at (d // 4, d % 4) of the (2, 4) mesh
    want = chip // 4 * 7 + chip % 4
    assert any(np.array_equal(np.asarray(i.value).reshape(-1), want)
               for i in program.instructions if isinstance(i, isa.Constant))
