"""Render the figures under docs/ that docs/cost_model.md shows, from the estimate alone
(nothing runs).

    pip install -e '.[plot]' && python docs/make_figures.py

docs/step.png: one training step (forward, backward and an SGD update) of the MaxText-style
decoder in examples/support/decoder.py, 4 layers of d_model 2048, with NamedShardings on
the 4x4x4 mesh of a Trn2-Ultra server: batch over data and fsdp, weights over fsdp and
tensor, as examples/auto_sharding.py's "dp x fsdp x tp" layout; XLA's partitioner inserts
the collectives.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "examples"))

import jax_trn2  # noqa: E402
from support import decoder  # noqa: E402

MODEL = decoder.Decoder(layers=4, d_model=2048, heads=16, d_ff=8192, vocab=32768)
BATCH, SEQ = 64, 1024
LAYOUT = dict(batch=("data", "fsdp"), embed="fsdp", heads="tensor", mlp="tensor",
              vocab="tensor")


def training_step() -> jax_trn2.Compiled:
    """The compiled step, from shapes."""
    mesh = jax_trn2.make_mesh((4, 4, 4), ("data", "fsdp", "tensor"))
    params = decoder.init_params(MODEL, None)  # shapes only
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)
    batch = NamedSharding(mesh, P(LAYOUT["batch"]))
    step = decoder.make_step(dataclasses.replace(
        MODEL, activation_sharding=NamedSharding(mesh, P(LAYOUT["batch"], None, None))))
    weights = decoder.param_shardings(params, mesh, LAYOUT)
    return jax_trn2.jit(step, in_shardings=(weights, batch),
                        out_shardings=(weights, NamedSharding(mesh, P())),
                        donate_argnums=0).lower(params, tokens).compile()


def main() -> None:
    start = time.perf_counter()
    compiled = training_step()
    path = DOCS / "step.png"
    compiled.plot(path)
    print(f"{path} written in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
