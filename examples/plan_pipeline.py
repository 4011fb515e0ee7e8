"""GPipe or 1F1B, and how many microbatches? A pipeline-parallel training step over 4 stages,
planned with each schedule at several microbatch counts: the bubble the planner measures
(the share of the chips' matmul work that is not the model's) beside GPipe's formula
(S-1)/(M+S-1), and the HBM each stage holds (GPipe keeps every microbatch's activations
for the backward, 1F1B at most 2S-1).

The schedules are written in JAX with shard_map and ppermute (examples/support/pipeline.py);
the model, 4 stages x 4 layers of width 4096 with 16 sequences of 2048 tokens a
microbatch, is planned from shapes alone on 4 chips of a trn2.48xlarge.

    python examples/plan_pipeline.py
"""

from __future__ import annotations

import dataclasses

from support import pipeline
from jax_trn2 import plan

STACK = pipeline.Stack(stages=4, layers=4, width=4096, batch=16 * 2048, microbatches=1)
TOPOLOGY = "trn2"


def build(layout: plan.Layout):
    """The step under the layout's schedule and microbatch count, and its arguments."""
    stack = dataclasses.replace(STACK, microbatches=layout.microbatches)
    return (pipeline.train_step(stack, layout.make_mesh(), layout.schedule, layout.topology),
            stack.args())


def run(microbatches=(4, 8, 16), workers: int | None = None) -> list[plan.Sweep]:
    """One sweep per microbatch count (the model's FLOPs per step grow with it); print
    them and return them."""
    tables = []
    for m in microbatches:
        stack = dataclasses.replace(STACK, microbatches=m)
        layouts = [plan.Layout.of(pp=stack.stages, microbatches=m, schedule=s,
                                  topology=TOPOLOGY) for s in pipeline.SCHEDULES]
        tables.append(plan.sweep(build, layouts, model_flops=stack.model_flops(),
                                 tokens_per_step=m * stack.batch, workers=workers))
        print(tables[-1], "\n", flush=True)
    return tables


if __name__ == "__main__":
    run()
