"""Loops and conditionals (stablehlo.while / if / case) on the 4x4x4 mesh, against CPU JAX:
collectives inside bodies and branches, conditions that differ from chip to chip, loop
layouts that widen, static trip counts, and hand-written StableHLO for the spec's corner
cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, run_both
from mesh.isa.control import Case, While

MESH = ((4, 4, 4), ("x", "y", "z"))
RING_X = [(i, (i + 1) % 4) for i in range(4)]


def control_flow(program, cls):
    """The instructions of class `cls` in a program, at any depth."""
    found = []
    for instr in program.instructions:
        if isinstance(instr, cls):
            found.append(instr)
        for _, sub in getattr(instr, "regions", lambda: ())():
            found += control_flow(sub, cls)
    return found


def lowered_program(body, in_specs, out_specs, *args, check_vma=True):
    mesh = jax_trn2.make_mesh(*MESH)
    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                      check_vma=check_vma))
    return step.lower(*args)


def test_scan_with_psum_in_body(rng):
    def body(xs):
        def step(carry, x):
            carry = carry + jax.lax.psum(x, "y")
            return carry, carry * 2
        return jax.lax.scan(step, jnp.zeros_like(xs[0]), xs)

    xs = rng.standard_normal((4, 32, 8)).astype(np.float32)
    specs = (P(None, "x"),), (P("x"), P(None, "x"))
    got, want = run_both(body, *MESH, *specs, xs)
    assert_matches(got, want)
    lowered = lowered_program(body, *specs, xs)
    (loop,) = control_flow(lowered.program, While)
    assert loop.trip_count == 4
    assert "body x4(" in lowered.as_text()


def test_fori_loop_ppermute_makes_a_replicated_carry_vary(rng):
    """The carry starts as a constant (the same on every chip) and the ring shift makes it
    differ along x: the loop's layout has to widen to a fixed point."""
    def body(x):
        def step(i, carry):
            return jax.lax.ppermute(carry * 0.5 + x + i, "x", RING_X)
        return jax.lax.fori_loop(0, 3, step, jnp.ones_like(x))

    x = rng.standard_normal((16, 4)).astype(np.float32)
    got, want = run_both(body, *MESH, P("x"), P("x"), x)
    assert_matches(got, want)
    program = lowered_program(body, P("x"), P("x"), x).program
    (loop,) = control_flow(program, While)
    assert loop.trip_count == 3
    assert program.info(loop.outs[-1]).varying == {0}  # the carry varies along x


