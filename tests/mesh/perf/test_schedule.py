"""List scheduling onto engines: overlap, dependencies, HBM sharing, critical path."""

import pytest

from mesh import isa
from mesh.perf.schedule import ALL, Task, schedule

T = isa.TensorType((8,), "float32")


def chain_program(edges):
    """A program where instruction i defines value i+1 and reads the values of `edges[i]`
    (instruction indices, or -1 for the program input 0)."""
    instructions = tuple(isa.Elementwise((i + 1,), tuple(d + 1 for d in deps), op="add")
                         for i, deps in enumerate(edges))
    values = {v: isa.ValueInfo(T) for v in range(len(edges) + 1)}
    return isa.Program(isa.MeshSpec((), ()), instructions, (0,), (len(edges),), values)


def test_independent_work_on_different_engines_overlaps():
    program = chain_program([[-1], [-1], [-1]])
    s = schedule(program, [Task(isa.TENSOR, 3.0), Task(isa.VECTOR, 2.0),
                           Task(isa.COLLECTIVE, 5.0)])
    assert [slot.start for slot in s.slots] == [0.0, 0.0, 0.0]
    assert s.step_seconds == 5.0
    assert s.exposed_seconds(isa.COLLECTIVE) == 2.0  # 3 of its 5 hidden behind the Tensor Engine


def test_dependencies_serialise():
    program = chain_program([[-1], [0], [1]])
    s = schedule(program, [Task(isa.TENSOR, 1.0), Task(isa.COLLECTIVE, 2.0),
                           Task(isa.VECTOR, 3.0)])
    assert [slot.start for slot in s.slots] == [0.0, 1.0, 3.0]
    assert s.step_seconds == 6.0
    assert s.exposed_seconds(isa.COLLECTIVE) == 2.0


def test_one_engine_runs_one_instruction_at_a_time():
    program = chain_program([[-1], [-1]])
    s = schedule(program, [Task(isa.VECTOR, 1.0), Task(isa.VECTOR, 1.0)])
    assert sorted(slot.start for slot in s.slots) == [0.0, 1.0]


def test_hbm_traffic_is_shared_between_engines():
    """Two memory-bound ops on different engines take turns on the DMA queue."""
    program = chain_program([[-1], [-1]])
    s = schedule(program, [Task(isa.VECTOR, 2.0, hbm_seconds=2.0),
                           Task(isa.SCALAR, 2.0, hbm_seconds=2.0)])
    assert s.step_seconds == 4.0
    assert sorted(slot.start for slot in s.slots) == [0.0, 2.0]


def test_ready_work_overtakes_work_waiting_for_its_operands():
    """Instruction 2 (independent) runs on Vector while instruction 1 waits for 0."""
    program = chain_program([[-1], [0], [-1]])
    s = schedule(program, [Task(isa.TENSOR, 4.0), Task(isa.VECTOR, 1.0),
                           Task(isa.VECTOR, 2.0)])
    assert s.slots[2].start == 0.0 and s.slots[1].start == 4.0
    assert s.step_seconds == 5.0


def test_instruction_with_sub_programs_holds_every_engine():
    """A loop waits for every engine and nothing runs beside it (independent work may go
    before it)."""
    program = chain_program([[-1], [-1], [-1], [-1]])
    s = schedule(program, [Task(isa.TENSOR, 3.0), Task(ALL, 1.0), Task(isa.VECTOR, 4.0),
                           Task(isa.COLLECTIVE, 1.0)])
    loop = s.slots[1]
    assert loop.start == 4.0
    assert all(slot.end <= loop.start or slot.start >= loop.end
               for slot in s.slots if slot is not loop)


def test_critical_path_shares_add_up_to_the_step_time():
    program = chain_program([[-1], [0], [-1], [1, 2], [-1]])
    tasks = [Task(isa.TENSOR, 1.5, hbm_seconds=0.5), Task(isa.COLLECTIVE, 2.25),
             Task(isa.VECTOR, 0.75, hbm_seconds=0.75), Task(isa.VECTOR, 1.0, hbm_seconds=1.0),
             Task(isa.GPSIMD, 0.25, hbm_seconds=0.25)]
    s = schedule(program, tasks)
    shares = [slot.critical_seconds for slot in s.slots]
    assert sum(shares) == pytest.approx(s.step_seconds, rel=1e-12)
    assert shares[0] == 1.5 and shares[1] == 2.25 and shares[3] == 1.0  # the chain 0 -> 1 -> 3
    assert all(share == 0 for share in shares[2::2])


def test_task_count_must_match():
    with pytest.raises(ValueError, match="1 tasks for 2 instructions"):
        schedule(chain_program([[-1], [-1]]), [Task(isa.VECTOR, 1.0)])
