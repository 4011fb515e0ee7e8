"""HBM liveness on hand-built programs, byte counts worked out by hand.

Transposes (DMA instructions, never fused) keep every value in HBM, so each value's bytes
are its full per-chip type. F is one float32[256,256] buffer: 256 KiB.
"""

import numpy as np
import pytest

from mesh import isa
from mesh.isa import control
from mesh.machine.chip import ChipSpec
from mesh.memory import MemoryAnalysis, OutOfHBMError, liveness

F32 = isa.TensorType((256, 256), "float32")
F = F32.nbytes
BOOL = isa.TensorType((), "bool")
NO_MESH = isa.MeshSpec((), ())
LINE = isa.MeshSpec(("x",), (4,))


def transpose(out, src, loc=""):
    return isa.Transpose((out,), (src,), permutation=(1, 0), loc=loc)


def program_of(instructions, types, inputs, outputs, mesh=NO_MESH, varying=None, **fields):
    varying = varying or {}
    values = {v: isa.ValueInfo(t, frozenset(varying.get(v, ()))) for v, t in types.items()}
    return isa.Program(mesh, tuple(instructions), tuple(inputs), tuple(outputs), values,
                       **fields)


def chain(**fields):
    """out = T(T(T(x))): three transposes one after another."""
    instrs = [transpose(1, 0), transpose(2, 1, loc="model.py:7:3"), transpose(3, 2)]
    return program_of(instrs, {v: F32 for v in range(4)}, (0,), (3,), **fields)


def test_chain_holds_the_argument_the_live_pair_and_the_output():
    # instr 1 runs with x, t1 (its input) and t2 (its result): 3 F; instr 2 with x, t2, out.
    stats = MemoryAnalysis(chain(), ChipSpec()).stats()
    assert stats.peak_memory_in_bytes == 3 * F
    assert stats.argument_size_in_bytes == F and stats.output_size_in_bytes == F
    assert stats.temp_size_in_bytes == 2 * F  # t1 and t2 together
    assert stats.alias_size_in_bytes == 0
    assert sorted(b.values[0] for b in stats.live_at_peak) == [0, 1, 2]
    assert {b.loc for b in stats.live_at_peak} == {"", "model.py:7:3"}


def test_a_donated_argument_is_freed_after_its_last_use():
    # x dies after instr 0, so instr 1 holds t1 and t2 only, instr 2 t2 and out: 2 F.
    stats = MemoryAnalysis(chain(donated_inputs=((0, 0),)), ChipSpec()).stats()
    assert stats.peak_memory_in_bytes == 2 * F
    assert stats.alias_size_in_bytes == F  # out is written where x was


def test_elementwise_result_is_written_into_a_dying_operand():
    # a + b with a donated: the sum reuses a's buffer, so only a and b are ever held.
    add = isa.Elementwise((2,), (0, 1), op="add")
    kept = program_of([add], {0: F32, 1: F32, 2: F32}, (0, 1), (2,))
    donated = program_of([add], {0: F32, 1: F32, 2: F32}, (0, 1), (2,),
                         donated_inputs=((0, 0),))
    assert liveness(kept).peak_bytes == 3 * F
    assert liveness(donated).peak_bytes == 2 * F
    assert MemoryAnalysis(donated, ChipSpec()).stats().alias_size_in_bytes == F


def test_schedule_times_overlap_independent_instructions():
    # Two transposes of x running at the same time hold both results at once (3 F); run
    # one after the other with the first result dead before the second starts (2 F).
    instrs = [transpose(1, 0), transpose(2, 0)]
    program = program_of(instrs, {0: F32, 1: F32, 2: F32}, (0,), ())
    assert liveness(program, [(0.0, 1.0), (0.0, 1.0)]).peak_bytes == 3 * F
    assert liveness(program, [(0.0, 1.0), (1.0, 2.0)]).peak_bytes == 2 * F


def loop(trip_count):
    """x0 = T(a); x = while(x0) { x = T(x) }: the carried value is counted once."""
    cond = program_of([isa.Constant((12,), (), value=np.bool_(True))],
                      {10: F32, 12: BOOL}, (10,), (12,), )
    body = program_of([transpose(21, 20, loc="model.py:30:5")], {20: F32, 21: F32},
                      (20,), (21,))
    instrs = [transpose(1, 0), control.While((2,), (1,), cond=cond, body=body,
                                             trip_count=trip_count)]
    return program_of(instrs, {0: F32, 1: F32, 2: F32}, (0,), (2,))


