"""lowering/rules/control_flow.py: while, if/case over sub-programs."""

import numpy as np
from jax import lax

from mesh import isa
from mesh.isa.control import Case, While
from rule_lowering import lower_jax, only


def test_fori_loop_is_a_while_with_a_static_trip_count():
    program = lower_jax(lambda x: lax.fori_loop(0, 7, lambda i, v: v * 2, x),
                        np.ones(3, np.float32))
    loop = only(program, While)
    assert loop.trip_count == 7
    assert any(isinstance(i, isa.Elementwise) and i.op == "multiply"
               for i in loop.body.instructions)
    assert any(isinstance(i, isa.Elementwise) and i.op == "compare"
               for i in loop.cond.instructions)


def test_while_with_data_dependent_exit_has_no_trip_count():
    program = lower_jax(lambda x: lax.while_loop(lambda v: v.sum() < 100, lambda v: v * 2, x),
                        np.ones(3, np.float32))
    assert only(program, While).trip_count is None


def test_switch_has_one_sub_program_per_branch():
    branches = [lambda v: v + 1, lambda v: v * 3, lambda v: -v]
    program = lower_jax(lambda i, x: lax.switch(i, branches, x), np.int32(1),
                        np.ones(3, np.float32))
    case = only(program, Case)
    ops = [[i.op for i in b.instructions if isinstance(i, isa.Elementwise)]
           for b in case.branches]
    assert ops == [["add"], ["multiply"], ["negate"]]
