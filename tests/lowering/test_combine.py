"""lowering.combine: independent all-reduces of a block become one variadic all-reduce."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import lowering
from lowering import combine, mlir
from mesh import isa

_SUM = """({
      ^bb0(%l: tensor<f32>, %r: tensor<f32>):
        %s = stablehlo.add %l, %r : tensor<f32>
        stablehlo.return %s : tensor<f32>
    })"""
_MAX = _SUM.replace("stablehlo.add", "stablehlo.maximum")


def _all_reduce(result: str, operand: str, groups: str = "[[0, 1], [2, 3]]", channel: int = 1,
                body: str = _SUM, shape: str = "4x4xf32") -> str:
    return (f'%{result} = "stablehlo.all_reduce"(%{operand}) <{{channel_handle = '
            f'#stablehlo.channel_handle<handle = {channel}, type = 1>, replica_groups = '
            f'dense<{groups}> : tensor<2x2xi64>, use_global_device_ids}}> {body} : '
            f'(tensor<{shape}>) -> tensor<{shape}>')


def _combined(body: str, args: str = "%a: tensor<4x4xf32>, %b: tensor<4x4xf32>, "
              "%c: tensor<4x4xf32>", results: str = "tensor<4x4xf32>, tensor<4x4xf32>, "
              "tensor<4x4xf32>"):
    """The module of `main(args) -> results { body }`, its all-reduces combined."""
    module = mlir.parse(f"func.func @main({args}) -> ({results}) {{\n{body}\n}}")
    combine.combine_all_reduces(module)
    module.operation.verify()
    return module


def _main_block(module):
    return module.body.operations[0].regions[0].blocks[0]


def _operand_counts(module) -> list[int]:
    """The operand count of each all-reduce of main, in order."""
    return [len(op.operands) for op in _main_block(module).operations
            if op.operation.name == "stablehlo.all_reduce"]


def test_independent_all_reduces_become_one_with_all_operands():
    module = _combined("\n".join([
        _all_reduce("x", "a"), "%t = stablehlo.tanh %x : tensor<4x4xf32>",
        _all_reduce("y", "b", channel=2), _all_reduce("z", "c", channel=3),
        "return %t, %y, %z : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>"]))
    assert _operand_counts(module) == [3]
    # the tanh that read the first result moved after the combined all-reduce
    block = _main_block(module)
    combined, tanh, _ = block.operations
    assert list(combined.operation.operands) == list(block.arguments)
    assert tanh.operation.name == "stablehlo.tanh"


def test_an_all_reduce_of_anothers_result_stays_separate():
    module = _combined("\n".join([
        _all_reduce("x", "a"), "%t = stablehlo.tanh %x : tensor<4x4xf32>",
        _all_reduce("y", "t", channel=2), _all_reduce("z", "c", channel=3),
        "return %x, %y, %z : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>"]))
    # %y reads %x (through the tanh): the set {x} ends; %y and %z combine
    assert _operand_counts(module) == [1, 2]


def test_different_groups_or_reductions_stay_separate():
    module = _combined("\n".join([
        _all_reduce("x", "a"), _all_reduce("y", "b", groups="[[0, 2], [1, 3]]", channel=2),
        _all_reduce("z", "c", channel=3, body=_MAX),
        "return %x, %y, %z : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>"]))
    assert _operand_counts(module) == [1, 1, 1]


def test_a_side_effect_reading_a_result_is_not_moved():
    module = _combined("\n".join([
        _all_reduce("x", "a"),
        'stablehlo.custom_call @print(%x) {has_side_effect = true} : (tensor<4x4xf32>) -> ()',
        _all_reduce("y", "b", channel=2), _all_reduce("z", "c", channel=3),
        "return %x, %y, %z : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>"]))
    assert _operand_counts(module) == [1, 2]


def test_a_combined_all_reduce_stays_under_the_size_threshold():
    elements = combine.COMBINE_THRESHOLD_BYTES // 4 // 2  # f32: half the threshold each
    shape = f"{elements}xf32"
    args = ", ".join(f"%{n}: tensor<{shape}>" for n in "abc")
    module = _combined("\n".join(
        [_all_reduce(r, a, channel=i + 1, shape=shape) for i, (r, a) in enumerate(
            zip("xyz", "abc"))] + [f"return %x, %y, %z : {', '.join([f'tensor<{shape}>'] * 3)}"]),
        args=args, results=", ".join([f"tensor<{shape}>"] * 3))
    assert _operand_counts(module) == [2, 1]


def test_a_partitioned_programs_gradients_are_one_all_reduce():
    """The all-reduces XLA's partitioner inserts after a data-parallel gradient (one per
    weight) are one collective in the lowered program."""
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices("cpu")[:4])
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    ws = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=replicated) for s in [(8, 16), (16, 4)]]
    x = jax.ShapeDtypeStruct((32, 8), jnp.float32, sharding=rows)

    def loss(ws, x):
        return jnp.tanh(jnp.tanh(x @ ws[0]) @ ws[1]).sum()

    program = lowering.lower(jax.jit(jax.grad(loss)).lower(ws, x).as_text())
    (all_reduce,) = [i for i in program.instructions if isinstance(i, isa.AllReduce)]
    # (the partitioner reduces each weight's gradient, as the transpose of the weight)
    assert sorted(program.values[v].type.size for v in all_reduce.ins) == [16 * 4, 8 * 16]
