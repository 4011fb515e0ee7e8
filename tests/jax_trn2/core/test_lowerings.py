"""The trn2 platform's lowering rules (jax_trn2.core.lowerings), each checked on the
StableHLO it emits, beside the e2e tests that run what they emit: ragged_dot as a grouped
matmul, dot_general with the algorithms XLA:CPU lacks, host callbacks by their global ids,
CHLO functions kept as composites, and the CPU's rules for the rest."""

from __future__ import annotations

import collections
import re

import jax
import jax.experimental
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax._src.lax import lax

from jax_trn2.core import lowerings
from jax_trn2.core.platform import PLATFORM_NAME

A = np.ones((4, 4), np.float32)


def module_text(f, *args, platform: str = PLATFORM_NAME) -> str:
    """The StableHLO jax emits for `f` lowered for `platform` (the trn2 one by default)."""
    lowerings.register(PLATFORM_NAME)
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def test_ragged_dot_of_one_free_lhs_dim_is_a_grouped_matmul():
    """[rows, k] x [groups, k, n]: chlo.ragged_dot, not the CPU's dense dot over every group
    with a masked [groups, rows, k] operand."""
    args = (np.ones((10, 4), np.float32), np.ones((3, 4, 5), np.float32),
            np.array([2, 5, 1], np.int32))
    f = jax.lax.ragged_dot
    ours = module_text(f, *args)
    assert re.search(r'"chlo.ragged_dot"\(.*lhs_ragged_dimensions = \[0\], '
                     r'rhs_group_dimensions = \[0\].*-> tensor<10x5xf32>', ours)
    assert "dot_general" not in ours
    assert "chlo.ragged_dot" not in module_text(f, *args, platform="cpu")


def test_ragged_dot_of_several_free_lhs_dims_keeps_the_cpus_rule():
    """jaxlib's serialization for a plugin infers a wrong shape for such a chlo.ragged_dot:
    the CPU's dense form instead, op for op."""
    numbers = jax.lax.RaggedDotDimensionNumbers((([3], [2]), ([0], [0])), [1], [1])

    def f(lhs, rhs, sizes):
        return jax.lax.ragged_dot_general(lhs, rhs, sizes, numbers)

    args = (np.ones((2, 7, 3, 4), np.float32), np.ones((2, 3, 4, 5), np.float32),
            np.array([[2, 1, 3], [0, 7, 0]], np.int32))
    ours, cpus = module_text(f, *args), module_text(f, *args, platform="cpu")
    assert "chlo.ragged_dot" not in ours

    def ops(text):
        return re.findall(r"= (?:stablehlo|chlo)\.(\w+)", text)
    assert ops(ours) == ops(cpus) and "dot_general" in ops(ours)


def test_dot_general_takes_the_algorithms_xla_cpu_refuses():
    def f(a, b):
        return jax.lax.dot(a, b, precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32)

    assert re.search(r"stablehlo.dot_general .*algorithm = <lhs_precision_type = tf32, "
                     r"rhs_precision_type = tf32, accumulation_type = f32", module_text(f, A, A))
    with pytest.raises(ValueError, match="not supported by dot_general on CPU"):
        module_text(f, A, A, platform="cpu")


def callback_indices(text: str) -> list[int]:
    return [int(i) for i in re.findall(r"@xla_ffi_python_cpu_callback.*index = (\d+) : ui64",
                                       text)]


@pytest.mark.parametrize("call", [
    lambda v: jax.pure_callback(lambda u: u + 1, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
    lambda v: jax.experimental.io_callback(lambda u: u + 1,
                                           jax.ShapeDtypeStruct(v.shape, v.dtype), v,
                                           ordered=True),
    lambda v: (jax.debug.print("{}", v), v * 2)[1],
], ids=["pure_callback", "ordered_io_callback", "debug_print"])
def test_a_host_callback_is_named_by_its_global_id(call):
    """Each callback lowered for trn2 gets the next id of the process's CALLBACKS, which
    holds it (the plugin's compile passes that list to lowering), where jax's CPU rule
    numbers each module's callbacks from 0."""
    first = module_text(call, A)
    second = module_text(lambda v: call(v) + 0, A)
    (a,), (b,) = callback_indices(first), callback_indices(second)
    assert b > a and b == len(lowerings.CALLBACKS) - 1
    assert callback_indices(module_text(call, A, platform="cpu")) == [0]


@pytest.mark.parametrize("f, name", [
    (jax.scipy.special.gammaln, "chlo.lgamma"), (jax.scipy.special.digamma, "chlo.digamma"),
    (jax.scipy.special.erfc, "chlo.erfc"), (jax.scipy.special.erfinv, "chlo.erf_inv"),
    (lambda v: jax.lax.nextafter(v, v * 2), "chlo.next_after"),
])
def test_a_chlo_function_serialization_would_expand_is_a_composite_of_its_name(f, name):
    """Kept as the op (lowering computes it as jax on a CPU does): one composite, its
    decomposition lowered by the CPU's rule (no composite inside it)."""
    text = module_text(f, A)
    assert re.findall(r'stablehlo.composite "([\w.]+)"', text) == [name]
    assert "stablehlo.composite" not in module_text(f, A, platform="cpu")


def test_the_platform_takes_the_cpus_rules_once_its_own_first():
    platform = "trn2-lowerings-test"
    lowerings.register(platform)
    table = mlir._platform_specific_lowerings[platform]
    lowerings.register(platform)
    assert mlir._platform_specific_lowerings[platform] is table
    assert isinstance(table, collections.ChainMap)
    cpu = mlir._platform_specific_lowerings["cpu"]
    only_cpu = next(p for p in cpu if p not in table.maps[0])
    assert table[only_cpu] is cpu[only_cpu]  # a CPU-only rule (LAPACK's, ...) is taken
    assert table[lax.dot_general_p] is mlir._lowerings[lax.dot_general_p]  # jax's own
    mine = mlir.LoweringRuleEntry(lambda ctx, *args, **params: None, True)
    table[lax.add_p] = mine  # a rule registered for the platform later takes precedence
    assert table[lax.add_p] is mine and cpu.get(lax.add_p) is not mine
