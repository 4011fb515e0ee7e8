"""Collectives on the torus: which links carry what, in how many steps, and how long it takes.

A collective's replica groups are lines of the logical mesh (or arbitrary device sets);
the placement (mesh.machine.placement.place_mesh) puts each logical device on a chip, so a logical
axis becomes one or more physical torus axes. Every algorithm below is a sequence of steps;
a step is a set of transfers (source chip, destination chip, bytes) that run at the same
time, each routed hop by hop by dimension-order routing (Topology.route). Alpha-beta model
of a step: the longest route's latency (link latency x hops) plus the bytes on the busiest
link divided by that link's bandwidth. On a logical axis that is a whole torus ring, every
transfer is one hop and no two share a link, so a bidirectional ring gives exactly
mesh/machine/trn2_facts.md's formulas (all-gather (k-1)a + (k-1)/k M/(2B), all-reduce twice
that); on other groups the busiest link shows the contention.

Algorithms (M is the full buffer per chip: the result of an all-gather, the operand of the
others; P is the group size):
  ring            bidirectional ring along each group axis in turn ("one dimension after
                  another"), every axis order tried; all-reduce = reduce-scatter + all-gather.
  line            the same on groups that are not whole torus rings (a segment of a ring:
                  a 2-chip group on a 4-ring is one link), without the wraparound link:
                  each link carries twice a ring's bytes per direction.
  rotated rings   the buffer split into one part per axis, part i running the axes in an
                  order rotated by i, so every axis is busy in every stage (reaches the
                  injection bound on a torus of equal links); the split is equal, or in
                  proportion to the bandwidth of each part's heaviest stage.
  direct          every member sends each other member its block in one step (the
                  latency-optimal choice for small messages); all-reduce as one-shot (full
                  buffers, reduced at the receiver) or two-shot (direct reduce-scatter then
                  direct all-gather); all-to-all also axis by axis.
  recursive halving-doubling
                  the group as a hypercube (a 4x4 torus is a 4-D one): log2(P) exchanges
                  with partners at distance P/2, P/4, ... of halving blocks (reduce-scatter),
                  then of doubling blocks (all-gather); groups of a power of two.
The ideal time is the least alpha-beta time of every candidate: what the links and their
per-hop latency allow.

The expected time is what the Neuron runtime takes (mesh.machine.runtime.RuntimeSpec):
  - the algorithm it picks by message size (its intra-node collectives page): mesh (the
    direct algorithms) below 1 MB, recursive halving-doubling to 56 MB, rings above; the
    fastest of that family;
  - a fixed cost per collective (its launch), and per stage among the ranks of a chip;
  - the per-hop latency of every step, as in the ideal;
  - the transfer time: the busiest link (EFA at its sustained share), the bytes a chip's
    collective DMA rings send, or the HBM traffic the collective makes, whichever is
    longest. HBM traffic: every byte sent is read, every byte received written, and a
    reduction reads the local part and writes the sum for each byte it combines. That
    traffic also occupies HBM against compute (the schedule puts it on the DMA queue).

Across servers (the UltraServers of an UltraCluster, Topology.efa_axes) EFA is a switched
fabric: a transfer between servers is one hop at the EFA latency from the sender's NIC port
to the receiver's, each port at the chip's share of its instance's EFA (the sustained share
in the expected time), so everything a chip sends to other servers in a step shares its
port. Groups that span servers with several chips in each run hierarchically, as the
runtime does by default (_plan_between_chips): the in-server stages over NeuronLink
(LocalStages "in server", planned as above) around the stage over EFA among the chips of
the same in-server index, whose algorithm is the cheapest of ring, RDH and mesh (the
runtime's inter-node choice by group and message size).

Not modelled: the collective cores' arithmetic itself, congestion from other collectives
running at the same time, incast or a per-peer cost of the mesh algorithm over EFA, the
overlap of a hierarchical collective's stages, and faults of EFA (a failed chip takes its
NIC; links between servers cannot fail).

The package's modules, by job: `plan` (the CollectivePlan and LocalStages values),
`algorithms` (each algorithm's steps of transfers), `network` (routing those steps on the
torus and EFA, and their alpha-beta cost), `runtime_choice` (the algorithm the Neuron runtime
picks and its expected time), `planning` (from a collective instruction to its plan, and the
bytes it puts on each link).
"""

from mesh.perf.collectives.plan import KINDS, ON_CHIP, CollectivePlan, LocalStages
from mesh.perf.collectives.planning import link_bytes, plan_collective

__all__ = ["CollectivePlan", "KINDS", "LocalStages", "ON_CHIP", "link_bytes",
           "plan_collective"]
