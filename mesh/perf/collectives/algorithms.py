"""The collective algorithms as steps of transfers: rings and lines axis by axis, rotated
rings, direct (all-pairs) and recursive halving-doubling (the package doc,
mesh.perf.collectives, lists them)."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from mesh.perf.collectives.network import Network, Pattern, Steps, grid_lines


# Largest group given the direct (all-pairs) candidates, whose n(n-1) transfers make them
# costly to evaluate and, like a collective library's one-shot algorithms, only ever worth
# it in small groups (all-to-all has no other algorithm and always gets them).
DIRECT_MAX_GROUP = 64


def candidate_steps(kind: str, grids: list[np.ndarray], m: float, net: Network,
                    on_rings: bool, only: str | None = None):
    """(name, steps, ring lengths) of every candidate algorithm for `kind`, or of the one
    named `only` (the others' steps are not built: building them is most of the cost)."""
    dims = list(range(grids[0].ndim))
    shape = grids[0].shape
    names = [net.axis_name(grids[0], d) for d in dims]
    ring_stages = {"all-gather": _all_gather, "reduce-scatter": _reduce_scatter,
                   "all-reduce": _all_reduce}.get(kind)
    if ring_stages is not None:
        # Lines first, so that where a line costs what a ring does (2 chips) it is named so.
        # a healthy machine has no broken links: no need to ask of every pair of neighbours
        broken = net.broken if net.topology.has_faults else None
        line = functools.partial(_line_stage, broken=broken)
        stages = (("line", line),) * (not on_rings) + (("ring", _ring_stage),)
        for (label, stage), order in itertools.product(stages, itertools.permutations(dims)):
            if len(dims) > 1:
                label = f"{label}s " + ">".join(names[d] for d in order)
            if only in (None, label):
                yield label, ring_stages(grids, order, m, stage), tuple(shape[d] for d in order)
        if len(dims) > 1:
            yield from _rotated(kind, ring_stages, grids, names, m, net, only)
        if _is_power_of_two(grids[0].size) and only in (None, RDH):
            yield RDH, _recursive_halving_doubling(kind, grids, m), ()
    if grids[0].size <= DIRECT_MAX_GROUP or ring_stages is None:
        yield from _direct(kind, grids, m, only)


def _ring_stage(grids: list[np.ndarray], dim: int, block: float) -> Steps:
    """k-1 steps of a bidirectional ring along grid dim `dim` of every group: each member
    sends half of a `block` to its next and the other half to its previous member."""
    k = grids[0].shape[dim]
    if k == 1:
        return []
    # every group at once, in the order of a loop over groups, then shifts -1 and +1
    stacked = np.stack(grids)
    members = np.stack([stacked, stacked], axis=1).ravel()
    peers = np.stack([np.roll(stacked, shift, axis=dim + 1) for shift in (-1, 1)],
                     axis=1).ravel()
    return [(Pattern(members, peers, np.full(members.size, block / 2)), k - 1)]


def _line_stage(grids: list[np.ndarray], dim: int, block: float, broken=None) -> Steps:
    """k-1 steps of a bidirectional line (a ring without its wraparound link: a segment of
    a torus ring, or a ring with a failed link, opened there) along grid dim `dim`: each
    step every member passes a whole `block` on to each neighbour it has, both ways
    pipelined, so a link carries (k-1) blocks each way, twice a ring's (k-1) half blocks.
    `broken(a, b)` says whether neighbours a and b lost their link."""
    k = grids[0].shape[dim]
    if k == 1:
        return []
    # [group, line, member], a line opened after its broken link (a healthy machine has none)
    lines = np.stack([np.array([_opened(line, broken) for line in grid_lines(grid, dim)])
                      if broken is not None else grid_lines(grid, dim) for grid in grids])
    lower = lines[:, :, :-1].reshape(len(grids), -1)
    upper = lines[:, :, 1:].reshape(len(grids), -1)
    # every group at once, in the order of a loop over groups
    src = np.concatenate([lower, upper], axis=1).ravel()
    dst = np.concatenate([upper, lower], axis=1).ravel()
    return [(Pattern(src, dst, np.full(src.size, block)), k - 1)]


def _opened(ring: np.ndarray, broken) -> np.ndarray:
    """The members of a ring as a line that starts after its first broken link, if any."""
    for r in range(len(ring)):
        if broken is not None and broken(int(ring[r - 1]), int(ring[r])):
            return np.roll(ring, -r)
    return ring


def _all_gather(grids, order, m, stage=_ring_stage) -> Steps:
    held = m / grids[0].size  # bytes each member holds before the first stage
    steps = []
    for d in order:
        steps += stage(grids, d, held)
        held *= grids[0].shape[d]
    return steps


def _reduce_scatter(grids, order, m, stage=_ring_stage) -> Steps:
    held = m
    steps = []
    for d in order:
        k = grids[0].shape[d]
        steps += stage(grids, d, held / k)
        held /= k
    return steps


def _all_reduce(grids, order, m, stage=_ring_stage) -> Steps:
    return _reduce_scatter(grids, order, m, stage) + \
        _all_gather(grids, tuple(reversed(order)), m, stage)


def _rotated(kind, ring_stages, grids, names, m, net: Network, only: str | None = None):
    """Rotated rings: one part of the buffer per axis, each starting on a different axis.

    The heaviest stage of part i is its first for reduce-scatter and all-reduce and its last
    for all-gather; the weighted split gives each part a share in proportion to the link
    bandwidth of the axis it uses there.
    """
    dims = list(range(grids[0].ndim))
    n = len(dims)
    for cyclic in _cyclic_orders(dims):
        orders = [cyclic[i:] + cyclic[:i] for i in range(n)]
        heavy = [o[-1] if kind == "all-gather" else o[0] for o in orders]
        bandwidth = np.array([net.axis_bandwidth(grids[0], d) for d in heavy])
        splits = {"": np.full(n, 1.0 / n), ", split by link bandwidth": bandwidth / bandwidth.sum()}
        if np.allclose(splits[""], splits[", split by link bandwidth"]):
            del splits[", split by link bandwidth"]
        label = ">".join(names[d] for d in cyclic)
        for suffix, shares in splits.items():
            name = f"rotated rings {label} ({n} parts{suffix})"
            if only not in (None, name):
                continue
            parts = [ring_stages(grids, order, m * share) for order, share in zip(orders, shares)]
            yield name, _concurrent(parts), \
                tuple(grids[0].shape[d] for d in cyclic)


RDH = "recursive halving-doubling"


def _is_power_of_two(n: int) -> bool:
    return n > 1 and n & (n - 1) == 0


def _recursive_halving_doubling(kind: str, grids: list[np.ndarray], m: float) -> Steps:
    """Recursive halving (reduce-scatter: at step s each member exchanges half of what it
    holds with the member P/2^(s+1) ranks away) and recursive doubling (all-gather: it
    exchanges all it holds with the member 2^s ranks away); all-reduce is both. Members are
    ranked in the grid's row-major order, so on a torus of power-of-two rings the partners
    lie along one axis at a time (a 4x4 torus is a 4-D hypercube)."""
    size = grids[0].size
    rounds = size.bit_length() - 1
    rank = np.arange(size)

    def exchange(distance: int, nbytes: float) -> tuple[Pattern, int]:
        parts = [Pattern(g.ravel(), g.ravel()[rank ^ distance], np.full(size, nbytes))
                 for g in grids]
        return Pattern.concat(parts), 1

    halving = [exchange(size >> (s + 1), m / 2 ** (s + 1)) for s in range(rounds)]
    doubling = [exchange(1 << s, m * 2 ** s / size) for s in range(rounds)]
    return {"reduce-scatter": halving, "all-gather": doubling,
            "all-reduce": halving + doubling}[kind]


def _cyclic_orders(dims: list[int]) -> list[list[int]]:
    """Axis orders up to rotation (each rotation is one part of the rotated algorithm)."""
    first, rest = dims[0], dims[1:]
    return [[first, *p] for p in itertools.permutations(rest)]


def _direct(kind, grids, m, only: str | None = None):
    members = [g.ravel() for g in grids]
    block = m / grids[0].size
    if kind == "all-reduce":
        if only in (None, "one-shot"):
            yield "one-shot", [(_all_pairs(members, m), 1)], ()
        if only in (None, "two-shot"):
            yield "two-shot", [(_all_pairs(members, block), 1)] * 2, ()
    elif only in (None, "direct"):
        yield "direct", [(_all_pairs(members, block), 1)], ()
    if kind == "all-to-all" and grids[0].ndim > 1 and only in (None, "direct axis by axis"):
        steps = [(_all_pairs([line for g in grids for line in grid_lines(g, d)], m / k), 1)
                 for d, k in enumerate(grids[0].shape) if k > 1]
        yield "direct axis by axis", steps, ()


def _all_pairs(member_sets: list[np.ndarray], nbytes: float) -> Pattern:
    """Every chip of each set sends `nbytes` to every other chip of its set."""
    parts = []
    for members in member_sets:
        src, dst = np.repeat(members, members.size), np.tile(members, members.size)
        keep = src != dst
        parts.append(Pattern(src[keep], dst[keep], np.full(int(keep.sum()), nbytes)))
    return Pattern.concat(parts)


def _concurrent(parts: list[Steps]) -> Steps:
    """Step sequences run side by side, step by step: step t carries each part's t-th step."""
    expanded = [[pattern for pattern, times in part for _ in range(times)] for part in parts]
    steps: Steps = []
    for t in range(max(len(e) for e in expanded)):
        pattern = Pattern.concat([e[t] for e in expanded if t < len(e)])
        if steps and _same(steps[-1][0], pattern):
            steps[-1] = (steps[-1][0], steps[-1][1] + 1)
        else:
            steps.append((pattern, 1))
    return steps


def _same(a: Pattern, b: Pattern) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("src", "dst", "nbytes"))
