"""A sweep's recommendation: the fastest layout that fits, and why the layouts nearest it
lost, in terms a user can act on.

    rec = table.recommendation                # jax_trn2.plan.Sweep.recommendation
    rec.best                                  # the Plan to run (None if nothing fits)
    for r in rec.runners_up: r.plan, r.reason
    print(rec)

Two kinds of runner-up lose for two kinds of reason, each read from the plans' own figures:

- a layout faster than the best that does not fit loses on memory: its peak against a
  device's HBM and the largest part of the peak's split ("peak 26.10 GiB > 24.00 GiB per
  device (temporaries 14.20 GiB of it)"), which says whether remat, more FSDP or
  offloading would help;
- a fitting layout slower than the best loses on time: the gap in expected step time split
  into the exposed time of each collective kind, a pipeline's bubble and the rest of the
  step (the engines' work no collective waits on), the parts that grew most by at least a
  quarter of the gap named ("1.2 ms slower (1.03x the step): exposed all-reduce 3.1 ms
  more").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from jax_trn2.planner.tables import duration_text
from mesh.units import bytes_text

# A jax_trn2.plan.Plan (which module imports this one: its name only, to keep imports one
# way).
Plan = Any

RUNNERS_UP = 3  # of each kind (faster but too big; fitting but slower)
# A part of the step-time gap is named when it is at least this share of the gap; the two
# largest such parts at most.
NAMED_SHARE, NAMED_PARTS = 0.25, 2
COMPUTE, BUBBLE = "compute", "bubble"  # the time parts that are not a collective kind
PEAK_PARTS = (("donated_arguments", "donated arguments"), ("other_arguments", "arguments"),
              ("outputs", "outputs"), ("temporaries", "temporaries"))


@dataclass(frozen=True)
class RunnerUp:
    """A layout the recommendation passed over, and why (`reason`)."""

    plan: Plan
    reason: str


@dataclass(frozen=True)
class Recommendation:
    """The fastest plan that fits (`best`; None when none does) and runners-up with the
    reason each lost: the fastest layouts that do not fit, then the next fitting ones
    (when nothing fits: the layouts nearest to fitting)."""

    best: Plan | None
    runners_up: tuple[RunnerUp, ...] = ()

    def __str__(self) -> str:
        if self.best is None:
            lines = ["recommended: none: no planned layout fits in a device's HBM" +
                     ("; nearest to fitting:" if self.runners_up else "")]
        else:
            e = self.best.estimate
            lines = [f"recommended: {self.best.name} on "
                     f"{self.best.layout.topology_name}: step "
                     f"{duration_text(e.step_seconds)} expected, peak "
                     f"{bytes_text(e.peak_bytes)} of {bytes_text(e.hbm_bytes)} per device"]
            if self.runners_up:
                lines.append("why not the next ones:")
        lines += [f"  {r.plan.name}: {r.reason}" for r in self.runners_up]
        return "\n".join(lines)


def recommend(plans: Sequence[Plan], count: int = RUNNERS_UP) -> Recommendation:
    """The recommendation of a sweep's plans: the fastest that fits, the `count` fastest
    that are faster but do not fit and the `count` fitting ones after it, each with the
    reason it lost."""
    planned = sorted((p for p in plans if p.ok), key=lambda p: p.rank_seconds)
    fitting = [p for p in planned if p.fits]
    if not fitting:
        nearest = sorted(planned, key=lambda p: p.estimate.peak_bytes - p.estimate.hbm_bytes)
        return Recommendation(None, tuple(RunnerUp(p, memory_reason(p))
                                          for p in nearest[:count]))
    best = fitting[0]
    too_big = [p for p in planned if not p.fits and p.rank_seconds < best.rank_seconds]
    runners = [RunnerUp(p, memory_reason(p)) for p in too_big[:count]]
    runners += [RunnerUp(p, time_reason(p, best)) for p in fitting[1:count + 1]]
    return Recommendation(best, tuple(runners))


def memory_reason(plan: Plan) -> str:
    """'does not fit: peak 26.10 GiB > 24.00 GiB per device (temporaries 14.20 GiB of
    it)': the peak, a device's HBM, and what holds most of the peak."""
    e = plan.estimate
    field, name = max(PEAK_PARTS, key=lambda part: getattr(e.peak_split, part[0]))
    largest = getattr(e.peak_split, field)
    held = f" ({name} {bytes_text(largest)} of it)" if largest else ""
    return (f"does not fit: peak {bytes_text(e.peak_bytes)} > {bytes_text(e.hbm_bytes)} "
            f"per device{held}")


def time_reason(plan: Plan, best: Plan) -> str:
    """'1.2 ms slower (1.03x the step): exposed all-reduce 3.1 ms more': the gap to the
    best's expected step and the parts of the step that grew most (see time_parts). A plan
    training another number of tokens a step is compared for the best's tokens ('1.2 ms
    slower for the same tokens'): its step and parts scaled by the ratio of tokens."""
    scale = best.tokens_per_step / plan.tokens_per_step \
        if plan.tokens_per_step and best.tokens_per_step else 1.0
    same = "" if scale == 1.0 else " for the same tokens"
    step = plan.step_seconds * scale
    gap = step - best.step_seconds
    if gap <= 0:
        return f"as fast ({duration_text(plan.step_seconds)} expected); ranked after it"
    mine, theirs = time_parts(plan), time_parts(best)
    growth = {part: mine.get(part, 0.0) * scale - theirs.get(part, 0.0)
              for part in dict.fromkeys([*mine, *theirs])}
    named = sorted((part for part, more in growth.items() if more >= NAMED_SHARE * gap),
                   key=lambda part: -growth[part])[:NAMED_PARTS]
    ratio = step / best.step_seconds
    return (f"{duration_text(gap)} slower{same} ({ratio:.2f}x the step): " +
            ", ".join(_part_text(part, growth[part], plan, best) for part in named))


def time_parts(plan: Plan) -> dict[str, float]:
    """A plan's expected step (seconds) in parts that add up to it: each collective kind's
    exposed time, and the rest of the step (the engines' work no collective waits on),
    split for a pipeline into its bubble (the bubble's share of it) and compute."""
    e = plan.estimate
    parts = {t.kind: t.exposed_seconds for t in e.communication}
    rest = e.step_seconds - e.exposed_communication_seconds
    bubble = max(plan.bubble or 0.0, 0.0)
    parts[BUBBLE] = rest * bubble
    parts[COMPUTE] = rest * (1.0 - bubble)
    return parts


def _part_text(part: str, more: float, plan: Plan, best: Plan) -> str:
    """One grown part of the step, named as the user would change it."""
    if part == BUBBLE:
        return f"pipeline bubble {plan.bubble:.0%} ({duration_text(more)} more)"
    if part == COMPUTE:
        remat = plan.layout.remat
        recomputes = f"; remat {remat} recomputes" if remat and remat != best.layout.remat \
            else ""
        return (f"compute {duration_text(more)} more (busiest engine "
                f"{plan.estimate.busiest_engine}{recomputes})")
    return f"exposed {part} {duration_text(more)} more"
