"""jax_trn2.jit's sharded results are made of their chips' pieces (jax_trn2.core.chip_pieces):
each device's buffer a view of its chip's piece in the executor's array, with the values,
sharding and block order of the global array the Unshard would have assembled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2
from jax_trn2.core import chip_pieces
from mesh import executor, sharding


def cpu_mesh(shape, names):
    """The same mesh over jax's own CPU devices, for the reference run."""
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=jax.devices("cpu")[:int(np.prod(shape))])


def chip_dependent(names):
    """A body whose piece differs from chip to chip along every mesh axis."""
    def body(x):
        for k, name in enumerate(names):
            x = x * 3 + (k + 1) * jax.lax.axis_index(name).astype(x.dtype)
        return x
    return body


# (mesh shape, names, in_specs, out_specs, global input shape): blocks over one axis, over
# two axes of one dim (either order), over none (replicated), dims over axes out of order
PROGRAMS = [
    ((4, 4, 4), ("x", "y", "z"), P("x", ("y", "z")), P("x", ("y", "z")), (8, 32)),
    ((4, 4, 4), ("x", "y", "z"), P("x", ("y", "z")), P("x", ("z", "y")), (8, 32)),
    ((2, 4), ("a", "b"), P("b", "a"), P("b", "a"), (8, 6)),
    ((2, 4), ("a", "b"), P(("b", "a")), P(("b", "a")), (16, 3)),
    ((2, 4), ("a", "b"), P("a"), P("a", None), (4, 5)),
]


@pytest.mark.parametrize("shape,names,in_spec,out_spec,x_shape", PROGRAMS)
def test_a_sharded_result_has_the_global_arrays_values_and_sharding(
        rng, shape, names, in_spec, out_spec, x_shape):
    x = rng.standard_normal(x_shape).astype(np.float32)
    body = chip_dependent(names)
    fn = jax.shard_map(body, mesh=jax_trn2.make_mesh(shape, names), in_specs=in_spec,
                       out_specs=out_spec, check_vma=False)
    compiled = jax_trn2.jit(fn).lower(x).compile()
    assert compiled._out_pieces[0] is not None  # made of the chips' pieces
    got = compiled(x)
    reference = jax.jit(jax.shard_map(body, mesh=cpu_mesh(shape, names), in_specs=in_spec,
                                      out_specs=out_spec, check_vma=False))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(reference))
    assert got.sharding == compiled.out_shardings[0]
    assert got.sharding.spec == reference.sharding.spec
    for shard, want in zip(got.addressable_shards, got.sharding.devices_indices_map(
            x_shape).values()):
        assert shard.index == got.sharding.devices_indices_map(x_shape)[shard.device]
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(reference)[want])


def test_a_result_varying_along_an_axis_it_is_replicated_over_is_chip_zeros(rng):
    """check_vma=False with out_specs that leave an axis out: the Unshard takes the piece of
    the chip at coordinate 0 along it, and so does every device's buffer."""
    names = ("a", "b")
    x = rng.standard_normal((4, 6)).astype(np.float32)
    fn = jax.shard_map(chip_dependent(names), mesh=jax_trn2.make_mesh((2, 4), names),
                       in_specs=P("a"), out_specs=P("a"), check_vma=False)
    got = jax_trn2.jit(fn)(x)
    through_client = jax_trn2.client().compile(jax.jit(fn).lower(x).as_text())
    (want,) = through_client.execute([x])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for shard in got.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(want)[shard.index])


