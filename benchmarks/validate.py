"""How close the estimates come to published measurements of real Trainium2 hardware.

Each row is a figure AWS (or, where marked, a third party) published, with its
configuration; the script builds that configuration with the project's public API (a JAX
program over jax_trn2.make_mesh, lowered and compiled from shapes) and prints the expected
and ideal estimates next to the measurement. Rows are of two kinds, kept apart:

- calibration: micro-benchmarks and specifications (nccom-test collective sweeps, a
  measured kernel, a link latency). The runtime constants (mesh/machine/runtime.py) come
  from figures of this kind; these rows show how the model reproduces them.
- validation: whole programs (inference steps of published models). Nothing was fitted to
  them.

    python benchmarks/validate.py                                 # the table
    python benchmarks/validate.py --markdown docs/validation.md   # and the document

Conventions the measurements need (docs/validation.md says more):
- nccom-test ranks are logical NeuronCores: at Trn2's default LNC=2 a chip has 4, so a
  16-rank collective runs on 4 chips. Each rank is a device of the machine as rented
  (a trn2.48xlarge: 64 devices), so the collective runs the runtime's stages among the
  ranks of each chip around the stage between chips.
- A tensor-parallel degree counts logical cores too: TP64 is the 64 devices of a
  trn2.48xlarge (16 chips), TP8 8 of its devices (2 chips), TP4 a trn2.3xlarge (1 chip).
- Serving figures (vLLM, llmperf, guidellm) are measured at the client: they include the
  server's own time per request and, at a concurrency above one, waiting behind other
  requests' steps. The device estimate has neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import jax_trn2  # noqa: E402
from mesh.machine import ChipSpec, get_topology  # noqa: E402
from support import llama, moe  # noqa: E402

RANKS_PER_CHIP = 4  # logical NeuronCores per chip at Trn2's default LNC=2
NCCOM = "Neuron docs, tools/neuron-sys-tools/nccom-test.rst"
NXDI = "Neuron docs, libraries/nxd-inference/tutorials"
OPTIMUM = "huggingface/optimum-neuron benchmark/vllm/single-instance"


@dataclasses.dataclass(frozen=True)
class Case:
    """One published figure and how to build it."""

    name: str
    kind: str  # "calibration" or "validation"
    configuration: str
    measured_seconds: float
    source: str
    build: Callable[[], tuple[Callable, tuple]]  # -> (a jax_trn2.jit function, its args)
    note: str = ""


def estimate(case: Case) -> tuple[float, float]:
    """(expected, ideal) seconds of a case's program."""
    jitted, args = case.build()
    info = jitted.lower(*args).compile().cost_analysis()["trn2"]
    return info["step_seconds"], info["ideal_step_seconds"]


# --- collectives: nccom-test -------------------------------------------------------------

NCCOM_MACHINE = "trn2.48xlarge"  # 64 ranks: 16 chips of 4 logical NeuronCores (LNC=2)


def nccom(op: str, ranks: int, size: int, dtype, groups: int = 1,
          pairs: tuple[tuple[int, int], ...] = ()):
    """An nccom-test collective over `ranks` ranks (in `groups` concurrent groups of
    consecutive ranks) of `size` bytes (nccom's size: each rank's buffer for all-reduce and
    permute, the gathered output for all-gather), one rank per device of a trn2.48xlarge.
    A permute sends each rank's buffer along its (source, target) `pairs`."""
    def build():
        itemsize = jnp.dtype(dtype).itemsize
        whole = op in ("all-reduce", "permute")
        per_rank = size // itemsize if whole else size // (ranks * itemsize)
        mesh = jax_trn2.make_mesh((groups, ranks), ("group", "rank"), topology=NCCOM_MACHINE)

        def body(buffer):
            if op == "all-reduce":
                return jax.lax.psum(buffer, "rank")
            if op == "permute":
                return jax.lax.ppermute(buffer, "rank", pairs)
            return jax.lax.all_gather(buffer, "rank", tiled=True)

        spec = P(("group", "rank"))
        out_spec = spec if whole else P("group")
        f = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out_spec, check_vma=False)
        args = (jax.ShapeDtypeStruct((groups * ranks * max(per_rank, 1),), dtype),)
        return jax_trn2.jit(f), args
    return build


