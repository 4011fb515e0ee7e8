"""Search a large space of layouts: plan them all, pruning those that cannot fit or cannot
win before planning them in full.

    result = jax_trn2.plan.search(build, jax_trn2.plan.grid(1024, ("dp", "fsdp", "tp"),
                                  topologies=("trn2-ultracluster-16",)),
                                  params={"batch": [128, 256]},
                                  tokens_per_step=lambda batch: batch * 8192)
    print(result)                 # the sweep table of the plans made in full, then
    result.pruned                 # each layout pruned, with its bound and why

Each variant (a layout and the build's parameters) is built (cheap: shapes and shardings,
no tracing) and then:

- pruned as "shape" when a sharding of its arguments does not divide their shape (the
  full plan would fail so, its reason naming the layout axis at fault);
- pruned as "memory" when the least its peak can be (`least_peak_bytes`) exceeds a
  device's HBM: its arguments, split as the step's in_shardings say (every argument is
  resident when the step starts: `argument_bytes`), or, while a top-level scan or matmul
  of its traced program runs, what it writes (a scan's stacked per-step outputs, a
  matmul's result and its operands other matmuls wrote) and the scans' stacked outputs
  made before it and read after it (the activations a jax.grad keeps for the backward
  pass), each split over every device at most, with the arguments still to be read
  (`memory_floor`, from the jaxpr, once per variant and remat policy);
- pruned as "time" when the least time its matmuls can keep the Tensor Engine, each the
  longer of its FLOPs at the peak rate and its operands and result at the HBM's bandwidth,
  spread evenly over the devices (`compute_seconds` of `matmul_work`, counted once per
  variant and remat policy), is no less (per token, when tokens per step are known) than
  the expected step of the best fitting plan found so far: the partitioner splits the
  matmuls, it does not remove them, and the busiest device does at least the average.

The rest are planned in worker processes as a sweep plans, first those whose least peak
leaves half a device's HBM free, each group fastest bound first (so a plan that fits is
found early and prunes the most); each is asked again when its turn comes (branch and
bound) and pruned as "time" once the best plan found beats its bound. A worker partitions
the step first (XLA's SPMD partitioner, as lowering does: a second or two for a 405B
model, against several to lower, schedule and cost it) and prunes it as "memory" when the
least peak of the per-device program (jax_trn2.planner.resident: its arguments, and what
its top-level loops hold, at their real per-device sizes) exceeds a device's HBM
(`Pruned.partitioned`); the rest it plans in full.

What the bounds leave out: communication (which collectives a step needs, and how large,
is the partitioner's choice: a weight split over fsdp may be gathered or the activations
moved instead, so no floor of it follows from the layout alone without partitioning), and,
before partitioning, the sharding the partitioner gives values the step does not
constrain (a scan's stacked activations count as split over every device there, though
most layouts split them over their batch axes only: the partitioned bound reads their real
split).
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.extend.core import DropVar, Var, jaxprs_in_params
from jax.sharding import NamedSharding, Sharding

import lowering
from jax_trn2.planner.layout import Layout
from jax_trn2.planner.plan import (PerVariant, Plan, StepEstimate, Sweep, Variant,
                                   build_variant, check_figures, estimate_lowered,
                                   indivisible_text, plan_jobs, plan_of, variants,
                                   _progress_printer)
from jax_trn2.planner.resident import least_resident_bytes
from jax_trn2.planner.tables import duration_text, format_table
from mesh.machine import Topology
from mesh.units import bytes_text

SHAPE, MEMORY, TIME = "shape", "memory", "time"  # why a variant was pruned


class IndivisibleArgumentError(ValueError):
    """An argument's sharding splits a dimension into parts that do not divide it."""


@dataclass(frozen=True)
class Pruned:
    """A variant not planned in full, and why: `why` is SHAPE (its arguments do not split
    as its shardings say), MEMORY (`bound`: the least bytes per device its peak can be,
    over a device's HBM: least_peak_bytes, or, when `partitioned`, least_resident_bytes of
    its partitioned program) or TIME (`bound`: the least seconds its step can take, no
    less than the best plan's); `reason` in words."""

    variant: Variant
    why: str
    reason: str
    bound: float
    partitioned: bool = False  # pruned by the bound of its partitioned program

    @property
    def name(self) -> str:
        return Plan(self.variant.layout, None, params=self.variant.params).name


