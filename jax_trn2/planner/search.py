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
- pruned as "memory" when its arguments alone, split as the step's in_shardings say, take
  more than a device's HBM: every argument is resident when the step starts, so the peak
  is at least their bytes per device (`argument_bytes`);
- pruned as "time" when the least time its matmuls can take, the FLOPs of its traced
  program (counted once per variant and remat policy, `matmul_flops`) spread evenly over
  the devices at their peak rate (`compute_seconds`), is no less (per token, when tokens
  per step are known) than the expected step of the best fitting plan found so far: the
  partitioner splits the matmuls, it does not remove them, and the busiest device does at
  least the average share.

The rest are planned in full, those with the least bound first (so a good plan is found
early and prunes the most), in worker processes as a sweep plans.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.extend.core import jaxprs_in_params
from jax.sharding import NamedSharding, Sharding

from jax_trn2.planner.layout import Layout
from jax_trn2.planner.plan import (PerVariant, Plan, Sweep, Variant, build_variant,
                                   check_figures, indivisible_text, plan_jobs, plan_of,
                                   variants, _progress_printer)
from jax_trn2.planner.tables import duration_text, format_table
from mesh.units import bytes_text

SHAPE, MEMORY, TIME = "shape", "memory", "time"  # why a variant was pruned


class IndivisibleArgumentError(ValueError):
    """An argument's sharding splits a dimension into parts that do not divide it."""


@dataclass(frozen=True)
class Pruned:
    """A variant not planned in full, and why: `why` is SHAPE (its arguments do not split
    as its shardings say), MEMORY (`bound`: bytes per device its arguments alone take,
    over a device's HBM) or TIME (`bound`: the least seconds its step can take, no less
    than the best plan's)."""

    variant: Variant
    why: str
    reason: str
    bound: float

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

    def table(self) -> str:
        counts = self.counts()
        total = sum(counts.values())
        head = (f"searched {total} variants in {self.wall_seconds:.1f} s: {counts['planned']} "
                f"planned in full; pruned {counts[SHAPE]} whose arguments do not split as "
                f"their shardings say, {counts[MEMORY]} whose arguments alone exceed a "
                f"device's HBM, {counts[TIME]} whose least compute time cannot beat the best "
                "plan found")
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
    dynamic, _ = jitted.dynamic_arguments(tuple(args), {})
    shardings = getattr(jitted, "in_shardings", None)
    if not isinstance(shardings, (tuple, list)):
        shardings = (shardings,) * len(dynamic)
    total = 0
    for i, (sharding, arg) in enumerate(zip(shardings, dynamic)):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        given = [sharding] * len(leaves) if isinstance(sharding, Sharding) or \
            sharding is None or not isinstance(sharding, (tuple, list, dict)) else \
            jax.tree.leaves(sharding, is_leaf=lambda s: isinstance(s, Sharding) or s is None)
        if len(given) != len(leaves):
            given = [None] * len(leaves)
        for (path, leaf), s in zip(leaves, given):
            s = s if isinstance(s, Sharding) else getattr(leaf, "sharding", None)
            total += _shard_bytes(layout, s, leaf, f"argument {i}{jax.tree_util.keystr(path)}")
    return total


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


