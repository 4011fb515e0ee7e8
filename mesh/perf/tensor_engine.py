"""dot_general on the Tensor Engine: how one chip tiles a matmul, and how long it takes.

Model (nki.isa.nc_matmul and the NKI Trainium2 guide, as summarised in
mesh/machine/trn2_facts.md):

- One matmul instruction computes out[m, n] += stationary[k, m]^T @ moving[k, n] with
  k <= pe_rows (the partition dim), m <= pe_cols (stationary columns) and n <= one PSUM bank
  (psum_bank_fp32_per_partition FP32 words). The K passes of one output tile accumulate in
  FP32 in the same PSUM bank, so they run on the same NeuronCore.
- A matmul streams the moving tile through the array one column per cycle: it takes
  max(n, MIN_MATMUL_CYCLES) cycles at the BF16 rate, divided by the dtype's rate factor (FP8
  twice BF16 in double-row mode, i.e. with K of at least two 128-row tiles; FP32 a quarter:
  ChipSpec.matmul_rate_factor).
- Loading the next stationary tile overlaps the current matmul, so a core running matmuls
  back to back pays the array's fill (pe_rows cycles, the first stationary load) and drain
  (pe_cols cycles, the last partial sums leaving the array) once per dot, not per tile.
- Either operand may be the stationary one (the output tile is then transposed in PSUM,
  which is free); the one giving fewer cycles, then fewer HBM bytes, is chosen.
- The chip's output tiles are spread over its NeuronCores as a grid of
  (batch x stationary-tile x moving-tile) blocks; each core reads from HBM the operand rows
  and columns its block needs, once when they fit in its SBUF together, else re-reading one
  operand once per group of the other's tiles that fits (see `_streamed_bytes`).
- A dot takes max(compute time, HBM time): DMA into SBUF is double-buffered against the
  matmuls, so whichever is slower bounds the instruction.
"""

from __future__ import annotations

import dataclasses

import itertools
import math
from dataclasses import dataclass

from mesh import dtypes, isa
from mesh.machine.chip import ChipSpec
from mesh.units import bytes_text, seconds_text

# A back-to-back matmul instruction takes at least this many cycles, however narrow its
# moving tile (NKI architecture guide: "about max(N, 64) cycles").
MIN_MATMUL_CYCLES = 64
# FP8 and INT8 run at twice the BF16 rate only in the Tensor Engine's double-row mode, which
# takes the contraction as pairs of 128-row tiles (NKI Trainium2 guide, nc_matmul perf_mode):
# a contraction shorter than a pair runs at the BF16 rate.
DOUBLE_ROW_TILES = 2
STATIONARY_SIDES = ("lhs", "rhs")