class Search(Sweep):
    """A sweep of the variants planned in full, and those pruned (`pruned`)."""

    def __init__(self, plans: Iterable[Plan], pruned: Sequence[Pruned], **kwargs: Any):
        super().__init__(plans, **kwargs)
        self.pruned = list(pruned)

    def counts(self) -> dict[str, int]:
        """Variants planned in full ('planned') and pruned by each reason."""
        counts = {"planned": len(self.plans), SHAPE: 0, MEMORY: 0, TIME: 0}
        for p in self.pruned:
            counts[p.why] += 1
        return counts

    @property
    def partitioned_only(self) -> int:
        """Variants pruned as MEMORY after partitioning alone (counted in counts()[MEMORY])."""
        return sum(p.partitioned for p in self.pruned)

    def table(self) -> str:
        counts = self.counts()
        total = sum(counts.values())
        head = (f"searched {total} variants in {self.wall_seconds:.1f} s: {counts['planned']} "
                f"planned in full; pruned {counts[SHAPE]} whose arguments do not split as "
                f"their shardings say, {counts[MEMORY]} whose least peak (arguments, "
                "activations their scans keep, matmul results) exceeds a device's HBM "
                f"({self.partitioned_only} of them once partitioned), {counts[TIME]} whose "
                "matmuls alone (their FLOPs at the peak rate, their bytes at the HBM's "
                "bandwidth) cannot beat the best plan found")
        return "\n\n".join([head, super().table(), pruned_table(self.pruned)])


def pruned_table(pruned: Sequence[Pruned], count: int = 10) -> str:
    """The first `count` pruned variants of each reason, with their bound."""
    rows = []
    for why in (SHAPE, MEMORY, TIME):
        some = [p for p in pruned if p.why == why]
        for p in some[:count]:
            bound = "-" if why == SHAPE else bytes_text(int(p.bound)) if why == MEMORY \
                else duration_text(p.bound)
            rows.append([why, p.name, bound, p.reason[:160]])
        if len(some) > count:
            rows.append([why, f"... and {len(some) - count} more", "", ""])
    if not rows:
        return "nothing pruned"
    return format_table(["pruned", "variant", "bound", "why"], rows, left=(0, 1, 3))


def argument_bytes(layout: Layout, jitted: Any, args: Sequence[Any]) -> int:
    """Bytes per device of the step's arguments split as its in_shardings (or the
    arguments' own shardings) say: what is resident when the step starts. An argument
    without a sharding counts as split over every device (the least it could take).
    Raises IndivisibleArgumentError naming the layout axis when a sharding does not
    divide its shape."""
    return sum(_argument_leaf_bytes(layout, jitted, args))


def _argument_leaf_bytes(layout: Layout, jitted: Any, args: Sequence[Any]) -> list[int]:
    """argument_bytes of each leaf of the arguments, in the order the jaxpr takes them."""
    dynamic, _ = jitted.dynamic_arguments(tuple(args), {})
    shardings = getattr(jitted, "in_shardings", None)
    if not isinstance(shardings, (tuple, list)):
        shardings = (shardings,) * len(dynamic)
    sizes = []
    for i, (sharding, arg) in enumerate(zip(shardings, dynamic)):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        given = [sharding] * len(leaves) if isinstance(sharding, Sharding) or \
            sharding is None or not isinstance(sharding, (tuple, list, dict)) else \
            jax.tree.leaves(sharding, is_leaf=lambda s: isinstance(s, Sharding) or s is None)
        if len(given) != len(leaves):
            given = [None] * len(leaves)
        for (path, leaf), s in zip(leaves, given):
            s = s if isinstance(s, Sharding) else getattr(leaf, "sharding", None)
            sizes.append(_shard_bytes(layout, s, leaf, f"argument {i}{jax.tree_util.keystr(path)}"))
    return sizes


