"""jax.lax.ragged_all_to_all (the custom call @ragged_all_to_all) on the simulated mesh.

XLA:CPU cannot run ragged-all-to-all ("not supported by XLA:CPU ThunkEmitter"), so the CPU
JAX reference is the op as jax's docstring writes it: each slice, padded to the operand's
rows, goes through a dense lax.all_to_all, together with the sender's output_offsets, and the
receiver writes the slices one after another. Every result is data movement: exact.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, assert_same_bits, cpu_mesh, random_array, \
    trn2_mesh

SLICES = 2  # slices each member sends each other member
ROW = (3,)  # the trailing dims of a row


def reference_body(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                   axis):
    """jax's docstring of ragged_all_to_all, with dense collectives that XLA:CPU runs."""
    rows = operand.shape[0]
    t = jnp.arange(rows)
    slices = operand[jnp.clip(input_offsets[:, None] + t, 0, rows - 1)]  # [K, rows, ...]
    received = lax.all_to_all(slices, axis, 0, 0, tiled=True)
    sent_sizes = lax.all_to_all(send_sizes, axis, 0, 0, tiled=True)
    offsets = lax.all_to_all(output_offsets, axis, 0, 0, tiled=True)
    result = output
    for j in range(input_offsets.shape[0]):
        written = t < jnp.minimum(sent_sizes[j], recv_sizes[j])
        where = jnp.where(written, offsets[j] + t, output.shape[0])  # past the end: dropped
        result = result.at[where].set(received[j], mode="drop")
    return result


def ragged_exchange(rng, shape, axis_index, dtype):
    """Per-chip arguments [*mesh shape, ...] of a valid exchange within each group along
    `axis_index`: random slice sizes (0 to 2 rows), packed after a one-row gap at the sender
    and at the receiver, and a random `output` whose rows no slice covers must survive."""
    size = shape[axis_index]
    k = size * SLICES
    rows = 2 * k + 2
    operand = random_array(rng, shape + (rows,) + ROW, dtype)
    output = random_array(rng, shape + (rows,) + ROW, dtype)
    offsets = {name: np.zeros(shape + (k,), np.int32) for name in
               ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")}
    rest = shape[:axis_index] + shape[axis_index + 1:]
    for coords in np.ndindex(*rest):
        def at(member):
            return coords[:axis_index] + (member,) + coords[axis_index:]
        sizes = rng.integers(0, 3, (size, size, SLICES))  # [sender, receiver, slice]
        for s in range(size):
            sent = sizes[s].ravel()  # the sender's slots i = receiver * SLICES + slice
            offsets["send_sizes"][at(s)] = sent
            offsets["input_offsets"][at(s)] = 1 + np.cumsum(sent) - sent
        for r in range(size):
            got = sizes[:, r].ravel()  # the receiver's slots j = sender * SLICES + slice
            offsets["recv_sizes"][at(r)] = got
            starts = 1 + np.cumsum(got) - got
            for s in range(size):
                offsets["output_offsets"][at(s)][r * SLICES:(r + 1) * SLICES] = \
                    starts[s * SLICES:(s + 1) * SLICES]
    return [operand, output] + list(offsets.values())


def per_chip_global(x: np.ndarray, ndim_mesh: int) -> np.ndarray:
    """[*mesh, a, ...] -> [n_chips * a, ...]: chip by chip in logical device order."""
    return x.reshape((-1,) + x.shape[ndim_mesh + 1:])


def ragged_program(mesh, names, axis, body):
    spec = P(names)

    def per_chip(*args):
        return body(*args, axis)

    return jax.shard_map(per_chip, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec)


def simulated_body(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                   axis):
    return lax.ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                                 recv_sizes, axis_name=axis)


def run_both(shape, names, axis, args):
    """(simulated, CPU reference) results; the simulated one through both front doors,
    jax_trn2.jit and plain jax.jit on the trn2 plugin's devices, which agree bit for bit."""
    sim = jax_trn2.jit(ragged_program(jax_trn2.make_mesh(shape, names), names, axis,
                                      simulated_body))
    plain = jax.jit(ragged_program(trn2_mesh(shape, names), names, axis, simulated_body))
    ref = jax.jit(ragged_program(cpu_mesh(shape, names), names, axis, reference_body))
    got = sim(*args)
    assert_same_bits(plain(*args), got)
    return got, ref(*args)


CASES = [((8,), ("x",), "x"), ((2, 4), ("data", "model"), "model"),
         ((2, 4), ("data", "model"), "data")]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("shape,names,axis", CASES, ids=lambda c: str(c))
