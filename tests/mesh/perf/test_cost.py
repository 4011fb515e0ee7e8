"""Per-instruction costs, their sums, and the estimate of a planned program."""

import dataclasses
import math
from typing import ClassVar

import numpy as np
import pytest

from mesh import isa
from mesh.machine.chip import ChipSpec
from mesh.fusion import on_chip_values
from mesh.perf.cost import Cost, instruction_cost
from mesh.perf.estimate import IDEAL, ProgramEstimate
from mesh.perf.tensor_engine import tile_matmul
from mesh.machine import get_topology, place_mesh
from mesh.perf.collectives import plan_collective

CHIP = ChipSpec()
LANES = CHIP.neuron_cores * CHIP.sbuf_partitions  # elements per engine cycle per chip
NO_MESH = isa.MeshSpec((), ())
TOPOLOGY = get_topology("trn2-ultra")
F32 = isa.TensorType((1024, 1024), "float32")
KEYS = ("flops", "bytes accessed", "transcendentals", "optimal_seconds")


def program_of(instructions, types, inputs, outputs):
    values = {v: isa.ValueInfo(t) for v, t in types.items()}
    return isa.Program(NO_MESH, tuple(instructions), tuple(inputs), tuple(outputs), values)


def test_costs_add_and_scale():
    a = Cost(flops=1, bytes_accessed=2, seconds=3, engine_seconds={isa.VECTOR: 3})
    b = Cost(flops=10, transcendentals=5, engine_seconds={isa.VECTOR: 1, isa.DMA: 2})
    total = a + b
    assert (total.flops, total.transcendentals, total.bytes_accessed) == (11, 5, 2)
    assert total.engine_seconds == {isa.VECTOR: 4, isa.DMA: 2}
    assert (3 * a).flops == 3 and (a * 3).engine_seconds == {isa.VECTOR: 9}
    assert sum([a, b]).flops == 11


def test_elementwise_alone_streams_hbm_and_runs_at_the_vector_rate():
    """An unfused add of two FP32 1M-element arrays: 12 MiB through HBM; two tensor
    operands in FP32 take the Vector Engine two cycles an element (tensor_tensor)."""
    add = isa.Elementwise((2,), (0, 1), op="add")
    program = program_of([add], {0: F32, 1: F32, 2: F32}, (0, 1), (2,))
    cost = instruction_cost(add, program, CHIP)
    assert cost.flops == F32.size and cost.transcendentals == 0
    assert cost.bytes_accessed == 3 * F32.nbytes
    compute = 2 * math.ceil(F32.size / LANES) / CHIP.vector_clock_hz
    assert cost.seconds == max(compute, 3 * F32.nbytes / CHIP.hbm_bandwidth)
    assert cost.engine_seconds[isa.DMA] == 3 * F32.nbytes / CHIP.hbm_bandwidth


def test_fused_chain_keeps_intermediates_on_chip():
    """exp(x) * broadcast(2.0): the exp result and the broadcast never reach HBM."""
    scalar = isa.TensorType((), "float32")
    instrs = [isa.Elementwise((1,), (0,), op="exponential"),
              isa.Constant((2,), (), value=np.float32(2.0)),
              isa.BroadcastInDim((3,), (2,), dimensions=(), shape=F32.shape),
              isa.Elementwise((4,), (1, 3), op="multiply")]
    program = program_of(instrs, {0: F32, 1: F32, 2: scalar, 3: F32, 4: F32}, (0,), (4,))
    assert on_chip_values(program) == {1, 3}
    exp, _, broadcast, mul = (instruction_cost(i, program, CHIP) for i in instrs)
    assert exp.transcendentals == F32.size and exp.flops == 0
    assert exp.bytes_accessed == F32.nbytes  # reads x; its result stays in SBUF
    assert broadcast.bytes_accessed == 4 and broadcast.seconds == 4 / CHIP.hbm_bandwidth
    assert mul.bytes_accessed == F32.nbytes  # writes the program's output only
    assert instrs[0].engine == isa.SCALAR