C1 = "16-rank all-reduce fp32 (4 chips), nccom-test --show-algorithm, SDK 2.28 example"
C2 = ("16-rank all-reduce bf16 in 4 groups (16 chips), nccom-test --streams-json, SDK 2.32 "
      "example; a 64-rank all-gather ran concurrently on another stream")
C3 = "32-rank all-gather fp32 (8 chips), nccom-test --show-input-output-size, SDK 2.24 example"
C5 = "8-rank all-gather fp32 (2 chips), nccom-test --stats, SDK 2.28 example"
C6 = "4-rank all-gather fp16 (1 chip), nccom-test allgv -N 1 --variable-size-op-metadata example"
C7 = ("64-rank all-gather fp32 (16 chips), 2 per iteration, nccom-test --streams-json, SDK 2.32 "
      "example; stream 1, beside the 16-rank all-reduces of C2 on stream 0")
C8 = ("8-rank permute uint8 (2 chips), pairs 0<->1 and 2<->3 (one chip's ranks), ranks 4-7 "
      "to themselves; nccom-test --custom-src-target-pairs example (docs of Nov 2025)")
# nccom-test's permute example: pairs.json's src_target_pairs.
PERMUTE_PAIRS = ((0, 1), (1, 0), (2, 3), (3, 2), (4, 4), (5, 5), (6, 6), (7, 7))

CAPTURED = ("models the runtime's algorithm by size, its launch, per-hop latency and "
            "collective-DMA/HBM-bound transfer, and the stages among each chip's 4 ranks")
COLLECTIVES = [
    *(Case(f"all-reduce {size:,} B", "calibration", C1, us * 1e-6, NCCOM,
           nccom("all-reduce", 16, size, jnp.float32),
           f"{CAPTURED}; the instance is not stated (KangaRing implies Trn2); below 32 MiB this "
           "example's standalone all-reduces floor at 300-690 us, 10x what a collective costs "
           "inside a program (~25 us in a DeepSeek-V3 TP64 decode profile): not modelled")
      for size, us in ((4, 299.91), (32, 299.69), (512, 299.82), (8192, 299.74), (131072, 574.15), (2097152, 686.32),
                       (33554432, 2754.15), (536870912, 9689.51))),
    *(Case(f"all-reduce {size:,} B", "calibration", C2, us * 1e-6, NCCOM,
           nccom("all-reduce", 16, size, jnp.bfloat16, groups=4),
           f"{CAPTURED}; the concurrent stream's contention is not modelled (it slowed that "
           "stream's 1 KiB all-gathers to 258 us)")
      for size, us in ((1024, 101.14), (65536, 103.28), (262144, 107.37),
                       (1048576, 117.67))),
    *(Case(f"all-gather {size:,} B", "calibration", C3, us * 1e-6, NCCOM,
           nccom("all-gather", 32, size, jnp.float32),
           f"{CAPTURED}; the instance is not stated (Trn1 or Trn2)")
      for size, us in ((1024, 6.16), (8192, 6.48), (65536, 8.17), (524288, 23.16))),
    *(Case(f"all-gather {size:,} B", "calibration", C5, us * 1e-6, NCCOM,
           nccom("all-gather", 8, size, jnp.float32),
           f"{CAPTURED}; the instance is not stated (Trn1 or Trn2)")
      for size, us in ((1024, 10.0), (8192, 10.22), (65536, 11.31), (524288, 14.83))),
    Case("all-gather 2,048 B", "calibration", C6, 16.28e-6, NCCOM,
         nccom("all-gather", 4, 2048, jnp.float16),
         f"{CAPTURED}; the source of on_chip_stage_seconds (equal send counts, as its "
         "metadata gives)"),
    # The mean of the 11 published 1 KiB rows, one per size of stream 0's sweep.
    Case("all-gather 1,024 B", "calibration", C7, 258.59e-6, NCCOM,
         nccom("all-gather", 64, 1024, jnp.float32),
         f"{CAPTURED}; the all-reduces running on the other stream are not modelled (the "
         "model runs a program's collectives one at a time)"),
    Case("permute 33,554,432 B", "calibration", C8, 894.24e-6, NCCOM,
         nccom("permute", 8, 33554432, jnp.uint8, pairs=PERMUTE_PAIRS),
         f"{CAPTURED}; the instance is not stated (Trn1 or Trn2); at 37.52 GB/s per pair "
         "it is one DMA stream per pair, not the chip's collective DMA rings"),
]