def _shard_bytes(layout: Layout, sharding: Sharding | None, leaf: Any, what: str) -> int:
    shape = tuple(leaf.shape)
    itemsize = np.dtype(leaf.dtype).itemsize
    if not isinstance(sharding, Sharding):  # unknown: the least it could take
        return -(-math.prod(shape) * itemsize // layout.devices)
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec)
        for dim, size in enumerate(shape):
            text = indivisible_text(layout, spec, dim, shape, what)
            parts = math.prod(sharding.mesh.shape[a] for a in _axes(spec, dim))
            if text is not None and size % parts:
                raise IndivisibleArgumentError(text)
    return math.prod(sharding.shard_shape(shape)) * itemsize


def _axes(spec: tuple, dim: int) -> tuple[str, ...]:
    entry = spec[dim] if dim < len(spec) else None
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


@dataclass(frozen=True)
class Instant:
    """What must be in HBM while one top-level scan or matmul of a step runs, from its
    jaxpr (the same for every sharding of the step): `live_bytes`, the global bytes of
    what it writes (a scan's per-step outputs; a matmul's result, and its operands that
    other matmuls wrote) and of the scans' per-step outputs live then (earlier scans' it
    reads or later work reads: the residuals a backward pass keeps from the forward one),
    and `donated`, the donated argument leaves it or work after it still reads (a matmul;
    work after it alone for a scan, which may write its outputs over one it reads)."""

    live_bytes: int
    donated: frozenset[int]


@dataclass(frozen=True)
class MemoryFloor:
    """The parts of a step's least peak HBM that come from its jaxpr: its instants,
    each leaf's global bytes and donation, and the leaves not donated that it reads (every
    argument not donated is live the whole step)."""

    instants: tuple[Instant, ...]
    leaf_bytes: tuple[int, ...]  # global bytes of each argument leaf
    held: frozenset[int]  # leaves not donated that the step reads


def memory_floor(traced: Any) -> MemoryFloor | None:
    """The MemoryFloor of a traced step (`jitted.trace(*args)`), or None when its jaxpr's
    arguments do not line up with its arguments' leaves."""
    jaxpr = traced.jaxpr.jaxpr
    donated = [bool(getattr(info, "donated", False)) for info in jax.tree.leaves(traced.args_info)]
    if len(donated) != len(jaxpr.invars):
        return None
    eqns = _needed_eqns(jaxpr)
    read = {v for e in eqns for v in _vars(e.invars)} | set(_vars(jaxpr.outvars))
    argument = {v: i for i, v in enumerate(jaxpr.invars)}
    made_by = {v: k for k, e in enumerate(eqns) for v in _vars(e.outvars)}
    stacked = {k: _stacked_outputs(e) & read for k, e in enumerate(eqns)
               if e.primitive.name == "scan"}
    instants = []
    matmuls = {k for k, e in enumerate(eqns) if _writes_a_matmul(e)}
    for k, e in enumerate(eqns):
        if k not in stacked and k not in matmuls:
            continue
        reads_after = {v for j in _descendants(eqns, k) for v in _vars(eqns[j].invars)}
        before = _ancestors(eqns, k)
        inputs = set(_vars(e.invars))
        live = {v for v in inputs | reads_after if made_by.get(v) in stacked and
                v in stacked[made_by[v]] and (v in inputs or made_by[v] in before)}
        still_read = reads_after
        if k in stacked:
            live |= stacked[k]
        else:  # a matmul writes a buffer of its own while it reads its operands
            live |= set(_vars(e.outvars)) | {v for v in inputs if made_by.get(v) in matmuls}
            still_read = reads_after | inputs
        instants.append(Instant(
            sum(_value_bytes(v) for v in live),
            frozenset(argument[v] for v in still_read if v in argument and donated[argument[v]])))
    return MemoryFloor(tuple(instants), tuple(_value_bytes(v) for v in jaxpr.invars),
                       frozenset(i for v, i in argument.items() if not donated[i] and v in read))


