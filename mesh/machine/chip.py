"""One simulated Trainium2 chip: engines, on-chip memories, HBM and peak rates.

Every default comes from mesh/machine/trn2_facts.md ("Chip" table); each is a default,
not a law, and any field can be overridden: ``ChipSpec(tensor_clock_hz=2.0e9)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
FP32_BYTES = 4

# Dense peak per chip in FLOP/s (AWS "Trainium2" page; SemiAnalysis: 667 BF16).
BF16_PEAK_FLOPS = 667e12
FP32_PEAK_FLOPS = 181e12
FP8_PEAK_FLOPS = 1299e12

REFERENCE_DTYPE = "bfloat16"  # matmul_rate_factor is relative to this dtype

DEFAULT_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("bfloat16", BF16_PEAK_FLOPS),
    ("float16", BF16_PEAK_FLOPS),
    ("float32", FP32_PEAK_FLOPS),
    ("float8_e4m3fn", FP8_PEAK_FLOPS),
    ("float8_e5m2", FP8_PEAK_FLOPS),
    ("float8_e4m3", FP8_PEAK_FLOPS),
    ("float8_e3m4", FP8_PEAK_FLOPS),  # "cFP8"
    ("int8", FP8_PEAK_FLOPS),  # INT8 runs at the FP8 rate
)


@dataclass(frozen=True)
class ChipSpec:
    """A Trainium2 chip (one logical device of the mesh).

    Sources (trn2_facts.md): 8 NeuronCore-v3 per chip (AWS Neuron "Trainium2" page);
    128x128 Tensor Engine at 2.4 GHz, Vector/Scalar/GpSimd at 0.96/1.2/1.2 GHz, SBUF of
    28 MiB per core in 128 partitions of 224 KiB (AWS Neuron "NeuronCore-v3 architecture"
    page: 28 MB of on-chip SRAM; NKI Trainium3 guide: "32MiB (up from 28 MiB in
    NeuronCore-v3)"), PSUM of 2 MiB = 128 partitions x 8 banks x 512 FP32 (NKI Trainium2
    guide); 96 GiB HBM at 2.9 TB/s and dense peaks BF16/FP16 667, FP8 1299, FP32 181
    TFLOP/s per chip (AWS "Trainium2" page).

    ``peak_flops`` is a tuple of ``(dtype_name, flop_per_s)`` pairs so the spec stays
    hashable; dtype names are numpy/ml_dtypes names (``"bfloat16"``, ``"float8_e4m3fn"``).
    """

    name: str = "Trainium2"
    neuron_cores: int = 8  # per chip
    pe_rows: int = 128  # systolic array rows (contraction dim K, one per partition)
    pe_cols: int = 128  # systolic array columns (stationary free dim M)
    tensor_clock_hz: float = 2.4e9
    vector_clock_hz: float = 0.96e9
    scalar_clock_hz: float = 1.2e9
    gpsimd_clock_hz: float = 1.2e9
    sbuf_bytes_per_core: int = 28 * MIB  # 128 partitions x 224 KiB (NeuronCore-v3)
    sbuf_partitions: int = 128  # SBUF and PSUM share the partition count
    psum_bytes_per_core: int = 2 * MIB
    psum_banks: int = 8
    psum_bank_fp32_per_partition: int = 512  # FP32 words per partition per bank
    hbm_bytes: int = 96 * GIB  # per chip
    hbm_bandwidth: float = 2.9e12  # bytes/s per chip
    peak_flops: tuple[tuple[str, float], ...] = DEFAULT_PEAK_FLOPS  # FLOP/s per chip

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", tuple((str(k), float(v)) for k, v in self.peak_flops))
        self._check_positive()
        self._check_memories()
        self._check_peak_flops()

    def _check_positive(self) -> None:
        for field in (
            "neuron_cores", "pe_rows", "pe_cols", "tensor_clock_hz", "vector_clock_hz",
            "scalar_clock_hz", "gpsimd_clock_hz", "sbuf_bytes_per_core", "sbuf_partitions",
            "psum_bytes_per_core", "psum_banks", "psum_bank_fp32_per_partition", "hbm_bytes",
            "hbm_bandwidth",
        ):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"ChipSpec.{field} must be positive, got {value}")

    def _check_memories(self) -> None:
        if self.pe_rows > self.sbuf_partitions:
            raise ValueError(
                f"ChipSpec.pe_rows={self.pe_rows} exceeds sbuf_partitions={self.sbuf_partitions}: "
                "the contraction dim is fed one partition per PE row"
            )
        if self.sbuf_bytes_per_core % self.sbuf_partitions:
            raise ValueError(
                f"ChipSpec.sbuf_bytes_per_core={self.sbuf_bytes_per_core} is not a multiple of "
                f"sbuf_partitions={self.sbuf_partitions}"
            )
        psum = self.sbuf_partitions * self.psum_banks * self.psum_bank_fp32_per_partition * FP32_BYTES
        if psum != self.psum_bytes_per_core:
            raise ValueError(
                f"ChipSpec.psum_bytes_per_core={self.psum_bytes_per_core} but sbuf_partitions * "
                f"psum_banks * psum_bank_fp32_per_partition * {FP32_BYTES} = {self.sbuf_partitions} * "
                f"{self.psum_banks} * {self.psum_bank_fp32_per_partition} * {FP32_BYTES} = {psum}"
            )

    def _check_peak_flops(self) -> None:
        names = [name for name, _ in self.peak_flops]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"ChipSpec.peak_flops lists {duplicates} more than once")
        for name, flops in self.peak_flops:
            if not flops > 0:
                raise ValueError(f"ChipSpec.peak_flops[{name!r}] must be positive, got {flops}")
        if REFERENCE_DTYPE not in names:
            raise ValueError(
                f"ChipSpec.peak_flops must include {REFERENCE_DTYPE!r} (the rate reference), "
                f"got {names}"
            )

    def peak_flops_for(self, dtype_name: str) -> float:
        """Dense peak FLOP/s of the whole chip for matmul inputs of ``dtype_name``."""
        for name, flops in self.peak_flops:
            if name == dtype_name:
                return flops
        known = [name for name, _ in self.peak_flops]
        raise ValueError(f"no peak FLOP/s for dtype {dtype_name!r} on {self.name}; known: {known}")

    def matmul_rate_factor(self, dtype_name: str) -> float:
        """Tensor Engine rate of ``dtype_name`` relative to BF16: FP8 2.0, BF16/FP16 1.0, FP32 0.25.

        Derived from ``peak_flops``, rounded to the nearest power of two: the PE array
        processes a power-of-two number of rows per cycle (NKI guide: "FP8 2x BF16 rate",
        "FP32 inputs ~4x slower"), while the published chip peaks are rounded
        (1299/667 = 1.95, 181/667 = 0.27).
        """
        ratio = self.peak_flops_for(dtype_name) / self.peak_flops_for(REFERENCE_DTYPE)
        return 2.0 ** round(math.log2(ratio))
