"""From a collective instruction to its plan: its groups as chips (and ranks per chip), the
hierarchical split across servers, every candidate algorithm evaluated on the network and
the fastest kept; and the bytes a planned collective puts on each link (the package doc,
mesh.perf.collectives, holds the model)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from mesh import isa
from mesh.machine import Placement, Topology
from mesh.perf.collectives.algorithms import candidate_steps
from mesh.perf.collectives.network import Network, Pattern, Steps
from mesh.perf.collectives.plan import (KINDS, LOCAL_STAGES, ON_CHIP, RAGGED_BOUND,
                                        CollectivePlan)
from mesh.perf.collectives.runtime_choice import (in_server_stages, on_chip_stages,
                                                  with_expected)


def plan_collective(instr: isa.Instruction, message_bytes: int, topology: Topology,
                    placement: Placement | None) -> CollectivePlan:
    """The fastest algorithm for collective `instr` moving `message_bytes` per chip."""
    kind = KINDS.get(type(instr))
    if kind is None:
        raise ValueError(f"{type(instr).__name__} is not a collective")
    if isinstance(instr, isa.CollectivePermute):
        return _plan_permute(instr.pairs, message_bytes, topology, placement)
    plan = _plan_grouped(kind, instr.groups, message_bytes, topology, placement)
    if isinstance(instr, isa.RaggedAllToAll):
        return dataclasses.replace(plan, kind=RAGGED_BOUND)
    return plan


@functools.lru_cache(maxsize=1024)
def _plan_grouped(kind: str, groups: isa.Groups, message_bytes: int, topology: Topology,
                  placement: Placement | None) -> CollectivePlan:
    size = groups.group_size
    logical = None if groups.axes is None or placement is None else \
        tuple(placement.axis_names[a] for a in groups.axes)
    if size == 1 or message_bytes == 0:
        return _trivial(kind, message_bytes, size, logical)
    _check_placement(placement, size)
    chip_groups, local, per_chip = _chip_groups(groups, placement)
    # The stage between chips runs among ranks of the same in-chip index and carries the
    # chip's whole buffer: `per_chip` groups' of it where several groups share the chips
    # (a mesh's other axes on the cores), and for an all-to-all every local rank's blocks.
    between = message_bytes * per_chip * (local if kind == "all-to-all" else 1)
    plan = _plan_between_chips(kind, chip_groups, between, topology, logical) \
        if len(chip_groups[0]) > 1 else _on_chip_only(kind, message_bytes, size, logical,
                                                       topology)
    if local == 1:
        return plan if per_chip == 1 else dataclasses.replace(plan, message_bytes=message_bytes)
    # several ranks of each group per chip: the runtime's stages on the chip around the
    # stage between chips
    on_chip = on_chip_stages(kind, local, per_chip, message_bytes, size, topology)
    return dataclasses.replace(plan, message_bytes=message_bytes, group_size=size,
                               on_chip=on_chip)


def _chip_groups(groups: isa.Groups, placement: Placement
                 ) -> tuple[tuple[tuple[int, ...], ...], int, int]:
    """(the distinct chip sets the groups span, each in the order of its first rank; the
    most ranks a group has on one chip; how many groups share a chip set). A whole-chip
    machine's groups come back as they are, with 1 and 1."""
    chips = [tuple(placement.chip_of(d) for d in g) for g in groups.device_groups]
    local = max(max(c.count(x) for x in set(c)) for c in chips)
    distinct = tuple(dict.fromkeys(tuple(dict.fromkeys(c)) for c in chips))
    return distinct, local, -(-len(chips) // len(distinct))


def _plan_between_chips(kind: str, chip_groups: tuple[tuple[int, ...], ...],
                        message_bytes: float, topology: Topology,
                        logical: tuple[str, ...] | None) -> CollectivePlan:
    """The stage between chips. Groups that span servers and hold several chips in each
    run hierarchically, as the Neuron runtime does by default since Neuron collectives
    2.12 (trn2_facts.md, the inter-node collectives bullet): an all-reduce or
    reduce-scatter is first reduce-scattered among the chips of each server (NeuronLink),
    the 1/L piece each chip then holds (L chips of the group per server) is all-reduced or
    reduce-scattered over EFA among the chips of the same in-server index, and an
    all-reduce is all-gathered inside each server again; an all-gather runs the same
    backwards. Any other collective over servers runs as one stage over the switched
    fabric."""
    split = _server_split(chip_groups, topology) if kind in LOCAL_STAGES else None
    if split is None:
        return _plan_chips(kind, chip_groups, message_bytes, topology, logical)
    inside, across, local, groups = split
    stage_bytes = message_bytes / local
    between = _plan_chips(kind, across, stage_bytes, topology, logical)
    stages = tuple(_plan_chips(stage, inside, message_bytes, topology, logical)
                   for stage in LOCAL_STAGES[kind])
    return dataclasses.replace(between, message_bytes=message_bytes,
                               group_size=len(chip_groups[0]), stage_bytes=stage_bytes,
                               in_server=in_server_stages(stages, local, groups))


def _server_split(chip_groups: tuple[tuple[int, ...], ...], topology: Topology
                  ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...],
                             int, int] | None:
    """How groups of chips that span servers split for a hierarchical collective: (the
    groups' chips in each server, the groups of chips of the same in-server index across
    the servers, chips of each group per server, such groups per server); None when the
    groups span no servers (or hold one chip per server, their stage over EFA alone) or
    hold different numbers of chips in different servers (one stage over the fabric).
    A chip's in-server index is its place among its group's chips in that server, in the
    group's order."""
    if not topology.efa_axes:
        return None
    efa = sorted(topology.efa_axes)
    inside, across, servers = [], [], set()
    for group in chip_groups:
        parts: dict[tuple[int, ...], list[int]] = {}
        for chip in group:
            parts.setdefault(tuple(topology.coords(chip)[a] for a in efa), []).append(chip)
        servers |= set(parts)
        inside += [tuple(part) for part in parts.values()]
        across += list(zip(*parts.values()))
    sizes = {len(part) for part in inside}
    if len(inside) == len(chip_groups) or sizes == {1} or len(sizes) > 1:
        return None
    return tuple(inside), tuple(across), sizes.pop(), len(inside) // len(servers)


