"""Hand-written SPMD StableHLO modules (mhlo.num_replicas x mhlo.num_partitions, no
sdy.mesh) through Client.compile, with every process-grouping strategy of the StableHLO
spec. Expected values are computed here with numpy from the spec's definitions.

The grid is 2 replicas x 8 partitions on the 16 chips of a trn2: process (r, p) is device
r * 8 + p, and device d holds x[d] = 100 * d + [0, 1, 2, 3].
"""

import numpy as np
import pytest

import jax_trn2

R, P = 2, 8
N = R * P
X = (100 * np.arange(N)[:, None] + np.arange(4)[None, :]).astype(np.float32)
F4 = "tensor<4xf32>"

ADD = """({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    })"""
CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"
GLOBAL_IDS = "use_global_device_ids"


def module(body: str, result_types: str, replicas: int = R, partitions: int = P,
           arg_type: str = F4) -> str:
    grid = f"mhlo.num_replicas = {replicas} : i32, mhlo.num_partitions = {partitions} : i32"
    return f"""
module attributes {{{grid}}} {{
  func.func public @main(%x: {arg_type}) -> ({result_types}) {{
{body}
  }}
}}"""


def collective(name: str, attrs: list[str], out_type: str = F4, in_type: str = F4,
               reducer: bool = False) -> str:
    """A body of one collective on %x that returns its result."""
    region = f" {ADD}" if reducer else ""
    return (f'    %0 = "stablehlo.{name}"(%x){region} {{{", ".join(attrs)}}}\n'
            f"      : ({in_type}) -> {out_type}\n"
            f"    return %0 : {out_type}")


def groups_attr(groups, name: str = "replica_groups") -> str:
    groups = np.asarray(groups)
    return f"{name} = dense<{groups.tolist()}> : tensor<{groups.shape[0]}x{groups.shape[1]}xi64>"


@pytest.fixture(scope="module")
def client():
    return jax_trn2.client("trn2")


def run(client, text: str, inputs=X) -> list[np.ndarray]:
    """Each output stacked over devices: [output][device, ...]."""
    results = client.compile(text).execute_sharded([[x] for x in inputs])
    return [np.stack([np.asarray(r[i]) for r in results]) for i in range(len(results[0]))]


def process(d: int) -> tuple[int, int]:
    return divmod(d, P)


# --- the spec's strategies, as flattened-id groups -------------------------------------------


def cross_replica(replica_groups):
    return [[r * P + p for r in group] for group in replica_groups for p in range(P)]


def cross_partition(partition_groups):
    return [[r * P + p for p in group] for group in partition_groups for r in range(R)]


def cross_replica_and_partition(replica_groups):
    """Replica-major, as XLA and the StableHLO interpreter order it (openxla/stablehlo#1933)."""
    return [[r * P + p for r in group for p in range(P)] for group in replica_groups]


def group_of(groups, d):
    return next(g for g in groups if d in g)


SCRAMBLED = [[3, 12, 0, 7], [1, 2, 15, 4], [5, 6, 9, 10], [8, 11, 13, 14]]
PAIRED = [[15, 0], [1, 14], [2, 13], [3, 12], [4, 11], [5, 10], [6, 9], [7, 8]]


# --- tests ----------------------------------------------------------------------------------


