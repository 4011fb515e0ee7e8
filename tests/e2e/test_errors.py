"""Bad input gets an error that names what is wrong and where, never a wrong result."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
import lowering

MESH = jax_trn2.make_mesh()


def matmul_psum(a, b):
    return jax.lax.psum(a @ b, "y")


STEP = jax_trn2.jit(jax.shard_map(matmul_psum, mesh=MESH, in_specs=(P("x", "y"), P("y", None)),
                                  out_specs=P("x", None)))
A = np.ones((8, 16), np.float32)
B = np.ones((16, 4), np.float32)


@pytest.fixture(scope="module")
def compiled():
    return STEP.lower(A, B).compile()


def test_wrong_argument_count(compiled):
    executable = compiled.executable
    with pytest.raises(TypeError, match=r"expected 2 arguments .*got 1"):
        executable.execute([A])


@pytest.mark.parametrize("b, got", [(np.ones((16, 8), np.float32), r"float32\[16,8\]"),
                                    (np.ones((16, 4), np.int32), r"int32\[16,4\]"),
                                    (np.ones((16, 4), jnp.bfloat16), r"bfloat16\[16,4\]")])
def test_wrong_shape_or_dtype_names_the_argument(compiled, b, got):
    with pytest.raises(TypeError, match=rf"argument 'b'.*expected float32\[16,4\], got {got}"):
        compiled.executable.execute([A, b])


def test_compiled_function_checks_its_arguments(compiled):
    with pytest.raises(TypeError, match=r"argument 'a'.*expected float32\[8,16\]"):
        compiled(np.ones((8, 8), np.float32), B)
    with pytest.raises(TypeError, match="structure"):
        compiled(A, B, A)


def test_mesh_shape_larger_than_the_topology():
    with pytest.raises(ValueError, match=r"'trn2-ultra' has only 64 chips"):
        jax_trn2.make_mesh((4, 4, 8))
    with pytest.raises(ValueError, match=r"'trn2' has only 16 chips"):
        jax_trn2.make_mesh((4, 8), topology="trn2")


def test_op_without_a_rule_names_the_op_and_the_users_line(monkeypatch):
    """Every op jax emits for jnp.sin has a rule; with the rule taken away the error must
    name stablehlo.sine and the line of this file that called jnp.sin."""
    monkeypatch.delitem(lowering.RULES, "stablehlo.sine")

    def body(x):
        return jnp.sin(x) * 2  # the user's line
    line = inspect.getsourcelines(body)[1] + 1

    step = jax_trn2.jit(jax.shard_map(body, mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    with pytest.raises(lowering.UnsupportedOpError) as error:
        step(np.ones((8,), np.float32))
    message = str(error.value)
    assert "stablehlo.sine is not supported by jax-trn2" in message
    assert f"{__file__}:{line}:" in message
    assert "return jnp.sin(x) * 2  # the user's line" in message


def test_unsupported_custom_call_is_named():
    with pytest.raises(lowering.UnsupportedOpError, match=r"stablehlo.custom_call @\w+"):
        jax_trn2.jit(lambda x: jax.ffi.ffi_call("vendor_fused_kernel", x)(x))(
            np.eye(4, dtype=np.float32))


@pytest.mark.parametrize("shape, message", [
    ((-8, -8), r"positive ints, got -8 at position 0 of axis_shapes \(-8, -8\)"),
    ((4.0, 16), r"positive ints, got 4.0 at position 0 of axis_shapes \(4.0, 16\)"),
    ((4, 0), r"positive ints, got 0 at position 1 of axis_shapes \(4, 0\)"),
    ((True, 4), r"positive ints, got True at position 0 of axis_shapes \(True, 4\)"),
    ((4, np.bool_(True)), r"positive ints, got np.True_ at position 1"),
    (8, r"axis_shapes must be a sequence of positive ints, got 8"),
])
def test_make_mesh_rejects_bad_shapes_where_they_are_given(shape, message):
    with pytest.raises(ValueError, match=message):
        jax_trn2.make_mesh(shape)


def test_make_mesh_takes_string_axis_names_only():
    with pytest.raises(ValueError, match=r"axis names must be strings, got 1 \(int\) at "
                                         r"position 1 of axis_names \('a', 1\)"):
        jax_trn2.make_mesh((8, 8), ("a", 1))
    assert jax_trn2.make_mesh((8,), "data").axis_names == ("data",)  # as jax.sharding.Mesh
    assert jax_trn2.make_mesh((np.int64(2), 4), ("a", "b")).shape == {"a": 2, "b": 4}


def test_make_mesh_names_more_than_six_axes():
    mesh = jax_trn2.make_mesh((2, 2, 2, 2, 2, 2, 1))
    assert mesh.axis_names == tuple(f"axis{i}" for i in range(7))
    with pytest.raises(ValueError, match=r"axis_names \('a',\) and axis_shapes \(2, 4\)"):
        jax_trn2.make_mesh((2, 4), ("a",))
