"""A constant that is one value broadcast stays one value while lowering, listing and
estimating; the executor broadcasts it."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jax_trn2

REPO = Path(__file__).resolve().parents[2]


def splat_module(n: int, value: str = "2.5") -> str:
    return f"""
func.func public @main(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %c = stablehlo.constant dense<{value}> : tensor<{n}xf32>
  %y = stablehlo.add %x, %c : tensor<{n}xf32>
  return %y : tensor<{n}xf32>
}}"""


RSS_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_splat_constants import splat_module
from jax_trn2.core.executable import LoadedExecutable

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) / 1024

base = rss_mib()
executable = LoadedExecutable.from_stablehlo(None, splat_module(1 << 30))  # 4 GiB per chip
executable.as_text(), executable.timed_text(), executable.cost_analysis()
print(rss_mib() - base)
"""


def test_four_gib_splat_is_lowered_listed_and_estimated_without_allocating_it():
    script = RSS_SCRIPT.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 100  # MiB of host RSS growth


def test_splat_constant_runs_broadcast():
    executable = jax_trn2.client().compile(splat_module(6, "-1.25"))
    (out,) = executable.execute([np.arange(6, dtype=np.float32)])
    np.testing.assert_array_equal(np.asarray(out), np.arange(6, dtype=np.float32) - 1.25)


@pytest.mark.parametrize("dtype, value", [
    (np.uint64, 2**64 - 1), (np.int64, 2**63 - 1), (np.int64, -(2**63) + 1),
    (np.int32, -(2**31)), (np.uint32, 2**32 - 1)])
def test_splat_integer_constant_keeps_every_bit(dtype, value):
    # a float holds 53 bits: reading the literal through one rounds (or overflows) these
    name = {np.uint64: "ui64", np.int64: "i64", np.int32: "i32", np.uint32: "ui32"}[dtype]
    executable = jax_trn2.client().compile(f"""
func.func public @main() -> tensor<3x{name}> {{
  %c = stablehlo.constant dense<{value}> : tensor<3x{name}>
  return %c : tensor<3x{name}>
}}""")
    (out,) = executable.execute([])
    np.testing.assert_array_equal(np.asarray(out), np.full(3, value, dtype))
