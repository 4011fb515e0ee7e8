"""Tensor Engine tiling and cycle model, pinned to first principles."""

import math

import pytest

from mesh import isa
from mesh.machine.chip import ChipSpec
from mesh.perf.tensor_engine import MIN_MATMUL_CYCLES, matmul_shape, tile_matmul

CHIP = ChipSpec()
FILL_DRAIN = CHIP.pe_rows + CHIP.pe_cols  # cycles a core pays once per dot
# The cycle model's BF16 peak: every core's 128x128 array does one MAC per PE per cycle.
MODEL_PEAK = CHIP.neuron_cores * CHIP.pe_rows * CHIP.pe_cols * 2 * CHIP.tensor_clock_hz


def bf16(batch, m, n, k, chip=CHIP):
    return tile_matmul(batch, m, n, k, "bfloat16", "bfloat16", "float32", chip)


def test_large_bf16_matmul_is_compute_bound_at_peak_within_fill_and_drain():
    t = bf16(1, 4096, 4096, 4096)
    ideal = 4096**3 / (CHIP.neuron_cores * CHIP.pe_rows * CHIP.pe_cols)  # cycles per core
    assert t.cycles == ideal + FILL_DRAIN
    assert t.bound == "compute" and t.seconds == t.compute_seconds
    rate = t.flops / t.seconds
    assert rate <= MODEL_PEAK
    assert rate == pytest.approx(MODEL_PEAK * ideal / (ideal + FILL_DRAIN), rel=1e-12)
    assert t.pe_utilisation == pytest.approx(ideal / (ideal + FILL_DRAIN), rel=1e-12)
    # 629 TFLOP/s: the 128x128x8 array at 2.4 GHz (the published 667 is slightly higher)
    assert 628e12 < rate < 630e12


def test_small_matmul_is_memory_bound():
    t = bf16(1, 8, 4096, 4096)  # a matrix-vector-like product: little reuse
    assert t.bound == "memory" and t.seconds == t.hbm_seconds
    operands = 2 * (8 * 4096 + 4096 * 4096) + 4 * 8 * 4096  # BF16 in, FP32 out, read once
    assert t.hbm_bytes >= operands
    assert t.hbm_seconds == t.hbm_bytes / CHIP.hbm_bandwidth


@pytest.mark.parametrize("dtype, cycle_ratio", [("float8_e4m3fn", 0.5), ("float32", 4.0)])
def test_dtype_rates_relative_to_bf16(dtype, cycle_ratio):
    """FP8 runs twice the BF16 rate, FP32 a quarter (fill/drain does not scale)."""
    shape = (1, 2048, 2048, 2048)
    base = bf16(*shape)
    other = tile_matmul(*shape, dtype, dtype, "float32", CHIP)
    assert other.rate == 1 / cycle_ratio
    assert other.cycles - FILL_DRAIN == pytest.approx((base.cycles - FILL_DRAIN) * cycle_ratio)


def test_mixed_dtypes_run_at_the_slower_rate():
    assert tile_matmul(1, 256, 256, 256, "float8_e4m3fn", "bfloat16", "float32", CHIP).rate == 1.0


@pytest.mark.parametrize("m, n, k", [(300, 700, 200), (129, 513, 129), (1, 1, 1), (128, 512, 128)])
def test_tile_counts_for_any_shape(m, n, k):
    t = bf16(1, m, n, k)
    stationary, moving = (m, n) if t.stationary == "lhs" else (n, m)
    assert t.k_passes == math.ceil(k / 128)
    assert t.stationary_tiles == math.ceil(stationary / 128)
    assert t.moving_tiles == math.ceil(moving / 512)
    assert t.matmuls == t.k_passes * t.stationary_tiles * t.moving_tiles
    assert t.flops == 2 * m * n * k


