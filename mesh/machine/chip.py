"""One simulated Trainium2 chip: engines, on-chip memories, HBM and peak rates.

Every default comes from mesh/machine/trn2_facts.md ("Chip" table); each is a default,
not a law, and any field can be overridden: ``ChipSpec(tensor_clock_hz=2.0e9)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
FP32_BYTES = 4

REFERENCE_DTYPE = "bfloat16"  # matmul rates are relative to this dtype

# Tensor Engine matmuls per PE cycle relative to BF16, per input dtype (NKI Trainium2 guide:
# BF16/FP16/TF32 one multiply-add per PE per cycle, FP32 a quarter of that, FP8 and INT8
# twice BF16 only in double-row mode, which takes K in pairs of 128-row tiles;
# mesh.perf.tensor_engine applies that condition). The chip's peak follows from the array:
# 8 cores x 128 x 128 PEs x 2 FLOPs x 2.4 GHz = 629 TFLOP/s BF16, the figure the Neuron
# profiler and nki-library divide by for MFU (AWS's Trainium2 page quotes 667, which no
# clock of the published array reaches).
DEFAULT_MATMUL_RATES: tuple[tuple[str, float], ...] = (
    ("bfloat16", 1.0),
    ("float16", 1.0),
    ("float32", 0.25),
    ("float8_e4m3fn", 2.0),
    ("float8_e5m2", 2.0),
    ("float8_e4m3", 2.0),
    ("float8_e3m4", 2.0),  # "cFP8"
    ("int8", 2.0),  # INT8 runs at the FP8 rate
)
FLOPS_PER_MAC = 2

# Element types whose Vector Engine ops run in Trainium2's performance mode (every tensor
# operand and the result of the op in one of them; NKI Trainium2 guide).
PERFORMANCE_MODE_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class ChipSpec:
    """A Trainium2 chip (one logical device of the mesh).

    Sources (trn2_facts.md): 8 NeuronCore-v3 per chip (AWS Neuron "Trainium2" page);
    128x128 Tensor Engine at 2.4 GHz, Vector/Scalar/GpSimd at 0.96/1.2/1.2 GHz, SBUF of
    28 MiB per core in 128 partitions of 224 KiB (AWS Neuron "NeuronCore-v3 architecture"
    page: 28 MB of on-chip SRAM; NKI Trainium3 guide: "32MiB (up from 28 MiB in
    NeuronCore-v3)"), PSUM of 2 MiB = 128 partitions x 8 banks x 512 FP32 (NKI Trainium2
    guide); 96 GiB HBM at 2.9 TB/s (AWS "Trainium2" page). Peaks come from the array:
    629 BF16, 1,258 FP8 (double-row), 157 FP32 TFLOP/s per chip (8 x the NKI guide's 79,
    158 and 20 per core; the Trainium2 page's 667, 1,299 and 181 exceed them).

    ``matmul_rates`` is a tuple of ``(dtype_name, rate)`` pairs, matmuls per PE cycle
    relative to BF16, so the spec stays hashable; dtype names are numpy/ml_dtypes names
    (``"bfloat16"``, ``"float8_e4m3fn"``). Peak FLOP/s follow from the PE array and clock.
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
    matmul_rates: tuple[tuple[str, float], ...] = DEFAULT_MATMUL_RATES
    # The Vector Engine's elements per lane and cycle by the op's tensor operands (1, or 2
    # and more): an op of one tensor operand (tensor_copy, tensor_scalar) takes N cycles for
    # N elements, one of two (tensor_tensor) 2N (the nki.isa cost formulas); in performance
    # mode (PERFORMANCE_MODE_DTYPES) 4x and 2x those rates (NKI Trainium2 guide).
    vector_rates: tuple[tuple[int, float], ...] = ((1, 1.0), (2, 0.5))
    vector_performance_mode_rates: tuple[tuple[int, float], ...] = ((1, 4.0), (2, 2.0))
    # A host callback's round trip (mesh.perf.cost): the operands go to the host and the
    # results come back over PCIe Gen5 x16 (~64 GB/s per direction, ~32 GB/s usable each
    # way assumed), plus a fixed 100 us assumed for DMA setup, the interrupt, the runtime's
    # callback dispatch and the Python call (AWS gives no figure; a Python call alone is
    # tens of us).
    host_link_bandwidth: float = 32e9  # bytes/s per direction
    host_round_trip_seconds: float = 100e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "matmul_rates",
                           tuple((str(k), float(v)) for k, v in self.matmul_rates))
        self._check_positive()
        self._check_memories()
        self._check_matmul_rates()
        self._check_vector_rates()

    def _check_positive(self) -> None:
        for field in (
            "neuron_cores", "pe_rows", "pe_cols", "tensor_clock_hz", "vector_clock_hz",
            "scalar_clock_hz", "gpsimd_clock_hz", "sbuf_bytes_per_core", "sbuf_partitions",
            "psum_bytes_per_core", "psum_banks", "psum_bank_fp32_per_partition", "hbm_bytes",
            "hbm_bandwidth", "host_link_bandwidth",
        ):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"ChipSpec.{field} must be positive, got {value}")
        if self.host_round_trip_seconds < 0:
            raise ValueError("ChipSpec.host_round_trip_seconds must be >= 0, got "
                             f"{self.host_round_trip_seconds}")

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

    def _check_matmul_rates(self) -> None:
        names = [name for name, _ in self.matmul_rates]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"ChipSpec.matmul_rates lists {duplicates} more than once")
        for name, rate in self.matmul_rates:
            if not rate > 0:
                raise ValueError(f"ChipSpec.matmul_rates[{name!r}] must be positive, got {rate}")
        if dict(self.matmul_rates).get(REFERENCE_DTYPE) != 1.0:
            raise ValueError(
                f"ChipSpec.matmul_rates must give {REFERENCE_DTYPE!r} (the rate reference) the "
                f"rate 1.0, got {self.matmul_rates}"
            )

    def _check_vector_rates(self) -> None:
        for name in ("vector_rates", "vector_performance_mode_rates"):
            rates = getattr(self, name)
            if sorted(k for k, _ in rates) != [1, 2] or not all(r > 0 for _, r in rates):
                raise ValueError(f"ChipSpec.{name} must give positive rates for ops of 1 and 2 "
                                 f"tensor operands, as ((1, rate), (2, rate)); got {rates}")

    def logical_core(self, lnc: int) -> ChipSpec:
        """One logical NeuronCore of this chip at logical-core setting `lnc` (Neuron's
        "Logical NeuronCore configuration": LNC=2, Trn2's default, pairs the 8 physical
        cores into 4 devices; LNC=1 makes each core a device): `lnc` cores' engines, SBUF
        and PSUM, and an equal share of the chip's HBM capacity and bandwidth and of its
        host link (the chip's one PCIe link, which its devices share), so its peak
        FLOP/s are `lnc / neuron_cores` of the chip's."""
        if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc < 1 or \
                self.neuron_cores % lnc:
            raise ValueError(f"LNC={lnc!r}: a logical NeuronCore must group a whole divisor of "
                             f"the chip's {self.neuron_cores} NeuronCores (Trn2: 1 or 2)")
        share = self.neuron_cores // lnc
        return dataclasses.replace(self, name=f"{self.name} logical NeuronCore (LNC={lnc})",
                                   neuron_cores=lnc, hbm_bytes=self.hbm_bytes // share,
                                   hbm_bandwidth=self.hbm_bandwidth / share,
                                   host_link_bandwidth=self.host_link_bandwidth / share)

    @property
    def matmul_dtypes(self) -> frozenset[str]:
        """The input dtypes the Tensor Engine has a rate for."""
        return frozenset(name for name, _ in self.matmul_rates)

    def peak_flops_for(self, dtype_name: str) -> float:
        """Dense peak FLOP/s of the whole chip for matmul inputs of ``dtype_name``: every PE
        of every core busy at the dtype's rate (for FP8, in double-row mode)."""
        macs_per_cycle = self.neuron_cores * self.pe_rows * self.pe_cols
        return FLOPS_PER_MAC * macs_per_cycle * self.tensor_clock_hz * \
            self.matmul_rate_factor(dtype_name)

    def matmul_rate_factor(self, dtype_name: str) -> float:
        """Tensor Engine matmuls per cycle of ``dtype_name`` relative to BF16: FP8 2.0 (in
        double-row mode), BF16/FP16 1.0, FP32 0.25."""
        rates = dict(self.matmul_rates)
        if dtype_name not in rates:
            raise ValueError(f"no Tensor Engine rate for dtype {dtype_name!r} on {self.name}; "
                             f"known: {[name for name, _ in self.matmul_rates]}")
        return rates[dtype_name]