# --- engines -----------------------------------------------------------------------------

def one_core_matmul():
    """The NKI kernel-optimization tutorial's FP32 matmul on one NeuronCore: a chip of one
    core whose HBM is the core's DMA engines' peak (16 x 23 B/ns)."""
    core = ChipSpec(neuron_cores=1, hbm_bandwidth=16 * 23e9)
    topology = get_topology("trn2", chip=core)
    mesh = jax_trn2.make_mesh((1,), ("core",), topology=topology)
    args = (jax.ShapeDtypeStruct((4096, 8192), jnp.float32),
            jax.ShapeDtypeStruct((8192, 8192), jnp.float32))
    f = jax.shard_map(jnp.matmul, mesh=mesh, in_specs=(P(), P()), out_specs=P())
    return jax_trn2.jit(f, topology=topology), args


ENGINES = [
    Case("fp32 matmul 4096x8192 @ 8192x8192", "calibration",
         "one NeuronCore, NKI kernel with hoisted loads (tutorial v3)", 28.197982e-3,
         "Neuron docs, nki/guides/tutorials/kernel-optimization.rst (profile)",
         one_core_matmul, "models max(N, 64)-cycle matmuls at FP32's quarter rate and the "
         "DMA's sustained rate (hbm_efficiency comes from this profile's DMA, not its time)"),
]


# --- whole programs: inference -----------------------------------------------------------

def machine_for(tp: int) -> str:
    """The instance a published tensor-parallel degree ran on: TP4 is one chip (a
    trn2.3xlarge), larger degrees the chips of a trn2.48xlarge (4 ranks a chip)."""
    return "trn2.3xlarge" if tp <= RANKS_PER_CHIP else "trn2.48xlarge"


def decode(config: llama.Llama, tp: int, batch: int, bucket: int, model=llama):
    """A decode step of `model` (examples/support's llama or moe) at TP `tp`."""
    def build():
        split = llama.Split(config, tp)
        mesh = jax_trn2.make_mesh((tp,), (llama.TP,), topology=machine_for(tp))
        return model.decode_step(split, mesh), model.decode_args(split, batch, bucket)
    return build


def prefill(config: llama.Llama, tp: int, length: int, model=llama):
    """A prefill of one `length`-token prompt of `model` at TP `tp`."""
    def build():
        split = llama.Split(config, tp)
        mesh = jax_trn2.make_mesh((tp,), (llama.TP,), topology=machine_for(tp))
        return model.prefill(split, mesh), model.prefill_args(split, 1, length)
    return build


DECODE = ("models the weights and the cache bucket streamed from HBM, two all-reduces a layer "
          "with their stages among each chip's ranks, per-instruction DMA and warm-up costs; ")
PREFILL = ("models the matmuls at the PE array's rate, attention as the fused kernel, the "
           "sequence-parallel all-gathers and reduce-scatters at the collective DMA's rate; ")
SERVED = "leaves out the server's own time (measured at the client through vLLM)"
# optimum-neuron (October 2025) compiles one context-encoding graph of the full sequence
# length: bucketing is off by default (backend/config.py enable_bucketing=False, and
# modeling_decoder.py builds the context buckets as generate_buckets(max_context_length,
# max_context_length)), so every prompt is padded to SEQUENCE_LENGTH (4,096) positions.
UNBUCKETED = ("; the prompt runs padded to the one compiled length (optimum-neuron compiles no "
              "buckets)")
