"""jax_trn2.jit with jax.jit's sharding arguments: XLA's SPMD partitioner makes each chip's
program (lowering.partition), which runs on the simulated mesh; results against the same
program under jax.jit on 64 CPU host devices, collectives against XLA:CPU's own compiled
program, per-chip costs against the global program's."""

import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import jax_trn2
import lowering.partition
from e2e_reference import assert_matches, cpu_mesh
from mesh import isa

SHAPE, NAMES = (4, 4, 4), ("data", "fsdp", "tensor")


@pytest.fixture(scope="module")
def mesh():
    return cpu_mesh(SHAPE, NAMES)


def mlp_loss(params, x):
    h = jax.nn.relu(x @ params["w1"])
    return jnp.mean((h @ params["w2"]) ** 2)


def sgd_step(params, x):
    loss, grads = jax.value_and_grad(mlp_loss)(params, x)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def mlp_data(rng):
    params = {"w1": rng.standard_normal((32, 64)).astype(np.float32) / 8,
              "w2": rng.standard_normal((64, 16)).astype(np.float32) / 8}
    return params, rng.standard_normal((64, 32)).astype(np.float32)


def param_shardings(mesh):
    return {"w1": NamedSharding(mesh, P("fsdp", "tensor")),
            "w2": NamedSharding(mesh, P("tensor", "fsdp"))}


def collectives(program: isa.Program) -> list[isa.Instruction]:
    return [i for i in program.instructions if i.engine == isa.COLLECTIVE]


def test_named_shardings_in_and_out_with_donation(rng, mesh):
    params, x = mlp_data(rng)
    kwargs = dict(in_shardings=(param_shardings(mesh), NamedSharding(mesh, P(("data", "fsdp")))),
                  out_shardings=(param_shardings(mesh), NamedSharding(mesh, P())),
                  donate_argnums=0)
    step = jax_trn2.jit(sgd_step, **kwargs)
    got = step(params, x)
    assert_matches(got, jax.jit(sgd_step, **kwargs)(params, x))
    assert collectives(step.lower(params, x).program)  # the partitioner's, now on the torus


def test_partition_specs_under_set_mesh_with_prefix_and_none(rng, mesh):
    params, x = mlp_data(rng)
    kwargs = dict(in_shardings=(P(None, "tensor"), P("data")), out_shardings=None)
    with jax.set_mesh(mesh):
        got = jax_trn2.jit(sgd_step, **kwargs)(params, x)
        want = jax.jit(sgd_step, **kwargs)(params, x)
    assert_matches(got, want)


def test_explicit_axes_mesh_sharding_in_types(rng):
    mesh = jax.make_mesh(SHAPE, NAMES, axis_types=(AxisType.Explicit,) * 3,
                         devices=jax.devices("cpu")[:64])
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    loss = lambda x, w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("data"))
        w = jax.device_put(w, P(None, "tensor"))
        got = jax_trn2.jit(jax.grad(loss, argnums=1))(x, w)
        want = jax.jit(jax.grad(loss, argnums=1))(x, w)
    assert_matches(got, want)


def test_shard_map_over_some_axes_inside_a_partitioned_program(rng, mesh):
    x = rng.standard_normal((16, 64)).astype(np.float32)

    def f(x):
        y = jnp.sin(x) * 2
        inner = jax.shard_map(lambda b: jax.lax.psum(b, "tensor"), mesh=mesh,
                              in_specs=P(None, "tensor"), out_specs=P(None, None),
                              axis_names={"tensor"})
        return inner(y) + 1

    kwargs = dict(in_shardings=NamedSharding(mesh, P("data", "tensor")))
    assert_matches(jax_trn2.jit(f, **kwargs)(x), jax.jit(f, **kwargs)(x))


def test_sharding_constraint_inside(rng, mesh):
    a = rng.standard_normal((16, 32)).astype(np.float32)

    def f(a):
        b = jax.lax.with_sharding_constraint(jnp.tanh(a), NamedSharding(mesh, P("fsdp", None)))
        return b @ b.T

    kwargs = dict(in_shardings=NamedSharding(mesh, P(None, "tensor")))
    assert_matches(jax_trn2.jit(f, **kwargs)(a), jax.jit(f, **kwargs)(a))


