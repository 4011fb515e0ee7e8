"""Decoding replica groups and permutation pairs into logical mesh axes."""

from __future__ import annotations

import itertools

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