PROGRAMS = [
    Case("Llama-3.3-70B TPOT", "validation",
         "TP64 (16 chips) BF16, batch 1, decode at 10,000-11,500 tokens (12,800 bucket); "
         "vLLM + llmperf, SDK 2.22 docs", 19.6e-3, f"{NXDI}/trn2-llama3.3-70b-tutorial.rst",
         decode(llama.LLAMA_3_70B, 64, 1, 12800), DECODE + SERVED),
    Case("Llama-3.3-70B TTFT", "validation",
         "TP64 (16 chips) BF16, batch 1, 10,000-token prompt (12,288 bucket); SDK 2.22 docs",
         814.2e-3, f"{NXDI}/trn2-llama3.3-70b-tutorial.rst",
         prefill(llama.LLAMA_3_70B, 64, 12288), PREFILL + SERVED),
    Case("Llama-3.3-70B TTFT", "validation",
         "as above, the SDK 2.21 version of the tutorial", 575.6e-3,
         f"{NXDI}/trn2-llama3.3-70b-tutorial.rst (commit 06f33784)",
         prefill(llama.LLAMA_3_70B, 64, 12288), PREFILL + SERVED),
    # The prefix-caching tutorial's baseline (no prefix caching): TP64, compiled for batch 4
    # (continuous batching, one prompt per context-encoding run) and context buckets 512,
    # 1,024, 2,048, 4,096, 8,192; P50 TTFT per dataset through vLLM. The datasets' prompt
    # lengths and the benchmark's concurrency are not stated.
    Case("Llama-3.3-70B TTFT", "validation",
         "TP64 (16 chips) BF16, HumanEval prompts (under 512 tokens: the 512 bucket), no "
         "prefix caching; vLLM, SDK 2.24 docs", 89.7e-3,
         f"{NXDI}/llama70b_apc_perf_comparison.csv (commit 87b7d009)",
         prefill(llama.LLAMA_3_70B, 64, 512),
         PREFILL + SERVED + "; the benchmark's concurrency is not stated"),
    Case("Llama-3.3-70B TTFT", "validation",
         "as above, \"dynamic sonnet 1k\" prompts (~1,000 tokens: the 1,024 bucket)", 123.08e-3,
         f"{NXDI}/llama70b_apc_perf_comparison.csv (commit 87b7d009)",
         prefill(llama.LLAMA_3_70B, 64, 1024),
         PREFILL + SERVED + "; the benchmark's concurrency and the prompts' exact lengths are "
         "not stated (a prompt over 1,024 tokens runs in the 2,048 bucket)"),
    Case("Llama-3.1-405B TPOT", "validation",
         "TP64 (16 chips) BF16, batch 1, decode at ~10,000-11,800 tokens (12,800 bucket)",
         37.9e-3, f"{NXDI}/trn2-llama3.1-405b-speculative-tutorial.rst",
         decode(llama.LLAMA_3_405B, 64, 1, 12800), DECODE + SERVED),
    # The 405B tutorial compiles context-encoding buckets of 2,048, 4,096, 10,240 and
    # 12,288 positions (the 70B tutorial's are 2,048, 4,096, 8,192 and 12,288): llmperf's
    # 10,000-token prompts run in the 10,240 bucket.
    Case("Llama-3.1-405B TTFT", "validation",
         "TP64 (16 chips) BF16, batch 1, 10,000-token prompt (10,240 bucket)", 2442e-3,
         f"{NXDI}/trn2-llama3.1-405b-speculative-tutorial.rst",
         prefill(llama.LLAMA_3_405B, 64, 10240), PREFILL + SERVED),
    Case("Llama-3.1-8B TPOT", "validation",
         "TP8 (2 chips) BF16, 2 requests at a time (batch 2, 2,048 bucket), ~512 in / 128 "
         "out; vLLM-Neuron, SDK 2.32 (\"illustrative\")", 10.52e-3,
         "vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md",
         decode(llama.LLAMA_3_8B, 8, 2, 2048), DECODE + SERVED),
    Case("Llama-3.1-8B TTFT", "validation",
         "TP8 (2 chips) BF16, ~512-token prompt, 2 requests at a time", 51.07e-3,
         "vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md",
         prefill(llama.LLAMA_3_8B, 8, 512),
         PREFILL + SERVED + ", and waiting behind the other request's decode steps"),
    Case("Llama-3.1-8B inter-token latency", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, compiled for batch 32 and 4,096 tokens, one "
         "request at a time (~1,500 in / 250 out); optimum-neuron + guidellm", 22.136e-3,
         f"{OPTIMUM}/llama3.1-8b (commit b52f1a3a)", decode(llama.LLAMA_3_8B, 4, 32, 4096),
         DECODE + SERVED + "; the batch-32 graph runs padded"),
    Case("Llama-3.1-8B TTFT", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, ~1,500-token prompt run in the 4,096-token graph",
         197.2e-3, f"{OPTIMUM}/llama3.1-8b (commit b52f1a3a)",
         prefill(llama.LLAMA_3_8B, 4, 4096), PREFILL + SERVED + UNBUCKETED),
    Case("Qwen3-32B inter-token latency", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, compiled for batch 2 and 4,096 tokens, one "
         "request at a time", 32.084e-3, f"{OPTIMUM}/qwen3-32b (commit 56c35e6d)",
         decode(llama.QWEN_3_32B, 4, 2, 4096), DECODE + SERVED),
    Case("Qwen3-32B TTFT", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, ~1,500-token prompt run in the 4,096-token graph",
         770.9e-3, f"{OPTIMUM}/qwen3-32b (commit 56c35e6d)",
         prefill(llama.QWEN_3_32B, 4, 4096), PREFILL + SERVED + UNBUCKETED),
]