def _on_chip_only(kind, message_bytes, size, logical, topology: Topology) -> CollectivePlan:
    """A collective whose every group lies on one chip: no stage between chips, the
    runtime's fixed cost of a collective (its launch; the stages add theirs)."""
    plan = dataclasses.replace(_trivial(kind, message_bytes, size, logical),
                               algorithm=ON_CHIP, candidates=((ON_CHIP, 0.0),))
    return dataclasses.replace(plan, expected_algorithm=ON_CHIP,
                               fixed_seconds=topology.runtime.collective_launch_seconds)


@functools.lru_cache(maxsize=1024)
def _plan_chips(kind: str, chip_groups: tuple[tuple[int, ...], ...], message_bytes: float,
                topology: Topology, logical: tuple[str, ...] | None) -> CollectivePlan:
    """The fastest algorithm for a `kind` collective among `chip_groups` (chip ids, one
    rank per chip), `message_bytes` per chip."""
    size = len(chip_groups[0])
    net = Network.of(topology)
    grids, on_rings = net.grids([list(g) for g in chip_groups])
    candidates, rings = {}, {}
    for name, steps, ring_lengths in candidate_steps(kind, grids, message_bytes, net,
                                                     on_rings):
        candidates[name], rings[name] = net.evaluate(steps), ring_lengths
    best = min(candidates, key=lambda name: candidates[name].seconds)
    plan = _plan(kind, message_bytes, size, logical, net, grids[0].ravel(),
                 candidates[best].max_hops > 1, best, rings[best], candidates)
    plan = with_expected(plan, candidates, topology)
    if not topology.has_faults:
        return plan
    healthy = _plan_chips(kind, chip_groups, message_bytes, topology.healthy(), logical)
    return dataclasses.replace(plan, detours=candidates[best].detours,
                               healthy_seconds=healthy.seconds)