@pytest.mark.parametrize("trips", [1, 100])
def test_loop_counts_its_state_once_and_adds_the_body_temporaries(trips):
    # a (argument), the state buffer (x0 and the loop's result share it), and inside the
    # body the new state beside the old: 3 F, whatever the trip count.
    stats = MemoryAnalysis(loop(trips), ChipSpec()).stats()
    assert stats.peak_memory_in_bytes == 3 * F
    inside = [b for b in stats.live_at_peak if b.kind == "inside"]
    assert [b.nbytes for b in inside] == [F] and inside[0].loc == "model.py:30:5"


def test_replicated_and_varying_values_count_on_every_chip_of_the_mesh():
    # One value replicated over x, one varying along x: each chip holds both, 2 F; chips
    # the mesh does not use hold nothing.
    instrs = [transpose(1, 0)]
    program = program_of(instrs, {0: F32, 1: F32}, (0,), (1,), mesh=LINE, varying={1: (0,)})
    analysis = MemoryAnalysis(program, ChipSpec(), device_to_chip=(4, 5, 6, 7), num_chips=8)
    for chip in (4, 5, 6, 7):
        assert analysis.stats(chip).peak_memory_in_bytes == 2 * F
    assert analysis.stats(0).peak_memory_in_bytes == 0
    assert analysis.stats().chip == 4 and analysis.stats().peak_memory_in_bytes == 2 * F
    with pytest.raises(ValueError, match="chip 8 is not a chip"):
        analysis.stats(8)


def test_shard_map_arguments_are_held_as_per_chip_pieces():
    # A global float32[1024,256] split in 4 rows blocks over x: each chip holds its
    # [256,256] piece (F), the Shard is a view of it, the transpose result is F more, and
    # the output assembled from pieces is the piece: 2 F per chip.
    whole = isa.TensorType((1024, 256), "float32")
    instrs = [isa.Shard((1,), (0,), dim_axes=((0,), ())), transpose(2, 1),
              isa.Unshard((3,), (2,), dim_axes=((0,), ()))]
    program = program_of(instrs, {0: whole, 1: F32, 2: F32, 3: whole}, (0,), (3,),
                         mesh=LINE, varying={1: (0,), 2: (0,)})
    stats = MemoryAnalysis(program, ChipSpec(), device_to_chip=(0, 1, 2, 3),
                           num_chips=4).stats()
    assert stats.argument_size_in_bytes == F and stats.output_size_in_bytes == F
    assert stats.peak_memory_in_bytes == 2 * F


def test_a_global_value_read_whole_is_held_whole():
    # The same argument also read by an ordinary instruction: every chip holds all of it.
    whole = isa.TensorType((1024, 256), "float32")
    instrs = [isa.Shard((1,), (0,), dim_axes=((0,), ())),
              isa.Transpose((2,), (0,), permutation=(1, 0))]
    program = program_of(instrs, {0: whole, 1: F32, 2: isa.TensorType((256, 1024), "float32")},
                         (0,), (1, 2), mesh=LINE, varying={1: (0,)})
    live = liveness(program)
    assert live.input_types == (whole,)
    assert live.peak_bytes == 4 * F + F + 4 * F  # argument, its piece, the transpose


def test_a_conditional_adds_its_costliest_branch_beyond_its_results():
    # Branch 0 returns T(x) (its result is the case's result: nothing extra); branch 1
    # computes T(T(x)) and holds the intermediate beside the result: F extra. The peak is
    # x, the case's result and branch 1's intermediate, whichever branch runs: 3 F.
    index = isa.TensorType((), "int32")
    plain = program_of([transpose(31, 30)], {30: F32, 31: F32}, (30,), (31,), name="b0")
    deep = program_of([transpose(41, 40), transpose(42, 41, loc="model.py:50:1")],
                      {40: F32, 41: F32, 42: F32}, (40,), (42,), name="b1")
    case = control.Case((2,), (1, 0), branches=(plain, deep))
    program = program_of([case], {0: F32, 1: index, 2: F32}, (0, 1), (2,))
    stats = MemoryAnalysis(program, ChipSpec()).stats()
    assert stats.peak_memory_in_bytes == 3 * F + index.nbytes
    (inside,) = [b for b in stats.live_at_peak if b.kind == "inside"]
    assert inside.nbytes == F and inside.what == "case branch 1"