def least_peak_bytes(layout: Layout, leaf_bytes: Sequence[int], floor: MemoryFloor | None
                     ) -> int:
    """A lower bound of the step's peak HBM per device under `layout`, given its arguments'
    bytes per device (`_argument_leaf_bytes`) and its MemoryFloor: the larger of

    - its arguments, all resident when the step starts;
    - at each top-level scan, while it runs: its per-step outputs (a scan writes them into
      stacked buffers of their own), the earlier scans' stacked outputs it or work after it
      reads (made before it starts, freed after it ends: the residuals a jax.grad keeps for
      its backward pass), the donated arguments work after it reads, each at least its
      global bytes over the layout's devices (the most it can be split), and the arguments
      not donated, as split;
    - at each top-level matmul (the largest temporaries of a step outside its loops: the
      logits, a weight's gradient), likewise, with its result and its operands that other
      matmuls wrote (a matmul's result is a buffer of its own, mesh.fusion keeps none in
      SBUF, and no view of its operands) and the donated arguments it reads.

    A scan's per-step output that its body passes through from an input is not counted
    (it may be a view), nor one nothing needed reads."""
    least = sum(leaf_bytes)
    if floor is None:
        return least
    held = sum(leaf_bytes[i] for i in floor.held)
    for instant in floor.instants:
        split = _split(instant.live_bytes, layout) + \
            sum(_split(floor.leaf_bytes[i], layout) for i in instant.donated)
        least = max(least, held + split)
    return least


def memory_lower_bound(layout: Layout, jitted: Any, args: Sequence[Any]) -> int:
    """least_peak_bytes of `jitted` called with `args` under `layout` (traced here)."""
    return least_peak_bytes(layout, _argument_leaf_bytes(layout, jitted, args),
                            memory_floor(jitted.trace(*args)))