def test_ragged_all_to_all_matches_cpu_jax(shape, names, axis, dtype, rng):
    args = ragged_exchange(rng, shape, names.index(axis), dtype)
    args = [per_chip_global(a, len(shape)) for a in args]
    got, want = run_both(shape, names, axis, args)
    assert_matches(got, want, exact=True)
    # the reference is not vacuous: rows arrived, and rows no slice covers kept `output`
    assert not np.array_equal(want, args[1]) and (np.asarray(want) == args[1]).any()


def test_docstring_example():
    """The example of jax's docstring, on an axis of 2."""
    mesh = jax_trn2.make_mesh((2,), ("x",))
    args = [np.array(v, np.int32) for v in (
        [1, 2, 2, 3, 4, 0], [0] * 8, [0, 1, 0, 1], [1, 2, 1, 1], [0, 0, 1, 2], [1, 1, 2, 1])]
    step = jax_trn2.jit(ragged_program(mesh, ("x",), "x", simulated_body))
    np.testing.assert_array_equal(step(*args), [1, 3, 0, 0, 2, 2, 4, 0])


def test_later_slices_overwrite_earlier_ones_and_rows_outside_are_skipped():
    """Slices are written in slot order (the docstring's loop); rows a slice would put past
    the output's end are not written."""
    mesh = jax_trn2.make_mesh((2,), ("x",))
    args = [np.array(v, np.int32) for v in (
        [1, 2, 3, 4, 5, 6, 7, 8],  # operand, 4 rows per chip
        [0] * 6,                   # output, 3 rows per chip
        [0, 2, 0, 2],              # input_offsets
        [2, 2, 2, 2],              # send_sizes
        [0, 1, 2, 0],              # output_offsets (the sender says where, at the receiver)
        [2, 2, 2, 2])]             # recv_sizes
    # chip 0 gets [1, 2] at row 0, then [5, 6] at row 2 (6 would be past the end);
    # chip 1 gets [3, 4] at row 1, then [7, 8] at row 0, over the 3
    step = jax_trn2.jit(ragged_program(mesh, ("x",), "x", simulated_body))
    np.testing.assert_array_equal(step(*args), [1, 2, 5, 7, 8, 4])


def test_under_auto_partitioning(rng):
    """A shard_map body inside a program that XLA partitions (in_shardings)."""
    shape, names = (2, 4), ("data", "model")
    args = [per_chip_global(a, 2) for a in ragged_exchange(rng, shape, 1, "float32")]
    sharding = NamedSharding(jax_trn2.make_mesh(shape, names), P(names))
    inner = ragged_program(sharding.mesh, names, "model", simulated_body)
    step = jax_trn2.jit(lambda x, *rest: inner(2 * x, *rest), in_shardings=(sharding,) * 6,
                        out_shardings=sharding)
    reference = jax.jit(ragged_program(cpu_mesh(shape, names), names, "model", reference_body))
    doubled = [2 * args[0]] + args[1:]
    assert_matches(step(*args), reference(*doubled), exact=True)
    assert "RaggedAllToAll" in step.lower(*args).as_text()


def test_costed_as_an_all_to_all_of_the_operand_and_listed_as_an_estimate(rng):
    shape, names = (2, 4), ("data", "model")
    args = [per_chip_global(a, 2) for a in ragged_exchange(rng, shape, 1, "float32")]
    step = jax_trn2.jit(ragged_program(jax_trn2.make_mesh(shape, names), names, "model",
                                       simulated_body))
    text = step.lower(*args).as_text()
    operand_bytes = math.prod(args[0].shape[1:]) * (args[0].shape[0] // 8) * 4
    line = next(l for l in text.splitlines() if "torus: ragged all-to-all" in l)
    assert "estimated as an all-to-all of the whole operand: balanced send sizes" in line
    assert f"of {operand_bytes} B over logical model" in line


def test_offsets_that_do_not_divide_among_the_group_are_an_error():
    mesh = jax_trn2.make_mesh((4,), ("x",))
    odd = np.zeros(12, np.int32)  # 3 per chip, for a group of 4
    args = [np.zeros((16, 3), np.float32)] * 2 + [odd] * 4
    step = jax_trn2.jit(ragged_program(mesh, ("x",), "x", simulated_body))
    with pytest.raises(jax_trn2.LoweringError,
                       match="3 offsets do not divide among the 4 members"):
        step(*args)
