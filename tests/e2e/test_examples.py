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
    layouts = [example.plan.Layout.of(dp=1, fsdp=16, tp=4, remat="full"),
               example.plan.Layout.of(dp=4, fsdp=4, tp=4)]
    table = example.run("tiny", layouts, price_per_chip_hour=2.0, workers=1)
    assert [p.layout for p in table] == sorted(layouts, key=lambda l: next(
        p.estimate.step_seconds for p in table if p.layout == l))
    for plan in table:
        assert plan.fits and 0 < plan.estimate.peak_bytes < 96 * 2**30
        assert 0 < plan.model_mfu() < 1 and plan.estimate.exposed_communication_seconds >= 0
        assert plan.training(example.TRAIN_TOKENS, 2.0).cost > 0
    out = capsys.readouterr()
    assert "fsdp 16 x tp 4, remat full" in out.out and "time to train 15T tokens" in out.out
    assert "[2/2] " in out.err  # progress


def test_plan_pipeline_measures_the_bubble(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    (table,) = importlib.import_module("plan_pipeline").run(microbatches=(8,), workers=1)
    assert [p.layout.schedule for p in table] == ["1f1b", "gpipe"]  # 1F1B: less HBM moved
    for p in table:
        assert p.bubble == pytest.approx(3 / 11, rel=1e-9)


def test_serve_llama_answers_a_serving_question(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    table = importlib.import_module("serve_llama").run(tp=(4,), batches=(1, 8), workers=1)
    one, eight = table
    assert one.fits and eight.fits and one.max_batch == eight.max_batch > 8
    assert eight.kv_cache_bytes == 8 * one.kv_cache_bytes
    assert eight.tokens_per_second > one.tokens_per_second


def test_flax_lm_trains_on_trn2_with_cpu_jax_gradients(monkeypatch):
    """A Flax linen LM under plain jax.jit on a mesh of jax.devices("trn2")."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = importlib.import_module("flax_lm").run(steps=3)
    assert result["losses"][-1] < result["losses"][0]
    assert result["cost"]["trn2.step_seconds"] > result["cost"]["trn2.ideal_step_seconds"] > 0
    # FP32 gradients of order 1e-3: summed in another order than CPU JAX's they differ by
    # at most ~3e-8 (a few ulps); a wrong gradient would differ by its own size.
    assert max(leaf.max_abs_error for leaf in result["gradients"].leaves) < 1e-7


def test_equinox_mlp_trains_on_trn2_as_on_cpu_jax(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = importlib.import_module("equinox_mlp").run(steps=10)
    assert result["losses"][-1] < result["losses"][0]
    assert result["losses"] == pytest.approx(result["cpu_losses"], rel=1e-5)
    # 10 Adam steps apart only by FP32 summation order: a few ulps of each weight's scale.
    assert max(leaf.max_ulp_error for leaf in result["weights"].leaves) <= 16
    assert result["cost"]["trn2.step_seconds"] > 0


def test_every_file_in_examples_is_an_example_that_runs():
    """Helpers live in examples/support/ (they print nothing when run): every .py file
    directly in examples/ is a script with something to do when run."""
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert len(scripts) >= 8
    for script in scripts:
        assert 'if __name__ == "__main__":' in script.read_text(), script.name


@pytest.mark.xdist_group("jax_distributed")  # one job of processes at a time (test_processes)
def test_multi_process_example_runs_one_simulation_over_two_processes(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    lines = importlib.import_module("multi_process").launch()
    assert [line.split(":")[0] for line in lines] == ["process 0", "process 1"]
    assert "rows from 0," in lines[0] and "rows from 32," in lines[1]
    # every process gathers the same whole result: the 64 x 64 values' blocks summed over y
    total = float(sum(range(64 * 64)))
    assert all(line.endswith(f"sum {total:.6g}") for line in lines)
    assert all(f"jax.jit on trn2: sum {total:.6g}," in line for line in lines)  # both doors