def _split(nbytes: int, layout: Layout) -> int:
    return -(-nbytes // layout.devices)


def _vars(atoms: Iterable[Any]) -> list[Any]:
    """The variables among jaxpr atoms (not literals, not dropped outputs)."""
    return [v for v in atoms if isinstance(v, Var) and not isinstance(v, DropVar)]


def _value_bytes(v: Any) -> int:
    return math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize


def _needed_eqns(jaxpr: Any) -> list[Any]:
    """The equations the jaxpr's outputs depend on (or with effects), in order: what a
    compiler keeps."""
    needed = set(_vars(jaxpr.outvars))
    kept = []
    for e in reversed(jaxpr.eqns):
        if e.effects or any(v in needed for v in _vars(e.outvars)):
            kept.append(e)
            needed.update(_vars(e.invars))
    return kept[::-1]


def _descendants(eqns: Sequence[Any], k: int) -> list[int]:
    """The equations after eqns[k] that depend on it: whatever the schedule, they start
    after it ends."""
    made = set(_vars(eqns[k].outvars))
    found = []
    for j in range(k + 1, len(eqns)):
        if any(v in made for v in _vars(eqns[j].invars)):
            found.append(j)
            made.update(_vars(eqns[j].outvars))
    return found


def _ancestors(eqns: Sequence[Any], k: int) -> set[int]:
    """The equations before eqns[k] it depends on: they end before it starts."""
    wanted = set(_vars(eqns[k].invars))
    found = set()
    for j in range(k - 1, -1, -1):
        if any(v in wanted for v in _vars(eqns[j].outvars)):
            found.add(j)
            wanted.update(_vars(eqns[j].invars))
    return found


def _writes_a_matmul(eqn: Any) -> bool:
    """Whether a jaxpr equation is a matmul that contracts two or more elements: the
    Tensor Engine writes its result to a buffer of its own (no fused chain keeps a matmul's
    result in SBUF, mesh.fusion), and it is no view of its operands. (One that contracts
    one element is a product a compiler may run as an elementwise op, and fuse.)"""
    if eqn.primitive.name != "dot_general":
        return False
    (contract, _), _ = eqn.params["dimension_numbers"]
    return math.prod(eqn.invars[0].aval.shape[d] for d in contract) >= 2


def _stacked_outputs(eqn: Any) -> set[Any]:
    """A scan's per-step outputs stacked over two or more steps, each distinct body result
    once, leaving out those its body passes through from a constant or a per-step input
    (or a literal): those may be views of its inputs. (A carry's value at each step is
    written anew.)"""
    if eqn.params["length"] < 2:
        return set()
    body = eqn.params["jaxpr"].jaxpr
    consts, carries = eqn.params["num_consts"], eqn.params["num_carry"]
    read_only = set(_vars(body.invars[:consts] + body.invars[consts + carries:]))
    seen, stacked = set(), set()
    for inner, outer in zip(body.outvars[carries:], eqn.outvars[carries:]):
        if isinstance(inner, Var) and inner not in read_only and inner not in seen \
                and isinstance(outer, Var) and not isinstance(outer, DropVar):
            seen.add(inner)
            stacked.add(outer)
    return stacked


@dataclass(frozen=True)
class Matmul:
    """One dot_general of a step, global: its operands' dtype, its FLOPs and the least HBM
    bytes it moves (its operands read once and its result written once; 0 inside a fused
    kernel, which keeps its operands on chip, or for a product of one element a compiler
    may fuse into an elementwise chain)."""

    dtype: str
    flops: float
    hbm_bytes: float


def matmul_work(jaxpr: Any, fused: bool = False) -> dict[Matmul, float]:
    """The dot_generals of a (closed) jaxpr and how many times each runs, counting a scan's
    body `length` times, a cond's branch of fewest FLOPs (its HBM bytes left out: another
    branch may move fewer), a while loop's body not at all (its trip count is unknown) and
    any other sub-jaxpr once: never more than the program does. `fused`: the jaxpr is a
    composite's, which the chip may run as one fused kernel (flash attention)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    work: dict[Matmul, float] = {}

    def add(more: Mapping[Matmul, float], times: float = 1.0) -> None:
        for matmul, n in more.items():
            work[matmul] = work.get(matmul, 0.0) + n * times

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = math.prod(eqn.outvars[0].aval.shape)
            k = math.prod(lhs[d] for d in contract)
            moved = sum(_value_bytes(v) for v in [*eqn.invars, *eqn.outvars]) \
                if _writes_a_matmul(eqn) and not fused else 0
            add({Matmul(str(eqn.invars[0].aval.dtype), 2.0 * out * k, moved): 1.0})
        elif name == "while":
            continue
        elif name == "cond":
            branches = [matmul_work(b, fused) for b in eqn.params["branches"]]
            cheapest = min(branches, key=lambda w: sum(m.flops * n for m, n in w.items()))
            add({Matmul(m.dtype, m.flops, 0): n for m, n in cheapest.items()})
        else:
            times = eqn.params.get("length", 1) if name == "scan" else 1
            for sub in jaxprs_in_params(eqn.params):
                add(matmul_work(sub, fused or name == "composite"), times)
    return work


def matmul_flops(jaxpr: Any) -> dict[str, float]:
    """FLOPs of the dot_generals of a (closed) jaxpr by their operands' dtype, counted as
    matmul_work counts them: never more than the program does."""
    flops: dict[str, float] = {}
    for matmul, times in matmul_work(jaxpr).items():
        flops[matmul.dtype] = flops.get(matmul.dtype, 0.0) + matmul.flops * times
    return flops


def compute_seconds(work: Mapping[Matmul, float], layout: Layout) -> float:
    """The least time the matmuls of `work` (matmul_work) keep the busiest device's Tensor
    Engine, in seconds: each matmul takes the longer of its FLOPs at the peak rate (FP8 at
    its own, every other dtype at BF16's, the fastest the engine runs anything but FP8) and
    its HBM bytes at the HBM's full bandwidth (the cost model holds the engine for the
    longer of the two), both spread evenly over the layout's devices (the partitioner
    splits a matmul, it does not remove its FLOPs or the bytes of its operands and result,
    and the busiest device does at least the average: the average of a maximum is no less
    than the maximum of the averages)."""
    device = layout.machine.device
    seconds = 0.0
    for m, times in work.items():
        peak = device.peak_flops_for(m.dtype if m.dtype.startswith("float8") else "bfloat16")
        seconds += times * max(m.flops / peak, m.hbm_bytes / device.hbm_bandwidth)
    return seconds / layout.devices


def search(build: Callable[..., tuple[Any, Sequence[Any]]], layouts: Iterable[Layout], *,
           params: Mapping[str, Sequence[Any]] | None = None,
           tokens_per_step: PerVariant = None, model_flops: PerVariant = None,
           train_tokens: float | None = None, price_per_chip_hour: float | None = None,
           workers: int | None = None, progress: bool | Callable[[int, int, Plan], None] = False
           ) -> Search:
    """Plan every layout (and combination of `params`) of `build` as jax_trn2.plan.sweep
    does, but prune first what cannot fit (its least peak, arguments and the activations
    its scans keep, exceeds a device's HBM: from the jaxpr, then, in the worker, from the
    partitioned program before it is lowered) or cannot win (its least compute time is no
    less than the best plan found so far), and what cannot be split (its arguments' shapes
    over its shardings): see the module's docstring. Returns a Search: the table of the
    plans made in full, `pruned`, `counts()` and `partitioned_only`."""
    jobs = variants(layouts, params)
    check_figures(tokens_per_step, train_tokens, price_per_chip_hour)
    report = _progress_printer if progress is True else progress or None
    started = time.perf_counter()
    plans: list[Plan] = []
    pruned: list[Pruned] = []
    traced: dict[tuple, _Traced] = {}  # by _trace_key
    bounds: dict[Variant, float] = {}  # least seconds (per token)
    least_bytes: dict[Variant, float] = {}  # least peak HBM per device

    for job in jobs:
        if job.layout.placement_error:
            plans.append(plan_of(job, (None, job.layout.placement_error, 0.0, ()),
                                 tokens_per_step, model_flops))
            continue
        why = _cannot_fit(build, job, traced)
        if isinstance(why, Pruned):
            pruned.append(why)
            continue
        least_bytes[job] = why / job.layout.machine.device.hbm_bytes
        work = traced[_trace_key(job)].work if _trace_key(job) in traced else {}
        bounds[job] = _per_token(compute_seconds(work, job.layout),
                                 job.figure(tokens_per_step))
    survivors = sorted(bounds, key=lambda job: _planning_order(bounds[job], least_bytes[job]))

    def best_seconds() -> float:
        return min((p.rank_seconds for p in plans if p.fits), default=math.inf)

    def skip(job: Variant) -> bool:
        best = best_seconds()
        if bounds[job] < best:
            return False
        tokens = job.figure(tokens_per_step)
        pruned.append(Pruned(job, TIME, f"its matmuls take at least "
                                        f"{duration_text(bounds[job] * (tokens or 1))} a "
                                        "step over its devices at their peak; the best plan "
                                        f"found takes {duration_text(best * (tokens or 1))} "
                                        "for as many tokens", bounds[job] * (tokens or 1)))
        return True

    def handled() -> int:  # survivors planned, or pruned once partitioned
        return len(plans) + sum(p.partitioned for p in pruned)

    def done(job: Variant, outcome: tuple) -> None:
        answer, seconds = outcome[0], outcome[2]
        if isinstance(answer, TooLarge):
            pruned.append(Pruned(job, MEMORY, answer.reason, answer.least_bytes,
                                 partitioned=True))
            if report is _progress_printer:  # (a caller's own report takes plans only)
                print(f"[{handled()}/{len(survivors)}] {pruned[-1].name} on "
                      f"{answer.topology}: pruned, {answer.reason} ({seconds:.1f} s)",
                      file=sys.stderr, flush=True)
            return
        plans.append(plan_of(job, outcome, tokens_per_step, model_flops))
        if report is not None:
            report(handled(), len(survivors), plans[-1])

    count = plan_jobs(functools.partial(build_variant, build), survivors, workers, done,
                      skip=skip, estimator=estimate_if_it_may_fit)
    return Search(plans, pruned, train_tokens=train_tokens,
                  price_per_chip_hour=price_per_chip_hour,
                  wall_seconds=time.perf_counter() - started, workers=count)


@dataclass(frozen=True)
class TooLarge:
    """A worker's answer for a step whose partitioned program cannot fit a device's HBM:
    its least peak (least_resident_bytes), not planned further."""

    least_bytes: int
    hbm_bytes: int
    topology: str  # the machine's name

    @property
    def reason(self) -> str:
        return (f"partitioned, its arguments with what its loops hold (a scan's stacked "
                f"activations, as split) take at least {bytes_text(self.least_bytes)} per "
                f"device, over a device's {bytes_text(self.hbm_bytes)}")


def estimate_if_it_may_fit(jitted: Any, args: Sequence[Any], topology: Topology
                           ) -> StepEstimate | TooLarge:
    """jax_trn2.plan.estimate of `jitted` on `args`, unless the least peak of the program
    XLA's SPMD partitioner makes of it (least_resident_bytes, read before it is lowered)
    exceeds a device's HBM on `topology`: then a TooLarge, the step never lowered,
    scheduled or costed. A program that is not partitioned is estimated."""
    traced = jitted.trace(*args)
    partitioned = lowering.partitioned_module(traced.stablehlo())
    if partitioned is not None:
        least = least_resident_bytes(partitioned)
        if least > topology.device.hbm_bytes:
            made_for = jitted.options.topology or topology  # (None: the mesh's machine)
            return TooLarge(least, topology.device.hbm_bytes, made_for.name)
    return estimate_lowered(traced.lower(), topology)


def _trace_key(job: Variant) -> tuple:
    """What a step's traced program (its matmuls, its scans' outputs) may depend on besides
    its shardings: the build's parameters and the layout's remat, microbatches and
    schedule."""
    layout = job.layout
    return job.params, layout.remat, layout.microbatches, layout.schedule


@dataclass(frozen=True)
class _Traced:
    """What a search reads from a variant's traced program."""

    work: Mapping[Matmul, float]  # matmul_work
    floor: MemoryFloor | None  # memory_floor