@dataclass(frozen=True)
class MatmulTiling(isa.Plan):
    """One chip's share of a dot_general, cut into Tensor Engine matmul instructions.

    Sizes are per chip: `batch`, `m` (lhs free), `n` (rhs free), `k` (contraction), each the
    product of the dims of that kind. Grid counts are tiles per chip; `cycles` is the slowest
    core's count at `clock_hz`; times are seconds, bytes are HBM bytes per chip.
    """

    batch: int
    m: int
    n: int
    k: int
    dtype: str  # input element type whose rate the Tensor Engine runs at
    rate: float  # matmuls per cycle relative to BF16
    stationary: str  # "lhs" or "rhs": the operand held in the PE array
    k_pass: int  # contraction rows per pass (<= pe_rows)
    stationary_cols: int  # stationary tile width (<= pe_cols)
    moving_cols: int  # moving tile width (<= one PSUM bank of FP32)
    k_passes: int
    stationary_tiles: int
    moving_tiles: int
    core_grid: tuple[int, int, int]  # cores along (batch, stationary tiles, moving tiles)
    cycles: float
    clock_hz: float
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s
    reread_bytes: int  # of hbm_bytes: operand bytes read again because SBUF cannot hold them
    sbuf_bytes: int  # per core
    pe_utilisation: float  # useful MACs / (cores x PE array x rate x cycles)
    # Real products per product of the program: 4 for a complex matmul (mesh.isa.kernels.
    # matmul: the 4M method), whose real products are counted in `batch`.
    real_products: int = 1

    @property
    def matmuls(self) -> int:
        """Matmul instructions per chip."""
        return self.batch * self.stationary_tiles * self.moving_tiles * self.k_passes

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def compute_seconds(self) -> float:
        return self.cycles / self.clock_hz

    @property
    def hbm_seconds(self) -> float:
        return self.hbm_bytes / self.hbm_bandwidth

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.hbm_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.hbm_seconds else "memory"

    def describe(self) -> str:
        moving = "rhs" if self.stationary == "lhs" else "lhs"
        complex_note = (f"complex as {self.real_products} real matmuls (Re = Ar Br - Ai Bi, "
                        f"Im = Ar Bi + Ai Br) in B; " if self.real_products > 1 else "")
        return (f"tensor engine: {complex_note}B={self.batch} M={self.m} N={self.n} K={self.k} per chip, "
                f"{self.dtype} at {_rate_text(self.rate)} BF16 rate; stationary {self.stationary} "
                f"in {self.stationary_cols}-col tiles, moving {moving} in {self.moving_cols}-col "
                f"tiles, K in passes of {self.k_pass}\n"
                f"grid {self.batch}x{self.stationary_tiles}x{self.moving_tiles}x{self.k_passes} "
                f"= {self.matmuls} matmuls on cores {'x'.join(map(str, self.core_grid))}; "
                f"{self.cycles:,.0f} cycles = {seconds_text(self.compute_seconds)} at "
                f"{self.clock_hz / 1e9:g} GHz, PE {self.pe_utilisation:.1%}; HBM "
                f"{bytes_text(self.hbm_bytes)} = {seconds_text(self.hbm_seconds)}; "
                f"{self.bound}-bound"
                + (f"\noperand blocks exceed SBUF ({bytes_text(self.sbuf_bytes)} per core): "
                   f"{bytes_text(self.reread_bytes)} re-read from HBM"
                   if self.reread_bytes else ""))


def tile_matmul(batch: int, m: int, n: int, k: int, lhs_dtype: str, rhs_dtype: str,
                out_dtype: str, chip: ChipSpec) -> MatmulTiling:
    """The fastest tiling of a per-chip [batch, m, k] x [batch, k, n] dot on `chip`."""
    for name, size in (("batch", batch), ("m", m), ("n", n), ("k", k)):
        if size < 0:
            raise ValueError(f"matmul {name}={size} is negative")
    if dtypes.COMPLEX_PARTS.keys() & {lhs_dtype, rhs_dtype, out_dtype}:
        real = [dtypes.COMPLEX_PARTS.get(d, d) for d in (lhs_dtype, rhs_dtype, out_dtype)]
        products = 4  # the 4M method: four real products of the parts
        return dataclasses.replace(tile_matmul(products * batch, m, n, k, *real, chip),
                                   real_products=products)
    dtype, rate = _slowest_rate(lhs_dtype, rhs_dtype, chip)
    if rate > 1 and k < DOUBLE_ROW_TILES * chip.pe_rows:
        rate = 1.0  # FP8's double rate needs double-row mode: K in pairs of 128-row tiles
    sizes = {"lhs": (m, dtypes.itemsize(lhs_dtype)), "rhs": (n, dtypes.itemsize(rhs_dtype))}
    candidates = []
    for stationary in STATIONARY_SIDES:
        moving = "rhs" if stationary == "lhs" else "lhs"
        for grid in _core_grids(chip.neuron_cores):
            candidates.append(_tiling(batch, m, n, k, dtype, rate, stationary, sizes[stationary],
                                      sizes[moving], dtypes.itemsize(out_dtype), grid, chip))
    return min(candidates, key=lambda t: (t.cycles, t.hbm_bytes))


