"""The peak never falls below the least a step must hold at once, worked out by hand.

Each step runs elementwise work (Adam's `b1 * m`) that the schedule may place early, on an
engine the matmuls leave idle, while the fused kernel that reads it runs at the end: the
values that kernel reads stay in HBM until then, whatever the schedule order. Donation
saves exactly the buffers the outputs take over.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2
from mesh import isa
from mesh.isa import control
from mesh.memory import liveness

GIB = 2**30
MIB = 2**20
SCALARS = 64  # bytes: the few float32 scalars of a step (a sum, a loss) live beside the rest


def peak_bytes(f, *args, donate=()) -> int:
    return jax_trn2.jit(f, donate_argnums=donate).lower(*args).memory_analysis().peak_memory_in_bytes


def assert_least(peak: int, least: int) -> None:
    """The peak is the hand formula's least, give or take a step's scalars."""
    assert least <= peak <= least + SCALARS, (peak / GIB, least / GIB)


def matmul_chain_then_scale(m, x, w):
    """Issue 40's reproduction: four activations through one weight, then `0.9 * m + sum`."""
    y = x
    for _ in range(4):
        y = jnp.tanh(y @ w)
    return 0.9 * m + y.sum()


@pytest.mark.parametrize("donate", [(), (0,)], ids=["kept", "donated"])
def test_a_donated_buffer_read_early_by_a_fused_chain_is_held_until_the_chain_ends(donate):
    m = jax.ShapeDtypeStruct((2**29,), jnp.float32)  # 2 GiB
    x = jax.ShapeDtypeStruct((2**15, 2**14), jnp.bfloat16)  # 1 GiB, as is each activation
    w = jax.ShapeDtypeStruct((2**14, 2**14), jnp.bfloat16)  # 0.5 GiB
    # A matmul reads one activation and writes the next (tanh is written in place) while
    # m, x and w are held: m is read only by the fused `0.9 * m + sum` at the end (donated,
    # the output takes its buffer then; kept, the output is written beside it once the
    # activations are gone: m, x, w and the output, as much).
    least = 2 * GIB + GIB + GIB // 2 + 2 * GIB
    assert_least(peak_bytes(matmul_chain_then_scale, m, x, w, donate=donate), least)
    stats = jax_trn2.jit(matmul_chain_then_scale, donate_argnums=donate).lower(m, x, w) \
        .memory_analysis()
    assert stats.alias_size_in_bytes == (2 * GIB if donate else 0)


def adam_step(p, m, v, a, w, u):
    """A gradient from two matmuls, then Adam's update of p, m and v."""
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    g = (a @ w) @ u
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * m / (jnp.sqrt(v) + eps)
    return p, m, v


N, K = 2**13, 2**12
S = N * N * 4  # p, m, v and g, float32[N, N]: 256 MiB each
A = N * K * 4  # a, u and h = a @ w: 128 MiB each
W = K * K * 4  # w: 64 MiB
STATE = jax.ShapeDtypeStruct((N, N), jnp.float32)
INPUTS = (jax.ShapeDtypeStruct((N, K), jnp.float32), jax.ShapeDtypeStruct((K, K), jnp.float32),
          jax.ShapeDtypeStruct((K, N), jnp.float32))


def test_adam_with_donated_state_holds_the_state_through_the_gradient():
    # While the second matmul writes g, every argument (p, m, v, a, w, u) is held beside h
    # and g: 4 S + 3 A + W. The update then writes m', v', p' in place into m, v, p, which
    # the fused kernels read elementwise as they die: b1 * m and b2 * v, run early on an
    # idle engine, free nothing before that.
    least = 4 * S + 3 * A + W
    assert least == 1472 * MIB
    assert_least(peak_bytes(adam_step, STATE, STATE, STATE, *INPUTS, donate=(0, 1, 2)), least)


def test_adam_with_kept_state_holds_the_new_state_beside_the_old():
    # Kept, p, m, v and the inputs live the whole step, and while v' is written g, m' and
    # v' are beside them (then p', m', v'): 6 S + 2 A + W, above the matmul's 4 S + 3 A + W.
    # Donation saves the difference, 2 S - A = 384 MiB.
    least = max(6 * S + 2 * A + W, 4 * S + 3 * A + W)
    assert least == 1856 * MIB
    assert_least(peak_bytes(adam_step, STATE, STATE, STATE, *INPUTS), least)


# --- the same cases on hand-built programs, with a schedule given --------------------------

F32 = isa.TensorType((256, 256), "float32")
F = F32.nbytes
SCALAR = isa.TensorType((), "float32")


def program_of(instructions, types, inputs, outputs, **fields):
    values = {v: isa.ValueInfo(t, frozenset()) for v, t in types.items()}
    return isa.Program(isa.MeshSpec((), ()), tuple(instructions), tuple(inputs),
                       tuple(outputs), values, **fields)


