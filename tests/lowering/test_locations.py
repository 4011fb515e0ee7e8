"""An op's MLIR location read as the user's scopes, the user's line and the library line
(lowering.mlir.location, user_scope), built as jax builds them."""

import sysconfig

import pytest
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

from lowering import mlir

FLAX = "/venv/lib/python3.11/site-packages/flax/linen/linear.py"
USER = "/home/me/model.py"


def op_location(name_stack: str, *frames: tuple[str, int]) -> ir.Location:
    """jax's location of an op: its name stack around the call sites of `frames` (path,
    line), innermost first."""
    positions = [ir.Location.name("f", ir.Location.file(path, line, 1)) for path, line in frames]
    site = positions[0] if len(positions) == 1 else \
        ir.Location.callsite(positions[0], positions[1:])
    return ir.Location.name(name_stack, site)


@pytest.fixture(autouse=True)
def context():
    with jax_mlir.make_ir_context():
        yield


def test_a_library_line_is_kept_beside_the_users_line_that_called_it():
    where = mlir.location(op_location("jit(step)/jvp(Model)/Dense_0/dot_general",
                                      (FLAX, 287), (USER, 12), (USER, 40)))
    assert where == mlir.Location(f"{USER}:12:1", f"{FLAX}:287:1",
                                  "jit(step)/jvp(Model)/Dense_0/dot_general")


def test_the_standard_library_is_a_library():
    stdlib = sysconfig.get_paths()["stdlib"] + "/functools.py"
    where = mlir.location(op_location("jit(f)/mul", (stdlib, 9), (USER, 3)))
    assert (where.source, where.via) == (f"{USER}:3:1", f"{stdlib}:9:1")


def test_an_op_with_only_library_frames_is_at_the_librarys_line():
    where = mlir.location(op_location("jit(update)/mul", (FLAX, 287)))
    assert (where.source, where.via) == (f"{FLAX}:287:1", "")


@pytest.mark.parametrize("name_stack, scope", [
    ("jit(step)/jvp(Model)/block0/attn/q/dot_general", "Model/block0/attn/q"),
    ("jit(step)/transpose(jvp(Model))/block0/attn/q/dot_general", "Model/block0/attn/q"),
    # a rematerialized module's backward pass re-enters its scope
    ("jit(f)/transpose(jvp(Net))/jvp(Net)/checkpoint/rem/dot_general", "Net/rem"),
    ("jit(f)/jvp()/while/body/add", ""),  # jax's own scopes: a scan's loop
    ("jit(f)/cond/branch_1_fun/decoder/mul", "decoder"),
    ("jit(f)/jvp(myscope)/jit(inner)", "myscope"),  # a call of a jitted function
    ("jit(f)/transpose(jvp(vmap(mlp)))/neg", "mlp"),
    ("layers/mlp/dot_general", "layers/mlp"),  # a function jax lowered out of line
    # an op XLA's partitioning passes merged from two: their names joined by ';'
    ("jit(f)/transpose(jvp(Model))/mul;jit(f)/transpose(jvp(Model))/broadcast_in_dim", "Model"),
    ("jit(f)", ""),
    ("", ""),
])
def test_user_scope_is_the_name_stack_without_jax_own_names(name_stack, scope):
    assert mlir.user_scope(name_stack) == scope
