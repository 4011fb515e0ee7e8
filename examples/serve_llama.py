"""How fast does Llama-3 8B answer on 1, 4 and 8 Trainium2 chips (TP4, TP16, TP32), at batch
1 and 32, and how many sequences fit? Planned from shapes alone, with jax_trn2.serving.

The prefill and decode steps are examples/support/llama.py's: tensor parallel over the
devices as NxD Inference lays them out (prefill sequence-parallel with the fused
flash-attention kernel, decode reading the whole KV-cache bucket), on a trn2.48xlarge as
Neuron exposes it: 64 logical NeuronCores (LNC=2), 4 per chip, so TP4 is one chip, TP16
four and TP32 eight. For each degree and batch: time to first token of a 1,024-token
prompt, time per output token with a 4,096-position KV cache, decode tokens/s, KV-cache
bytes per device, and the largest batch whose decode fits in a device's share of HBM.

    python examples/serve_llama.py
    python examples/serve_llama.py --tp 16 --batch 8 --kv-length 8192
"""

from __future__ import annotations

import argparse

from support import llama
from jax_trn2 import serving
from jax_trn2.planner.layout import Layout

MODEL = llama.LLAMA_3_8B
TOPOLOGY = "trn2.48xlarge"  # 16 chips on a 4x4 torus, 4 devices (logical cores) each


def prefill(layout: Layout, batch: int, prompt_tokens: int):
    """The prefill of `batch` prompts of `prompt_tokens` tokens, and its arguments."""
    split = llama.Split(MODEL, layout.size(llama.TP))
    step = llama.prefill(split, layout.make_mesh(), layout.topology)
    return step, llama.prefill_args(split, batch, prompt_tokens)


def decode(layout: Layout, batch: int, kv_length: int):
    """One decode step of `batch` sequences over a KV cache of `kv_length` positions."""
    split = llama.Split(MODEL, layout.size(llama.TP))
    step = llama.decode_step(split, layout.make_mesh(), layout.topology)
    return step, llama.decode_args(split, batch, kv_length)


def run(tp=(4, 16, 32), batches=(1, 32), prompt_tokens: int = 1024,
        kv_length: int = 4096, workers: int | None = None) -> serving.ServingTable:
    """Plan the serving of Llama-3 8B at each tensor-parallel degree (in devices, 4 per
    chip); print and return the table."""
    print(f"Llama-3 8B: {MODEL.param_count() / 1e9:.2f}B parameters, bfloat16, tensor "
          f"parallel on {TOPOLOGY}", flush=True)
    layouts = [Layout.of(**{llama.TP: n}, topology=TOPOLOGY) for n in tp]
    table = serving.serve(prefill, decode, layouts, batches, prompt_tokens=prompt_tokens,
                          kv_length=kv_length, workers=workers)
    print(table)
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, action="append",
                        help="tensor-parallel degree in devices, 4 per chip (repeatable; "
                             "default: 4, 16 and 32; Llama-3 8B has 32 heads)")
    parser.add_argument("--batch", type=int, action="append",
                        help="sequences per step (repeatable; default: 1 and 32)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--kv-length", type=int, default=4096)
    parser.add_argument("--workers", type=int, help="planning processes (default: one per "
                                                    "core)")
    args = parser.parse_args()
    run(tuple(args.tp or (4, 16, 32)), tuple(args.batch or (1, 32)), args.prompt_tokens,
        args.kv_length, args.workers)