def test_partial_contraction_pass_costs_a_whole_pass():
    """K=129 needs two passes, the second one row deep: twice the streaming of K=128."""
    full, partial = bf16(1, 1024, 4096, 128), bf16(1, 1024, 4096, 129)
    assert partial.k_passes == 2
    assert partial.cycles - FILL_DRAIN == 2 * (full.cycles - FILL_DRAIN)
    # 129/128 of the MACs in twice the streaming cycles: about half the utilisation
    ratio = (129 / 128) * full.cycles / partial.cycles
    assert partial.pe_utilisation == pytest.approx(full.pe_utilisation * ratio, rel=1e-12)
    assert 0.45 < partial.pe_utilisation / full.pe_utilisation < 0.55


def test_narrow_moving_tile_takes_the_minimum_cycles():
    """16 moving columns still take MIN_MATMUL_CYCLES per matmul."""
    t = bf16(1, 16, 16, 128 * 64)  # one output tile, 64 passes, on one core
    assert (t.stationary_tiles, t.moving_tiles, t.k_passes) == (1, 1, 64)
    assert t.cycles == 64 * MIN_MATMUL_CYCLES + FILL_DRAIN


def test_work_is_spread_over_the_cores():
    """Eight batches of one output tile each: eight cores stream them in an eighth of the
    time one core takes."""
    eight_cores = bf16(8, 128, 512, 1024)
    one_core = bf16(8, 128, 512, 1024, ChipSpec(neuron_cores=1))
    assert eight_cores.cycles - FILL_DRAIN == (one_core.cycles - FILL_DRAIN) / 8
    assert math.prod(eight_cores.core_grid) == CHIP.neuron_cores


def test_stationary_side_is_the_faster_one():
    """A tall-skinny lhs should be the moving operand: its rows stream, the weights stay."""
    t = bf16(1, 8, 4096, 1024)
    assert t.stationary == "rhs"


def test_hbm_traffic_reads_each_core_block_once_when_sbuf_holds_it():
    """With room in SBUF, a core reads its stationary and moving blocks once: on a 2x4 core
    grid the stationary operand is read 4 times and the moving one twice; with 28 MiB per
    core the blocks do not fit and some are read again."""
    operand = 8192 * 8192 * 2  # bytes of each BF16 operand
    out = 8192 * 8192 * 4  # FP32 result
    roomy = bf16(1, 8192, 8192, 8192, ChipSpec(sbuf_bytes_per_core=1024 * 2**20))
    cm, cn = sorted(roomy.core_grid[1:])
    assert roomy.hbm_bytes == (cm + cn) * operand + out == 6 * operand + out
    assert bf16(1, 8192, 8192, 8192).hbm_bytes > roomy.hbm_bytes
    assert roomy.reread_bytes == 0 and "re-read" not in roomy.describe()


def test_operands_sbuf_cannot_hold_are_re_read_and_the_plan_says_so():
    """K = 65536: on a 1x1x8 core grid each core's lhs block is 1 GiB and its rhs block
    128 MiB; neither stays in SBUF beside a tile of the other, so the inner one is read
    again for every group of outer tiles, and the plan's text says how much."""
    t = bf16(1, 8192, 8192, 65536)
    assert t.core_grid == (1, 1, 8)
    once = 8 * 8192 * 65536 * 2 + 8192 * 65536 * 2 + 8192 * 8192 * 4  # lhs per core, rhs, out
    assert t.hbm_bytes - t.reread_bytes == once and t.reread_bytes > 0
    assert "operand blocks exceed SBUF (28.00 MiB per core)" in t.describe()
    assert "re-read from HBM" in t.describe()


def test_matmul_shape_from_dimension_numbers():
    instr = isa.Matmul((2,), (0, 1), lhs_batch=(0,), rhs_batch=(0,), lhs_contract=(2,),
                       rhs_contract=(1,), out_dtype="float32")
    lhs = isa.TensorType((4, 16, 32, 8), "bfloat16")  # batch 4, k 32, free 16*8
    rhs = isa.TensorType((4, 32, 64), "bfloat16")  # batch 4, k 32, free 64
    assert matmul_shape(instr, lhs, rhs) == (4, 16 * 8, 64, 32)


def test_negative_size_is_an_error():
    with pytest.raises(ValueError, match="k=-1"):
        bf16(1, 1, 1, -1)
