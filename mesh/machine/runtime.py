"""What the Neuron runtime, the compiler's instruction streams and the engines' real rates add
to the hardware's limits: the constants of the expected estimate.

Every estimate comes twice (mesh.perf): the ideal time, what the hardware's published limits
allow (the PE array at full rate, HBM and links at their bandwidth, the per-hop latency), and
the expected time, which adds what AWS measured or specified for the machine as it runs:
fixed costs per collective and per DMA, the sustained rate of DMA from HBM, the engines'
per-instruction overhead, the Tensor Engine's warm-up. The ideal is this spec with every
cost zero and every efficiency one (`RuntimeSpec.ideal()`).

Each default below names its source; the figures are collected, with their configurations,
in mesh/machine/trn2_facts.md ("Runtime costs") and checked against published whole-program
measurements by benchmarks/validate.py (docs/validation.md). Every one can be overridden:
``get_topology("trn2-ultra", runtime=RuntimeSpec(on_chip_stage_seconds=5e-6))``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class RuntimeSpec:
    """The measured costs of a Trainium2 machine running a program (seconds, bytes/s)."""

    # --- collectives (Neuron runtime; nccom-test outputs in the Neuron docs) ----------------
    # Fixed cost of any collective: the trigger, the handshake between the ranks' collective
    # cores and the first DMA. nccom-test's smallest all-gathers: 6.16 us over 32 ranks,
    # 10.0 us over 8 (tools/neuron-sys-tools/nccom-test.rst, SDK 2.24 and 2.28 examples).
    collective_launch_seconds: float = 5e-6
    # Fixed cost of each stage among the ranks (logical NeuronCores) of one chip: the
    # semaphore handshake of the chip's local ranks' collective cores around one step of
    # DMA through HBM (its DMA start, dma_fixed_seconds, is added beside it): the Neuron
    # runtime's intra-chip reduction and broadcast (intra-node collectives page). A 2 KiB
    # all-gather among the 4 ranks of one chip (nccom-test allgv -r 4 -N 1, its
    # variable-size example) took 16.28 us: collective_launch_seconds, one broadcast stage
    # and its DMA start (5 + 10 + 1.3 us). Stages between chips have no such cost beyond
    # their hops' latency (1-2 us per hop, the same page).
    on_chip_stage_seconds: float = 10e-6
    # Bytes per second a chip's collective DMA rings send: the 16-rank (4-chip) fp32
    # all-reduce of 512 MiB, contention-free, ran at 103.89 GB/s bus bandwidth per rank
    # (nccom-test --show-algorithm example, SDK 2.28, KangaRing), which is the rate each rank
    # sends (a ring all-reduce sends 2(n-1)/n of the buffer per rank); a chip has 4 ranks at
    # the default LNC=2. The large-message end of the sweep, where the fixed costs are under
    # 1% of the time. (A 32 MiB permute ran at 37.52 GB/s per rank: one stream per pair.)
    collective_dma_bytes_per_second: float = 4 * 103.89e9
    # The runtime picks the algorithm by message size (intra-node collectives page,
    # "Algorithm Comparison"): mesh (all-to-all in one or two steps) below 1 MB, recursive
    # halving-doubling from 1 to 56 MB, rings (KangaRing) above.
    mesh_max_bytes: int = 1 * MIB
    rdh_max_bytes: int = 56 * MIB
    # EFA between servers sustains this share of its nominal 200 Gbit/s per chip: 19.3 GB/s
    # measured HBM to HBM on trn2.48xlarge (third party: Mooncake transfer engine, PR #3888).
    efa_efficiency: float = 19.3e9 / 25e9

    # --- engines and DMA (NKI guides) ---------------------------------------------------------
    # Sustained HBM-to-SBUF DMA as a share of the peak: 314.1 GB/s of a core's 368 GB/s
    # (16 DMA engines x 23 B/ns) in the Trn2 matmul tutorial's profile (NKI kernel
    # optimization tutorial, v3: DMA and Tensor Engine both 99.8% active).
    hbm_efficiency: float = 314.1 / 368.0
    # Fixed cost of a DMA transfer: descriptor set-up, synchronisation and semaphore-to-start
    # ("~1300 ns cross-engine", NKI DMA bandwidth guide). An instruction that reads or writes
    # HBM waits for one before its data arrives.
    dma_fixed_seconds: float = 1.3e-6
    # Per-instruction overhead of the Vector, Scalar and GpSimd engines: 46-62 cycles per
    # instruction measured on Trn2 (matmul tutorial v5 profile: 5,403 Vector instructions
    # took 0.26-0.35 ms beyond their elements' cycles); instructions of at most
    # `instruction_free_elements` elements per partition, a PSUM bank of FP32 (512), the tile
    # that profile's instructions work on.
    instruction_overhead_cycles: float = 60.0
    instruction_free_elements: int = 512
    # The Tensor Engine starts at about 50% utilisation and ramps to full over the first
    # ~3 us of work after idling (Neuron Explorer glossary, "dI/dt throttling"); taken as a
    # linear ramp (RuntimeSpec.warm_compute_seconds), from each matmul's start.
    tensor_ramp_seconds: float = 3e-6

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise ValueError(f"RuntimeSpec.{f.name} must be >= 0, got {value}")
        for name in ("collective_dma_bytes_per_second", "efa_efficiency", "hbm_efficiency"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RuntimeSpec.{name} must be positive, got {getattr(self, name)}")
        for name in ("efa_efficiency", "hbm_efficiency"):
            if getattr(self, name) > 1:
                raise ValueError(f"RuntimeSpec.{name} is a share of the peak (<= 1), got "
                                 f"{getattr(self, name)}")

    @staticmethod
    def ideal() -> RuntimeSpec:
        """The hardware's limits: no fixed costs, every rate at its peak, collectives as
        fast as their links allow."""
        return RuntimeSpec(collective_launch_seconds=0.0, on_chip_stage_seconds=0.0,
                           collective_dma_bytes_per_second=float("inf"), efa_efficiency=1.0,
                           hbm_efficiency=1.0, dma_fixed_seconds=0.0,
                           instruction_overhead_cycles=0.0, tensor_ramp_seconds=0.0)

    def warm_compute_seconds(self, seconds: float) -> float:
        """How long `seconds` of Tensor Engine work at full rate takes from idle, its rate
        ramping linearly from half to full over tensor_ramp_seconds: within the ramp t
        solves t/2 + t^2/(4 R) = work; after it, the ramp's lost quarter is added."""
        ramp = self.tensor_ramp_seconds
        if seconds <= 0 or ramp == 0:
            return seconds
        if seconds >= 0.75 * ramp:
            return seconds + ramp / 4
        return ramp * (math.sqrt(1 + 4 * seconds / ramp) - 1)

    @property
    def is_ideal(self) -> bool:
        return self == IDEAL_RUNTIME

    def items(self) -> list[tuple[str, float]]:
        """(name, value) of every constant."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

    def text(self) -> str:
        """The constants in their units, for listings."""
        def shown(name: str, value: float) -> str:
            if name.endswith("_bytes_per_second"):
                return f"{value / 1e9:g} GB/s"
            if name.endswith("_seconds"):
                return f"{value * 1e6:g} us"
            if name.endswith("_bytes"):
                return f"{value / MIB:g} MiB"
            return f"{value:g}"

        return ", ".join(f"{name} {shown(name, value)}" for name, value in self.items())


IDEAL_RUNTIME = RuntimeSpec.ideal()

# What the expected time does not hold (mesh/machine/trn2_facts.md, "Runtime costs"; the
# gaps docs/validation.md measures), said with every estimate.
EXPECTED_LEAVES_OUT = (
    "the runtime's launch of each program execution and of each kernel in it; the "
    "compiler's choices below StableHLO (its fusion, layout transposes, PSUM evacuation); "
    "contention with collectives of other streams or programs (a program's collectives run "
    "one at a time on its collective cores); activation-table loads on the Scalar Engine. "
    "Against published figures (docs/validation.md): decode steps 0.73-1.16 of the "
    "measurement; dense prefills 0.74-1.62 (a 512-token prompt served two at a time: 0.35); "
    "mixture-of-experts prefills 0.91 as NxD's torch loop over the blocks, 0.17-0.41 as its "
    "blockwise NKI kernel (the kernel's per-block schedule is not modelled); "
    "nccom-test's standalone all-reduces of 4 B-2 MiB over 16 ranks took 8-17x it (a "
    "300-690 us floor no published per-collective cost accounts for), a 32 MiB permute "
    "2.6x (its instance not stated)")