def loop_with_a_fill(fill_reader):
    """x = while(x0=T(a), fill=broadcast(-1e9)) { x = T(max(x, fill)) }, the fill passed
    through unchanged (as jax hoists a scan's loop-invariant `jnp.where` fill), then
    `fill_reader(out, fill)` after the loop reads the loop's copy of it."""
    scalar = isa.TensorType((), "float32")
    cond = program_of([isa.Constant((12,), (), value=np.bool_(True))],
                      {10: F32, 11: F32, 12: BOOL}, (10, 11), (12,))
    body = program_of([isa.Elementwise((22,), (20, 21), op="maximum"), transpose(23, 22)],
                      {20: F32, 21: F32, 22: F32, 23: F32}, (20, 21), (23, 21))
    instrs = [isa.Constant((1,), (), value=np.float32(-1e9)),
              isa.BroadcastInDim((2,), (1,), dimensions=(), shape=(256, 256)),
              transpose(3, 0),
              control.While((4, 5), (3, 2), cond=cond, body=body, trip_count=8),
              fill_reader(6, 5)]
    types = {0: F32, 1: scalar, 2: F32, 3: F32, 4: F32, 5: F32, 6: F32}
    return program_of(instrs, types, (0,), (4, 6))


def test_a_loop_invariant_broadcast_constant_is_sunk_into_the_loop():
    # The fill is read by an elementwise op in the body and after the loop: XLA sinks it
    # into the body and fuses it, so it is never stored. Held in the loop: a, the state
    # and the body's new state (after it: a and the two outputs): 3 F. Read by a transpose
    # after the loop it must be stored, through the whole loop: 4 F.
    fused = loop_with_a_fill(lambda out, fill: isa.Elementwise((out,), (4, fill), op="add"))
    stored = loop_with_a_fill(lambda out, fill: transpose(out, fill))
    assert liveness(fused).peak_bytes == 3 * F
    assert liveness(stored).peak_bytes == 4 * F


def test_out_of_hbm_on_a_chip_smaller_than_a_gib_gives_sizes_that_read():
    # The chain needs 3 F = 768 KiB; a chip of 512 KiB (HBM overridden) does not hold it.
    analysis = MemoryAnalysis(chain(), ChipSpec(hbm_bytes=2 * F))
    with pytest.raises(OutOfHBMError, match=r"needs 768\.00 KiB of HBM .* than the "
                                            r"512\.00 KiB of a"):
        analysis.check()


@pytest.mark.parametrize("shape, dimensions, peak", [
    ((1, 256, 256), (1, 2), 2 * F),  # adds a unit dimension: a bitcast of T(x)
    ((256, 1, 256), (0, 2), 2 * F),
    ((2, 256, 256), (1, 2), 4 * F),  # copies: a new buffer of 2 F beside T(x)
    ((256, 256), (1, 0), 3 * F),  # transposes: a new buffer
])
def test_a_broadcast_that_only_adds_unit_dimensions_is_a_view(shape, dimensions, peak):
    # out = broadcast(T(x)): x, T(x), and out unless it is T(x)'s bytes as they are.
    instrs = [transpose(1, 0), isa.BroadcastInDim((2,), (1,), dimensions=dimensions,
                                                  shape=shape)]
    program = program_of(instrs, {0: F32, 1: F32, 2: isa.TensorType(shape, "float32")},
                         (0,), (2,))
    assert liveness(program).peak_bytes == peak


def test_the_peak_split_adds_up_to_the_peak_by_role():
    # chain(): instr 1 holds x (argument) and t1, t2 (temporaries): 3 F at the peak.
    split = MemoryAnalysis(chain(), ChipSpec()).stats().peak_split
    assert (split.donated_arguments, split.other_arguments, split.outputs,
            split.temporaries) == (0, F, 0, 2 * F)
    # x donated and dead after instr 0: the peak, 2 F, is first reached at instr 0, which
    # holds x and its result t1.
    split = MemoryAnalysis(chain(donated_inputs=((0, 0),)), ChipSpec()).stats().peak_split
    assert (split.donated_arguments, split.other_arguments, split.outputs,
            split.temporaries) == (F, 0, 0, F)
    # x + y with x donated: the sum is written into x, y is held: at the add x (donated)
    # and y are live, then the output takes x's buffer.
    add = isa.Elementwise((2,), (0, 1), op="add")
    program = program_of([add], {0: F32, 1: F32, 2: F32}, (0, 1), (2,),
                         donated_inputs=((0, 0),))
    stats = MemoryAnalysis(program, ChipSpec()).stats()
    assert stats.peak_split.total == stats.peak_memory_in_bytes == 2 * F
    assert stats.peak_split.other_arguments == F
    assert "at the peak: donated arguments" in MemoryAnalysis(program, ChipSpec()).summary()
