"""The native matmul reads and writes where data movements would put the elements: an
operand a Shard made is read where the Shard's input holds it (mesh.isa.kernels.matmul
_operands), and a result whose only use is an Unshard is written straight into the
Unshard's global array (mesh.isa.kernels.movement.unshard_places_matmul): the same bits as
through the movements' copies, without them. A product whose only use is its conversion to
BF16 is written rounded (mesh.isa.kernels.matmul.converts_native_matmul): the same bits as
XLA's conversion of it, without an FP32 product in memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh import executor, isa, numerics
from mesh.isa.kernels import matmul, movement, native

K = 384  # three passes of 128: the native loop's


def global_executable(fn, *args, rounding: str = "nearest"):
    """fn's program as an executable that returns global results (the client's, as the
    plugin runs it; jax_trn2.jit gives a sharded result its chips' pieces instead)."""
    return jax_trn2.client().compile(jax.jit(fn).lower(*args).as_text(), rounding=rounding)


def run(executable, *args) -> np.ndarray:
    (result,) = executable.execute(list(args))
    return np.asarray(result)


def custom_calls(executable) -> list[str]:
    """The executor's custom calls (the native loop's), as lines of its optimized HLO."""
    text = executable._run_global.compiled.as_text()
    return [line for line in text.splitlines() if "custom-call(" in line]


def copied(monkeypatch):
    """Every Shard and Unshard a copy, the matmul reading and writing those."""
    monkeypatch.setattr(movement, "_placed_matmul", lambda *args: None)
    monkeypatch.setattr(matmul, "_operands", lambda instr, lhs, rhs, ctx: (
        native.Strided.of(lhs), native.Strided.of(rhs)))


def moves(executable) -> list[str]:
    """The executor's transposes and copies, as lines of its optimized HLO."""
    text = executable._run_global.compiled.as_text()
    return [line for line in text.splitlines() if "transpose(" in line or "copy(" in line]


# (mesh shape, names, in_specs, out_specs, x and w shapes): products unsharded over every
# mesh axis, over some (the others not varying), with the columns split over two axes
PROGRAMS = [
    ((4, 4, 4), ("x", "y", "z"), (P("x", "y"), P("y", "z")), P("x", ("y", "z")),
     (64, 4 * K), (4 * K, 32)),
    ((2, 4), ("a", "b"), (P("a"), P(None, "b")), P("a", "b"), (16, K), (K, 64)),
    ((2, 4), ("a", "b"), (P(None, None), P(None, "b")), P(None, "b"), (8, K), (K, 64)),
    ((8,), ("i",), (P("i"), P()), P("i"), (64, K), (K, 24)),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape,names,in_specs,out_specs,x_shape,w_shape", PROGRAMS)
def test_a_matmul_in_place_gives_the_bits_of_one_through_copies(
        rng, monkeypatch, dtype, shape, names, in_specs, out_specs, x_shape, w_shape):
    mesh = jax_trn2.make_mesh(shape, names)
    body = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)  # noqa: E731
    fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    placed = global_executable(fn, x, w)
    # one product, of the global shape: the matmul's own result was dropped; no copies
    (call,) = custom_calls(placed)
    rows, cols = jax.eval_shape(fn, x, w).shape
    assert f"f32[{','.join(['1'] * len(shape))},{rows},{cols}]" in call
    assert moves(placed) == []
    got = run(placed, x, w)
    # jax_trn2.jit's result, from the chips' pieces (the product in its executor layout)
    pieces = jax_trn2.jit(fn).lower(x, w).compile()
    assert moves(pieces.executable) == []
    np.testing.assert_array_equal(np.asarray(pieces(x, w)), got)
    copied(monkeypatch)
    want = run(global_executable(fn, x, w), x, w)
    np.testing.assert_array_equal(got, want)
    # and the sums are a matmul's (FP32 sums of exact products: 1e-5 of their magnitude)
    np.testing.assert_allclose(got, np.asarray(fn(x, w)), rtol=1e-4, atol=1e-4)


def test_a_result_used_again_or_rounded_stochastically_is_not_placed(rng):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((16, K)).astype(np.float32)
    w = rng.standard_normal((K, 64)).astype(np.float32)

    def twice(x, w):
        y = x @ w
        return y, y * 2

    both = jax.shard_map(twice, mesh=mesh, in_specs=(P("a"), P(None, "b")),
                         out_specs=(P("a", "b"), P("a", "b")))
    compiled = global_executable(both, x, w)
    (call,) = custom_calls(compiled)
    assert "f32[2,4,8,16]" in call  # the product in its executor layout, unshard copies it
    y, y2 = compiled.execute([x, w])
    np.testing.assert_array_equal(np.asarray(y2), 2 * np.asarray(y))

    once = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("a"), P(None, "b")),
                         out_specs=P("a", "b"))
    stochastic = global_executable(once, x, w, rounding="stochastic")
    (call,) = custom_calls(stochastic)
    assert "f32[2,4,8,16]" in call


