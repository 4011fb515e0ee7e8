"""What the Neuron runtime runs: the algorithm family it picks by message size, a
candidate's expected time (launch, per-hop latency, and links, collective DMA or HBM,
whichever bounds the transfer), and the stages it runs on a chip and in a server around
the stage between them (the package doc, mesh.perf.collectives, holds the model)."""

from __future__ import annotations

import dataclasses

from mesh.machine import Topology
from mesh.perf.collectives.algorithms import RDH
from mesh.perf.collectives.network import StepCost
from mesh.perf.collectives.plan import LOCAL_STAGES, CollectivePlan, LocalStages


def on_chip_stages(kind: str, local_ranks: int, groups: int, message_bytes: float,
                   group_size: int, topology: Topology) -> LocalStages:
    """The on-chip stages of a `kind` collective of `message_bytes` per rank over groups of
    `group_size` ranks, `local_ranks` of each on every chip it spans, `groups` such
    groups per chip. Per group and chip (r local ranks, M bytes per rank):
      reduce-scatter (the reduction)  each rank reads the r blocks of M/r it reduces and
                                      writes their sum: HBM (r + 1) M; DMA moves (r-1) M
      all-gather (the broadcast)      each rank's block of M/r read once and written to
                                      its r-1 peers (write duplication): HBM r M; DMA (r-1) M
      exchange (all-to-all, permute)  each rank copies its blocks of M/P for its r-1
                                      local peers: HBM 2 r (r-1) M/P; DMA r (r-1) M/P."""
    r, m = local_ranks, float(message_bytes)
    stages = LOCAL_STAGES.get(kind, ("exchange",))
    traffic = {"reduce-scatter": ((r + 1) * m, (r - 1) * m),
               "all-gather": (r * m, (r - 1) * m),
               "exchange": (2 * r * (r - 1) * m / group_size, r * (r - 1) * m / group_size)}
    hbm = groups * sum(traffic[stage][0] for stage in stages)
    dma = groups * sum(traffic[stage][1] for stage in stages)
    chip, runtime = topology.chip, topology.runtime
    times = {"HBM": hbm / (chip.hbm_bandwidth * runtime.hbm_efficiency),
             "collective DMA": dma / runtime.collective_dma_bytes_per_second}
    bound = max(times, key=times.get)
    fixed = len(stages) * (runtime.on_chip_stage_seconds + runtime.dma_fixed_seconds)
    return LocalStages(where="on chip", stages=stages, local_ranks=r, groups=groups,
                       hbm_bytes=hbm, seconds=hbm / chip.hbm_bandwidth, fixed_seconds=fixed,
                       transfer_seconds=times[bound], transfer_bound=bound)


def in_server_stages(plans: tuple[CollectivePlan, ...], local_chips: int,
                     groups: int) -> LocalStages:
    """The stages among the chips of each server (`plans`, planned on the NeuronLink torus)
    of a hierarchical collective: `local_chips` chips of each group in every server it
    spans, `groups` such groups per server."""
    bounds = dict.fromkeys(p.transfer_bound for p in plans)
    return LocalStages(where="in server", stages=tuple(p.kind for p in plans),
                       local_ranks=local_chips, groups=groups,
                       hbm_bytes=sum(p.hbm_bytes for p in plans),
                       seconds=sum(p.seconds for p in plans), fixed_seconds=0.0,
                       latency_seconds=sum(p.expected_latency_seconds for p in plans),
                       transfer_seconds=sum(p.transfer_seconds for p in plans),
                       transfer_bound=", ".join(bounds), plans=plans)


# Which candidates belong to the runtime's algorithm families (see with_expected).
MESH_FAMILY = ("direct", "one-shot", "two-shot", "direct axis by axis")


def _family(name: str) -> str:
    return "mesh" if name in MESH_FAMILY else "rdh" if name == RDH else "ring"


def with_expected(plan: CollectivePlan, candidates: dict[str, StepCost],
                  topology: Topology) -> CollectivePlan:
    """`plan` with the expected time: the fastest candidate (by expected time) of the family
    the runtime uses at this message size among the chips of a server (its intra-node page),
    or the next family that has candidates. Between servers the runtime's inter-node
    algorithms (ring, mesh, RDH over EFA) are chosen by group and message size (its
    inter-node page): the fastest of every candidate."""
    runtime = topology.runtime
    m = plan.message_bytes
    wanted = ("mesh", "rdh", "ring") if m < runtime.mesh_max_bytes else \
        ("rdh", "ring", "mesh") if m < runtime.rdh_max_bytes else ("ring", "rdh", "mesh")
    family = next(f for f in wanted if any(_family(n) == f for n in candidates))
    timed = {name: _expected(plan.kind, name, cost, topology)
             for name, cost in candidates.items()
             if plan.over_efa or _family(name) == family}
    name = min(timed, key=lambda n: sum(timed[n][:3]))
    fixed, latency, transfer, bound, hbm = timed[name]
    return dataclasses.replace(plan, expected_algorithm=name, fixed_seconds=fixed,
                               expected_latency_seconds=latency, transfer_seconds=transfer,
                               transfer_bound=bound, hbm_bytes=hbm)


def _expected(kind: str, name: str, cost: StepCost,
              topology: Topology) -> tuple[float, float, float, str, float]:
    """(fixed, latency, transfer seconds, what bounds the transfer, HBM bytes) of one
    candidate as the runtime runs it."""
    runtime = topology.runtime
    fixed = runtime.collective_launch_seconds
    # the share of the bytes a chip receives that it adds into its own (reading both and
    # writing the sum): all of them in a reduce-scatter and a one-shot all-reduce, the
    # reduce-scatter half of any other all-reduce
    reduced = 1.0 if kind == "reduce-scatter" or name == "one-shot" else \
        0.5 if kind == "all-reduce" else 0.0
    hbm = cost.sent_bytes + cost.received_bytes * (1 + 2 * reduced)
    times = {"links": cost.efa_bandwidth,
             "collective DMA": cost.sent_bytes / runtime.collective_dma_bytes_per_second,
             "HBM": hbm / (topology.chip.hbm_bandwidth * runtime.hbm_efficiency)}
    bound = max(times, key=times.get)
    return fixed, cost.latency, times[bound], bound, hbm
