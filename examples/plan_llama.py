"""Will Llama 3 train on a Trn2-Ultra server, and which sharding is best? Planned from
shapes alone: nothing the size of the model is ever allocated.

A Llama-3 training step (grouped-query attention, rotary embeddings, SwiGLU, untied output
head, float32 master weights and Adam moments, bfloat16 compute, layers run by a scan) is
built from jax.ShapeDtypeStructs, partitioned by XLA's SPMD partitioner for each layout
below on the 4x4x4 mesh ('data', 'fsdp', 'tensor') of trn2-ultra, lowered to a Trn2
program and estimated: per-chip peak HBM and whether it fits in 96 GiB, step time, MFU,
the busiest engine and the communication no compute hides.

    python examples/plan_llama.py                  # Llama-3 8B and 70B, every layout
    python examples/plan_llama.py --model 8B --layout "fsdp 64"
    python examples/plan_llama.py --tiny           # a small configuration, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from support import decoder
import jax_trn2
from mesh.machine import get_topology
from mesh.machine.chip import GIB
from mesh.perf.schedule import ENGINES
from mesh.units import bytes_text

# Llama 3 (Meta's model card and params.json): layers, d_model, heads, KV heads, d_ff, vocab.
MODELS = {
    "8B": decoder.Decoder(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                          vocab=128256, mlp="swiglu", tied_embedding=False, rope=True,
                          scan_layers=True, param_dtype="float32"),
    "70B": decoder.Decoder(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                           vocab=128256, mlp="swiglu", tied_embedding=False, rope=True,
                           scan_layers=True, param_dtype="float32"),
}
TINY = decoder.Decoder(layers=2, d_model=256, heads=8, kv_heads=2, d_ff=512, vocab=1024,
                       mlp="swiglu", tied_embedding=False, rope=True, scan_layers=True,
                       param_dtype="float32")
BATCH, SEQ = 64, 8192  # sequences per step (one per chip under FSDP 64), Llama 3's context
TINY_BATCH, TINY_SEQ = 64, 64

# How each layout maps the logical axes (decoder.PARAM_AXES) onto the mesh axes.
TOPOLOGY, MESH_SHAPE, MESH_AXES = "trn2-ultra", (4, 4, 4), ("data", "fsdp", "tensor")
ALL = ("data", "fsdp", "tensor")
LAYOUTS = {
    "fsdp 64": dict(batch=ALL, embed=ALL),
    "fsdp 16 x tp 4": dict(batch=("data", "fsdp"), embed=("data", "fsdp"), heads="tensor",
                           kv_heads="tensor", mlp="tensor", vocab="tensor"),
    "dp 4 x fsdp 4 x tp 4": dict(batch=("data", "fsdp"), embed="fsdp", heads="tensor",
                                 kv_heads="tensor", mlp="tensor", vocab="tensor"),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    layout: str
    remat: bool
    peak_bytes: int
    fits: bool
    step_seconds: float
    mfu: float  # model FLOPs (no recomputation) over the chips' BF16 peak for the step
    busiest: str  # engine and its share of the step
    exposed_seconds: float
    wall_seconds: float  # how long planning took


def model_flops(config: decoder.Decoder, batch: int, seq: int) -> float:
    """FLOPs of one training step of the model, not counting recomputation (PaLM's MFU
    convention): 6 per parameter per token for the matmuls (the embedding lookup is not
    one), plus 12 * layers * d_model * seq per token for attention's two matmuls."""
    matmul_params = config.param_count() - config.vocab * config.d_model
    per_token = 6 * matmul_params + 12 * config.layers * config.d_model * seq
    return per_token * batch * seq