def _xla_collective_kinds(jax_jitted, *args) -> Counter:
    """How many collectives of each kind XLA:CPU's compiled program holds."""
    text = jax_jitted.lower(*args).compile().as_text()
    return Counter(re.findall(r" (all-gather|all-reduce|reduce-scatter|all-to-all|"
                              r"collective-permute)(?:-start)?\(", text))


def test_listing_holds_the_collectives_xla_cpu_compiles(rng, mesh):
    params, x = mlp_data(rng)
    kwargs = dict(in_shardings=(param_shardings(mesh), NamedSharding(mesh, P(("data", "fsdp")))),
                  out_shardings=(param_shardings(mesh), NamedSharding(mesh, P())))
    program = jax_trn2.jit(sgd_step, **kwargs).lower(params, x).program
    ours = {{isa.AllGather: "all-gather", isa.AllReduce: "all-reduce",
             isa.ReduceScatter: "reduce-scatter", isa.AllToAll: "all-to-all",
             isa.CollectivePermute: "collective-permute"}[type(i)] for i in collectives(program)}
    xla = _xla_collective_kinds(jax.jit(sgd_step, **kwargs), params, x)
    # XLA:CPU's later passes combine collectives (fewer ops), never change their kinds.
    assert ours == set(xla), (ours, xla)