def test_a_convert_fused_into_a_reduce_takes_no_engine_pass():
    """sum(convert(x: bf16) -> f32), as jnp.sum of BF16 runs: the engines convert on read,
    so the convert only streams x from HBM (half the bytes of FP32), with no Vector pass of
    its own; the reduce's pass follows."""
    bf16 = isa.TensorType(F32.shape, "bfloat16")
    scalar, row = isa.TensorType((), "float32"), isa.TensorType((1024,), "float32")
    instrs = [isa.Elementwise((1,), (0,), op="convert"),
              isa.Constant((2,), (), value=np.float32(0.0)),
              isa.Reduce((3,), (1, 2), dimensions=(1,), combiner="add")]
    program = program_of(instrs, {0: bf16, 1: F32, 2: scalar, 3: row}, (0,), (3,))
    convert = instruction_cost(instrs[0], program, CHIP)
    read = bf16.nbytes / CHIP.hbm_bandwidth
    assert convert.seconds == read and convert.flops == F32.size
    reduce_pass = math.ceil(F32.size / LANES) / CHIP.vector_clock_hz
    assert ProgramEstimate(program, TOPOLOGY, model=IDEAL).step_seconds == pytest.approx(read + reduce_pass,
                                                                            rel=1e-9)


def test_matmul_cost_is_its_tiling():
    lhs = isa.TensorType((512, 256), "bfloat16")
    rhs = isa.TensorType((256, 1024), "bfloat16")
    out = isa.TensorType((512, 1024), "float32")
    tiling = tile_matmul(1, 512, 1024, 256, "bfloat16", "bfloat16", "float32", CHIP)
    mm = isa.Matmul((2,), (0, 1), lhs_batch=(), rhs_batch=(), lhs_contract=(1,),
                    rhs_contract=(0,), out_dtype="float32", tiling=tiling)
    program = program_of([mm], {0: lhs, 1: rhs, 2: out}, (0, 1), (2,))
    cost = instruction_cost(mm, program, CHIP)
    assert cost.flops == 2 * 512 * 1024 * 256
    assert cost.seconds == tiling.seconds and cost.bytes_accessed == tiling.hbm_bytes
    assert cost.peak_seconds == cost.flops / CHIP.peak_flops_for("bfloat16")
    with pytest.raises(ValueError, match="no tiling: plan the program first"):
        instruction_cost(dataclasses.replace(mm, tiling=None), program, CHIP)


def test_views_are_free():
    reshape = isa.Reshape((1,), (0,), shape=(1024 * 1024,))
    program = program_of([reshape], {0: F32, 1: isa.TensorType((1024 * 1024,), "float32")},
                         (0,), (1,))
    assert instruction_cost(reshape, program, CHIP) == Cost()


@dataclasses.dataclass(frozen=True, eq=False)
class Repeat(isa.Instruction):
    """A test-only loop: runs `body` `trip_count` times (no cost rule of its own)."""

    body: isa.Program
    trip_count: int
    engine: ClassVar[str] = isa.NONE


def test_sub_programs_are_walked_and_multiplied_by_their_trip_count():
    body = program_of([isa.Elementwise((1,), (0,), op="tanh")], {0: F32, 1: F32}, (0,), (1,))
    loop = Repeat((1,), (0,), body=body, trip_count=5)
    program = program_of([loop, isa.Elementwise((2,), (1,), op="negate")],
                         {0: F32, 1: F32, 2: F32}, (0,), (2,))
    estimate = ProgramEstimate(program, TOPOLOGY)
    inner = ProgramEstimate(body, TOPOLOGY)
    loop_cost = estimate.costs[0]
    assert loop_cost.transcendentals == 5 * F32.size
    assert loop_cost.seconds == pytest.approx(5 * inner.step_seconds, rel=1e-12)
    assert estimate.schedule.slots[1].start == pytest.approx(loop_cost.seconds, rel=1e-12)