def _cannot_fit(build: Callable, job: Variant, traced: dict[tuple, _Traced]
                ) -> Pruned | float:
    """Build `job`; a Pruned when its arguments do not split or its least peak HBM
    (least_peak_bytes) exceeds a device's; else that least peak, its program's figures
    traced into `traced` if not yet (a build or trace that fails has none: the full plan
    will say why)."""
    key = _trace_key(job)
    try:
        jitted, args = build_variant(build, job)
        leaf_bytes = _argument_leaf_bytes(job.layout, jitted, args)
    except IndivisibleArgumentError as e:
        return Pruned(job, SHAPE, str(e), 0.0)
    except Exception:
        return 0.0
    if key not in traced:
        try:
            step = jitted.trace(*args)
            traced[key] = _Traced(matmul_work(step.jaxpr), memory_floor(step))
        except Exception:  # not kept: another layout of the same program may trace
            return 0.0
    nbytes = least_peak_bytes(job.layout, leaf_bytes, traced[key].floor)
    hbm = job.layout.machine.device.hbm_bytes
    if nbytes > hbm:
        arguments = sum(leaf_bytes)
        what = f"its arguments alone take {bytes_text(arguments)}" if nbytes == arguments \
            else ("its arguments with the per-step outputs of its scans or a matmul's "
                  f"result (at their most split) take at least {bytes_text(nbytes)}")
        return Pruned(job, MEMORY, f"{what} per device, over a device's {bytes_text(hbm)}",
                      nbytes)
    return nbytes


def _planning_order(seconds: float, hbm_share: float) -> tuple[bool, float]:
    """Plan first those whose least peak leaves at least half a device's HBM free (the
    activations and temporaries the floor leaves out must fit there), fastest bound
    first: the first plans are then likely to fit, and the time bound prunes from the
    start."""
    return hbm_share > 0.5, seconds


def _per_token(seconds: float, tokens: float | None) -> float:
    return seconds / tokens if tokens else seconds
