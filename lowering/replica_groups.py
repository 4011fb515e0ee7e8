"""Decoding replica groups and permutation pairs into logical mesh axes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mesh import isa


def axis_groups(mesh: isa.MeshSpec, axes: tuple[int, ...]) -> np.ndarray:
    """The groups [n_groups, size] of devices that differ only along `axes`, members in
    row-major order over `axes` (the order jax emits for a collective over those axes)."""
    ids = np.arange(mesh.num_devices).reshape(mesh.axis_sizes)
    rest = [a for a in range(mesh.rank) if a not in axes]
    size = int(np.prod([mesh.axis_sizes[a] for a in axes], dtype=np.int64))
    return ids.transpose(rest + list(axes)).reshape(-1, size)


def decode_groups(groups: np.ndarray, mesh: isa.MeshSpec) -> isa.Groups:
    """Replica groups (logical device ids) as isa.Groups, naming the mesh axes they span
    when they are exactly the lines of the mesh along some axes, in rank order."""
    groups = np.asarray(groups, dtype=np.int64)
    if groups.size == 0:  # the spec's empty groups: every device in one group
        groups = np.arange(mesh.num_devices)[None, :]
    if groups.ndim != 2:
        raise ValueError(f"replica groups of shape {groups.shape}: expected [groups, size]")
    members = np.sort(groups.ravel())
    if not np.array_equal(members, np.arange(mesh.num_devices)):
        raise ValueError(f"replica groups {groups.tolist()} do not partition the "
                         f"{mesh.num_devices} devices of mesh {mesh}")
    as_tuples = tuple(tuple(int(d) for d in g) for g in groups)
    wanted = set(as_tuples)
    for axes in _candidate_axes(mesh, groups.shape[1]):
        if set(map(tuple, axis_groups(mesh, axes).tolist())) == wanted:
            return isa.Groups(as_tuples, axes)
    return isa.Groups(as_tuples, None)


def _candidate_axes(mesh: isa.MeshSpec, group_size: int):
    """Ordered tuples of distinct non-trivial mesh axes whose sizes multiply to group_size."""
    nontrivial = [a for a in range(mesh.rank) if mesh.axis_sizes[a] > 1]
    if group_size == 1:
        yield ()
        return
    for k in range(1, len(nontrivial) + 1):
        for axes in itertools.permutations(nontrivial, k):
            if int(np.prod([mesh.axis_sizes[a] for a in axes])) == group_size:
                yield axes



# --- the StableHLO process grid ------------------------------------------------------------

# How a collective's replica_groups (or source_target_pairs) name processes: the grouping
# strategies of the StableHLO spec ("Parallel execution", "Collective ops").
CROSS_REPLICA = "cross_replica"
CROSS_PARTITION = "cross_partition"
CROSS_REPLICA_AND_PARTITION = "cross_replica_and_partition"
FLATTENED_IDS = "flattened_ids"


def mesh_axes_groups(mesh: isa.MeshSpec,
                     axes: tuple[tuple[str, tuple[int, int] | None], ...]) -> np.ndarray:
    """Flattened device ids [groups, size] of replica groups named by axes of `mesh`
    (row-major device ids): one group per coordinate of the other axes, members ordered by
    the named (sub-)axes, the first major. A sub-axis (pre_size, size) of an axis is the part
    of size `size` after the major `pre_size` (Shardy's `"x":(pre_size)size`)."""
    pieces: list[tuple[str, int, int]] = []  # (axis, pre_size, size) of each part, major first
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        cuts = {1, size}
        for axis, sub in axes:
            if axis == name and sub is not None:
                cuts |= {sub[0], sub[0] * sub[1]}
        cuts_sorted = sorted(cuts)
        if any(b % a for a, b in zip(cuts_sorted, cuts_sorted[1:])) or cuts_sorted[-1] != size:
            raise ValueError(f"sub-axes {axes} do not divide axis {name} of size {size}")
        pieces += [(name, a, b // a) for a, b in zip(cuts_sorted, cuts_sorted[1:])]
    selected: list[int] = []
    for axis, sub in axes:
        if axis not in mesh.axis_names:
            raise ValueError(f"replica groups name axis {axis!r}, not an axis of {mesh}")
        low, high = (1, mesh.axis_sizes[mesh.axis_names.index(axis)] + 1) if sub is None \
            else (sub[0], sub[0] * sub[1])
        selected += [i for i, (n, pre, _) in enumerate(pieces) if n == axis and low <= pre < high]
    others = [i for i in range(len(pieces)) if i not in selected]
    ids = np.arange(mesh.num_devices).reshape([size for _, _, size in pieces] or [1])
    group_size = int(np.prod([pieces[i][2] for i in selected], dtype=np.int64))
    return ids.transpose(others + selected).reshape(-1, group_size)


def grouping_mode(op_name: str, channel_id: int, use_global_device_ids: bool) -> str:
    """The spec's grouping strategy of a collective op from its channel_id and
    use_global_device_ids (all_gather, all_reduce, reduce_scatter have three; all_to_all,
    collective_permute and collective_broadcast two)."""
    if op_name.split(".")[-1] in ("all_to_all", "ragged_all_to_all", "collective_permute",
                                  "collective_broadcast"):
        return CROSS_PARTITION if channel_id > 0 else CROSS_REPLICA
    if use_global_device_ids:
        if channel_id <= 0:
            raise ValueError("use_global_device_ids needs a channel_id > 0 (StableHLO spec)")
        return FLATTENED_IDS
    return CROSS_REPLICA_AND_PARTITION if channel_id > 0 else CROSS_REPLICA


@dataclass(frozen=True)
class ProcessGrid:
    """StableHLO's process grid (num_replicas x num_partitions) laid on the logical mesh.

    A process's flattened id, replica_id * num_partitions + partition_id, is its logical
    device id: the replica id is the row-major index of its mesh coordinates along
    `replica_axes` and the partition id that along `partition_axes` (replica axes first).
    A shard_map program (with an sdy.mesh) is one replica whose partitions are the mesh's
    devices; a module with mhlo.num_replicas/num_partitions and no sdy.mesh runs on the mesh
    ('replica', 'partition') of those sizes.
    """

    mesh: isa.MeshSpec
    replica_axes: tuple[int, ...]
    partition_axes: tuple[int, ...]

    @property
    def num_replicas(self) -> int:
        return int(np.prod([self.mesh.axis_sizes[a] for a in self.replica_axes], dtype=np.int64))

    @property
    def num_partitions(self) -> int:
        return int(np.prod([self.mesh.axis_sizes[a] for a in self.partition_axes],
                           dtype=np.int64))

    def process_groups(self, groups: np.ndarray, mode: str, complete: bool = True) -> np.ndarray:
        """Flattened-id groups [n_groups, size] (members in rank order) of a collective's
        `replica_groups` read as the spec's `mode` says; empty groups mean one group of all.
        The groups must hold every id once, or at most once when not `complete`."""
        r, p = self.num_replicas, self.num_partitions
        groups = self._check_ids(groups, mode, complete)
        if mode == CROSS_REPLICA:  # each group once per partition
            ids = groups[:, None, :] * p + np.arange(p)[None, :, None]
            return ids.reshape(-1, groups.shape[1])
        if mode == CROSS_PARTITION:  # each group once per replica
            ids = (np.arange(r) * p)[None, :, None] + groups[:, None, :]
            return ids.reshape(-1, groups.shape[1])
        if mode == CROSS_REPLICA_AND_PARTITION:  # a group's replicas in every partition
            # Replica-major: (r0, p0), (r0, p1), ..., (r1, p0), ... as XLA orders the group
            # (and the StableHLO interpreter since openxla/stablehlo#1933; the spec's formula
            # lists the partition loop outermost)
            ids = groups[:, :, None] * p + np.arange(p)[None, None, :]
            return ids.reshape(groups.shape[0], -1)
        return groups

    def process_pairs(self, pairs: np.ndarray, mode: str) -> np.ndarray:
        """Flattened-id (source, target) pairs [n, 2] of collective_permute's
        `source_target_pairs` (replica ids for cross_replica, partition ids otherwise)."""
        r, p = self.num_replicas, self.num_partitions
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        limit = r if mode == CROSS_REPLICA else p
        if pairs.size and (pairs.min() < 0 or pairs.max() >= limit):
            raise ValueError(f"source_target_pairs name {_id_kind(mode)} ids outside "
                             f"0..{limit - 1}")
        if mode == CROSS_REPLICA:
            return (pairs[None, :, :] * p + np.arange(p)[:, None, None]).reshape(-1, 2)
        return ((np.arange(r) * p)[:, None, None] + pairs[None, :, :]).reshape(-1, 2)

    def _check_ids(self, groups: np.ndarray, mode: str, complete: bool) -> np.ndarray:
        count = {CROSS_REPLICA: self.num_replicas, CROSS_PARTITION: self.num_partitions,
                 CROSS_REPLICA_AND_PARTITION: self.num_replicas,
                 FLATTENED_IDS: self.num_replicas * self.num_partitions}[mode]
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size == 0:
            return np.arange(count)[None, :]
        if groups.ndim != 2:
            raise ValueError(f"replica groups of shape {groups.shape}: expected [groups, size]")
        ids = np.sort(groups.ravel())
        valid = np.array_equal(ids, np.arange(count)) if complete else \
            (ids.min() >= 0 and ids.max() < count and (np.diff(ids) > 0).all())
        if not valid:
            times = "exactly once" if complete else "at most once"
            raise ValueError(
                f"replica groups {groups.tolist()} ({mode}) must hold each of the {count} "
                f"{_id_kind(mode)} ids 0..{count - 1} {times} (process grid: "
                f"{self.num_replicas} replicas x {self.num_partitions} partitions)")
        return groups


def _id_kind(mode: str) -> str:
    return {CROSS_REPLICA: "replica", CROSS_PARTITION: "partition",
            CROSS_REPLICA_AND_PARTITION: "replica", FLATTENED_IDS: "flattened process"}[mode]