@pytest.mark.parametrize("inner_out", [P(), P("y")])
def test_a_result_an_inner_shard_map_assembled_first(rng, inner_out):
    """Nested shard_maps: the outer Unshard's pieces are themselves an inner Unshard's
    result; the outer one's pieces are given, the inner one still runs."""
    mesh = jax_trn2.make_mesh((2, 4), ("x", "y"))
    x = rng.standard_normal((8, 8)).astype(np.float32)

    def inner(v):
        return jax.lax.psum(jnp.sin(v), "y") if inner_out == P() else jnp.sin(v) * 2

    def outer(v):
        return jax.shard_map(inner, in_specs=P("y"), out_specs=inner_out,
                             axis_names={"y"})(v)

    fn = jax.jit(jax.shard_map(outer, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               axis_names={"x"}))
    compiled = jax_trn2.jit(fn).lower(x).compile()
    # with the inner result split over y, jax places the whole over ('x', 'y'): its shards
    # are not the outer Unshard's pieces, and the result is cut from the global array
    assert (compiled._out_pieces[0] is not None) == (inner_out == P())
    got = np.asarray(compiled(x))
    reference = jax.jit(jax.shard_map(outer, mesh=cpu_mesh((2, 4), ("x", "y")),
                                      in_specs=P("x"), out_specs=P("x"),
                                      axis_names={"x"}))(x)
    np.testing.assert_allclose(got, np.asarray(reference), rtol=1e-6, atol=1e-6)


def test_the_devices_buffers_are_views_of_one_array(rng):
    mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))
    x = rng.standard_normal((64, 1024)).astype(np.float32)  # 1 KiB pieces, 64-byte aligned
    fn = jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("x", ("y", "z")),
                       out_specs=P("x", ("y", "z")))
    got = jax_trn2.jit(fn)(x)
    starts = sorted(s.data.unsafe_buffer_pointer() for s in got.addressable_shards)
    piece = got.addressable_shards[0].data.nbytes
    # 64 pieces of one array, back to back: no copy was made of any
    assert np.diff(starts).tolist() == [piece] * 63
    np.testing.assert_array_equal(np.asarray(got), x * 2)


def test_a_replicated_result_shares_one_piece(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((8, 64)).astype(np.float32)
    fn = jax.shard_map(lambda x: jax.lax.psum(x, ("a", "b")), mesh=mesh,
                       in_specs=P("a", "b"), out_specs=P())
    got = jax_trn2.jit(fn)(x)
    assert got.sharding.is_fully_replicated
    pointers = {s.data.unsafe_buffer_pointer() for s in got.addressable_shards}
    assert len(pointers) == 1  # every device the same piece, not a copy each
    want = sum(x[4 * i:4 * (i + 1), 16 * j:16 * (j + 1)] for i in range(2) for j in range(4))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_an_auto_partitioned_result_is_made_of_its_pieces(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    fn = jax.jit(lambda x: jnp.sin(x) * 2, in_shardings=sharding, out_shardings=sharding)
    compiled = jax_trn2.jit(fn).lower(x).compile()
    assert compiled._out_pieces[0] is not None
    got = compiled(x)
    assert got.sharding == sharding
    np.testing.assert_allclose(np.asarray(got), np.sin(x) * 2, rtol=1e-6)


def test_a_result_made_of_pieces_can_be_donated(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    double = jax_trn2.jit(jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("a", "b"),
                                        out_specs=P("a", "b")))
    y = double(x)
    z = jax_trn2.jit(lambda y: y + 1, donate_argnums=0)(y)
    np.testing.assert_array_equal(np.asarray(z), x * 2 + 1)
    assert y.is_deleted()


def test_the_runtime_executable_still_gives_global_results(rng):
    """LoadedExecutable.execute assembles the outputs the run gives as chip pieces, unless
    asked for the pieces (as jax_trn2.jit asks)."""
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    fn = jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("a", "b"),
                       out_specs=P(None, ("b", "a")))
    compiled = jax_trn2.jit(fn).lower(x).compile()
    executable = compiled.runtime_executable()
    (whole,) = executable.execute([x])
    assert whole.shape == (4, 32)  # each chip's 4x4 piece side by side, b major
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(compiled(x)))
    # block 1 is chip (a=1, b=0)'s
    np.testing.assert_array_equal(np.asarray(whole)[:, 4:8], 2 * x[4:8, 0:4])
    (chips,) = executable.execute([x], chip_pieces=True)
    assert chips.shape == (2, 4, 4, 4)


def test_only_an_output_an_unshard_makes_is_given_as_pieces(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    fn = jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("a", "b"),
                       out_specs=P("a", "b"))
    program = jax_trn2.jit(fn).lower(x).program
    assert executor.output_unshard(program, 0) is not None
    no_unshard = jax_trn2.jit(lambda x: x * 2).lower(x).program
    assert executor.output_unshard(no_unshard, 0) is None
    with pytest.raises(ValueError, match="output 0 is not assembled by an Unshard"):
        executor.with_chip_outputs(no_unshard, [0])
    chips = executor.with_chip_outputs(program, [0])
    assert chips.outputs[0] == executor.output_unshard(program, 0).ins[0]
    assert len(chips.instructions) == len(program.instructions) - 1  # the Unshard dropped


