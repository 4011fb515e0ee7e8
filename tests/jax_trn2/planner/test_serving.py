"""jax_trn2.serving: a small Llama's prefill and decode (examples/support/llama.py) planned at
two batch sizes on one and two chips; KV-cache bytes, tokens/s and the largest batch that
fits checked by hand and by planning the batches around it."""

import pathlib
import sys

import pytest

from jax_trn2 import plan, serving
from jax_trn2.planner.layout import Layout

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from support import llama  # noqa: E402

TINY = llama.Llama(layers=2, d_model=256, heads=8, kv_heads=2, d_ff=512, vocab=1024,
                   head_dim=32)
PROMPT, KV = 64, 4096
BYTES = 2  # bfloat16


def prefill(layout, batch, prompt_tokens):
    split = llama.Split(TINY, layout.size(llama.TP))
    return (llama.prefill(split, layout.make_mesh(), layout.topology),
            llama.prefill_args(split, batch, prompt_tokens))


def decode(layout, batch, kv_length):
    split = llama.Split(TINY, layout.size(llama.TP))
    return (llama.decode_step(split, layout.make_mesh(), layout.topology),
            llama.decode_args(split, batch, kv_length))


LAYOUTS = [Layout.of(tp=1, topology="trn2"), Layout.of(tp=2, topology="trn2")]


@pytest.fixture(scope="module")
def table():
    return serving.serve(prefill, decode, LAYOUTS, batches=(1, 4), prompt_tokens=PROMPT,
                         kv_length=KV, workers=1, progress=False)


def test_serving_figures_worked_by_hand(table):
    assert [(p.devices, p.batch) for p in table] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    for p in table:
        assert p.ok and p.fits and not p.errors
        # k and v: [layers, batch, kv_length, kv heads per chip, head_dim] on each chip
        heads = TINY.kv_heads // p.devices
        assert p.kv_cache_bytes == 2 * TINY.layers * p.batch * KV * heads * TINY.head_dim * BYTES
        assert p.ttft_seconds == p.prefill.step_seconds > 0
        assert p.decode_seconds == p.decode.step_seconds > 0
        assert p.tokens_per_second == pytest.approx(p.batch / p.decode_seconds)
        assert p.tokens_per_second_per_device == pytest.approx(p.tokens_per_second / p.devices)
        assert p.prefill_tokens_per_second == pytest.approx(p.batch * PROMPT / p.ttft_seconds)
    one, four = table[2], table[3]
    assert four.decode_seconds > one.decode_seconds  # four times the cache to read
    assert four.max_batch == one.max_batch  # per layout


@pytest.mark.parametrize("index", [0, 2])
def test_the_largest_batch_fits_and_one_more_does_not(table, index):
    p = table[index]
    assert p.max_batch is not None and p.max_batch > 4
    for batch, fits in ((p.max_batch, True), (p.max_batch + 1, False)):
        assert plan.estimate(*decode(p.layout, batch, KV)).fits == fits


def test_the_table_and_rows(table):
    text = str(table)
    assert "steps planned" in text and f"KV cache of {KV:,} positions" in text
    assert "TTFT: the prefill step; per token: one decode step" in text
    row = table.rows()[1]
    assert row["batch"] == 4 and row["devices"] == 1 and row["kv_cache_bytes"] == \
        table[1].kv_cache_bytes and row["max_batch"] == table[1].max_batch


def test_a_failed_step_is_named():
    def bad_prefill(layout, batch, prompt_tokens):  # a prompt that does not split over 2
        return prefill(layout, batch, prompt_tokens + 1)

    (p,) = serving.serve(bad_prefill, decode, LAYOUTS[1:], batches=(1,),
                         prompt_tokens=PROMPT, kv_length=KV, max_batch=False, workers=1,
                         progress=False)
    assert not p.ok and p.decode is not None and p.max_batch is None
    assert p.errors and p.errors[0].startswith("prefill: ")
    assert "failed  tp 2, batch 1: prefill: " in str(serving.ServingTable([p], 0.0, 1, 2))
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        serving.serve(prefill, decode, LAYOUTS, batches=(0,), prompt_tokens=8, kv_length=8)


def test_serving_on_the_cores_of_one_chip_of_a_trn2_48xlarge():
    """tp 2 on a trn2.48xlarge: two logical NeuronCores of one chip, each holding its half
    of the KV heads; the largest batch is the one whose decode fits a device's 24 GiB."""
    layout = Layout.of(tp=2, topology="trn2.48xlarge")
    (p,) = serving.serve(prefill, decode, [layout], batches=(4,), prompt_tokens=PROMPT,
                         kv_length=KV, workers=1, progress=False)
    assert p.ok and p.fits and (p.devices, p.layout.chips) == (2, 1)
    assert p.decode.hbm_bytes == 24 * 2**30
    heads = TINY.kv_heads // 2
    assert p.kv_cache_bytes == 2 * TINY.layers * 4 * KV * heads * TINY.head_dim * BYTES
    assert p.tokens_per_second_per_device == pytest.approx(p.tokens_per_second / 2)
    for batch, fits in ((p.max_batch, True), (p.max_batch + 1, False)):
        e = plan.estimate(*decode(layout, batch, KV))
        assert e.fits == fits and (e.peak_bytes <= 24 * 2**30) == fits
    row = p.row()
    assert (row["devices"], row["chips"]) == (2, 1)
    text = str(serving.ServingTable([p], 0.0, 1, 2))
    assert "devices  batch" in text and "KV cache/device  peak HBM/device" in text
    assert "a device: an LNC=2 logical core of a chip on trn2.48xlarge" in text