def matmul_shape(instr: isa.Matmul, lhs: isa.TensorType,
                 rhs: isa.TensorType) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a Matmul on per-chip operands `lhs` and `rhs`."""
    def product(t: isa.TensorType, dims) -> int:
        return math.prod(t.shape[d] for d in dims)

    def free(t: isa.TensorType, batch, contract) -> int:
        return product(t, [d for d in range(t.rank) if d not in batch and d not in contract])

    return (product(lhs, instr.lhs_batch), free(lhs, instr.lhs_batch, instr.lhs_contract),
            free(rhs, instr.rhs_batch, instr.rhs_contract), product(lhs, instr.lhs_contract))


def ragged_matmul_shape(instr: isa.RaggedMatmul, lhs: isa.TensorType, rhs: isa.TensorType,
                        group_sizes: isa.TensorType) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of the per-group matmuls of a RaggedMatmul, as one batch of them.
    Group sizes are known only when the program runs: the estimate assumes the rows spread
    as evenly as they can (balanced routing). A ragged free dim of m rows is min(groups, m)
    matmuls of ceil(m / min(groups, m)) rows each: with fewer rows than groups (a decode
    step's few tokens over many experts) only as many groups hold rows, and only their
    weights are read from HBM, as NxD Inference loads only the experts a decode step
    selects. A ragged contraction of k is `groups` contractions of ceil(k / groups) (every
    group's output is written)."""
    groups = group_sizes.shape[-1] if group_sizes.rank else 1
    batch = math.prod(lhs.shape[d] for d in instr.lhs_batch)
    k = math.prod(lhs.shape[d] for d in instr.lhs_contract)
    m = math.prod(s for d, s in enumerate(lhs.shape)
                  if d not in instr.lhs_batch and d not in instr.lhs_contract)
    n = math.prod(s for d, s in enumerate(rhs.shape) if d not in instr.rhs_batch
                  and d not in instr.rhs_contract and d != instr.rhs_group)
    if instr.lhs_ragged in instr.lhs_contract:
        return batch * groups, m, n, math.ceil(k / max(groups, 1))
    holding = max(min(groups, m), 1)  # the groups that hold rows
    return batch * holding, math.ceil(m / holding), n, k


def _tiling(batch, m, n, k, dtype, rate, stationary, stat, mov, out_itemsize, grid,
            chip: ChipSpec) -> MatmulTiling:
    (stat_free, stat_itemsize), (mov_free, mov_itemsize) = stat, mov
    k_pass, stat_cols = chip.pe_rows, chip.pe_cols
    mov_cols = chip.psum_bank_fp32_per_partition
    k_passes = _ceil_div(k, k_pass)
    stat_tiles = _ceil_div(stat_free, stat_cols)
    mov_widths = [min(mov_cols, mov_free - i) for i in range(0, mov_free, mov_cols)]
    cb, cm, cn = grid
    batch_per_core = _ceil_div(batch, cb)
    stat_tiles_per_core = _ceil_div(stat_tiles, cm)
    mov_chunks = _split(mov_widths, cn)
    # The slowest core: most batches, most stationary tiles, the widest moving chunk.
    stream_cycles = max((sum(max(w, MIN_MATMUL_CYCLES) for w in chunk) for chunk in mov_chunks),
                        default=0) / rate
    busy = batch_per_core * stat_tiles_per_core * k_passes * stream_cycles
    cycles = busy + (chip.pe_rows + chip.pe_cols) * (busy > 0)
    macs = batch * m * n * k
    peak_macs = chip.neuron_cores * chip.pe_rows * chip.pe_cols * rate * cycles
    hbm, reread = _hbm_bytes(batch, k, stat_free, mov_free, stat_itemsize, mov_itemsize,
                             out_itemsize, grid, stat_tiles, len(mov_widths), chip)
    return MatmulTiling(
        batch=batch, m=m, n=n, k=k, dtype=dtype, rate=rate, stationary=stationary,
        k_pass=k_pass, stationary_cols=stat_cols, moving_cols=mov_cols, k_passes=k_passes,
        stationary_tiles=stat_tiles, moving_tiles=len(mov_widths), core_grid=grid,
        cycles=cycles, clock_hz=chip.tensor_clock_hz, hbm_bytes=hbm,
        hbm_bandwidth=chip.hbm_bandwidth, reread_bytes=reread,
        sbuf_bytes=chip.sbuf_bytes_per_core, pe_utilisation=macs / peak_macs if peak_macs else 0.0)


