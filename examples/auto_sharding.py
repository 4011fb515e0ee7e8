"""A decoder-only transformer training step written the MaxText way: parameters and batch
carry NamedShardings, and XLA's SPMD partitioner decides each chip's program and inserts
the collectives (no shard_map anywhere).

For three sharding choices on the 4x4x4 mesh of a Trn2-Ultra server:
  dp x fsdp x tp   batch over data and fsdp, weights over fsdp (embed) and tensor (heads, mlp)
  fsdp             batch and weights over all 64 chips (ZeRO-3 style)
  dp x tp          batch over data, weights 16-way tensor parallel over fsdp x tensor
it checks one step against CPU JAX (the same jax.jit with the same shardings on 64 host
devices), prints the collectives the partitioner inserted (kind, mesh axes, bytes per chip,
estimated time, source line) and the estimated step time, so the choices can be compared.

    python examples/auto_sharding.py           # small model, checked against CPU JAX
    python examples/auto_sharding.py --full    # a 1B-class model, from shapes only
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import Counter

from support import harness  # noqa: F401  (64 CPU host devices for the reference)
from support import decoder  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_trn2  # noqa: E402
from lowering import xla_log  # noqa: E402
from mesh import isa  # noqa: E402

SMALL = dict(layers=2, d_model=128, heads=8, d_ff=512, vocab=512, batch=64, seq=32)
FULL = dict(layers=16, d_model=2048, heads=16, d_ff=8192, vocab=32768, batch=256, seq=2048)

# How each layout maps the parameters' logical axes (decoder.PARAM_AXES) onto mesh axes.
LAYOUTS = {
    "dp x fsdp x tp": dict(batch=("data", "fsdp"), embed="fsdp", heads="tensor",
                           mlp="tensor", vocab="tensor"),
    "fsdp": dict(batch=("data", "fsdp", "tensor"), embed=("data", "fsdp", "tensor"),
                 heads=None, mlp=None, vocab=None),
    "dp x tp": dict(batch="data", embed=None, heads=("fsdp", "tensor"),
                    mlp=("fsdp", "tensor"), vocab=("fsdp", "tensor")),
}
_KIND = {isa.AllGather: "all-gather", isa.AllReduce: "all-reduce",
         isa.ReduceScatter: "reduce-scatter", isa.AllToAll: "all-to-all",
         isa.CollectivePermute: "collective-permute"}


def model_of(config: dict) -> decoder.Decoder:
    """The decoder of a SMALL or FULL configuration (GPT-style: MHA, GELU, tied embedding)."""
    return decoder.Decoder(**{k: config[k] for k in ("layers", "d_model", "heads", "d_ff",
                                                       "vocab")})


def collectives_table(program: isa.Program, rows_shown: int = 12) -> list[str]:
    """One line per kind, mesh axes and source line of the collectives the partitioner
    inserted (count, bytes per chip, estimated time each), the costliest first."""
    rows: Counter = Counter()
    detail = {}
    for instr in program.instructions:
        if type(instr) not in _KIND or not instr.why:
            continue
        axes = ",".join(program.mesh.axis_names[a] for a in instr.groups.axes) \
            if getattr(instr, "groups", None) is not None and instr.groups.axes else "-"
        where = os.path.basename(instr.loc.rsplit(":", 1)[0]) if instr.loc else "?"
        key = (_KIND[type(instr)], axes, where)
        rows[key] += 1
        detail[key] = instr.plan
    lines = [f"  {'kind':<19}{'axes':<21}{'count':>5}{'bytes/chip':>15}{'time each':>11}  source"]
    ranked = sorted(rows.items(), key=lambda kv: -kv[1] * detail[kv[0]].seconds)
    for key, count in ranked[:rows_shown]:
        kind, axes, where = key
        plan = detail[key]
        lines.append(f"  {kind:<19}{axes:<21}{count:>5}{plan.message_bytes:>15,}"
                     f"{plan.seconds * 1e6:>9.1f}us  {where}")
    if len(ranked) > rows_shown:
        lines.append(f"  ... and {len(ranked) - rows_shown} more rows "
                     f"({sum(rows.values())} inserted collectives in all)")
    return lines


def run(small: bool = True, layouts=tuple(LAYOUTS)) -> dict:
    config = SMALL if small else FULL
    mesh = jax_trn2.make_mesh((4, 4, 4), ("data", "fsdp", "tensor"))
    rng = np.random.default_rng(0)
    model = model_of(config)
    params = decoder.init_params(model, rng if small else None)
    tokens = (rng.integers(0, config["vocab"], (config["batch"], config["seq"] + 1),
                           dtype=np.int32) if small else
              jax.ShapeDtypeStruct((config["batch"], config["seq"] + 1), jnp.int32))
    results = {}
    for name in layouts:
        layout = LAYOUTS[name]
        # Activations keep the batch split between layers, as MaxText constrains them.
        batch_split = NamedSharding(mesh, P(layout["batch"], None, None))
        step_fn = decoder.make_step(dataclasses.replace(model, activation_sharding=batch_split))
        shardings = dict(in_shardings=(decoder.param_shardings(params, mesh, layout),
                                       NamedSharding(mesh, P(layout["batch"]))),
                         out_shardings=(decoder.param_shardings(params, mesh, layout),
                                        NamedSharding(mesh, P())),
                         donate_argnums=0)
        step = jax_trn2.jit(step_fn, **shardings)
        print(f"\n=== {name}: {config['layers']} layers, d_model {config['d_model']}, "
              f"batch {config['batch']}x{config['seq']} ===")
        compiled = step.lower(params, tokens).compile()
        print("\n".join(collectives_table(compiled.executable.program)))
        print(compiled.executable.estimate.summary())
        if small:
            # Both steps donate (delete) the parameters they are given: each gets a copy,
            # and `params` stays for the next layout.
            new_params, loss = compiled(jax.tree.map(jnp.copy, params), tokens)
            # CPU JAX's partitioner logs (from C++) what jax_trn2 warned about: keep that
            # log off the console as jax_trn2 does.
            with xla_log.captured_stderr() as log:
                ref_params, ref_loss = jax.jit(step_fn, **shardings)(
                    jax.tree.map(jnp.copy, params), tokens)
            xla_log.report(log)
            # BF16 weights and activations: the simulator's matmuls sum 128-long passes in
            # FP32 PSUM, XLA:CPU's in another order; after one step the weights agree to a
            # few BF16 ulps (2^-8 relative) at most.
            harness.check_close(f"{name}: loss", float(loss), float(ref_loss), 2e-2)
            harness.check_close(f"{name}: updated weights", new_params, ref_params, 2e-2)
        results[name] = compiled.cost_analysis()
    return {"cost": results[layouts[0]], "layouts": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="a 1B-class model, from shapes")
    run(small=not parser.parse_args().full)
