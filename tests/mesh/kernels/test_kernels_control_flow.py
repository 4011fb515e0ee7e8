"""Loop, conditional and scan kernels (mesh.isa.kernels.control_flow) called directly, their
sub-programs run by the executor: a condition or index the same on every chip, and one
that differs from chip to chip (each chip its own trip count or branch)."""

import numpy as np
from kernel_harness import run_kernel, sub_program

from mesh import isa
from mesh.isa.control import Case, Scan, While

SCALAR = ()


def scalar_op(op: str, out: int, *ins: int, **params) -> isa.Elementwise:
    return isa.Elementwise((out,), ins, op=op, **params)


def counting_loop(mesh, varying):
    """while i < bound: i, acc = i + 1, acc + acc; state (i, acc), bound captured."""
    types = {v: (SCALAR, "int32", varying) for v in range(6)}
    cond = sub_program(mesh, [scalar_op("compare", 3, 0, 2, direction="LT",
                                        compare_type="SIGNED")], (0, 1, 2), (3,),
                       {**types, 3: (SCALAR, "bool", varying)})
    one = isa.Constant((3,), (), value=np.array(1, np.int32))
    body = sub_program(mesh, [one, scalar_op("add", 4, 0, 3), scalar_op("add", 5, 1, 1)],
                       (0, 1, 2), (4, 5), {**types, 3: (SCALAR, "int32", set())})
    return lambda outs, ins: While(outs, ins, cond=cond, body=body, trip_count=None)


def test_while_runs_until_its_condition_fails_and_zero_times_if_it_starts_false():
    """From (0, 1), bound 5: five trips, acc = 2^5; bound 0: no trip, the state as given."""
    mesh = {"x": 1}
    outs = [(SCALAR, "int32", set())] * 2
    start = [np.array([0], np.int32), np.array([1], np.int32)]
    i, acc = run_kernel(counting_loop(mesh, set()), start + [np.array([5], np.int32)],
                        outs, mesh)
    assert (i.item(), acc.item()) == (5, 32)
    i, acc = run_kernel(counting_loop(mesh, set()), start + [np.array([0], np.int32)],
                        outs, mesh)
    assert (i.item(), acc.item()) == (0, 1)


def test_while_with_a_per_chip_condition_stops_each_chip_at_its_own_trip_count():
    """Bounds 3 and 5 on two chips: chip 0's state freezes after 3 trips while chip 1 goes
    on to 5."""
    mesh = {"x": 2}
    outs = [(SCALAR, "int32", {0})] * 2
    args = [np.array([0], np.int32), np.array([1], np.int32), np.array([3, 5], np.int32)]
    i, acc = run_kernel(counting_loop(mesh, {0}), args, outs, mesh)
    np.testing.assert_array_equal(i, [3, 5])
    np.testing.assert_array_equal(acc, [8, 32])


def three_branches(mesh, varying):
    """Branches on a captured x: x + x, x * x, -x."""
    types = {0: ((2,), "int32", set()), 1: ((2,), "int32", varying)}
    return tuple(sub_program(mesh, [scalar_op(op, 1, *operands)], (0,), (1,), types)
                 for op, operands in (("add", (0, 0)), ("multiply", (0, 0)),
                                      ("negate", (0,))))


def run_case(index: np.ndarray, mesh) -> np.ndarray:
    varying = {0} if index.shape[0] > 1 else set()
    branches = three_branches(mesh, varying)
    x = np.array([[3, -4]], np.int32)
    (out,) = run_kernel(lambda outs, ins: Case(outs, ins, branches=branches), [index, x],
                        [((2,), "int32", varying)], mesh)
    return out


def test_case_index_out_of_range_takes_the_last_branch():
    """The spec: an index below 0 or at least the number of branches runs the last one."""
    mesh = {"x": 1}
    np.testing.assert_array_equal(run_case(np.array([1], np.int32), mesh), [[9, 16]])
    for index in (3, 7, -1):
        np.testing.assert_array_equal(run_case(np.array([index], np.int32), mesh), [[-3, 4]])


def test_case_with_a_per_chip_index_gives_each_chip_its_own_branch():
    """Indices 0, 1, 5 on three chips: x + x, x * x, and -x (5 is out of range)."""
    out = run_case(np.array([0, 1, 5], np.int32), {"x": 3})
    np.testing.assert_array_equal(out, [[6, -8], [9, 16], [-3, 4]])


def test_if_with_a_bool_takes_branch_zero_when_true():
    mesh = {"x": 1}
    np.testing.assert_array_equal(run_case(np.array([True]), mesh), [[6, -8]])
    np.testing.assert_array_equal(run_case(np.array([False]), mesh), [[9, 16]])


def test_scan_carries_a_running_sum_forwards_and_in_reverse():
    """Over [1, 2, 3, 4] from carry 0, out = carry = carry + x: [1, 3, 6, 10] forwards,
    [10, 9, 7, 4] from the last; the final carry is 10 either way."""
    mesh = {"x": 1}
    types = {v: (SCALAR, "int32", set()) for v in range(3)}
    body = sub_program(mesh, [scalar_op("add", 2, 1, 0)], (0, 1), (2, 2), types)
    xs, zero = np.array([[1, 2, 3, 4]], np.int32), np.array([0], np.int32)
    outs = [((4,), "int32", set()), (SCALAR, "int32", set())]
    for reverse, expected in ((False, [1, 3, 6, 10]), (True, [10, 9, 7, 4])):
        make = lambda o, i: Scan(o, i, dimension=0, is_reverse=reverse, num_inputs=1,
                                 num_carries=1, body=body, trip_count=4)
        sums, carry = run_kernel(make, [xs, zero], outs, mesh)
        np.testing.assert_array_equal(sums, [expected])
        assert carry.item() == 10