def test_while_loop_whose_trip_count_differs_per_chip(rng):
    """Chips at x coordinate k run 1 + k iterations; the psum over y stays within chips
    that agree (same x), so every group reduces the same iteration."""
    def body(v):
        limit = 1 + jax.lax.axis_index("x")

        def step(state):
            i, v = state
            return i + 1, jax.lax.psum(v, "y") * 0.25 + 1.0

        return jax.lax.while_loop(lambda s: s[0] < limit, step, (0, v))

    v = rng.standard_normal((16, 8)).astype(np.float32)
    specs = P(None, "y"), (P(("x", "y", "z")), P(None, ("x", "y", "z")))
    got, want = run_both(lambda v: _per_chip_outputs(body(v)), *MESH, *specs, v,
                         check_vma=False)
    assert_matches(got, want)
    assert np.asarray(got[0]).tolist() == [1 + d // 16 for d in range(64)]
    (loop,) = control_flow(lowered_program(lambda v: _per_chip_outputs(body(v)), *specs, v,
                                           check_vma=False).program, While)
    assert loop.trip_count is None


def _raises_split(body, came: str, missing: str) -> None:
    """A shard_map of `body` over x, whose AllReduce the chips `came` reach and `missing`
    do not, raises SplitCollectiveError naming them."""
    step = jax_trn2.jit(jax.shard_map(body, mesh=jax_trn2.make_mesh(*MESH), in_specs=P("x"),
                                      out_specs=P("x"), check_vma=False))
    with pytest.raises(jax_trn2.SplitCollectiveError,
                       match=rf"AllReduce at .*test_control_flow.py:\d+.*logical devices "
                             rf"\[{came}\] of the group \[0, 16, 32, 48\] reached it and "
                             rf"\[{missing}\] did not"):
        step(np.ones((4, 2), np.float32))


def test_a_loop_collective_that_part_of_its_group_stops_reaching_is_an_error():
    """Chips at x coordinate k run 1 + k iterations of a psum over x: from the second
    iteration on, chip 0 of each x line has left the loop. Trainium2 (and XLA:CPU) would
    wait forever; the run names the collective and the chips instead of returning numbers."""
    def body(v):
        limit = 1 + jax.lax.axis_index("x")
        step = lambda s: (s[0] + 1, jax.lax.psum(s[1], "x"))  # noqa: E731
        return jax.lax.while_loop(lambda s: s[0] < limit, step, (0, v))[1]

    _raises_split(body, "16, 32, 48", "0")


def test_a_collective_in_a_loop_condition_checked_after_chips_leave():
    """A psum in the condition: a chip that has left the loop does not evaluate it again.
    After 3 iterations the sum is 12 on every chip, and only chips at x = 3 (12 < 13) go on
    to evaluate it alone: on Trainium2 they would wait for the others forever."""
    def body(v):
        go_on = lambda s: jax.lax.psum(s[1], "x") < 10 + jax.lax.axis_index("x")  # noqa: E731
        return jax.lax.while_loop(go_on, lambda s: (s[0] + 1, s[1] + 1), (v, 0))[0]

    _raises_split(body, "48", "0, 16, 32")


def test_a_branch_collective_over_chips_that_took_other_branches_is_an_error():
    def body(x):
        return jax.lax.cond(jax.lax.axis_index("y") == 0, lambda x: jax.lax.psum(x, "y"),
                            lambda x: x * 2.0, x)

    step = jax_trn2.jit(jax.shard_map(body, mesh=jax_trn2.make_mesh(*MESH),
                                      in_specs=P(("x", "y")), out_specs=P(("x", "y")),
                                      check_vma=False))
    with pytest.raises(jax_trn2.SplitCollectiveError, match=r"\[0\] of the group \[0, 4, 8, 12\]"
                                                            r" reached it and \[4, 8, 12\]"):
        step(np.ones((16, 2), np.float32))


def _per_chip_outputs(state):
    """(trip count [1], value [rows, cols]) of one chip, as blocks of a global output."""
    i, v = state
    return i.reshape(1), v


def test_cond_on_a_replicated_predicate_with_collectives_in_branches(rng):
    def body(x):
        total = jax.lax.psum(jnp.sum(x), ("x", "y", "z"))
        return jax.lax.cond(total > 0, lambda x: jax.lax.psum(x, "x"),
                            lambda x: jax.lax.pmax(x, "z") - 1.0, x)

    for sign in (1.0, -1.0):
        x = sign * np.abs(rng.standard_normal((16, 16))).astype(np.float32)
        got, want = run_both(body, *MESH, P("y", "z"), P("y", "z"), x, check_vma=False)
        assert_matches(got, want)


def test_cond_on_axis_index_runs_per_chip(rng):
    """Chips with z == 1 psum over x, the others double: the branch differs per chip."""
    def body(x):
        return jax.lax.cond(jax.lax.axis_index("z") == 1, lambda x: jax.lax.psum(x, "x"),
                            lambda x: x * 2.0, x)

    x = rng.standard_normal((16, 16)).astype(np.float32)
    specs = P("x", "y"), P(("x", "z"), "y")
    got, want = run_both(body, *MESH, *specs, x, check_vma=False)
    assert_matches(got, want)
    (case,) = control_flow(lowered_program(body, *specs, x, check_vma=False).program, Case)
    assert len(case.branches) == 2


def test_switch_on_axis_index_clamps_like_jax(rng):
    def body(x):
        branches = [lambda x: x + 1, lambda x: jax.lax.psum(x, "z"), lambda x: -x]
        return jax.lax.switch(jax.lax.axis_index("y"), branches, x)  # y == 3 -> branch 2

    x = rng.integers(-50, 50, (16, 8)).astype(np.int32)
    got, want = run_both(body, *MESH, P("y"), P(("y", "z")), x)
    assert_matches(got, want)


def test_nested_loops_and_conditionals(rng):
    def body(x):
        def outer(i, carry):
            carry = jax.lax.cond(i % 2 == 0, lambda c: c + jax.lax.psum(c, "z"),
                                 lambda c: c * 0.5, carry)
            inner, _ = jax.lax.scan(lambda c, _: (jax.lax.ppermute(c, "x", RING_X) + 1.0,
                                                  None), carry, None, length=2)
            return inner
        return jax.lax.fori_loop(0, 3, outer, x)

    x = rng.standard_normal((8, 8)).astype(np.float32) * 0.1
    specs = P("x", "z"), P(("x", "y"), "z")
    got, want = run_both(body, *MESH, *specs, x)
    assert_matches(got, want)
    loops = control_flow(lowered_program(body, *specs, x).program, While)
    assert sorted(loop.trip_count for loop in loops) == [2, 3]


@pytest.mark.parametrize("make_loop, expected", [
    (lambda x: jax.lax.scan(lambda c, r: (c + r, None), x[0], x)[0], 5),
    (lambda x: jax.lax.fori_loop(2, 9, lambda i, c: c * 1.5, x), 7),
    (lambda x: jax.lax.scan(lambda c, r: (c * r, None), x[0], x, reverse=True)[0], 5),
    (lambda x: jax.lax.while_loop(lambda c: jnp.sum(c) < 100.0, lambda c: c * 2.0, x), None),
])
def test_static_trip_counts(make_loop, expected):
    x = jax.ShapeDtypeStruct((5, 3), jnp.float32)
    (loop,) = control_flow(jax_trn2.jit(make_loop).lower(x).program, While)
    assert loop.trip_count == expected


def test_trip_count_of_a_loop_with_a_traced_bound_is_unknown():
    def count_to(x, n):
        return jax.lax.fori_loop(0, n, lambda i, c: c + 1.0, x)

    lowered = jax_trn2.jit(count_to).lower(np.zeros(3, np.float32), np.int32(4))
    (loop,) = control_flow(lowered.program, While)
    assert loop.trip_count is None
    np.testing.assert_array_equal(lowered.compile()(np.zeros(3, np.float32), np.int32(4)),
                                  np.full(3, 4.0, np.float32))


# Hand-written StableHLO: a case whose index is out of range takes the last branch (the
# spec; lax.switch clamps before the case), an if, and a while whose regions use values
# defined outside them and count down by 3 with a GT comparison.
CASE_AND_WHILE = """
module {
  func.func public @main(%index: tensor<i32>, %pred: tensor<i1>, %x: tensor<3xf32>)
      -> (tensor<3xf32>, tensor<3xf32>, tensor<i32>, tensor<3xf32>) {
    %one = stablehlo.constant dense<1.0> : tensor<3xf32>
    %case = "stablehlo.case"(%index) ({
      %a = stablehlo.add %x, %one : tensor<3xf32>
      stablehlo.return %a : tensor<3xf32>
    }, {
      %b = stablehlo.negate %x : tensor<3xf32>
      stablehlo.return %b : tensor<3xf32>
    }, {
      %c = stablehlo.multiply %x, %x : tensor<3xf32>
      stablehlo.return %c : tensor<3xf32>
    }) : (tensor<i32>) -> tensor<3xf32>
    %if = "stablehlo.if"(%pred) ({
      stablehlo.return %x : tensor<3xf32>
    }, {
      stablehlo.return %one : tensor<3xf32>
    }) : (tensor<i1>) -> tensor<3xf32>
    %ten = stablehlo.constant dense<10> : tensor<i32>
    %zero = stablehlo.constant dense<0> : tensor<i32>
    %three = stablehlo.constant dense<3> : tensor<i32>
    %n, %acc = stablehlo.while(%i = %ten, %s = %x) : tensor<i32>, tensor<3xf32>
     cond {
      %go = stablehlo.compare GT, %i, %zero, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %go : tensor<i1>
    } do {
      %next = stablehlo.subtract %i, %three : tensor<i32>
      %grown = stablehlo.add %s, %one : tensor<3xf32>
      stablehlo.return %next, %grown : tensor<i32>, tensor<3xf32>
    }
    return %case, %if, %n, %acc : tensor<3xf32>, tensor<3xf32>, tensor<i32>, tensor<3xf32>
  }
}
"""


@pytest.mark.parametrize("index, branch", [(0, 0), (1, 1), (2, 2), (3, 2), (-1, 2), (99, 2)])
def test_hand_written_case_if_and_while(index, branch):
    executable = jax_trn2.client().compile(CASE_AND_WHILE)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    expected_case = [x + 1, -x, x * x][branch]
    for pred in (True, False):
        case, if_, n, acc = executable.execute([np.int32(index), np.bool_(pred), x])
        np.testing.assert_array_equal(case, expected_case)
        np.testing.assert_array_equal(if_, x if pred else np.ones(3, np.float32))
        assert int(n) == -2  # 10, 7, 4, 1 -> -2: four iterations
        np.testing.assert_array_equal(acc, x + 4)
    (loop,) = control_flow(executable.program, While)
    assert loop.trip_count == 4


COUNT_DOWN = """
module {{
  func.func public @main(%x: tensor<f32>) -> tensor<f32> {{
    %start = stablehlo.constant dense<10> : tensor<{t}>
    %stop = stablehlo.constant dense<0> : tensor<{t}>
    %step = stablehlo.constant dense<{step}> : tensor<{t}>
    %n, %y = stablehlo.while(%i = %start, %v = %x) : tensor<{t}>, tensor<f32>
     cond {{
      %go = stablehlo.compare GT, %i, %stop : (tensor<{t}>, tensor<{t}>) -> tensor<i1>
      stablehlo.return %go : tensor<i1>
    }} do {{
      %next = stablehlo.subtract %i, %step : tensor<{t}>
      %w = stablehlo.add %v, %v : tensor<f32>
      stablehlo.return %next, %w : tensor<{t}>, tensor<f32>
    }}
    return %y : tensor<f32>
  }}
}}
"""


@pytest.mark.parametrize("counter, step, expected", [
    ("i32", 3, 4),  # 10, 7, 4, 1 -> -2
    ("ui32", 1, 10),
    ("ui32", 3, None),  # 1 - 3 wraps around to 2**32 - 2 > 0: the loop goes on
])
def test_trip_count_of_a_count_down(counter, step, expected):
    executable = jax_trn2.client().compile(COUNT_DOWN.format(t=counter, step=step))
    (loop,) = control_flow(executable.program, While)
    assert loop.trip_count == expected
    if expected is not None:
        assert float(executable.execute([np.float32(1.0)])[0]) == 2.0 ** expected