def test_partition_and_replica_ids(client):
    body = """    %p = stablehlo.partition_id : tensor<ui32>
    %r = stablehlo.replica_id : tensor<ui32>
    return %p, %r : tensor<ui32>, tensor<ui32>"""
    p, r = run(client, module(body, "tensor<ui32>, tensor<ui32>"))
    np.testing.assert_array_equal(p, np.arange(N) % P)
    np.testing.assert_array_equal(r, np.arange(N) // P)


@pytest.mark.parametrize("mode, attrs, groups", [
    ("cross_replica", [groups_attr([[0, 1]])], cross_replica([[0, 1]])),
    ("cross_replica_and_partition", [groups_attr([[0], [1]]), CHANNEL],
     cross_replica_and_partition([[0], [1]])),
    ("flattened_ids", [groups_attr(SCRAMBLED), GLOBAL_IDS, CHANNEL], SCRAMBLED),
])
def test_all_reduce_modes(client, mode, attrs, groups):
    (got,) = run(client, module(collective("all_reduce", attrs, reducer=True), F4))
    for d in range(N):
        np.testing.assert_array_equal(got[d], X[group_of(groups, d)].sum(0), err_msg=mode)


@pytest.mark.parametrize("mode, attrs, groups", [
    # Members in the group's order: replica 1 first.
    ("cross_replica", [groups_attr([[1, 0]])], cross_replica([[1, 0]])),
    # Replica-major: (0, 0), (0, 1), ..., (1, 0), (1, 1), ...
    ("cross_replica_and_partition", [groups_attr([[0, 1]]), CHANNEL],
     cross_replica_and_partition([[0, 1]])),
    ("flattened_ids", [groups_attr(PAIRED), GLOBAL_IDS, CHANNEL], PAIRED),
])
def test_all_gather_modes_keep_rank_order(client, mode, attrs, groups):
    out = f"tensor<{4 * len(groups[0])}xf32>"
    body = collective("all_gather", ["all_gather_dim = 0 : i64"] + attrs, out)
    (got,) = run(client, module(body, out))
    for d in range(N):
        np.testing.assert_array_equal(got[d], X[group_of(groups, d)].ravel(), err_msg=mode)


def test_all_reduce_over_an_inline_mesh_sub_axis_of_64_bit_integers(client):
    """Replica groups named by a sub-axis of an inline mesh (what XLA's HLO-to-StableHLO
    conversion writes): on mesh x=2, y=8 with device d = 8 x + y, the sub-axis "y":(1)2 is
    y's major factor, so each group is {d, d + 4} for y < 4. The operands are int64 values
    past 2**32 given per device, which must keep their type."""
    mesh = ('#stablehlo.mesh<axes = [#stablehlo.mesh_axis<name = "x", size = 2>, '
            '#stablehlo.mesh_axis<name = "y", size = 8>]>')
    groups = ("replica_groups = #stablehlo.replica_group_mesh_axes<mesh = " + mesh +
              ', axes = [#stablehlo.axis_ref<name = "y", sub_axis_info = (1)2>]>')
    i64 = "tensor<4xi64>"
    body = collective("all_reduce", [groups, GLOBAL_IDS, CHANNEL], i64, i64, reducer=True)
    text = module(body.replace("f32", "i64"), i64, arg_type=i64)
    x = (2 ** 40 * np.arange(N)[:, None] + np.arange(4)[None, :]).astype(np.int64)
    (got,) = run(client, text, x)
    assert got.dtype == np.int64
    for d in range(N):
        partner = d + 4 if d % 8 < 4 else d - 4
        np.testing.assert_array_equal(got[d], x[d] + x[partner])


def test_reduce_scatter_flattened_ids(client):
    groups = [[d, d + 8] for d in range(8)]  # replica 0 and 1 of each partition
    attrs = ["scatter_dimension = 0 : i64", groups_attr(groups), GLOBAL_IDS, CHANNEL]
    body = collective("reduce_scatter", attrs, "tensor<2xf32>", reducer=True)
    (got,) = run(client, module(body, "tensor<2xf32>"))
    for d in range(N):
        group = group_of(groups, d)
        rank = group.index(d)
        np.testing.assert_array_equal(got[d], X[group].sum(0)[2 * rank: 2 * rank + 2])


@pytest.mark.parametrize("mode, attrs, groups", [
    ("cross_replica", [groups_attr([[1, 0]])], cross_replica([[1, 0]])),
    ("cross_partition", [groups_attr([[0, 1, 2, 3], [7, 6, 5, 4]]), CHANNEL],
     cross_partition([[0, 1, 2, 3], [7, 6, 5, 4]])),
])
def test_all_to_all_modes(client, mode, attrs, groups):
    size = len(groups[0])
    x = np.tile(X, (1, size))  # [N, 4 * size]: `size` blocks of 4
    t = f"tensor<{4 * size}xf32>"
    dims = ["split_dimension = 0 : i64", "concat_dimension = 0 : i64",
            f"split_count = {size} : i64"]
    (got,) = run(client, module(collective("all_to_all", dims + attrs, t, t), t, arg_type=t), x)
    for d in range(N):
        group = group_of(groups, d)
        rank = group.index(d)
        want = np.concatenate([x[s].reshape(size, 4)[rank] for s in group])
        np.testing.assert_array_equal(got[d], want, err_msg=mode)


@pytest.mark.parametrize("mode, pairs, attrs", [
    ("cross_replica", [[0, 1], [1, 0]], []),  # swap the replicas of each partition
    ("cross_partition", [[0, 1], [1, 2], [2, 3], [5, 4]], [CHANNEL]),  # 0, 5..7 get nothing
])
def test_collective_permute_modes(client, mode, pairs, attrs):
    body = collective("collective_permute",
                      [groups_attr(pairs, "source_target_pairs")] + attrs)
    (got,) = run(client, module(body, F4))
    for d in range(N):
        r, p = process(d)
        own = r if mode == "cross_replica" else p
        source = next((s for s, t in pairs if t == own), None)
        if source is None:
            want = np.zeros(4, np.float32)
        else:
            want = X[source * P + p] if mode == "cross_replica" else X[r * P + source]
        np.testing.assert_array_equal(got[d], want, err_msg=f"{mode} device {d}")


def test_collective_broadcast_cross_partition(client):
    body = collective("collective_broadcast", [groups_attr([[3, 0, 1]]), CHANNEL])
    (got,) = run(client, module(body, F4))
    for d in range(N):
        r, p = process(d)
        want = X[r * P + 3] if p in (3, 0, 1) else np.zeros(4, np.float32)
        np.testing.assert_array_equal(got[d], want)


def test_loop_with_a_collective_and_a_per_process_trip_count(client):
    """Each process runs partition_id + 1 iterations of x = all_reduce(x) / 2 over its
    replica pair (cross_replica): both members of a pair take as many iterations."""
    body = f"""    %p = stablehlo.partition_id : tensor<ui32>
    %one = stablehlo.constant dense<1> : tensor<ui32>
    %limit = stablehlo.add %p, %one : tensor<ui32>
    %zero = stablehlo.constant dense<0> : tensor<ui32>
    %half = stablehlo.constant dense<0.5> : {F4}
    %n, %y = stablehlo.while(%i = %zero, %v = %x) : tensor<ui32>, {F4}
     cond {{
      %go = stablehlo.compare LT, %i, %limit, UNSIGNED : (tensor<ui32>, tensor<ui32>)
        -> tensor<i1>
      stablehlo.return %go : tensor<i1>
    }} do {{
      %s = "stablehlo.all_reduce"(%v) {ADD} {{{groups_attr([[0, 1]])}}} : ({F4}) -> {F4}
      %h = stablehlo.multiply %s, %half : {F4}
      %next = stablehlo.add %i, %one : tensor<ui32>
      stablehlo.return %next, %h : tensor<ui32>, {F4}
    }}
    return %y : {F4}"""
    (got,) = run(client, module(body, F4))
    for d in range(N):
        r, p = process(d)
        np.testing.assert_array_equal(got[d], (X[p] + X[P + p]) / 2)  # the mean: a fixed point


def test_execute_gives_every_device_the_same_arguments(client):
    body = f"""    %0 = "stablehlo.all_reduce"(%x) {ADD} {{{groups_attr([[0, 1]])}, {CHANNEL}}}
      : ({F4}) -> {F4}
    %p = stablehlo.partition_id : tensor<ui32>
    return %0, %p : {F4}, tensor<ui32>"""
    executable = client.compile(module(body, f"{F4}, tensor<ui32>"))
    total, partition = executable.execute([X[5]])
    np.testing.assert_array_equal(total, X[5] * N)  # one group of all 16 processes
    assert int(partition) == 0  # device 0's results
    assert executable.program.mesh.axis_sizes == (R, P)


def test_fewer_processes_than_chips_run_on_the_first_chips(client):
    """PJRT's default device assignment: process d on device d; the other chips idle."""
    groups = np.arange(8)[None, :]
    body = collective("all_reduce", [groups_attr(groups), CHANNEL, GLOBAL_IDS], reducer=True)
    executable = client.compile(module(body, F4, replicas=1, partitions=8))
    assert [d.id for d in executable.devices()] == list(range(8))
    results = executable.execute_sharded([[x] for x in X[:8]])
    for out in results:
        np.testing.assert_array_equal(np.asarray(out[0]), X[:8].sum(0))
    assert "chips 0-7 (8 of 16)" in executable.as_text()


def test_more_processes_than_chips_is_an_error(client):
    text = module(f"    return %x : {F4}", F4, replicas=2, partitions=16)
    with pytest.raises(ValueError, match=r"2 replicas x 16 partitions = 32 processes.*only 16 "
                                         r"devices"):
        client.compile(text)


def test_replica_groups_that_miss_a_replica_are_rejected(client):
    body = collective("all_reduce", [groups_attr([[0]])], reducer=True)
    with pytest.raises(jax_trn2.LoweringError, match="cross_replica.*replica ids 0..1"):
        client.compile(module(body, F4))


def test_sixty_four_processes_on_trn2_ultra():
    """4 replicas x 16 partitions: the replica axis takes a torus axis of the 4x4x4 mesh."""
    body = collective("all_reduce", [groups_attr([[0, 1, 2, 3]])], reducer=True)
    x = (np.arange(64)[:, None] * np.ones(4)).astype(np.float32)
    (got,) = run(jax_trn2.client(), module(body, F4, replicas=4, partitions=16), x)
    p = np.arange(64) % 16
    np.testing.assert_array_equal(got, sum(x[r * 16 + p] for r in range(4)))


def test_caller_chooses_the_device_assignment(client):
    """Processes on chips of the caller's choosing: 4 processes on one ring of trn2."""
    groups = np.arange(4)[None, :]
    body = collective("all_reduce", [groups_attr(groups), CHANNEL, GLOBAL_IDS], reducer=True)
    ring = client.devices()[0:16:4]  # chips 0, 4, 8, 12: a ring along x
    executable = client.compile(module(body, F4, replicas=1, partitions=4),
                                device_assignment=ring)
    assert executable.devices() == ring
    results = executable.execute_sharded([[x] for x in X[:4]])
    np.testing.assert_array_equal(np.asarray(results[3][0]), X[:4].sum(0))
    with pytest.raises(ValueError, match="needs 4 distinct chip ids"):
        client.compile(module(body, F4, replicas=1, partitions=4), device_assignment=[0, 0, 1, 2])