@functools.lru_cache(maxsize=1024)
def _plan_permute(pairs: tuple[tuple[int, int], ...], message_bytes: int, topology: Topology,
                  placement: Placement | None) -> CollectivePlan:
    pairs = tuple((s, t) for s, t in pairs if s != t)
    if not pairs or message_bytes == 0:
        return _trivial("collective-permute", message_bytes, 2 if pairs else 1, ())
    _check_placement(placement, 2)
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*pairs))
    logical = _moved_axes(placement, src, dst)
    between = _between_chips(pairs, placement)
    plan = _plan_permute_chips(between, message_bytes, topology, logical) if between else \
        _on_chip_only("collective-permute", message_bytes, 2, logical, topology)
    # pairs on one chip copy through its HBM (an exchange of 2 ranks), as many at once
    # as the chip holds senders
    on_chip = [placement.chip_of(s) for s, t in pairs
               if placement.chip_of(s) == placement.chip_of(t)]
    if not on_chip:
        return plan
    most = max(on_chip.count(c) for c in set(on_chip))
    return dataclasses.replace(plan, on_chip=on_chip_stages(
        "collective-permute", 2, most, message_bytes, 2, topology))


def _between_chips(pairs: tuple[tuple[int, int], ...],
                   placement: Placement) -> tuple[tuple[int, int], ...]:
    """The (source chip, destination chip) of each pair of devices on different chips."""
    chips = [(placement.chip_of(s), placement.chip_of(t)) for s, t in pairs]
    return tuple((a, b) for a, b in chips if a != b)


@functools.lru_cache(maxsize=1024)
def _plan_permute_chips(chip_pairs: tuple[tuple[int, int], ...], message_bytes: int,
                        topology: Topology, logical: tuple[str, ...]) -> CollectivePlan:
    """A permutation's transfers between chips: chip a sends `message_bytes` to chip b for
    every pair (a, b), all at once."""
    net = Network.of(topology)
    steps = _permute_steps(chip_pairs, message_bytes)
    result = net.evaluate(steps)
    moved = steps[0][0]
    plan = _plan("collective-permute", message_bytes, 2, logical, net,
                 np.concatenate([moved.src, moved.dst]), result.max_hops > 1, "direct", (),
                 {"direct": result})
    plan = with_expected(plan, {"direct": result}, topology)
    if not topology.has_faults:
        return plan
    healthy = _plan_permute_chips(chip_pairs, message_bytes, topology.healthy(), logical)
    return dataclasses.replace(plan, detours=result.detours, healthy_seconds=healthy.seconds)


def link_bytes(instr: isa.Instruction, topology: Topology,
               placement: Placement | None) -> np.ndarray:
    """The bytes planned collective `instr` puts on each torus link over its whole run, for
    the algorithm its plan chose, routed as the estimate routed it (around faults too): an
    array [chip the link leaves, torus axis, direction (0: towards lower coordinates, 1:
    higher)]. Zeros for an instruction without a plan or a collective that moves nothing
    (or moves only among the ranks of a chip)."""
    loads = np.zeros((topology.num_chips, topology.ndim, 2))
    plan = getattr(instr, "plan", None)
    if not isinstance(plan, CollectivePlan) or plan.algorithm in ("none", ON_CHIP):
        return loads
    if isinstance(instr, isa.CollectivePermute):
        net = Network.of(topology)
        steps = _permute_steps(_between_chips(
            tuple((s, t) for s, t in instr.pairs if s != t), placement), plan.message_bytes)
        for pattern, times in steps:
            loads += times * net.loads(pattern)[0].reshape(loads.shape)
        return loads
    kind = KINDS[type(instr)]
    chip_groups, local, per_chip = _chip_groups(instr.groups, placement)
    between = plan.message_bytes * per_chip * (local if kind == "all-to-all" else 1)
    split = _server_split(chip_groups, topology) if plan.in_server is not None else None
    if split is None:
        stages = [(kind, chip_groups, between, plan.algorithm)]
    else:  # hierarchical: the stage between servers and the stages in each server
        inside, across, _, _ = split
        stages = [(kind, across, plan.stage_bytes, plan.algorithm)] + [
            (stage.kind, inside, between, stage.algorithm) for stage in plan.in_server.plans]
    for stage in stages:
        loads += _stage_link_bytes(*stage, topology).reshape(loads.shape)
    return loads


