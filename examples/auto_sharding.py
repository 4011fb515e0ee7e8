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
import os
from collections import Counter

import harness  # noqa: F401  (64 CPU host devices for the reference)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_trn2  # noqa: E402
from mesh import isa  # noqa: E402

SMALL = dict(layers=2, d_model=128, heads=8, d_ff=512, vocab=512, batch=64, seq=32)
FULL = dict(layers=16, d_model=2048, heads=16, d_ff=8192, vocab=32768, batch=256, seq=2048)

# Logical axes of each parameter, as MaxText names them, and how each layout maps them.
PARAM_AXES = {"embedding": ("vocab", "embed"), "wq": ("embed", "heads"),
              "wk": ("embed", "heads"), "wv": ("embed", "heads"), "wo": ("heads", "embed"),
              "w_in": ("embed", "mlp"), "w_out": ("mlp", "embed"), "norm1": ("embed",),
              "norm2": ("embed",), "final_norm": ("embed",)}
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


def init_params(config: dict, rng: np.random.Generator | None) -> dict:
    """Parameters (arrays from `rng`, or ShapeDtypeStructs when rng is None), BF16."""
    d, ff, vocab = config["d_model"], config["d_ff"], config["vocab"]
    shapes = {"embedding": (vocab, d), "final_norm": (d,), "layers": [
        {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w_in": (d, ff),
         "w_out": (ff, d), "norm1": (d,), "norm2": (d,)} for _ in range(config["layers"])]}

    def make(shape):
        if rng is None:
            return jax.ShapeDtypeStruct(shape, jnp.bfloat16)
        if len(shape) == 1:
            return jnp.ones(shape, jnp.bfloat16)
        return jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[0]), jnp.bfloat16)

    return jax.tree.map(make, shapes, is_leaf=lambda s: isinstance(s, tuple))


def param_shardings(params: dict, mesh, layout: dict) -> dict:
    def spec(path, _):
        name = path[-1].key
        return NamedSharding(mesh, P(*(layout[axis] for axis in PARAM_AXES[name])))
    return jax.tree_util.tree_map_with_path(spec, params)


def rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, -1, keepdims=True) + 1e-6)
            ).astype(x.dtype) * scale


def decoder_layer(x, p, heads: int):
    b, s, d = x.shape
    h = rms_norm(x, p["norm1"])
    q, k, v = ((h @ p[w]).reshape(b, s, heads, d // heads) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((s, s), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1).astype(x.dtype)
    attention = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, d)
    x = x + attention @ p["wo"]
    h = rms_norm(x, p["norm2"])
    return x + jax.nn.gelu(h @ p["w_in"]) @ p["w_out"]


def loss_fn(params, tokens, heads: int):
    x = params["embedding"][tokens[:, :-1]]
    for layer in params["layers"]:
        x = decoder_layer(x, layer, heads)
    logits = (rms_norm(x, params["final_norm"]) @ params["embedding"].T).astype(jnp.float32)
    labels = jax.nn.one_hot(tokens[:, 1:], logits.shape[-1])
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))


def make_step(heads: int):
    def train_step(params, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, heads)
        return jax.tree.map(lambda p, g: p - 0.01 * g.astype(p.dtype), params, grads), loss
    return train_step


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
    params = init_params(config, rng if small else None)
    tokens = (rng.integers(0, config["vocab"], (config["batch"], config["seq"] + 1),
                           dtype=np.int32) if small else
              jax.ShapeDtypeStruct((config["batch"], config["seq"] + 1), jnp.int32))
    step_fn = make_step(config["heads"])
    results = {}
    for name in layouts:
        layout = LAYOUTS[name]
        shardings = dict(in_shardings=(param_shardings(params, mesh, layout),
                                       NamedSharding(mesh, P(layout["batch"]))),
                         out_shardings=(param_shardings(params, mesh, layout),
                                        NamedSharding(mesh, P())),
                         donate_argnums=0)
        step = jax_trn2.jit(step_fn, **shardings)
        print(f"\n=== {name}: {config['layers']} layers, d_model {config['d_model']}, "
              f"batch {config['batch']}x{config['seq']} ===")
        compiled = step.lower(params, tokens).compile()
        print("\n".join(collectives_table(compiled.executable.program)))
        print(compiled.executable.estimate.summary())
        if small:
            new_params, loss = compiled(params, tokens)
            ref_params, ref_loss = jax.jit(step_fn, **shardings)(params, tokens)
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