def test_estimate_totals_are_sums_over_instructions():
    instrs = [isa.Elementwise((1,), (0,), op="exponential"),
              isa.Reduce((3,), (1, 2), dimensions=(1,), combiner="add"),
              isa.Transpose((4,), (0,), permutation=(1, 0))]
    scalar = isa.TensorType((), "float32")
    program = program_of(instrs, {0: F32, 1: F32, 2: scalar, 3: isa.TensorType((1024,), "float32"),
                                  4: F32}, (0, 2), (3, 4))
    estimate = ProgramEstimate(program, TOPOLOGY)
    analysis = estimate.cost_analysis()
    per_instruction = [c.jax_dict() for c in estimate.costs]
    for key in KEYS:  # float sums of a few terms in a different order
        assert sum(c[key] for c in per_instruction) == pytest.approx(analysis[key], rel=1e-12)
    assert analysis["optimal_seconds"] == estimate.step_seconds > 0
    assert analysis["trn2"]["engine_busy_seconds"][isa.DMA] > 0


# --- the expected time: the runtime's measured costs ------------------------------------

RUNTIME = TOPOLOGY.runtime


def test_expected_engine_op_adds_instruction_overheads_and_the_dma_cost():
    """An unfused FP32 add: per lane 8,192 elements in instructions of 512, each with the
    engine's overhead; HBM at its sustained rate; the DMA's fixed cost before it."""
    add = isa.Elementwise((2,), (0, 1), op="add")
    program = program_of([add], {0: F32, 1: F32, 2: F32}, (0, 1), (2,))
    expected = instruction_cost(add, program, CHIP, RUNTIME)
    per_lane = F32.size // LANES
    cycles = 2 * per_lane + per_lane // RUNTIME.instruction_free_elements * \
        RUNTIME.instruction_overhead_cycles  # 2 cycles an element: FP32 tensor_tensor
    hbm = 3 * F32.nbytes / (CHIP.hbm_bandwidth * RUNTIME.hbm_efficiency)
    assert expected.seconds == pytest.approx(max(cycles / CHIP.vector_clock_hz, hbm)
                                             + RUNTIME.dma_fixed_seconds)
    assert expected.seconds > instruction_cost(add, program, CHIP).seconds


def test_expected_matmul_adds_the_warm_up_and_the_dma_cost():
    """Compute-bound: the engine's warm-up ramp slows it; an HBM-bound one it does not."""
    lhs, rhs = isa.TensorType((4096, 4096), "bfloat16"), isa.TensorType((4096, 4096), "bfloat16")
    tiling = tile_matmul(1, 4096, 4096, 4096, "bfloat16", "bfloat16", "bfloat16", CHIP)
    mm = isa.Matmul((2,), (0, 1), lhs_batch=(), rhs_batch=(), lhs_contract=(1,),
                    rhs_contract=(0,), out_dtype="bfloat16", tiling=tiling)
    program = program_of([mm], {0: lhs, 1: rhs, 2: lhs}, (0, 1), (2,))
    ideal = instruction_cost(mm, program, CHIP)
    expected = instruction_cost(mm, program, CHIP, RUNTIME)
    assert tiling.bound == "compute" and ideal.seconds == tiling.seconds
    # a linear ramp from half to full rate over R loses R/4 of full-rate work
    assert expected.seconds == pytest.approx(tiling.compute_seconds + RUNTIME.dma_fixed_seconds
                                             + RUNTIME.tensor_ramp_seconds / 4)
    assert expected.peak_seconds == ideal.peak_seconds == 2 * 4096**3 / (
        8 * 128 * 128 * 2 * 2.4e9)  # the MFU denominator is the array's own peak


@pytest.mark.parametrize("dtype,second,rate", [("bfloat16", "scalar", 4.0),
                                               ("bfloat16", "tensor", 2.0),
                                               ("float32", "scalar", 1.0),
                                               ("float32", "tensor", 0.5)])