@functools.lru_cache(maxsize=1024)
def _stage_link_bytes(kind: str, chip_groups: tuple[tuple[int, ...], ...],
                      message_bytes: float, algorithm: str, topology: Topology) -> np.ndarray:
    """The bytes each link carries (flat, by Network.link_id) over one run of candidate
    `algorithm` for a `kind` collective among `chip_groups`: cached (read-only), as a
    step's collectives repeat with the same groups and sizes (one per layer and weight)."""
    net = Network.of(topology)
    total = np.zeros(net.n_links)
    for pattern, times in _chosen_steps(kind, chip_groups, message_bytes, algorithm, net):
        total += times * net.loads(pattern)[0]
    total.flags.writeable = False
    return total


def _chosen_steps(kind: str, chip_groups: tuple[tuple[int, ...], ...], message_bytes: float,
                  algorithm: str, net: Network) -> Steps:
    """The steps of candidate `algorithm` for a `kind` collective among `chip_groups`."""
    grids, on_rings = net.grids([list(g) for g in chip_groups], every=True)
    return next(steps for _, steps, _ in candidate_steps(
        kind, grids, message_bytes, net, on_rings, only=algorithm))


def _permute_steps(chip_pairs: tuple[tuple[int, int], ...], message_bytes: int) -> Steps:
    """A permutation's one step: chip a sends a whole buffer to chip b, every pair (a, b)
    at once."""
    src, dst = (np.array(c, dtype=np.int64) for c in zip(*chip_pairs))
    return [(Pattern(src, dst, np.full(len(src), float(message_bytes))), 1)]


def _moved_axes(placement: Placement, src: np.ndarray, dst: np.ndarray) -> tuple[str, ...]:
    """Logical mesh axes along which a permutation moves data."""
    sizes = placement.axis_sizes
    a = np.stack(np.unravel_index(src, sizes), -1)
    b = np.stack(np.unravel_index(dst, sizes), -1)
    return tuple(placement.axis_names[i] for i in np.nonzero((a != b).any(0))[0])


def _check_placement(placement: Placement | None, size: int) -> None:
    if placement is None:
        raise ValueError(f"a collective over {size} devices needs a mesh placement")


def _trivial(kind, message_bytes, size, logical) -> CollectivePlan:
    return CollectivePlan(kind=kind, message_bytes=message_bytes, group_size=size,
                          logical_axes=logical, torus_axes=(), routed=False, algorithm="none",
                          rings=(), steps=0, link_bytes=0.0, max_hops=0, latency_seconds=0.0,
                          bandwidth_seconds=0.0, candidates=(("none", 0.0),))


def _plan(kind, message_bytes, size, logical, net: Network, chips: np.ndarray, routed, best,
          rings, candidates) -> CollectivePlan:
    """The plan of candidate `best` among `chips` (the chips the collective moves data
    between)."""
    chosen = candidates[best]
    return CollectivePlan(
        kind=kind, message_bytes=message_bytes, group_size=size, logical_axes=logical,
        torus_axes=net.torus_axes(chips), routed=routed,
        over_efa=bool(set(net.spanned_axes(chips)) & net.topology.efa_axes),
        algorithm=best, rings=rings, steps=chosen.steps, link_bytes=chosen.link_bytes,
        max_hops=chosen.max_hops, latency_seconds=chosen.latency,
        bandwidth_seconds=chosen.bandwidth,
        candidates=tuple((name, c.seconds) for name, c in candidates.items()))