def _hbm_bytes(batch, k, stat_free, mov_free, stat_itemsize, mov_itemsize, out_itemsize,
               grid, stat_tiles, mov_tiles, chip: ChipSpec) -> tuple[int, int]:
    """HBM bytes the cores read and write for one dot, and how many of them are re-reads:
    each core reads the K x block operands of its (stationary rows x moving columns) block,
    re-reading what its SBUF cannot hold (`_streamed_bytes`), and the output is written
    once."""
    cb, cm, cn = grid
    cm, cn = min(cm, stat_tiles), min(cn, mov_tiles)  # cores with nothing to do read nothing
    out = batch * stat_free * mov_free * out_itemsize
    if not (cm and cn):
        return out, 0
    stat_block = k * _ceil_div(stat_free, cm) * stat_itemsize  # per core, per batch
    mov_block = k * _ceil_div(mov_free, cn) * mov_itemsize
    per_core = _streamed_bytes(stat_block, _ceil_div(stat_tiles, cm), mov_block,
                               _ceil_div(mov_tiles, cn), chip.sbuf_bytes_per_core)
    reread = batch * cm * cn * (per_core - stat_block - mov_block)
    return batch * cm * cn * per_core + out, reread


def _streamed_bytes(a_block: int, a_tiles: int, b_block: int, b_tiles: int,
                    sbuf: int) -> int:
    """Bytes one core reads to multiply its blocks a (a_tiles tiles) and b (b_tiles tiles)
    with an SBUF of `sbuf` bytes.

    Both fit: each is read once. Otherwise one operand is the outer loop, read once in groups
    of g tiles; the other stays resident if it fits beside one outer tile, else it is
    re-read once per group (g as large as fits beside one inner tile). The cheaper order
    wins. When not even one tile of each fits, K itself is streamed and the inner operand is
    re-read for every outer tile.
    """
    if a_block + b_block <= sbuf:
        return a_block + b_block
    best = None
    for (outer, outer_tiles), (inner, inner_tiles) in (((a_block, a_tiles), (b_block, b_tiles)),
                                                       ((b_block, b_tiles), (a_block, a_tiles))):
        outer_tile, inner_tile = outer / outer_tiles, inner / inner_tiles
        if inner + outer_tile <= sbuf:
            reads = outer + inner
        else:
            group = max(1, int((sbuf - inner_tile) // outer_tile))
            reads = outer + inner * _ceil_div(outer_tiles, min(group, outer_tiles))
        best = reads if best is None else min(best, reads)
    return int(best)


def _slowest_rate(lhs_dtype: str, rhs_dtype: str, chip: ChipSpec) -> tuple[str, float]:
    """(dtype, rate factor) of the slower input. Types the Tensor Engine has no rate for
    (int32, float64, ...) are costed at the FP32 rate, the slowest it has."""
    def rate(name: str) -> tuple[float, str]:
        return (chip.matmul_rate_factor(name), name) if name in chip.matmul_dtypes else \
            (chip.matmul_rate_factor("float32"), "float32")

    slow, name = min(rate(lhs_dtype), rate(rhs_dtype))
    return name, slow


def _core_grids(cores: int) -> list[tuple[int, int, int]]:
    """Every way to arrange `cores` as (batch, stationary, moving) factors."""
    return [(a, b, cores // (a * b)) for a, b in itertools.product(range(1, cores + 1), repeat=2)
            if cores % (a * b) == 0]


def _split(widths: list[int], parts: int) -> list[list[int]]:
    """`widths` cut into `parts` contiguous chunks, sizes differing by at most one tile."""
    size, extra = divmod(len(widths), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        chunks.append(widths[start:end])
        start = end
    return chunks


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _rate_text(rate: float) -> str:
    return f"{rate:g}x" if rate >= 1 else f"1/{1 / rate:g}"