def test_per_chip_flops_are_the_global_share(rng, mesh):
    x = jax.ShapeDtypeStruct((1024, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    matmul = lambda x, w: x @ w  # noqa: E731
    sharded = jax_trn2.jit(matmul, in_shardings=(NamedSharding(mesh, P(("data", "fsdp"))),
                                                 NamedSharding(mesh, P(None, "tensor"))))
    per_chip = sharded.lower(x, w).compile().cost_analysis()["flops"]
    global_ = jax_trn2.jit(matmul).lower(x, w).compile().cost_analysis()["flops"]
    assert global_ == 2 * 1024 * 256 * 512
    assert per_chip == global_ / 64  # batch split 16 ways, columns 4 ways, no collective


def apply_layer(w, x):
    return jnp.tanh(x @ w)


def test_inserted_collectives_name_the_sharding_change_and_source_line(mesh):
    # A big replicated-per-row batch and a small FSDP weight: gathering the weight is the
    # partitioner's cheapest plan (the alternative all-reduces a 4096x64 partial product).
    x = jax.ShapeDtypeStruct((4096, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    step = jax_trn2.jit(apply_layer, in_shardings=(NamedSharding(mesh, P("fsdp", None)),
                                                   NamedSharding(mesh, P("data"))))
    line = apply_layer.__code__.co_firstlineno + 1
    assert re.search(
        re.escape("inserted by XLA's SPMD partitioner: all-gather of w: P('fsdp', None) -> "
                  "P(None, None) over fsdp for the dot_general at ")
        + rf"(tests/e2e/)?test_partitioned_programs\.py:{line}\b", step.lower(w, x).as_text())


def test_user_collectives_are_not_marked_inserted(rng, mesh):
    def f(x):
        body = jax.shard_map(lambda b: jax.lax.psum(b, "tensor"), mesh=mesh,
                             in_specs=P("data", "tensor"), out_specs=P("data", None))
        return body(x) * 2

    x = rng.standard_normal((16, 8)).astype(np.float32)
    program = jax_trn2.jit(f, in_shardings=NamedSharding(mesh, P("data", "tensor"))).lower(
        x).program
    reductions = [i for i in collectives(program) if isinstance(i, isa.AllReduce)]
    assert reductions and not any(i.why for i in reductions)


def test_partitioning_runs_once_per_signature(rng, mesh, monkeypatch):
    calls = []
    real = lowering.partition.partition
    monkeypatch.setattr(lowering.partition, "partition",
                        lambda *a: calls.append(1) or real(*a))
    params, x = mlp_data(rng)
    step = jax_trn2.jit(mlp_loss, in_shardings=(param_shardings(mesh), None))
    step(params, x)
    step(params, x)
    assert len(calls) == 1


def test_client_compile_partitions_a_sharded_module(rng, mesh):
    params, x = mlp_data(rng)
    jitted = jax.jit(mlp_loss, in_shardings=(param_shardings(mesh), None))
    executable = jax_trn2.client().compile(jitted.lower(params, x).as_text())
    (loss,) = executable.execute([params["w1"], params["w2"], x])
    assert_matches(loss, jitted(params, x))


def test_execute_sharded_takes_the_parameter_shardings_pieces(rng, mesh):
    a = rng.standard_normal((16, 8)).astype(np.float32)
    jitted = jax.jit(lambda a: a * 2, in_shardings=NamedSharding(mesh, P("data", "tensor")),
                     out_shardings=NamedSharding(mesh, P(None, "tensor")))
    executable = jax_trn2.client().compile(jitted.lower(a).as_text())
    pieces = [[a[(d // 16) * 4:(d // 16 + 1) * 4, (d % 4) * 2:(d % 4 + 1) * 2]]
              for d in range(64)]  # device d = (data, fsdp, tensor) row-major
    results = executable.execute_sharded(pieces)
    for d, (piece,) in enumerate(results):
        np.testing.assert_array_equal(np.asarray(piece.to_jax()),
                                      2 * a[:, (d % 4) * 2:(d % 4 + 1) * 2])


# --- bad input: jax.jit's errors, naming the argument -------------------------------------

def test_an_axis_the_mesh_lacks(rng, mesh):
    with pytest.raises(ValueError, match="'model'"):
        jax_trn2.jit(jnp.sin, in_shardings=NamedSharding(mesh, P("model"))).lower(
            np.zeros((8,), np.float32))


def test_a_dimension_its_axes_do_not_divide(mesh):
    with pytest.raises(ValueError, match=r"args\[0\]|x"):
        jax_trn2.jit(jnp.sin, in_shardings=NamedSharding(mesh, P("data"))).lower(
            np.zeros((6,), np.float32))


def test_in_shardings_of_the_wrong_structure(rng, mesh):
    params, x = mlp_data(rng)
    with pytest.raises(ValueError, match="in_shardings"):
        jax_trn2.jit(mlp_loss, in_shardings=({"w1": None}, None)).lower(params, x)


def test_a_mesh_larger_than_the_topology(rng):
    big = jax.sharding.Mesh(np.array(jax.devices("cpu")[:64]).reshape(64), ("d",))
    with pytest.raises(ValueError, match="16 chips"):
        jax_trn2.jit(jnp.sin, in_shardings=NamedSharding(big, P("d")), topology="trn2").lower(
            np.zeros((64,), np.float32))


# --- what XLA's HLO spells differently from jax's StableHLO ---------------------------------

def test_ops_hlo_spells_differently_survive_partitioning(rng):
    """The partitioned module comes back from HLO: erf is mhlo.erf, top_k is mhlo.topk, a
    LAPACK call returns a tuple and keeps its options (uplo) in `backend_config`, and a
    host callback finds its function by that config's index."""
    mesh = cpu_mesh((2, 4), ("a", "b"))
    x = rng.standard_normal((8, 16)).astype(np.float32)
    seen = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), x.sum())
        gram = x[:, :8] @ x[:, :8].T + jnp.eye(8)
        return jax.lax.erf(x), jax.lax.top_k(x, 3), jnp.linalg.cholesky(gram)

    kwargs = dict(in_shardings=NamedSharding(mesh, P("a", "b")))
    got = jax_trn2.jit(f, **kwargs)(x)
    assert len(seen) == 1  # the callback's operand is replicated: it runs once, as on CPU
    assert_matches(got, jax.jit(f, **kwargs)(x))


def test_ordered_effects_and_donation_in_a_partitioned_program(rng):
    """The partitioned module keeps jax's token argument and result for ordered effects:
    they are made on the chip, not passed, and donations count the arguments after it."""
    from jax.experimental import io_callback

    mesh = cpu_mesh((4, 2), ("a", "b"))
    x = rng.standard_normal((8, 4)).astype(np.float32)
    seen = []

    def f(x, y):
        z = io_callback(lambda a: seen.append(1) or np.asarray(a) + 1,
                        jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)
        return jnp.sin(z) @ y.T, y * 2

    kwargs = dict(in_shardings=NamedSharding(mesh, P("a", "b")), donate_argnums=1)
    step = jax_trn2.jit(f, **kwargs)
    assert step.lower(x, x).memory_analysis().alias_size_in_bytes == x.nbytes // 8
    got = step(x, x)
    assert seen == [1]
    assert_matches(got, jax.jit(f, **kwargs)(x, x))


def test_a_function_without_results(rng, mesh):
    x = rng.standard_normal((8,)).astype(np.float32)
    assert jax_trn2.jit(lambda x: (), in_shardings=NamedSharding(mesh, P("data")))(x) == ()


def test_what_xla_cpu_cannot_compile_after_partitioning(rng):
    """Only the partitioned module is wanted: XLA:CPU failing later (it has no all-reduce
    of int2) does not stop the program, whose maxima are checked against numpy."""
    mesh = cpu_mesh((2, 4), ("a", "b"))
    x = rng.integers(-2, 2, (8, 16)).astype(jnp.int2)
    f = jax_trn2.jit(lambda x: x.max(1), in_shardings=NamedSharding(mesh, P("a", "b")))
    np.testing.assert_array_equal(np.asarray(f(x), np.int8), np.asarray(x, np.int8).max(1))


def test_a_function_without_arguments(mesh):
    """XLA leaves no parameter shardings on a partitioned program without parameters: it is
    still each chip's program, whose result pieces are assembled (here into 4 x 4 tiles)."""
    tiles = jax.shard_map(lambda: jnp.full((1, 1), 3.0) + jax.lax.axis_index("fsdp"),
                          mesh=mesh, in_specs=(), out_specs=P("data", "fsdp"))
    kwargs = dict(out_shardings=NamedSharding(mesh, P("data", "fsdp")))  # so partitioned
    got = jax_trn2.jit(tiles, **kwargs)()
    assert got.shape == (4, 4)
    assert_matches(got, jax.jit(tiles, **kwargs)())


def test_results_carry_the_shardings_jax_jit_gives(rng, mesh):
    """A result's sharding is its type's on an explicit mesh, or the out_shardings asked
    for, as jax.jit's: so a shard_map over an explicit mesh, which wants its arguments'
    types to match its in_specs, takes the result of one program as the next's argument."""
    explicit = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2,
                             devices=jax.devices("cpu")[:8])
    x = rng.standard_normal((8, 16)).astype(np.float32)
    with jax.set_mesh(explicit):
        x = jax.device_put(x, P("a", "b"))
        double = jax_trn2.jit(lambda x: x * 2)
        assert double(x).sharding == jax.jit(lambda x: x * 2)(x).sharding
        row_sums = jax_trn2.jit(jax.shard_map(lambda x: jax.lax.psum(x, "b"),
                                              in_specs=P("a", "b"), out_specs=P("a", None)))
        got = row_sums(double(x))
        assert jax.typeof(got) == jax.typeof(jax.jit(row_sums)(jax.jit(double)(x)))
    assert_matches(got, jax.jit(row_sums)(x * 2))
    sharding = NamedSharding(mesh, P(None, "tensor"))
    assert jax_trn2.jit(jnp.sin, out_shardings=sharding)(np.ones((8, 8), np.float32)).sharding \
        == sharding


def test_shard_maps_over_several_meshes_of_the_same_devices(rng):
    """jax lets shard_maps in one program use different meshes of one device order (here
    a (2, 4) mesh, its flattening and its (4, 2) reshaping): XLA's partitioner makes one
    per-chip program of them, whose ppermutes name devices of every mesh."""
    def program(mesh):
        devices, auto = mesh.devices, (AxisType.Auto,) * 2
        flat = jax.sharding.Mesh(devices.reshape(8), ("f",), axis_types=auto[:1])
        tall = jax.sharding.Mesh(devices.reshape(4, 2), ("a", "b"), axis_types=auto)
        ring = lambda n: [(i, (i + 1) % n) for i in range(n)]
        first = jax.shard_map(lambda v: jax.lax.ppermute(v, "b", ring(4)), mesh=mesh,
                              in_specs=P("a", "b"), out_specs=P("a", "b"))
        second = jax.shard_map(lambda v: jax.lax.ppermute(v, "f", ring(8)), mesh=flat,
                               in_specs=P(None, "f"), out_specs=P(None, "f"))
        third = jax.shard_map(lambda v: jax.lax.psum(v, "a") + jax.lax.axis_index("b"),
                              mesh=tall, in_specs=P("a", "b"), out_specs=P(None, "b"))
        return lambda x: third(second(first(x)))

    x = rng.integers(-100, 100, (4, 8)).astype(np.int32)
    got = jax_trn2.jit(program(jax_trn2.make_mesh((2, 4), ("a", "b"))))(x)
    assert_matches(got, jax.jit(program(cpu_mesh((2, 4), ("a", "b"))))(x), exact=True)


def test_results_carry_the_shardings_xla_chose(rng, mesh):
    """Without out_shardings, jax.jit names the sharding XLA's partitioner chose for each
    result on the mesh of the arguments' (or jax.set_mesh's): so a training loop that feeds
    a step's results back keeps its parameters sharded, and runs the same program each
    step, as under jax.jit."""
    params, x = mlp_data(rng)
    params = jax.device_put(params, param_shardings(mesh))
    x = jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
    step = jax_trn2.jit(sgd_step)
    got, want = step(params, x), jax.jit(sgd_step)(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.sharding == w.sharding, (g.sharding, w.sharding)
    assert got[0]["w1"].sharding == params["w1"].sharding  # a step keeps the layout
    assert_matches(step(*got[:1], x), jax.jit(sgd_step)(*want[:1], x))
    assert len(step._cache) == 1  # the second step is the first one's program
    with jax.set_mesh(mesh):  # a constraint on host arrays: the context mesh names it
        doubled = jax_trn2.jit(lambda a: jax.lax.with_sharding_constraint(2 * a, P("tensor")))
        assert doubled(np.ones((8, 4), np.float32)).sharding == \
            NamedSharding(mesh, P("tensor"))


def test_shard_map_results_of_host_arrays_are_laid_out_as_shardy_propagates(rng):
    """With host arrays in, jax.jit lays a shard_map's results out by its out_specs, and
    the results of the ops after it as Shardy's propagation carries them on (an add keeps
    the layout, a transpose swaps it, a total is replicated): so do these results."""
    mesh = cpu_mesh((2, 4), ("a", "b"))

    def f(x):
        y = jax.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P("a", "b"),
                          out_specs=P("a", "b"))(x)
        return y, y + 1, y.sum(), y.T

    x = rng.standard_normal((8, 8)).astype(np.float32)
    got, want = jax_trn2.jit(f)(x), jax.jit(f)(x)
    for g, w in zip(got, want):
        assert (g.sharding, g.committed) == (w.sharding, w.committed)
    assert_matches(got, want)  # (the total is summed in another order)


@pytest.mark.parametrize("size", [4, 512])  # copied in by the call; the same memory (1 MiB)
def test_results_go_to_the_device_of_arguments_committed_to_one(rng, size):
    x = rng.standard_normal((size, size)).astype(np.float32)
    for device in (jax.devices()[0], jax.devices()[3]):
        got = jax_trn2.jit(lambda a: a + 1)(jax.device_put(x, device))
        assert got.sharding == SingleDeviceSharding(device) and got.committed
        np.testing.assert_array_equal(got, x + 1)


def test_results_go_where_out_shardings_or_the_context_mesh_put_them(rng, mesh):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    pinned = SingleDeviceSharding(jax.devices()[2])
    assert jax_trn2.jit(lambda a: a * 2, out_shardings=pinned)(x).sharding == pinned
    made_before = jnp.asarray(x)
    with jax.set_mesh(mesh):  # a program without shardings runs replicated over the mesh
        got = jax_trn2.jit(lambda a: a * 2)(made_before)
        want = jax.jit(lambda a: a * 2)(made_before)
    assert (got.sharding, got.committed) == (want.sharding, want.committed)


def test_compiled_input_and_output_shardings_are_jax_jits(rng, mesh):
    """Compiled.input_shardings and output_shardings: the layouts jax.jit's compiled
    function takes and gives (equivalent shardings: jax names the ones XLA chose for host
    arguments as GSPMDShardings)."""
    small = cpu_mesh((2, 4), ("a", "b"))
    sm = jax.shard_map(lambda v, w: (v * 2, w), mesh=small, in_specs=(P("a", "b"), P()),
                       out_specs=(P("a", "b"), P()))

    def shard_mapped(x, d):
        y, w = sm(x, d["w"])
        return {"y": y + 1, "total": y.sum()}, w

    x = rng.standard_normal((8, 8)).astype(np.float32)
    cases = [(shard_mapped, (x, {"w": np.ones(4, np.float32)})),
             (lambda a: a * 2, (jax.device_put(x, NamedSharding(mesh, P("data"))),)),
             (lambda a: a * 2, (x,))]
    for f, args in cases:
        ours, theirs = (j(f).lower(*args).compile() for j in (jax_trn2.jit, jax.jit))
        for got, want in ((ours.input_shardings, theirs.input_shardings),
                          (ours.output_shardings, theirs.output_shardings)):
            assert jax.tree.structure(got) == jax.tree.structure(want)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                assert g.is_equivalent_to(w, 2), (g, w)  # (every split array is 2-D)


def test_a_compiled_function_refuses_arguments_committed_elsewhere(rng, mesh):
    """As jax.jit's compiled functions: an argument committed to another sharding is an
    error naming it (an uncommitted one is moved)."""
    x = rng.standard_normal((8, 8)).astype(np.float32)
    xa = jax.device_put(x, NamedSharding(mesh, P("data")))
    xb = jax.device_put(x, NamedSharding(mesh, P("fsdp")))
    compiled = jax_trn2.jit(lambda v: v * 2).lower(xa).compile()
    np.testing.assert_array_equal(np.asarray(compiled(xa)), x * 2)
    np.testing.assert_array_equal(np.asarray(compiled(x)), x * 2)
    with pytest.raises(ValueError, match=r"argument 'v': got NamedSharding.*'fsdp'"):
        compiled(xb)
    with pytest.raises(ValueError, match="disagree"):
        jax.jit(lambda v: v * 2).lower(xa).compile()(xb)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("f", [
    lambda v: v.sum(0),                    # no result as large per device: kept
    lambda v: v.astype(jnp.bfloat16),      # half the bytes: kept
    lambda v: (v * 2).astype(jnp.int32),   # as many bytes per device: written into, deleted
])
def test_donated_sharded_arguments_are_deleted_when_xla_would_use_them(rng, mesh, f):
    """jax marks a sharded argument a buffer donor; XLA writes a result of as many bytes
    per device into it, or leaves it to the caller."""
    x = rng.standard_normal((8, 16)).astype(np.float32)
    sharding = NamedSharding(mesh, P("data", "fsdp"))
    ours, theirs = jax.device_put(x, sharding), jax.device_put(x, sharding)
    got = jax_trn2.jit(f, donate_argnums=0)(ours)
    want = jax.jit(f, donate_argnums=0)(theirs)
    assert ours.is_deleted() == theirs.is_deleted()
    # sum(0) adds the pieces of its chips in another order: a few FP32 ulps of values ~1
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=1e-6, atol=1e-6)


def test_arguments_the_function_does_not_use_are_dropped_as_jax_drops_them(rng, mesh):
    """jax.jit drops unused arguments (unless keep_unused): their shardings neither place
    the results nor have to agree with the others' devices."""
    w = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32),
                       NamedSharding(mesh, P(None, "tensor")))
    elsewhere = jax.device_put(np.ones((8, 16), np.float32), jax.devices()[12])
    for J in (jax.jit, jax_trn2.jit):
        zeros = J(lambda p: jnp.zeros_like(p))(w)
        assert zeros.sharding == SingleDeviceSharding(jax.devices()[0]) and not zeros.committed
        np.testing.assert_array_equal(np.asarray(J(lambda x, unused: x * 2)(w, elsewhere)),
                                      np.asarray(w) * 2)
    kept = jax_trn2.jit(lambda p: jnp.zeros_like(p), keep_unused=True)(w)
    assert kept.sharding == jax.jit(lambda p: jnp.zeros_like(p), keep_unused=True)(w).sharding


@pytest.mark.parametrize("spec", [P("data"), P("data", "fsdp"), P(None, "tensor")])
def test_results_on_a_mesh_of_explicit_and_auto_axes(rng, spec):
    """A result type on such a mesh names its Explicit axes and leaves the Auto ones to the
    partitioner: the result gets what it chose, as under jax.jit."""
    mesh = jax.make_mesh(SHAPE, NAMES, devices=jax.devices("cpu")[:64],
                         axis_types=(AxisType.Explicit, AxisType.Auto, AxisType.Auto))
    x = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32),
                       NamedSharding(mesh, spec))
    with jax.set_mesh(mesh):
        got, want = jax_trn2.jit(lambda v: v * 2)(x), jax.jit(lambda v: v * 2)(x)
    assert got.sharding.is_equivalent_to(want.sharding, 2) and jax.typeof(got) == jax.typeof(want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_donated_array_jax_moves_first_is_not_the_callers(rng, mesh):
    """Donated but elsewhere than in_shardings put it: jax copies it there and donates the
    copy, so the caller's array stays valid."""
    sharding = NamedSharding(mesh, P("data", "fsdp"))
    for J in (jax.jit, jax_trn2.jit):
        z = jnp.ones((8, 16))  # uncommitted, on the default device
        J(lambda v: v + 1, donate_argnums=0, in_shardings=sharding)(z)
        assert not z.is_deleted()
        placed = jax.device_put(jnp.ones((8, 16)), sharding)
        J(lambda v: v + 1, donate_argnums=0, in_shardings=sharding)(placed)
        assert placed.is_deleted()


@pytest.mark.parametrize("f, out_shardings", [
    (lambda v: jax.device_put(v * 2, jax.memory.Space.Host), None),
    (lambda v: v + 1, SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")),
])
def test_results_placed_in_host_memory_come_back_there(rng, f, out_shardings):
    """Offloading (a memory kind of pinned_host): the result comes back in the memory
    jax.jit puts it in."""
    x = rng.standard_normal(8).astype(np.float32)
    options = {} if out_shardings is None else {"out_shardings": out_shardings}
    got, want = jax_trn2.jit(f, **options)(x), jax.jit(f, **options)(x)
    assert got.sharding.memory_kind == want.sharding.memory_kind == "pinned_host"
    assert jax.typeof(got) == jax.typeof(want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_result_of_a_program_that_offloads_is_committed_as_jax_commits_it():
    """Gradient checkpointing that offloads to pinned_host: jax names the results' memory
    ("device"), and so commits them."""
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["h"],
        offload_src="device", offload_dst="pinned_host")

    def loss(w, x):
        h = checkpoint_name(x @ w, "h")
        return jnp.sum(jnp.tanh(h) ** 2)

    grad = jax.grad(jax.checkpoint(loss, policy=policy))
    w, x = jnp.ones((8, 8)) * 0.1, jnp.ones((4, 8))
    got, want = jax_trn2.jit(grad)(w, x), jax.jit(grad)(w, x)
    assert got.committed and want.committed and got.sharding == want.sharding
    # tanh and the 8-long dots round differently (the chips' FP32 order): ulps of values ~0.2
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