def small_products(mesh, out_type=jnp.float32):
    """Each chip's x block (8 x 256: two passes, the native loop) @ its w block, in FP32 or
    converted to BF16 (which the loop rounds as it writes), returned as pieces over all
    three axes."""
    return jax.shard_map(
        lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(out_type),
        mesh=mesh, in_specs=(P("x", "y"), P("y", "z")), out_specs=P("x", ("y", "z")))


@pytest.mark.parametrize("out_type", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("columns", [64, 48])
def test_a_large_product_comes_one_array_per_chip(rng, monkeypatch, columns, out_type):
    """A product the program returns as chips' pieces, of PER_CHIP_MIN_BYTES or more (here
    every one), FP32 or rounded to BF16 by the native loop, is written one array per chip
    where each tile of the loop's result is one chip's (a chip's columns a multiple of a
    tile's 32; else one array): the same bits as one array, the global array assembled
    from them where asked for."""
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((512, 2 * columns)).astype(np.float32)
    mesh = jax_trn2.make_mesh((2, 2, 2), ("x", "y", "z"))
    whole = jax_trn2.jit(small_products(mesh, out_type)).lower(x, w).compile()
    monkeypatch.setattr(executor, "PER_CHIP_MIN_BYTES", 0)
    per_chip = jax_trn2.jit(small_products(mesh, out_type)).lower(x, w).compile()
    (chips,) = per_chip.runtime_executable().run([x, w])
    assert isinstance(chips, sharding.PerChip) == (columns % 32 == 0)
    got, want = per_chip(x, w), whole(x, w)
    assert got.sharding == want.sharding and got.dtype == want.dtype == out_type
    np.testing.assert_array_equal(bits(np.asarray(got)), bits(np.asarray(want)))
    assert len({s.data.unsafe_buffer_pointer() for s in got.addressable_shards}) == 8
    (global_,) = per_chip.runtime_executable().execute([x, w])  # assembled
    np.testing.assert_array_equal(bits(np.asarray(global_)), bits(np.asarray(want)))
    reference = jax.jit(small_products(cpu_mesh((2, 2, 2), ("x", "y", "z")), out_type))(x, w)
    # FP32 sums of 256 products in another order: within 1e-5; rounded to BF16 from such
    # sums, neighbouring BF16 values at most (2^-7 apart, relative)
    tolerance = 1e-5 if out_type == jnp.float32 else 2.0 ** -7
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(reference, np.float32),
                               rtol=tolerance, atol=1e-5)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.dtype.itemsize}")


def _lowered_outputs():
    """A program of three outputs, each assembled by an Unshard: one laid out as its pieces
    over both axes, one reduced over 'a' (replicated along it), one with no elements."""
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    f = jax.shard_map(lambda x, y: (x * 2, jax.lax.psum(x, "a"), y), mesh=mesh,
                      in_specs=(P("a", "b"), P("a")),
                      out_specs=(P("a", "b"), P(None, "b"), P("a")))
    return jax_trn2.jit(f).lower(np.ones((4, 8), np.float32),
                                 np.ones((0,), np.float32))._executable


def test_chip_outputs_are_those_laid_out_as_their_pieces_with_elements():
    executable = _lowered_outputs()
    _, out_layouts = executable.layouts
    assert chip_pieces.chip_outputs(executable.program, out_layouts) == [0, 1]


def test_an_output_laid_out_otherwise_than_its_pieces_is_no_chip_output():
    """Where XLA lays a result out otherwise (here: replicated, for lack of a layout, or
    its dims' axes swapped), a device's buffer is not one chip's piece."""
    program = _lowered_outputs().program
    assert chip_pieces.chip_outputs(program, ()) == []
    assert chip_pieces.chip_outputs(program, (((1,), (0,)), ((), (1,)), None)) == [1]