def plan(name: str, config: decoder.Decoder, layout_name: str, remat: bool, batch: int,
         seq: int) -> Plan:
    """Partition, lower and estimate one training step; nothing is allocated."""
    started = time.perf_counter()
    mesh = jax_trn2.make_mesh(MESH_SHAPE, MESH_AXES)
    layout = LAYOUTS[layout_name]
    config = dataclasses.replace(
        config, remat=remat,
        activation_sharding=NamedSharding(mesh, P(layout["batch"], None, None)))
    params = decoder.init_params(config, None)
    moments = (jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32), params),) * 2
    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    weights = decoder.param_shardings(params, mesh, layout)
    state = (weights, (weights, weights))
    batch_sharding = NamedSharding(mesh, P(layout["batch"]))
    step = jax_trn2.jit(decoder.make_adam_step(config),
                        in_shardings=state + (batch_sharding,),
                        out_shardings=state + (NamedSharding(mesh, P()),),
                        donate_argnums=(0, 1),  # parameters and moments updated in place
                        topology=TOPOLOGY)
    lowered = step.lower(params, moments, tokens)
    memory = lowered.memory_analysis()
    cost = lowered.cost_analysis()["trn2"]
    step_seconds = cost["step_seconds"]
    busy = cost["engine_busy_seconds"]
    engine = max(ENGINES, key=lambda e: busy[e])
    share = busy[engine] / step_seconds if step_seconds else 0.0
    peak = cost["chips"] * get_topology(TOPOLOGY).chip.peak_flops_for("bfloat16")
    mfu = model_flops(config, batch, seq) / (peak * step_seconds) if step_seconds else 0.0
    return Plan(name, layout_name, remat, memory.peak_memory_in_bytes, memory.fits,
                step_seconds, mfu, f"{engine} {share:.0%}",
                cost["exposed_communication_seconds"], time.perf_counter() - started)


def table(plans: list[Plan]) -> str:
    head = (f"{'model':<6}{'layout':<22}{'remat':<6}{'peak HBM/chip':>14}  {'fits':<5}"
            f"{'step':>12}{'MFU':>7}  {'busiest engine':<16}{'exposed comm':>14}"
            f"{'planned in':>12}")
    rows = [head, "-" * len(head)]
    for p in plans:
        rows.append(f"{p.model:<6}{p.layout:<22}{'yes' if p.remat else 'no':<6}"
                    f"{bytes_text(p.peak_bytes):>14}  {'yes' if p.fits else 'NO':<5}"
                    f"{p.step_seconds * 1e3:>9,.1f} ms{p.mfu:>7.1%}  {p.busiest:<16}"
                    f"{p.exposed_seconds * 1e3:>11,.1f} ms{p.wall_seconds:>11.1f}s")
    return "\n".join(rows)


def host_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def run(models=tuple(MODELS), layouts=tuple(LAYOUTS), remats=(False, True),
        tiny: bool = False) -> list[Plan]:
    configs = {"tiny": TINY} if tiny else {m: MODELS[m] for m in models}
    batch, seq = (TINY_BATCH, TINY_SEQ) if tiny else (BATCH, SEQ)
    plans = []
    total = len(configs) * len(layouts) * len(remats)
    for name, config in configs.items():
        print(f"Llama-3 {name}: {config.param_count() / 1e9:.2f}B parameters, "
              f"{config.layers} layers, d_model {config.d_model}, {config.heads} heads "
              f"({config.n_kv} KV), d_ff {config.d_ff}, vocab {config.vocab}; "
              f"batch {batch} x {seq} tokens", flush=True)
        for layout in layouts:
            for remat in remats:
                what = f"[{len(plans) + 1}/{total}] {layout}, remat {'on' if remat else 'off'}"
                # A line of its own: XLA's partitioner may log warnings while it works.
                print(f"  {what}: partitioning, lowering, estimating", flush=True)
                plans.append(plan(name, config, layout, remat, batch, seq))
                p = plans[-1]
                print(f"  {what}: {bytes_text(p.peak_bytes)} per chip, step "
                      f"{p.step_seconds * 1e3:,.1f} ms (planned in {p.wall_seconds:.1f} s)",
                      flush=True)
    print()
    print(table(plans))
    print(f"\nhost peak RSS {host_rss_bytes() / GIB:.2f} GiB (one chip's HBM: 96 GiB)")
    return plans


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=tuple(MODELS), action="append",
                        help="plan only this model (repeatable; default: all)")
    parser.add_argument("--layout", choices=tuple(LAYOUTS), action="append",
                        help="plan only this layout (repeatable; default: all)")
    parser.add_argument("--remat", choices=("on", "off"), action="append",
                        help="with or without rematerialisation (default: both)")
    parser.add_argument("--tiny", action="store_true", help="a small configuration")
    args = parser.parse_args()
    run(models=tuple(args.model or MODELS), layouts=tuple(args.layout or LAYOUTS),
        remats=tuple(r == "on" for r in args.remat) if args.remat else (False, True),
        tiny=args.tiny)