# --- whole programs: mixture of experts --------------------------------------------------

# optimum-neuron (neuronx-distributed 0.15) compiles one context-encoding graph of the whole
# SEQUENCE_LENGTH (bucketing off), so every prompt runs padded to 4,096 positions, and one
# decode graph of BATCH_SIZE rows reading a 4,096-position cache (padded when one request
# runs). guidellm's "synchronous" row: one request at a time.
MOE_SERVED = " Leaves out the server's own time (measured at the client through vLLM)."
MOE_DECODE = ("models the attention weights and the padded cache streamed from HBM, the "
              "router, the experts as NxD's ExpertMLPsV2 runs them (fused gate and up "
              "weights; selective loading a Python loop over the rows, every expert a "
              "Python loop adding each expert's outputs into the result): ")
MOE_PREFILL = ("models the 4,096-position prompt through sequence-parallel attention (fused "
               "kernel), the router, NxD's blockwise experts: the (token, expert) pairs "
               "in N = ceil((T*k - (E-1))/512) + E - 1 blocks of 512 rows, one "
               "reduce-scatter after them. ")
# NxD 0.15 runs its blockwise NKI kernel only for hidden sizes 4096-8192 (the Neuron
# compiler's check_blockwise_mm_kernel_compatibility, SDK 2.26; NxD's
# test_can_use_blockwise_nki.py): Qwen3-30B-A3B's 2048 falls back to NxD's torch loop.
MOE_TORCH_LOOP = ("Hidden size 2048 is outside the blockwise NKI kernel's 4096-8192, so NxD "
                  "runs its torch fallback (torch_blockwise_matmul_inference): the 191 blocks "
                  "one after another, each gathering its 512 rows, its expert's weights "
                  "(by index) and its rows' routing weights, and writing its rows of the "
                  "output back (gather, add, scatter): about a hundred instructions a "
                  "block, most of them small index arithmetic (torch-xla wraps every index "
                  "tensor: add, "
                  "compare, select) that each pay the DMA's fixed cost; how much of it the "
                  "Neuron compiler fuses is not modelled. ")
MOE_KERNEL = ("The hidden size is in the blockwise NKI kernel's range (4096-8192): the "
              "blocks as one grouped matmul (jax.lax.ragged_dot), the pairs scattered into "
              "them and gathered back. ")
