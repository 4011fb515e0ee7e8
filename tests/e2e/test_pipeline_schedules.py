"""GPipe and 1F1B written with shard_map + ppermute (examples/support/pipeline.py): their
gradients match CPU JAX's of the unpipelined model, and jax_trn2.plan measures their
bubble as (S-1)/(M+S-1) from the model's FLOPs, with 1F1B holding less HBM than GPipe."""

import dataclasses
import pathlib
import sys

import jax
import numpy as np
import pytest

from jax_trn2 import plan
from jax_trn2.planner.layout import Layout

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from support import pipeline  # noqa: E402

STAGES = 4
SMALL = pipeline.Stack(stages=STAGES, layers=2, width=64, batch=8, microbatches=6,
                       dtype="float32")
# bfloat16 matmuls, costed at the BF16 peak the model FLOP utilisation is measured against
PLANNED = pipeline.Stack(stages=STAGES, layers=2, width=512, batch=128, microbatches=1)


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_pipelined_gradients_match_cpu_jax(schedule, rng):
    layout = Layout.of(pp=STAGES, topology="trn2")
    w = (rng.standard_normal((STAGES, 2, 64, 64)) / 8).astype(np.float32)
    xs = rng.standard_normal((6, 8, 64)).astype(np.float32)
    loss, grads = pipeline.train_step(SMALL, layout.make_mesh(), schedule, "trn2")(w, xs)
    want_loss, want_grads = jax.value_and_grad(pipeline.loss)(w, xs)
    # FP32 sums in another order (PSUM passes, ring reductions): a few ulps of the scale
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    scale = np.abs(np.asarray(want_grads)).max()
    assert np.abs(np.asarray(grads) - np.asarray(want_grads)).max() <= 1e-5 * scale


def build(layout):
    stack = dataclasses.replace(PLANNED, microbatches=layout.microbatches)
    step = pipeline.train_step(stack, layout.make_mesh(), layout.schedule, layout.topology)
    return step, stack.args()


@pytest.mark.parametrize("microbatches", [4, 12])
def test_planned_bubble_is_gpipes_formula(microbatches):
    layouts = [Layout.of(pp=STAGES, microbatches=microbatches, schedule=s, topology="trn2")
               for s in pipeline.SCHEDULES]
    flops = dataclasses.replace(PLANNED, microbatches=microbatches).model_flops()
    sweep = plan.sweep(build, layouts, model_flops=flops, workers=1, progress=False)
    by_schedule = {p.layout.schedule: p for p in sweep}
    formula = (STAGES - 1) / (microbatches + STAGES - 1)
    for p in sweep:
        assert p.gpipe_bubble == pytest.approx(formula, rel=1e-12)
        assert p.bubble == pytest.approx(formula, rel=1e-9)  # matmul FLOP counts: exact
        assert p.model_mfu() == pytest.approx(p.estimate.mfu * (1 - formula), rel=1e-9)
    gpipe, one_f_one_b = by_schedule["gpipe"].estimate, by_schedule["1f1b"].estimate
    assert one_f_one_b.peak_bytes < gpipe.peak_bytes  # a stash of 2S-1, not every tick's
    assert f"{formula:.1%} ({formula:.1%})" in str(sweep)  # the bubble column
