"""Serving questions from the user's own prefill and decode steps: time to first token,
time per output token, KV-cache bytes per device, the largest batch that fits, tokens/s.

    def prefill(layout, batch, prompt_tokens):   # -> (jax_trn2.jit function, its args)
    def decode(layout, batch, kv_length):        # one token for each of `batch` sequences

    table = jax_trn2.serving.serve(prefill, decode, layouts, batches=(1, 32),
                                   prompt_tokens=1024, kv_length=2048)
    print(table)

Each (layout, batch) is planned twice: the prefill of `prompt_tokens` tokens per sequence
(its step time is the time to first token of every sequence in the batch) and one decode
step reading a KV cache of `kv_length` positions (its step time is the time per output
token). The KV cache is what the decode step updates in place: the arguments it donates
(`donate_argnums`, as servers keep the cache on the chips); its bytes per device are those
arguments' pieces. The largest batch that fits is searched per layout: decode's peak HBM
grows linearly with the batch (weights stay, cache and activations grow), so two planned
batches predict it, and plans at the prediction and one above confirm it (or a bisection
finds it). Each plan runs as jax_trn2.plan's do, in worker processes when there are enough.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from jax_trn2.planner.layout import Layout
from jax_trn2.planner.plan import StepEstimate, plan_jobs, progress_line
from jax_trn2.planner.tables import serving_table

PREFILL, DECODE = "prefill", "decode"
MAX_SEARCH_PLANS = 8  # decode plans the largest-batch search may add per layout


@dataclass(frozen=True)
class ServingJob:
    """One step to plan: `kind` (prefill or decode) under `layout` at `batch` sequences of
    `length` tokens (the prompt, or the KV cache's positions)."""

    kind: str
    layout: Layout
    batch: int
    length: int

    @property
    def name(self) -> str:
        """'decode batch 32', for progress lines."""
        return f"{self.kind} batch {self.batch}"


def _step(prefill: Callable, decode: Callable, job: ServingJob):
    build = prefill if job.kind == PREFILL else decode
    return build(job.layout, job.batch, job.length)


@dataclass(frozen=True)
class ServingPlan:
    """Serving `batch` sequences under `layout`: the prefill and decode estimates (None
    where that step could not be planned: `errors` says why), and the largest decode batch
    that fits at the KV length (None when the search could not tell)."""

    layout: Layout
    batch: int
    prompt_tokens: int
    kv_length: int
    prefill: StepEstimate | None
    decode: StepEstimate | None
    errors: tuple[str, ...] = ()
    max_batch: int | None = None
    warnings: tuple[str, ...] = ()  # what planning its steps warned of

    @property
    def ok(self) -> bool:
        """Both steps were planned (else `errors` says why not)."""
        return self.prefill is not None and self.decode is not None

    @property
    def fits(self) -> bool:
        """Both steps planned, and both fit in a device's HBM."""
        return self.ok and self.prefill.fits and self.decode.fits

    @property
    def devices(self) -> int:
        """Devices the layout's mesh takes (chips, or logical NeuronCores on the instance
        presets)."""
        return self.layout.devices

    @property
    def ttft_seconds(self) -> float | None:
        """Time to first token: the prefill step."""
        return self.prefill.step_seconds if self.prefill else None

    @property
    def decode_seconds(self) -> float | None:
        """Time per output token: one decode step."""
        return self.decode.step_seconds if self.decode else None

    @property
    def kv_cache_bytes(self) -> int | None:
        """Bytes of the KV cache on each device (the decode step's donated arguments)."""
        return self.decode.donated_bytes if self.decode else None

    @property
    def tokens_per_second(self) -> float | None:
        """Output tokens per second of the whole batch, decoding."""
        return self.batch / self.decode.step_seconds if self.decode else None

    @property
    def tokens_per_second_per_device(self) -> float | None:
        """tokens_per_second over the layout's devices."""
        rate = self.tokens_per_second
        return None if rate is None else rate / self.devices

    @property
    def prefill_tokens_per_second(self) -> float | None:
        """Prompt tokens per second, prefilling."""
        return self.batch * self.prompt_tokens / self.prefill.step_seconds \
            if self.prefill else None

    def row(self) -> dict[str, Any]:
        """The plan as a flat dict, for a notebook's table."""
        row: dict[str, Any] = {
            "layout": self.layout.name, "topology": self.layout.topology_name,
            "devices": self.devices, "chips": self.layout.chips, "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "kv_length": self.kv_length, "errors": list(self.errors),
            "ttft_seconds": self.ttft_seconds, "decode_seconds": self.decode_seconds,
            "ideal_ttft_seconds": self.prefill.ideal_step_seconds if self.prefill else None,
            "ideal_decode_seconds": self.decode.ideal_step_seconds if self.decode else None,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_device": self.tokens_per_second_per_device,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "kv_cache_bytes": self.kv_cache_bytes, "max_batch": self.max_batch}
        for kind, e in ((PREFILL, self.prefill), (DECODE, self.decode)):
            if e is not None:
                row.update({f"{kind}_peak_hbm_bytes": e.peak_bytes, f"{kind}_fits": e.fits})
        return row


class ServingTable:
    """The serving plans, by layout then batch. Prints as a table; `rows()` for a
    notebook."""

    def __init__(self, plans: Iterable[ServingPlan], wall_seconds: float, workers: int,
                 planned: int):
        self.plans = list(plans)
        self.wall_seconds = wall_seconds
        self.workers = workers
        self.planned = planned  # steps planned, the largest-batch search's included

    def __iter__(self):
        return iter(self.plans)

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, i: int) -> ServingPlan:
        return self.plans[i]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per plan (`pandas.DataFrame(table.rows())`)."""
        return [p.row() for p in self.plans]

    def __repr__(self) -> str:
        return self.table()

    def table(self) -> str:
        """The table as text."""
        return serving_table(self)


def serve(prefill: Callable[[Layout, int, int], tuple[Any, Sequence[Any]]],
          decode: Callable[[Layout, int, int], tuple[Any, Sequence[Any]]],
          layouts: Iterable[Layout], batches: Sequence[int], *, prompt_tokens: int,
          kv_length: int, max_batch: bool = True, workers: int | None = None,
          progress: bool = True) -> ServingTable:
    """Plan prefill and decode under each layout at each batch size, and (`max_batch`)
    search the largest decode batch that fits at `kv_length`.

    `prefill(layout, batch, prompt_tokens)` and `decode(layout, batch, kv_length)` return
    `(jitted, args)` as jax_trn2.plan.sweep's build does: a jax_trn2.jit function for the
    layout (`topology=layout.topology`) and its arguments' shapes. The decode step donates
    its KV cache. `workers` as for jax_trn2.plan.sweep; `progress` prints a line per
    planned step to stderr."""
    layouts = list(layouts)
    batches = sorted(set(batches))
    if not layouts or not batches:
        raise ValueError("serve: give at least one layout and one batch size")
    if batches[0] < 1:
        raise ValueError(f"serve: batch sizes must be >= 1, got {batches}")
    for name, value in (("prompt_tokens", prompt_tokens), ("kv_length", kv_length)):
        if value < 1:
            raise ValueError(f"serve: {name} must be >= 1, got {value}")
    started = time.perf_counter()
    step = functools.partial(_step, prefill, decode)
    jobs = [ServingJob(kind, layout, batch, prompt_tokens if kind == PREFILL else kv_length)
            for layout in layouts for batch in batches for kind in (PREFILL, DECODE)]
    # the largest-batch search needs two decode batches per layout
    if max_batch and len(batches) == 1:
        jobs += [ServingJob(DECODE, layout, 2 * batches[0], kv_length) for layout in layouts]
    results, warned, count = _plan_all(step, jobs, workers, progress)
    searched = {}
    if max_batch:
        searched = _largest_batches(step, layouts, kv_length, results, progress)
    plans = []
    for layout in layouts:
        for batch in batches:
            outcome = {kind: results[ServingJob(kind, layout, batch, length)] for kind, length
                       in ((PREFILL, prompt_tokens), (DECODE, kv_length))}
            errors = tuple(f"{kind}: {error}" for kind, (_, error) in outcome.items() if error)
            warnings = tuple(dict.fromkeys(
                w for kind, length in ((PREFILL, prompt_tokens), (DECODE, kv_length))
                for w in warned[ServingJob(kind, layout, batch, length)]))
            plans.append(ServingPlan(layout, batch, prompt_tokens, kv_length,
                                     outcome[PREFILL][0], outcome[DECODE][0], errors,
                                     searched.get(layout), warnings))
    return ServingTable(plans, time.perf_counter() - started, count, len(results))


def _plan_all(step: Callable, jobs: Sequence[ServingJob], workers: int | None,
              progress: bool) -> tuple[dict[ServingJob, tuple], dict[ServingJob, tuple], int]:
    """Plan `jobs` (jax_trn2.plan.plan_jobs), a line of progress for each: their
    (StepEstimate | None, error | None), their warnings, and the worker processes used."""
    results, warned = {}, {}

    def done(job: ServingJob, outcome: tuple) -> None:
        results[job], warned[job] = outcome[:2], outcome[3]
        if progress:
            print(progress_line(len(results), len(jobs), f"{job.layout.name} on "
                                f"{job.layout.topology_name}, {job.name}", *outcome[:3]),
                  file=sys.stderr, flush=True)

    return results, warned, plan_jobs(step, jobs, workers, done)


def _largest_batches(step: Callable, layouts: Sequence[Layout], kv_length: int,
                     results: dict, progress: bool) -> dict[Layout, int | None]:
    """The largest decode batch that fits at `kv_length`, per layout (None when
    MAX_SEARCH_PLANS rounds do not pin it down): predicted from the two largest batches
    planned (peak HBM linear in the batch), then confirmed by plans at the prediction and
    one above it, doubling or bisecting while they disagree with it. A few plans a round:
    planned in this process."""
    bounds = {}  # layout -> [largest batch known to fit, smallest known not to]
    for layout in layouts:
        planned = sorted((job.batch, e) for job, (e, _) in results.items()
                         if job.layout == layout and job.kind == DECODE and e is not None)
        if len(planned) < 2:
            continue
        fit = max((b for b, e in planned if e.fits), default=0)
        over = min((b for b, e in planned if not e.fits), default=None)
        (b1, e1), (b2, e2) = planned[-2:]
        per_sequence = (e2.peak_bytes - e1.peak_bytes) / (b2 - b1)
        if over is not None:
            bounds[layout] = [fit, over, None]  # bisect
        elif per_sequence > 0:  # the batch where the line crosses the HBM capacity
            guess = int((e2.hbm_bytes - e1.peak_bytes) / per_sequence) + b1
            bounds[layout] = [fit, None, max(guess, fit)]
        else:  # no growth to predict from: double until a batch does not fit
            bounds[layout] = [fit, None, 2 * max(fit, 1)]
    for _ in range(MAX_SEARCH_PLANS):
        jobs = []
        for layout, (fit, over, guess) in bounds.items():
            if over is not None and over - fit <= 1:
                continue
            tries = [guess, guess + 1] if guess is not None else [(fit + over) // 2]
            jobs += [ServingJob(DECODE, layout, b, kv_length) for b in tries if b > fit and
                     (over is None or b < over)]
        jobs = list(dict.fromkeys(jobs))
        if not jobs:
            break
        for job, outcome in _plan_all(step, jobs, 1, progress)[0].items():
            results[job] = outcome
            fit, over, _ = bounds[job.layout]
            if outcome[0] is not None and outcome[0].fits:
                bounds[job.layout][0] = max(fit, job.batch)
            else:
                bounds[job.layout][1] = job.batch if over is None else min(over, job.batch)
        for bound in bounds.values():
            bound[2] = None  # the prediction is spent: bisect from here
            if bound[1] is None:  # still no batch over capacity: look further up
                bound[2] = 2 * max(bound[0], 1)
    return {layout: fit if over is not None and over - fit <= 1 else None
            for layout, (fit, over, _) in bounds.items()}
