"""lowering.partition: XLA's per-chip module of a global program, remembered for the
asker after the lowering (the trn2 plugin's optimized program)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import lowering
from lowering import partition, protobuf


def _global_program() -> str:
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices("cpu")[:4])
    x = jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P("x", "y")))
    return jax.jit(lambda a: a.sum(0)).lower(x).as_text()


def test_a_programs_partitioned_module_is_made_once():
    text = _global_program()
    lowering.lower(text)
    again = lowering.partitioned_module(text)
    assert again is lowering.partitioned_module(text)  # remembered, not partitioned again
    assert "stablehlo.all_reduce" in str(again)
    assert lowering.partitioned_module(jax.jit(lambda a: a + 1).lower(1.0).as_text()) is None


def test_the_memory_keeps_the_last_few():
    texts = [jax.jit(lambda a, k=k: a.sum(0) * k, out_shardings=None).lower(
        jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(
            jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices("cpu")[:4]), P("x", "y"))))
        .as_text() for k in range(partition._PARTITIONED_KEPT + 2)]
    for text in texts:
        lowering.partitioned_module(text)
    assert len(partition._PARTITIONED) == partition._PARTITIONED_KEPT


def test_fields_left_out_of_a_message():
    message = protobuf.field_varint(1, 7) + protobuf.field_bytes(12, b"ab") + \
        protobuf.field_bytes(14, b"c") + protobuf.field_bytes(2, b"kept")
    assert list(protobuf.fields(protobuf.without(message, {12, 14}))) == [(1, 7), (2, b"kept")]


def test_a_programs_inspected_shardings_are_the_partitioners():
    """jax.debug.inspect_array_sharding inside jit, on the plugin's devices: in a program
    with nothing else to partition (a shard_map, a replicated value), as XLA:CPU says."""
    mesh = jax.sharding.Mesh(np.array(jax.devices("trn2")[:8]).reshape(2, 4), ("x", "y"))
    seen = []

    def inspected(a):
        jax.debug.inspect_array_sharding(a, callback=seen.append)
        return a + 1

    body = jax.jit(jax.shard_map(inspected, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    x = np.arange(32.0).reshape(8, 4)
    np.testing.assert_array_equal(body(jax.device_put(x, NamedSharding(mesh, P("x")))), x + 1)
    whole = jax.jit(inspected, in_shardings=NamedSharding(mesh, P()))
    np.testing.assert_array_equal(whole(x), x + 1)
    assert [s.spec for s in seen] == [P(), P()]
    assert all(s.mesh == mesh for s in seen)


def test_the_options_that_cut_the_compile_leave_the_partitioned_module_as_it_is(monkeypatch):
    """The compile stops after the partitioner with options that make XLA:CPU's later work
    cheaper (partition._UNTIL_THE_STOP); the partitioned module is the one XLA's default
    options give: a gradient on a 2x4 mesh, with a shard_map and a scan."""
    mesh = jax.make_mesh((2, 4), ("x", "y"), devices=jax.devices("cpu")[:8])

    def loss(w, a):
        h = jax.shard_map(lambda v: jax.lax.psum(jnp.tanh(v), "y"), mesh=mesh,
                          in_specs=P("x", "y"), out_specs=P("x"))(a @ w)
        return jax.lax.scan(lambda c, r: (c + jnp.sum(r * r), None), 0.0, h.T)[0]

    w = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P(None, "y")))
    a = jax.ShapeDtypeStruct((8, 16), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    module = lowering.mlir.parse(jax.jit(jax.grad(loss)).lower(w, a).as_text())
    cut, _ = partition._partition(module, 8)
    monkeypatch.setattr(partition, "_UNTIL_THE_STOP", ())
    default, _ = partition._partition(module, 8)
    assert "stablehlo.all_reduce" in str(cut) and str(cut) == str(default)


def test_replicating_constraints_leave_the_program_unpartitioned():
    """A program where nothing is split (its values constrained to replicated, as jax's
    eager ops on replicated arrays are) runs as it is; one constraint that splits a value
    sends it to XLA's partitioner. Both compute what the CPU does."""
    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("x", "y"))

    def program(spec):
        def f(a):
            b = jax.lax.with_sharding_constraint(jnp.sin(a) * 2, NamedSharding(mesh, spec))
            return jax.lax.with_sharding_constraint(b.sum(0), NamedSharding(mesh, P()))
        return jax.jit(f).lower(jnp.zeros((8, 4), jnp.float32)).as_text()

    replicated, split = program(P()), program(P("x", "y"))
    assert "sdy.sharding_constraint" in replicated
    assert not partition.needs_partitioning(lowering.mlir.parse(replicated))
    assert partition.needs_partitioning(lowering.mlir.parse(split))

    trn2_mesh = jax.sharding.Mesh(np.array(jax.devices("trn2")[:4]).reshape(2, 2), ("x", "y"))
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(8, 4)
    for spec in (P(), P("x", "y")):
        f = jax.jit(lambda a: jax.lax.with_sharding_constraint(
            jnp.sin(a) * 2, NamedSharding(trn2_mesh, spec)).sum(0))
        want = jax.jit(lambda a: (jnp.sin(a) * 2).sum(0))(jax.device_put(x, jax.devices("cpu")[0]))
        # FP32 sums of 8 terms: the split program adds two partial sums of 4 across chips
        # (another order than the CPU's), which can differ by an ulp of the sum.
        np.testing.assert_allclose(f(x), want, rtol=2e-7, atol=2e-6)


def test_custom_partitioning_goes_to_xlas_partitioner():
    """jax.experimental.custom_partitioning's call is answered by XLA's partitioner (with
    the user's Python callback), whatever else the program has to split: here nothing,
    its values being constrained to replicated."""
    from jax.experimental.custom_partitioning import custom_partitioning

    @custom_partitioning
    def sine(a):
        return jnp.sin(a)

    sine.def_partition(
        partition=lambda mesh, args, result: (mesh, jnp.sin, result.sharding,
                                              (args[0].sharding,)),
        infer_sharding_from_operands=lambda mesh, args, result: args[0].sharding,
        sharding_rule="i j -> i j")
    mesh = jax.sharding.Mesh(np.array(jax.devices("trn2")[:4]).reshape(2, 2), ("x", "y"))
    f = jax.jit(lambda a: jax.lax.with_sharding_constraint(sine(a), NamedSharding(mesh, P())))
    x = jax.device_put(np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8),
                       NamedSharding(mesh, P()))
    assert partition.needs_partitioning(lowering.mlir.parse(f.lower(x).as_text()))
    want = jnp.sin(jax.device_put(np.asarray(x), jax.devices("cpu")[0]))
    np.testing.assert_array_equal(f(x), want)  # sin of FP32, elementwise: the CPU's bits