def test_a_placed_product_is_no_workspace(rng, monkeypatch):
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    fn = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("a"), P(None, "b")),
                       out_specs=P("a", "b"))
    x = rng.standard_normal((64, K)).astype(np.float32)
    w = rng.standard_normal((K, 256)).astype(np.float32)
    program = global_executable(fn, x, w).program
    matmuls = [i for i in program.instructions if isinstance(i, isa.Matmul)]
    assert matmuls and executor.workspace_values(program) == ()
    # stochastic rounding places nothing: the product is kept as a workspace
    stochastic = global_executable(fn, x, w, rounding="stochastic")
    assert stochastic._workspace_values == (matmuls[0].outs[0],)
    # but not where the program returns it, as its chips' pieces (the caller's to keep)
    pieces = jax_trn2.jit(fn, rounding="stochastic").lower(x, w).compile().executable
    assert pieces._chip_outputs == (0,) and pieces._workspace_values == ()


def test_a_left_operand_whose_contraction_is_not_contiguous_is_copied(rng, monkeypatch):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    fn = jax.shard_map(lambda x, w: x.T @ w, mesh=mesh, in_specs=(P(None, "a"), P(None, "b")),
                       out_specs=P("a", "b"))
    x = rng.standard_normal((K, 16)).astype(np.float32)
    w = rng.standard_normal((K, 64)).astype(np.float32)
    compiled = global_executable(fn, x, w)
    assert any("transpose(" in line for line in moves(compiled))  # x^T, contraction last
    got = run(compiled, x, w)
    copied(monkeypatch)
    np.testing.assert_array_equal(got, run(global_executable(fn, x, w), x, w))


def test_an_integer_matmul_is_not_placed_and_keeps_its_workspace(rng, monkeypatch):
    """Integer products are exact host GEMMs, not the native loop, so the Unshard copies."""
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)
    mesh = jax_trn2.make_mesh((8,), ("i",))
    fn = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("i"), P()),
                       out_specs=P("i"))
    x = rng.integers(-8, 8, (512, 128)).astype(np.int32)
    w = rng.integers(-8, 8, (128, 256)).astype(np.int32)
    program = jax_trn2.jit(fn).lower(x, w).compile().executable.program
    kept = executor.workspace_values(program)
    assert kept and kept == executor.workspace_values(
        program, rounding=numerics.Rounding("stochastic"))


def to_bf16(fn):
    return lambda *args: fn(*args).astype(jnp.bfloat16)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_product_converted_to_bf16_is_written_rounded(rng, monkeypatch, dtype):
    """One custom call, of a BF16 result: the FP32 product was dropped, and is no
    workspace; the bits of XLA's conversion of the FP32 product (the product returned
    too, so the loop does not round it), on the global and the chips' pieces paths."""
    monkeypatch.setattr(executor, "WORKSPACE_MIN_BYTES", 1024)
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    product = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)  # noqa: E731
    specs = dict(mesh=mesh, in_specs=(P("a"), P(None, "b")))
    x = rng.standard_normal((64, K)).astype(dtype)
    w = rng.standard_normal((K, 256)).astype(dtype)
    rounded = global_executable(jax.shard_map(to_bf16(product), out_specs=P("a", "b"),
                                              **specs), x, w)
    (call,) = custom_calls(rounded)
    assert "bf16[2,4,32,64]" in call
    assert rounded._workspace_values == ()
    def also_fp32(x, w):
        y = product(x, w)
        return y, y.astype(jnp.bfloat16)

    both = global_executable(jax.shard_map(also_fp32, out_specs=(P("a", "b"),) * 2, **specs),
                             x, w)
    (call,) = custom_calls(both)
    assert "f32[2,4,32,64]" in call
    want = np.asarray(both.execute([x, w])[1])
    assert want.dtype == jnp.bfloat16
    np.testing.assert_array_equal(run(rounded, x, w).view(np.uint16), want.view(np.uint16))
    pieces = jax_trn2.jit(jax.shard_map(to_bf16(product), out_specs=P("a", "b"), **specs))
    np.testing.assert_array_equal(np.asarray(pieces(x, w)).view(np.uint16),
                                  want.view(np.uint16))


def test_a_product_used_again_or_rounded_stochastically_is_converted_after(rng):
    """The loop writes the FP32 product: XLA converts it after (for stochastic rounding,
    the program's rounding hook)."""
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((16, K)).astype(np.float32)
    w = rng.standard_normal((K, 64)).astype(np.float32)
    specs = dict(mesh=mesh, in_specs=(P("a"), P(None, "b")))

    def twice(x, w):
        y = x @ w
        return y.astype(jnp.bfloat16), y * 2

    compiled = global_executable(jax.shard_map(twice, out_specs=(P("a", "b"),) * 2, **specs),
                                 x, w)
    (call,) = custom_calls(compiled)
    assert "f32[2,4,8,16]" in call
    once = jax.shard_map(to_bf16(lambda x, w: x @ w), out_specs=P("a", "b"), **specs)
    stochastic = global_executable(once, x, w, rounding="stochastic")
    (call,) = custom_calls(stochastic)
    assert "f32[2,4,8,16]" in call
