"""Planner benchmark: the 70B sweep of examples/plan_llama.py (24 layouts on a Trn2
UltraServer's 64 chips, planned in full) and a search of Llama 3.1 405B on 1,024 chips (16
UltraServers, trn2-ultracluster-16: every dp x fsdp x tp, remat off and on, four batch sizes
and two sequence lengths), pruning what cannot fit or win; wall time and plans per second.

    python benchmarks/plan_search.py            # both
    python benchmarks/plan_search.py --only 405B
    python benchmarks/plan_search.py --only 405B --batches 256 --seqs 8192   # 132 variants
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import plan_llama  # noqa: E402
from jax_trn2 import plan  # noqa: E402

CLUSTER = "trn2-ultracluster-16"  # 16 UltraServers: 1,024 chips, one device each
BATCHES, SEQS = (64, 128, 256, 512), (4096, 8192)


def sweep_70b() -> None:
    started = time.perf_counter()
    table = plan_llama.run("70B")
    seconds = time.perf_counter() - started
    print(f"\n70B sweep: {len(table)} layouts planned in full in {seconds:.1f} s, "
          f"{len(table) / seconds:.2f} plans/s ({table.workers} workers)\n", flush=True)


def search_405b(workers: int | None, batches: tuple[int, ...] = BATCHES,
                seqs: tuple[int, ...] = SEQS) -> None:
    config = plan_llama.MODELS["405B"]
    layouts = plan.grid(1024, ("dp", "fsdp", "tp"), remats=(None, "full"),
                        topologies=(CLUSTER,))
    print(f"Llama 3.1 405B: {config.param_count() / 1e9:.1f}B parameters on 1,024 chips; "
          f"{len(layouts)} layouts x {len(batches) * len(seqs)} (batch, seq)", flush=True)
    started = time.perf_counter()
    result = plan.search(functools.partial(plan_llama.build, "405B"), layouts,
                         params={"batch": batches, "seq": seqs},
                         tokens_per_step=lambda batch, seq: batch * seq,
                         model_flops=functools.partial(_model_flops, config),
                         workers=workers, progress=True)
    seconds = time.perf_counter() - started
    print(result)
    counts = result.counts()
    total = sum(counts.values())
    print(f"\n405B search: {total} variants in {seconds:.1f} s ({total / seconds:.2f} "
          f"variants/s); {counts['planned']} planned in full "
          f"({counts['planned'] / seconds:.2f} full plans/s, {result.workers} workers); "
          f"pruned: {counts['shape']} shape, {counts['memory']} memory "
          f"({result.partitioned_only} of them once partitioned), {counts['time']} time")


def _ints(text: str) -> tuple[int, ...]:
    """'256,512' -> (256, 512)."""
    return tuple(int(part) for part in text.split(","))


def _model_flops(config, batch: int, seq: int) -> float:
    return plan_llama.model_flops(config, batch, seq)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("70B", "405B"))
    parser.add_argument("--workers", type=int)
    parser.add_argument("--batches", type=_ints, default=BATCHES, metavar="B,B,...",
                        help="the 405B search's batch sizes (default: 64,128,256,512)")
    parser.add_argument("--seqs", type=_ints, default=SEQS, metavar="S,S,...",
                        help="the 405B search's sequence lengths (default: 4096,8192)")
    args = parser.parse_args()
    if args.only != "405B":
        sweep_70b()
    if args.only != "70B":
        search_405b(args.workers, args.batches, args.seqs)