def matmul_flops(jaxpr: Any) -> dict[str, float]:
    """FLOPs of the dot_generals of a (closed) jaxpr by their operands' dtype, counting a
    scan's body `length` times, a cond's cheapest branch, a while loop's body not at all
    (its trip count is unknown) and any other sub-jaxpr once: never more than the program
    does."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    flops: dict[str, float] = {}

    def add(more: Mapping[str, float], times: float = 1.0) -> None:
        for dtype, n in more.items():
            flops[dtype] = flops.get(dtype, 0.0) + n * times

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), (batch, _) = eqn.params["dimension_numbers"]
            lhs, rhs = (v.aval.shape for v in eqn.invars)
            out = math.prod(eqn.outvars[0].aval.shape)
            k = math.prod(lhs[d] for d in contract)
            add({str(eqn.invars[0].aval.dtype): 2.0 * out * k})
        elif name == "while":
            continue
        elif name == "cond":
            branches = [matmul_flops(b) for b in eqn.params["branches"]]
            add(min(branches, key=lambda f: sum(f.values())))
        else:
            times = eqn.params.get("length", 1) if name == "scan" else 1
            for sub in jaxprs_in_params(eqn.params):
                add(matmul_flops(sub), times)
    return flops


def compute_seconds(flops: Mapping[str, float], layout: Layout) -> float:
    """The least time `flops` (by dtype) take spread evenly over the layout's devices at
    their peak: FP8 at its rate, every other dtype at BF16's (the fastest the Tensor
    Engine runs anything but FP8)."""
    device = layout.machine.device
    return sum(n / (layout.devices * device.peak_flops_for(
        dtype if dtype.startswith("float8") else "bfloat16")) for dtype, n in flops.items())


def search(build: Callable[..., tuple[Any, Sequence[Any]]], layouts: Iterable[Layout], *,
           params: Mapping[str, Sequence[Any]] | None = None,
           tokens_per_step: PerVariant = None, model_flops: PerVariant = None,
           train_tokens: float | None = None, price_per_chip_hour: float | None = None,
           workers: int | None = None, progress: bool | Callable[[int, int, Plan], None] = False
           ) -> Search:
    """Plan every layout (and combination of `params`) of `build` as jax_trn2.plan.sweep
    does, but prune first what cannot fit (its arguments exceed a device's HBM) or cannot
    win (its least compute time is no less than the best plan found so far), and what
    cannot be split (its arguments' shapes over its shardings): see the module's
    docstring. Returns a Search: the table of the plans made in full, `pruned` and
    `counts()`."""
    jobs = variants(layouts, params)
    check_figures(tokens_per_step, train_tokens, price_per_chip_hour)
    report = _progress_printer if progress is True else progress or None
    started = time.perf_counter()
    plans: list[Plan] = []
    pruned: list[Pruned] = []
    flops: dict[tuple, dict[str, float]] = {}  # by variant: its traced matmul FLOPs
    bounds: dict[Variant, float] = {}

    for job in jobs:
        if job.layout.placement_error:
            plans.append(plan_of(job, (None, job.layout.placement_error, 0.0, ()),
                                 tokens_per_step, model_flops))
            continue
        why = _cannot_fit(build, job, flops)
        if why is None:
            bounds[job] = _per_token(compute_seconds(flops[_flops_key(job)], job.layout),
                                     job.figure(tokens_per_step))
        else:
            pruned.append(why)
    survivors = sorted(bounds, key=bounds.get)

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

    def done(job: Variant, outcome: tuple) -> None:
        plans.append(plan_of(job, outcome, tokens_per_step, model_flops))
        if report is not None:
            report(len(plans), len(survivors), plans[-1])

    count = plan_jobs(functools.partial(build_variant, build), survivors, workers, done,
                      skip=skip)
    return Search(plans, pruned, train_tokens=train_tokens,
                  price_per_chip_hour=price_per_chip_hour,
                  wall_seconds=time.perf_counter() - started, workers=count)


def _flops_key(job: Variant) -> tuple:
    """What a step's matmuls may depend on besides its shardings: the build's parameters
    and the layout's remat, microbatches and schedule."""
    layout = job.layout
    return job.params, layout.remat, layout.microbatches, layout.schedule


def _cannot_fit(build: Callable, job: Variant, flops: dict[tuple, dict[str, float]]
                ) -> Pruned | None:
    """Build `job`; a Pruned when its arguments do not split or exceed a device's HBM;
    else None, its variant's matmul FLOPs counted into `flops` if not yet (a build or
    trace that fails counts none: the full plan will say why)."""
    try:
        jitted, args = build_variant(build, job)
        nbytes = argument_bytes(job.layout, jitted, args)
    except IndivisibleArgumentError as e:
        return Pruned(job, SHAPE, str(e), 0.0)
    except Exception:
        flops.setdefault(_flops_key(job), {})
        return None
    hbm = job.layout.machine.device.hbm_bytes
    if nbytes > hbm:
        return Pruned(job, MEMORY, f"its arguments alone take {bytes_text(nbytes)} per "
                                   f"device, over a device's {bytes_text(hbm)}", nbytes)
    key = _flops_key(job)
    if key not in flops:
        try:
            flops[key] = matmul_flops(jitted.trace(*args).jaxpr)
        except Exception:
            flops[key] = {}
    return None


def _per_token(seconds: float, tokens: float | None) -> float:
    return seconds / tokens if tokens else seconds
