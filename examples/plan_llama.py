"""Which dp x fsdp x tp layout, with or without remat, trains Llama 3 fastest on a Trn2-Ultra
server, and does it fit? Planned from shapes alone: nothing the size of the model is ever
allocated.

A Llama-3 training step (grouped-query attention as the fused flash-attention kernel, rotary
embeddings, SwiGLU, untied output head, float32 master weights and Adam moments, bfloat16
compute, layers run by a scan; examples/support/decoder.py) is built for each layout from jax.ShapeDtypeStructs, and
jax_trn2.plan.sweep partitions, lowers and estimates every one and ranks them: peak HBM
per device against its HBM (96 GiB a chip; 24 GiB a logical NeuronCore of a
trn2.48xlarge), step time (expected and ideal), MFU by the model's FLOPs, tokens/s, exposed
communication, the busiest engine, and the time and chip-hours to train on 15T tokens
(Llama 3's pre-training corpus); then the recommendation: the fastest layout that fits and
why the next ones lost.

    python examples/plan_llama.py                  # Llama-3 70B: 12 layouts x remat off/on
    python examples/plan_llama.py --model 8B --price 2.5 --plot sweep.png
    python examples/plan_llama.py --model 8B --topology trn2.48xlarge   # 64 LNC=2 cores
    python examples/plan_llama.py --tiny           # a small configuration, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from support import decoder
import jax_trn2
from jax_trn2 import plan

# Llama 3 (Meta's model card and params.json): layers, d_model, heads, KV heads, d_ff, vocab.
# Attention runs as Trainium2's fused flash-attention kernel (jax_trn2.flash_attention).
LLAMA = dict(mlp="swiglu", tied_embedding=False, rope=True, scan_layers=True,
             param_dtype="float32", attention="flash")
MODELS = {
    "8B": decoder.Decoder(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                          vocab=128256, **LLAMA),
    "70B": decoder.Decoder(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                           vocab=128256, **LLAMA),
    "405B": decoder.Decoder(layers=126, d_model=16384, heads=128, kv_heads=8, d_ff=53248,
                            vocab=128256, **LLAMA),
    "tiny": decoder.Decoder(layers=2, d_model=256, heads=8, kv_heads=2, d_ff=512, vocab=1024,
                            **LLAMA),
}
# Sequences per step and their length: one 8192-token sequence (Llama 3's context) per device.
SHAPES = {"8B": (64, 8192), "70B": (64, 8192), "405B": (256, 8192), "tiny": (64, 64)}
TRAIN_TOKENS = 15e12  # Llama 3's pre-training tokens
LOGICAL_AXES = ("batch", "embed", "heads", "kv_heads", "mlp", "vocab")


def layouts(devices: int = 64, topology: str = "trn2-ultra") -> list[plan.Layout]:
    """Every dp x fsdp x tp of the devices with dp <= 4 and tp <= 8 (Llama 3 has 8 KV
    heads), without and with full remat."""
    return plan.grid(devices, ("dp", "fsdp", "tp"), remats=(None, "full"),
                     topologies=(topology,), limits={"dp": 4, "tp": 8})


def build(model: str, layout: plan.Layout, batch: int | None = None, seq: int | None = None):
    """The model's Adam training step under `layout` for `batch` sequences of `seq` tokens
    (default: SHAPES[model]), and its arguments' shapes."""
    mesh = layout.make_mesh()
    batch, seq = batch or SHAPES[model][0], seq or SHAPES[model][1]
    config = dataclasses.replace(
        MODELS[model], remat=layout.remat is not None,
        activation_sharding=layout.sharding(mesh, "batch", None, None))
    params = decoder.init_params(config, None)
    moments = (jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32), params),) * 2
    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    rules = {axis: (tuple(layout.spec(axis)) or (None,))[0] for axis in LOGICAL_AXES}
    weights = decoder.param_shardings(params, mesh, rules)
    state = (weights, (weights, weights))
    step = jax_trn2.jit(decoder.make_adam_step(config),
                        in_shardings=state + (layout.sharding(mesh, "batch"),),
                        out_shardings=state + (NamedSharding(mesh, P()),),
                        donate_argnums=(0, 1),  # parameters and moments updated in place
                        topology=layout.topology)
    return step, (params, moments, tokens)


def model_flops(config: decoder.Decoder, batch: int, seq: int) -> float:
    """FLOPs of one training step of the model, not counting recomputation (PaLM's MFU
    convention): 6 per parameter per token for the matmuls (the embedding lookup is not
    one), plus 12 * layers * d_model * seq per token for attention's two matmuls."""
    matmul_params = config.param_count() - config.vocab * config.d_model
    per_token = 6 * matmul_params + 12 * config.layers * config.d_model * seq
    return per_token * batch * seq


def run(model: str = "70B", candidates: list[plan.Layout] | None = None,
        price_per_chip_hour: float | None = None, plot: str | None = None,
        workers: int | None = None) -> plan.Sweep:
    """Plan `model` under `candidates` (default: layouts()); print and return the table."""
    config = MODELS[model]
    batch, seq = SHAPES[model]
    print(f"Llama-3 {model}: {config.param_count() / 1e9:.2f}B parameters, {config.layers} "
          f"layers, d_model {config.d_model}, {config.heads} heads ({config.n_kv} KV), d_ff "
          f"{config.d_ff}, vocab {config.vocab}; batch {batch} x {seq} tokens", flush=True)
    table = plan.sweep(functools.partial(build, model), candidates or layouts(),
                       tokens_per_step=batch * seq, model_flops=model_flops(config, batch, seq),
                       train_tokens=TRAIN_TOKENS, price_per_chip_hour=price_per_chip_hour,
                       workers=workers)
    print(table)
    if plot:
        table.plot(plot)
        print(f"plot written to {plot}")
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("8B", "70B"), default="70B")
    parser.add_argument("--tiny", action="store_true", help="a small configuration")
    parser.add_argument("--price", type=float, metavar="PER_CHIP_HOUR",
                        help="price of a chip-hour, for the cost of training (no default: "
                             "see jax_trn2.training)")
    parser.add_argument("--topology", default="trn2-ultra",
                        help="the machine: trn2-ultra (64 chips, the default) or "
                             "trn2.48xlarge (16 chips, 64 LNC=2 logical cores)")
    parser.add_argument("--plot", metavar="OUT.png", help="draw step time against peak HBM")
    parser.add_argument("--workers", type=int, help="planning processes (default: one per "
                                                    "core)")
    args = parser.parse_args()
    run("tiny" if args.tiny else args.model, layouts(topology=args.topology),
        price_per_chip_hour=args.price, plot=args.plot, workers=args.workers)
