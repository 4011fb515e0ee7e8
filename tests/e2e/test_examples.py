"""The parallelism examples at their small sizes, on the 4x4x4 mesh: each checks itself
against CPU JAX (and, where it trains, that the loss falls) and reports its estimated cost."""

import importlib
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["transformer_train", "moe", "ring_attention", "fsdp"])
def test_example_matches_cpu_jax(name, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = importlib.import_module(name).run(small=True)
    assert result["cost"]["optimal_seconds"] > 0
    assert result["cost"]["flops"] > 0
    if "losses" in result:
        assert result["losses"][-1] < result["losses"][0]


def test_auto_sharding_example_matches_cpu_jax(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = importlib.import_module("auto_sharding")
    result = example.run(small=True, layouts=("dp x fsdp x tp",))
    assert 0 < result["cost"]["flops"]


def test_plan_llama_plans_a_tiny_llama_from_shapes(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    example = importlib.import_module("plan_llama")
    plans = example.run(layouts=("fsdp 16 x tp 4",), remats=(True,), tiny=True)
    (plan,) = plans
    assert plan.fits and 0 < plan.peak_bytes < 96 * 2**30
    assert plan.step_seconds > 0 and 0 < plan.mfu < 1 and plan.exposed_seconds >= 0
    out = capsys.readouterr().out
    assert "[1/1] fsdp 16 x tp 4, remat on: partitioning" in out  # progress
    assert "tiny  fsdp 16 x tp 4        yes" in out and "host peak RSS" in out


def test_every_file_in_examples_is_an_example_that_runs():
    """Helpers live in examples/support/ (they print nothing when run): every .py file
    directly in examples/ is a script with something to do when run."""
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert len(scripts) >= 8
    for script in scripts:
        assert 'if __name__ == "__main__":' in script.read_text(), script.name