def scaled_plus(x_read, z_read=None, times=None):
    """out = x_read(x) * 0.9 + z_read(z) (z itself when None), x donated and z kept: the
    product is fused into the add (kept in SBUF)."""
    instrs = [isa.Constant((1,), (), value=np.float32(0.9)),
              isa.BroadcastInDim((2,), (1,), dimensions=(), shape=(256, 256)),
              x_read(3, 0),
              isa.Elementwise((4,), (3, 2), op="multiply")] + \
        ([z_read(6, 5)] if z_read else []) + \
        [isa.Elementwise((7,), (4, 6 if z_read else 5), op="add")]
    types = {0: F32, 1: SCALAR, 2: F32, 3: F32, 4: F32, 5: F32, 6: F32, 7: F32}
    program = program_of(instrs, types, (0, 5), (7,), donated_inputs=((0, 0),))
    return liveness(program, times)


def negate(out, operand):
    return isa.Elementwise((out,), (operand,), op="negate")


def transpose(out, operand):
    return isa.Transpose((out,), (operand,), permutation=(1, 0))


def transposed(out, operand):  # a broadcast that permutes dimensions: a transpose, fused
    return isa.BroadcastInDim((out,), (operand,), dimensions=(1, 0), shape=(256, 256))


def test_a_fused_chain_run_early_holds_what_it_reads_until_its_consumer_runs():
    # The product's instructions run by t=3, the transpose of z from t=3 to 10, the add
    # from 10 to 11: the add's fused kernel reads x at t=10, so x is held until then beside
    # z and T(z), and the sum is written into x, which dies there: 3 F.
    live = scaled_plus(negate, transpose, [(0, 0), (0, 1), (1, 2), (2, 3), (3, 10), (10, 11)])
    assert live.peak_bytes == 3 * F
    (x,) = [l for l in live.lifetimes if 0 in l.buffer.values]
    assert 7 in x.buffer.values  # the output took the donated buffer


def test_a_fused_chain_that_moves_elements_gets_its_own_result_buffer():
    # The chain reads x transposed: writing the sum into x would overwrite elements it has
    # yet to read, so the sum is a buffer of its own beside x and z (kept): 3 F. Read
    # elementwise, x takes the sum: 2 F.
    assert scaled_plus(transposed).peak_bytes == 3 * F
    assert scaled_plus(negate).peak_bytes == 2 * F


def test_a_result_is_not_written_over_an_operand_another_instruction_still_reads():
    # neg(x) runs from t=1 to 2 while T(x) reads x from t=0 to 10: x (donated), T(x) and
    # neg(x) are three buffers at once.
    instrs = [transpose(1, 0), negate(2, 0)]
    program = program_of(instrs, {0: F32, 1: F32, 2: F32}, (0,), (1, 2),
                         donated_inputs=((0, 0),))
    assert liveness(program, [(0, 10), (1, 2)]).peak_bytes == 3 * F


def test_every_argument_is_held_when_the_step_starts():
    # A donated argument nothing reads (2 F) was still handed to the step beside y (F),
    # more than the transpose of y ever holds with y (2 F): 3 F.
    program = program_of([transpose(2, 1)],
                         {0: isa.TensorType((512, 256), "float32"), 1: F32, 2: F32}, (0, 1),
                         (2,), donated_inputs=((0, 0),))
    assert liveness(program).peak_bytes == 3 * F


def test_one_value_in_two_loop_state_slots_is_two_buffers():
    # while(x, x) { T(s0), T(s1) } with x = T(a) dying at the loop and only the second
    # result used: the loop carries two states, one in x's buffer and one beside it, and
    # its body makes both new states beside them (T(s0) is held while T(s1) reads s1):
    # a, two states, two new states: 5 F.
    cond = program_of([isa.Constant((12,), (), value=np.bool_(True))],
                      {10: F32, 11: F32, 12: isa.TensorType((), "bool")}, (10, 11), (12,))
    body = program_of([transpose(22, 20), transpose(23, 21)],
                      {20: F32, 21: F32, 22: F32, 23: F32}, (20, 21), (22, 23))
    instrs = [transpose(1, 0), control.While((2, 3), (1, 1), cond=cond, body=body, trip_count=4)]
    program = program_of(instrs, {v: F32 for v in range(4)}, (0,), (3,))
    assert liveness(program).peak_bytes == 5 * F


def test_a_loop_body_adds_its_most_beyond_the_state_not_what_it_adds_at_its_own_peak():
    # while(a) { T(T(T(T(s)))) } with a float32[1024, 256] (4 F) donated: the state lives
    # in a's buffer through the loop. The body's peak is first reached with s beside T(s)
    # (8 F, 4 F beyond the state); then s is dead and T(s) and T(T(s)) are 8 F beyond it
    # (the last transpose writes the new state into the state's buffer): 12 F in all.
    tall, wide = isa.TensorType((1024, 256), "float32"), isa.TensorType((256, 1024), "float32")
    cond = program_of([isa.Constant((11,), (), value=np.bool_(True))],
                      {10: tall, 11: isa.TensorType((), "bool")}, (10,), (11,))
    body = program_of([transpose(21, 20), transpose(22, 21), transpose(23, 22),
                       transpose(24, 23)],
                      {20: tall, 21: wide, 22: tall, 23: wide, 24: tall}, (20,), (24,))
    program = program_of([control.While((1,), (0,), cond=cond, body=body, trip_count=4)],
                         {0: tall, 1: tall}, (0,), (1,), donated_inputs=((0, 0),))
    assert liveness(program).peak_bytes == 12 * F