def test_vector_rates_by_operands_and_precision(dtype, second, rate):
    """The Vector Engine: N cycles for N elements with one tensor operand (tensor_scalar),
    2N with two (tensor_tensor); BF16 in Trainium2's performance mode 4x and 2x faster."""
    tensor = isa.TensorType(F32.shape, dtype)
    op = "multiply" if second == "scalar" else "add"
    instrs = [isa.Constant((1,), (), value=np.asarray(2.0, "float32").astype(dtype)),
              isa.BroadcastInDim((2,), (1,), dimensions=(), shape=F32.shape),
              isa.Elementwise((3,), (0, 2 if second == "scalar" else 0), op=op)]
    types = {0: tensor, 1: isa.TensorType((), dtype), 2: tensor, 3: tensor}
    program = program_of(instrs, types, (0,), (3,))
    cost = instruction_cost(instrs[2], program, ChipSpec(hbm_bandwidth=1e18))  # not HBM-bound
    assert cost.seconds == pytest.approx(F32.size / LANES / rate / CHIP.vector_clock_hz)


def test_fp8_doubles_the_rate_only_with_double_row_contractions():
    """FP8's 2x needs the contraction in pairs of 128-row tiles (double-row mode)."""
    short = tile_matmul(1, 4096, 4096, 128, "float8_e4m3fn", "float8_e4m3fn", "bfloat16", CHIP)
    long = tile_matmul(1, 4096, 4096, 1024, "float8_e4m3fn", "float8_e4m3fn", "bfloat16", CHIP)
    bf16 = tile_matmul(1, 4096, 4096, 1024, "bfloat16", "bfloat16", "bfloat16", CHIP)
    assert short.rate == 1.0 and long.rate == 2.0
    assert long.cycles < 0.51 * bf16.cycles + CHIP.pe_rows + CHIP.pe_cols


def test_a_collectives_hbm_traffic_delays_a_memory_bound_op_beside_it():
    """Expected: the collective's HBM reads and writes occupy the DMA queue, so an
    elementwise op that streams HBM starts after them; ideal: they overlap."""
    mesh = isa.MeshSpec(("x",), (4,))
    big = isa.TensorType((64 * 2**20,), "float32")  # 256 MiB per chip
    groups = isa.Groups(((0, 1, 2, 3),), (0,))
    reduce = isa.AllReduce((2,), (0,), groups=groups, reduction="add")
    reduce = dataclasses.replace(reduce, plan=plan_collective(
        reduce, big.nbytes, TOPOLOGY, place_mesh(TOPOLOGY, (4,), ("x",))))
    add = isa.Elementwise((3,), (1, 1), op="add")
    values = {v: isa.ValueInfo(big, frozenset({0})) for v in range(4)}
    program = isa.Program(mesh, (reduce, add), (0, 1), (2, 3), values)
    expected = ProgramEstimate(program, TOPOLOGY)
    start = {s.index: s.start for s in expected.schedule.slots}
    assert start[1] == pytest.approx(expected.costs[0].engine_seconds[isa.DMA])
    ideal = ProgramEstimate(program, TOPOLOGY, model=IDEAL)
    assert [s.start for s in ideal.schedule.slots] == [0.0, 0.0]


@pytest.mark.parametrize("work", [0.5e-6, 1e-6, 2.25e-6, 10e-6])
def test_the_warm_up_ramp_runs_work_at_its_rate(work):
    """Integrating the rate 1/2 + t/(2R) over the time taken gives the work back."""
    ramp = RUNTIME.tensor_ramp_seconds
    t = RUNTIME.warm_compute_seconds(work)
    ramped = min(t, ramp)
    done = ramped / 2 + ramped ** 2 / (4 * ramp) + max(0.0, t - ramp)
    assert done == pytest.approx(work)