MOE = [
    Case("Qwen3-30B-A3B inter-token latency", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, compiled for batch 16 and 4,096 tokens, one "
         "request at a time; optimum-neuron + guidellm", 56.36e-3,
         f"{OPTIMUM}/qwen3-30B-A3B-trn2 (commit b0a576eb)",
         decode(moe.QWEN_3_30B_A3B, 4, 16, 4096, moe),
         MOE_DECODE + "every expert over the 16 rows (16 x 8 / 128 = 1 reaches NxD's "
         "selective-loading threshold): all 128 experts' weights read each layer, their "
         "outputs added one expert after another." + MOE_SERVED),
    Case("Qwen3-30B-A3B TTFT", "validation",
         "trn2.3xlarge (1 chip, TP4) BF16, prompt padded to the 4,096-token graph", 1546.75e-3,
         f"{OPTIMUM}/qwen3-30B-A3B-trn2 (commit b0a576eb)",
         prefill(moe.QWEN_3_30B_A3B, 4, 4096, moe),
         MOE_PREFILL + MOE_TORCH_LOOP + MOE_SERVED),
    Case("Qwen3-235B-A22B inter-token latency", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, compiled for batch 4 and 4,096 tokens, one "
         "request at a time; optimum-neuron + guidellm", 32.18e-3,
         f"{OPTIMUM}/qwen3-235B-A22B-trn2 (commit 5996de0f)",
         decode(moe.QWEN_3_235B_A22B, 64, 4, 4096, moe),
         MOE_DECODE + "selective loading (4 x 8 / 128 < 1): one row after another, its 8 "
         "experts' weights gathered and applied to it, 32 experts' weights read each "
         "layer." + MOE_SERVED),
    Case("Qwen3-235B-A22B TTFT", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, prompt padded to the 4,096-token graph",
         4587.15e-3, f"{OPTIMUM}/qwen3-235B-A22B-trn2 (commit 5996de0f)",
         prefill(moe.QWEN_3_235B_A22B, 64, 4096, moe),
         MOE_PREFILL + MOE_KERNEL + "The kernel's own schedule is not modelled: per "
         "block its indirect loads of the rows, a cross-core all-reduce of the gate and up "
         "projections (LNC=2, hidden dim split), its expert's weights loaded again (N "
         "blocks read N experts' weights where the grouped matmul reads each once; the gate "
         "and up weights 96 bytes a partition), the output rows read, added and written "
         "back." + MOE_SERVED),
    # Llama 4 in optimum-neuron (modeling_llama4.py at 5996de0f): NxD's ExpertMLPsV2 with a
    # sigmoid router, early affinity modulation and a fused shared expert; hidden size 5120,
    # in the blockwise NKI kernel's range.
    Case("Llama-4-Scout inter-token latency", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, compiled for batch 32 and 4,096 tokens, one "
         "request at a time; optimum-neuron + guidellm", 32.764e-3,
         f"{OPTIMUM}/llama4-Scout-trn2 (commit 5996de0f)",
         decode(moe.LLAMA_4_SCOUT, 64, 32, 4096, moe),
         MOE_DECODE + "every expert over the 32 rows (32 x 1 / 16 >= 1): all 16 experts' "
         "weights read each layer, with the shared expert's; 40 query heads padded to 64 "
         "as NxD pads them." + MOE_SERVED),
    Case("Llama-4-Scout TTFT", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, prompt padded to the 4,096-token graph",
         575.03e-3, f"{OPTIMUM}/llama4-Scout-trn2 (commit 5996de0f)",
         prefill(moe.LLAMA_4_SCOUT, 64, 4096, moe),
         MOE_PREFILL + MOE_KERNEL + "The kernel's own schedule is not modelled (see the "
         "Qwen3-235B-A22B row)." + MOE_SERVED),
    Case("Llama-4-Maverick inter-token latency", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, compiled for batch 8 and 4,096 tokens, one "
         "request at a time; optimum-neuron + guidellm", 16.941e-3,
         f"{OPTIMUM}/llama4-Maverick-trn2 (commit 5996de0f)",
         decode(moe.LLAMA_4_MAVERICK, 64, 8, 4096, moe),
         MOE_DECODE + "selective loading (8 x 1 / 128 < 1) in the 24 MoE layers, the 24 "
         "dense layers between them as llama's." + MOE_SERVED),
    Case("Llama-4-Maverick TTFT", "validation",
         "trn2.48xlarge (16 chips, TP64) BF16, prompt padded to the 4,096-token graph",
         1713.82e-3, f"{OPTIMUM}/llama4-Maverick-trn2 (commit 5996de0f)",
         prefill(moe.LLAMA_4_MAVERICK, 64, 4096, moe),
         MOE_PREFILL + MOE_KERNEL + "The kernel's own schedule is not modelled (see the "
         "Qwen3-235B-A22B row)." + MOE_SERVED),
]

CASES = COLLECTIVES + ENGINES + PROGRAMS + MOE


def seconds_text(s: float) -> str:
    return f"{s * 1e3:,.2f} ms" if s >= 1e-3 else f"{s * 1e6:,.2f} us"


def run(cases=CASES) -> list[tuple[Case, float, float]]:
    results = []
    for case in cases:
        started = time.perf_counter()
        expected, ideal = estimate(case)
        results.append((case, expected, ideal))
        print(f"  {case.kind:<11} {case.name:<36} measured {seconds_text(case.measured_seconds):>11}"
              f"  expected {seconds_text(expected):>11} ({expected / case.measured_seconds:5.2f}x)"
              f"  ideal {seconds_text(ideal):>11} ({ideal / case.measured_seconds:5.2f}x)"
              f"  [{time.perf_counter() - started:.1f} s]", file=sys.stderr, flush=True)
    return results


def summary(results) -> list[str]:
    lines = []
    for kind in ("calibration", "validation"):
        ratios = [e / c.measured_seconds for c, e, _ in results if c.kind == kind]
        ideal_ratios = [i / c.measured_seconds for c, _, i in results if c.kind == kind]
        if not ratios:
            continue
        within = sum(0.75 <= r <= 1.25 for r in ratios)
        within_2x = sum(0.5 <= r <= 2.0 for r in ratios)
        lines.append(f"{kind}: {len(ratios)} figures; expected/measured median "
                     f"{statistics.median(ratios):.2f}, {within} within +-25%, {within_2x} "
                     f"within 2x; ideal above the measurement in "
                     f"{sum(r > 1 for r in ideal_ratios)}")
    return lines


DOC_HEAD = """# Validation: the estimates against published Trainium2 measurements

Made by `python benchmarks/validate.py --markdown docs/validation.md` (on {machine}, in
{seconds:.0f} s). Every row is a figure published for real Trainium2 hardware, rebuilt with the
project's public API at its configuration (from shapes: nothing is allocated), with the
expected estimate (the hardware plus the Neuron runtime's measured costs,
mesh/machine/runtime.py) and the ideal one (the hardware's limits) beside it; ratio is
estimate / measured. Calibration rows are the micro-benchmarks and specifications the
runtime constants come from (mesh/machine/trn2_facts.md, "Runtime costs"); validation rows are
whole programs, to which nothing was fitted.

Conventions: nccom-test ranks and tensor-parallel degrees count logical NeuronCores, 4 per
chip at Trn2's default LNC=2, and each is a device of the machine as rented (TP64 is the 64
devices of a trn2.48xlarge, TP4 the 4 of a trn2.3xlarge). Serving figures were measured at the client through vLLM and include the server's own
time per request (a DeepSeek-V3 comparison in NxD Inference's contrib models measured
about 2 ms per token between the native and the served decode).

"""


def markdown(results) -> str:
    rows = ["| kind | figure | configuration | measured | expected (ratio) | ideal (ratio) | "
            "source | what the model does and does not capture |",
            "|---|---|---|---|---|---|---|---|"]
    for case, expected, ideal in results:
        m = case.measured_seconds
        rows.append(f"| {case.kind} | {case.name} | {case.configuration} | {seconds_text(m)} | "
                    f"{seconds_text(expected)} ({expected / m:.2f}) | {seconds_text(ideal)} "
                    f"({ideal / m:.2f}) | {case.source} | {case.note} |")
    return "\n".join(rows + [""] + [f"- {line}" for line in summary(results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="PATH",
                        help="also write the table as markdown (docs/validation.md)")
    parser.add_argument("--machine", default="an unnamed machine",
                        help="the host's name for the markdown's header")
    parser.add_argument("--only", choices=("calibration", "validation"),
                        help="only the rows of one kind")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in (None, c.kind)]
    started = time.perf_counter()
    results = run(cases)
    print("\n".join(summary(results)))
    if args.markdown:
        head = DOC_HEAD.format(machine=args.machine, seconds=time.perf_counter() - started)
        Path(args.markdown).write_text(head + markdown(results) + "\n")


if __name__ == "__main__":
    main()
