"""Plan a Trn2 deployment: sweep layouts of a step, rank what fits, and read the answer in a
planner's units (step time, tokens/s, time to train, chip-hours, money).

    def build(layout):                       # the user's step under one layout
        mesh = layout.make_mesh()
        step = jax_trn2.jit(train_step, in_shardings=..., topology=layout.topology)
        return step, (params, tokens)        # jax.ShapeDtypeStructs: nothing is allocated

    table = jax_trn2.plan.sweep(build, jax_trn2.plan.grid(64, ("fsdp", "tp")),
                                tokens_per_step=64 * 8192, model_flops=6 * n * 64 * 8192)
    print(table)                             # ranked: what fits, fastest first
    table.rows()                             # a list of dicts, for a notebook
    table.plot("sweep.png")                  # step time against peak HBM per device
    print(table.recommendation)              # the fastest that fits; why the next ones lost

A device is what JAX sees: a chip on the whole-chip presets (trn2, trn2-ultra, ...), a
logical NeuronCore on the machines as AWS rents them (trn2.48xlarge: 64 of 24 GiB); memory
and throughput are per device, chip-hours count the chips the devices occupy.

Each layout's step is built, partitioned, lowered and estimated (jax_trn2.jit's Lowered:
cost_analysis and memory_analysis), in worker processes when the sweep is large enough to
pay for their start-up, with a line of progress per plan. A layout whose step cannot be
built or lowered (a shape that does not divide over its mesh, an op without a lowering
rule) is kept in the table with the reason; one that does not fit in HBM is planned and
marked.

Utilisations. `mfu` is the estimate's: the time the matmuls the devices run would take at
their dtype's peak, jax.checkpoint's recomputation left out, over the step. It cannot see
work that is not the model's, such as a pipeline's bubble, where stages compute on no
microbatch: with `model_flops` (the step's FLOPs by the model's own count, e.g. 6 per
parameter per token), `model_mfu` is those FLOPs over the devices' BF16 peak for the step,
and a pipeline's `bubble` is the share of the devices' matmul work that is not the model's.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import itertools
import math
import multiprocessing
import os
import pickle
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from jax_trn2.planner.layout import (DEFAULT_RULES, KINDS, MESH_ORDER, Layout,
                                    UnknownLogicalAxisError, grid)
from jax_trn2.planner.recommend import Recommendation, RunnerUp, recommend
from jax_trn2.planner.tables import duration_text, sweep_table
from jax_trn2.planner.training import TrainingRun, training_run
from mesh.machine import Topology, get_topology
from mesh.memory import PeakSplit
from mesh.perf.estimate import CollectiveTimes
from mesh.perf.schedule import ENGINES
from mesh.units import bytes_text

__all__ = ["DEFAULT_RULES", "KINDS", "MESH_ORDER", "Layout", "Plan", "Recommendation",
           "RunnerUp", "StepEstimate", "Sweep", "UnknownLogicalAxisError", "estimate", "grid",
           "recommend", "sweep", "Variant", "variants"]

# A worker process takes about this long to start (spawn, import jax and the user's module,
# the first trace): worth it only when it saves more than that (measured on a 2-core AMD
# EPYC: 3-5 s).
WORKER_START_SECONDS = 5.0
REASON_CHARS = 160  # of a failure's reason shown in a progress line


@dataclass(frozen=True)
class StepEstimate:
    """The figures of one lowered step that a plan reports (per device unless named: a
    chip, or a logical NeuronCore on the instance presets)."""

    devices: int  # devices the step runs on (its mesh's)
    topology: str
    peak_bytes: int  # peak HBM in use on the fullest device
    hbm_bytes: int  # a device's HBM (24 GiB for an LNC=2 core, 96 GiB for a chip)
    step_seconds: float  # expected (with the Neuron runtime's measured costs)
    ideal_step_seconds: float  # the hardware's limits
    mfu: float  # the estimate's (expected step), recomputation left out
    hfu: float  # counting recomputation
    ideal_mfu: float
    exposed_communication_seconds: float
    busiest_engine: str
    busiest_seconds: float
    peak_flops: float  # one device's BF16 peak, FLOP/s
    # of the arguments the step updates in place (its outputs written into donated
    # arguments), per device
    donated_bytes: int
    # what holds the peak at its instant (mesh.memory.PeakSplit: donated arguments, other
    # arguments, outputs, temporaries; they sum to peak_bytes)
    peak_split: PeakSplit = PeakSplit()
    # the step's collectives by kind (count, seconds, exposed seconds), most time first
    communication: tuple[CollectiveTimes, ...] = ()
    # (link, bytes per step, seconds at its bandwidth) of the busiest torus links
    busiest_links: tuple[tuple[str, float, float], ...] = ()

    @property
    def fits(self) -> bool:
        """Whether the peak HBM in use fits in a device's HBM."""
        return self.peak_bytes <= self.hbm_bytes


def estimate(jitted: Any, args: Sequence[Any],
             topology: str | Topology | None = None) -> StepEstimate:
    """Lower `jitted` (a jax_trn2.jit function) for `args` (arrays or
    jax.ShapeDtypeStructs) and read its estimate; nothing runs or is allocated.
    `topology`: the machine it was made for (its device's peak; default: the preset of the
    name the estimate gives)."""
    return estimate_lowered(jitted.lower(*args), topology)


def estimate_lowered(lowered: Any, topology: str | Topology | None = None) -> StepEstimate:
    """`estimate` of a step lowered already (a jax_trn2.jit Lowered)."""
    memory = lowered.memory_analysis()
    info = lowered.cost_analysis()["trn2"]
    program = lowered.program
    busy = info["engine_busy_seconds"]
    engine = max(ENGINES, key=lambda e: busy[e])
    if not isinstance(topology, Topology):
        topology = get_topology(topology or info["topology"])
    return StepEstimate(
        devices=max(program.mesh.num_devices, 1), topology=info["topology"],
        peak_bytes=memory.peak_memory_in_bytes, hbm_bytes=memory.hbm_bytes,
        step_seconds=info["step_seconds"], ideal_step_seconds=info["ideal_step_seconds"],
        mfu=info["mfu"], hfu=info["hfu"], ideal_mfu=info["ideal_mfu"],
        exposed_communication_seconds=info["exposed_communication_seconds"],
        busiest_engine=engine, busiest_seconds=busy[engine],
        peak_flops=topology.device.peak_flops_for("bfloat16"),
        donated_bytes=memory.alias_size_in_bytes, peak_split=memory.peak_split,
        communication=tuple(CollectiveTimes(kind, **t)
                            for kind, t in info["communication_by_kind"].items()),
        busiest_links=tuple((l["link"], float(l["bytes"]), float(l["seconds"]))
                            for l in info["busiest_links"]))


@dataclass(frozen=True)
class Plan:
    """One layout's plan: its estimate, or why it could not be planned (`error`)."""

    layout: Layout
    estimate: StepEstimate | None
    error: str | None = None
    planned_seconds: float = 0.0  # host wall time to build, lower and estimate
    tokens_per_step: float | None = None  # given to the sweep
    model_flops: float | None = None  # the model's FLOPs per step, given to the sweep
    warnings: tuple[str, ...] = ()  # what planning warned of (XLA's partitioner, say)
    # the build function's parameters for this plan (a sweep's `params`): (name, value)
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        """The layout's name and the plan's parameters: 'fsdp 64, batch 16, seq 8192'."""
        return ", ".join([self.layout.name] + [f"{k} {v}" for k, v in self.params])

    @property
    def rank_seconds(self) -> float | None:
        """What a sweep ranks by: the expected step per token when tokens_per_step is
        known (so that variants training other numbers of tokens a step compare), else
        the expected step; None when not planned."""
        if not self.ok:
            return None
        step = self.estimate.step_seconds
        return step / self.tokens_per_step if self.tokens_per_step else step

    @property
    def ok(self) -> bool:
        """Whether the layout was planned (else `error` says why not)."""
        return self.estimate is not None

    @property
    def fits(self) -> bool:
        """Planned, and its peak HBM fits in a device's."""
        return self.ok and self.estimate.fits

    @property
    def headroom_bytes(self) -> int | None:
        """HBM left on the fullest device at the peak (negative: over capacity)."""
        return None if not self.ok else self.estimate.hbm_bytes - self.estimate.peak_bytes

    @property
    def step_seconds(self) -> float | None:
        """The expected step time (None: not planned)."""
        return self.estimate.step_seconds if self.ok else None

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens per second over all devices (expected step)."""
        if not self.ok or not self.tokens_per_step or not self.estimate.step_seconds:
            return None
        return self.tokens_per_step / self.estimate.step_seconds

    @property
    def tokens_per_second_per_device(self) -> float | None:
        """tokens_per_second over the devices the step runs on."""
        rate = self.tokens_per_second
        return None if rate is None else rate / self.estimate.devices

    def model_mfu(self, ideal: bool = False) -> float | None:
        """The model's FLOPs per step over the devices' BF16 peak for the expected (or
        ideal) step; None without model_flops."""
        if not self.ok or self.model_flops is None:
            return None
        e = self.estimate
        step = e.ideal_step_seconds if ideal else e.step_seconds
        return self.model_flops / (e.devices * e.peak_flops * step) if step else None

    @property
    def bubble(self) -> float | None:
        """A pipeline's bubble: the share of the devices' matmul work that is not the
        model's (1 - model MFU / MFU), for a layout with a `pp` axis and model_flops."""
        model = self.model_mfu()
        if model is None or self.layout.size("pp") < 2 or not self.estimate.mfu:
            return None
        return 1.0 - model / self.estimate.mfu

    @property
    def gpipe_bubble(self) -> float | None:
        """GPipe's bubble (S-1)/(M+S-1) for the layout's S stages and M microbatches."""
        stages, micro = self.layout.size("pp"), self.layout.microbatches
        if stages < 2 or micro is None:
            return None
        return (stages - 1) / (micro + stages - 1)

    def training(self, tokens: float, price_per_chip_hour: float | None = None
                 ) -> TrainingRun | None:
        """Training `tokens` tokens with this plan's expected step on the chips its
        devices occupy (None when it could not be planned or no tokens_per_step was
        given)."""
        if not self.ok or not self.tokens_per_step:
            return None
        return training_run(self.estimate.step_seconds, self.tokens_per_step,
                            self.layout.chips, tokens, price_per_chip_hour)

    def row(self, train_tokens: float | None = None,
            price_per_chip_hour: float | None = None) -> dict[str, Any]:
        """The plan as a flat dict (seconds, bytes, shares), for a notebook's table."""
        row: dict[str, Any] = {"layout": self.layout.name, "topology":
                               self.layout.topology_name, "remat": self.layout.remat,
                               "devices": self.layout.devices, "chips": self.layout.chips,
                               "error": self.error,
                               "planned_seconds": self.planned_seconds}
        row.update({k: v for k, v in self.layout.axes})
        row.update(self.params)
        row.update(tokens_per_step=self.tokens_per_step, model_flops=self.model_flops)
        if not self.ok:
            return row
        e = self.estimate
        row.update(
            peak_hbm_bytes=e.peak_bytes, hbm_bytes=e.hbm_bytes, fits=e.fits,
            headroom_bytes=self.headroom_bytes, step_seconds=e.step_seconds,
            ideal_step_seconds=e.ideal_step_seconds, mfu=e.mfu, ideal_mfu=e.ideal_mfu,
            hfu=e.hfu, model_mfu=self.model_mfu(), ideal_model_mfu=self.model_mfu(ideal=True),
            tokens_per_second=self.tokens_per_second,
            tokens_per_second_per_device=self.tokens_per_second_per_device,
            exposed_communication_seconds=e.exposed_communication_seconds,
            busiest_engine=e.busiest_engine,
            busiest_engine_share=e.busiest_seconds / e.step_seconds if e.step_seconds else 0.0,
            bubble=self.bubble, gpipe_bubble=self.gpipe_bubble,
            peak_donated_argument_bytes=e.peak_split.donated_arguments,
            peak_other_argument_bytes=e.peak_split.other_arguments,
            peak_output_bytes=e.peak_split.outputs,
            peak_temporary_bytes=e.peak_split.temporaries)
        for t in e.communication:  # 'all-gather_seconds', 'all-gather_exposed_seconds'...
            row.update({f"{t.kind}_count": t.count, f"{t.kind}_seconds": t.seconds,
                        f"{t.kind}_exposed_seconds": t.exposed_seconds})
        row["busiest_links"] = [dict(link=name, bytes=nbytes, seconds=seconds)
                                for name, nbytes, seconds in e.busiest_links]
        run = self.training(train_tokens, price_per_chip_hour) if train_tokens else None
        if run is not None:
            row.update(train_tokens=run.tokens, train_seconds=run.seconds,
                       train_days=run.days, chip_hours=run.chip_hours, cost=run.cost)
        return row


def _rank_key(plan: Plan) -> tuple:
    """Planned before failed, fitting before not, then the fastest expected step (per
    token, when tokens_per_step is known)."""
    return (not plan.ok, not plan.fits, plan.rank_seconds if plan.ok else 0.0)


class Sweep:
    """The plans of a sweep, ranked (fitting plans by expected step time, then those that
    do not fit, then those that failed). Prints as a table; `rows()` for a notebook."""

    def __init__(self, plans: Iterable[Plan], *, train_tokens: float | None = None,
                 price_per_chip_hour: float | None = None, wall_seconds: float = 0.0,
                 workers: int = 1):
        self.plans = sorted(plans, key=_rank_key)
        self.train_tokens = train_tokens
        self.price_per_chip_hour = price_per_chip_hour
        self.wall_seconds = wall_seconds
        self.workers = workers

    def __iter__(self):
        return iter(self.plans)

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, i: int) -> Plan:
        return self.plans[i]

    @property
    def best(self) -> Plan | None:
        """The fastest plan that fits (None if none does)."""
        return self.plans[0] if self.plans and self.plans[0].fits else None

    @property
    def recommendation(self) -> Recommendation:
        """The fastest plan that fits, and why others lost: the fastest that do not fit
        (their peak against a device's HBM, and what holds most of it) and the next
        fitting ones (what made their step longer). Printed under the table."""
        return recommend(self.plans)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per plan, in rank order (`pandas.DataFrame(sweep.rows())`)."""
        return [dict(rank=i + 1, **p.row(self.train_tokens, self.price_per_chip_hour))
                for i, p in enumerate(self.plans)]

    def plot(self, path: str | os.PathLike) -> None:
        """Draw expected step time against peak HBM per device, one point per planned
        layout, the HBM capacity marked (jax_trn2.plot; needs matplotlib)."""
        from jax_trn2.core.plot import save_sweep_plot
        save_sweep_plot(self, path)

    def __repr__(self) -> str:
        return self.table()

    def table(self) -> str:
        """The ranked table as text."""
        return sweep_table(self)


# A figure given per sweep (a number) or per variant (a function of the build's parameters).
PerVariant = float | Callable[..., float] | None


@dataclass(frozen=True)
class Variant:
    """One job of a sweep: a layout and the build function's parameters for it."""

    layout: Layout
    params: tuple[tuple[str, Any], ...] = ()

    def figure(self, given: PerVariant) -> float | None:
        """`given` for this variant: a number as it is, a function called with the
        variant's parameters (`model_flops(batch=16, seq=8192)`)."""
        return given(**dict(self.params)) if callable(given) else given


def variants(layouts: Iterable[Layout], params: Mapping[str, Sequence[Any]] | None = None
             ) -> list[Variant]:
    """Every layout with every combination of the parameters' values, layouts outermost:
    variants([a, b], {"batch": [8, 16]}) -> a with batch 8, a with 16, b with 8, b with
    16."""
    layouts = list(layouts)
    for i, layout in enumerate(layouts):
        if not isinstance(layout, Layout):
            raise TypeError(f"layouts[{i}] is a {type(layout).__name__}, not a "
                            "jax_trn2.plan.Layout")
    params = dict(params or {})
    for name, values in params.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) or \
                not list(values):
            raise ValueError(f"params[{name!r}] must be a non-empty list of values, got "
                             f"{values!r}")
    names = list(params)
    combos = list(itertools.product(*(list(params[n]) for n in names)))
    return [Variant(layout, tuple(zip(names, combo))) for layout in layouts
            for combo in combos]


def sweep(build: Callable[..., tuple[Any, Sequence[Any]]], layouts: Iterable[Layout], *,
          params: Mapping[str, Sequence[Any]] | None = None,
          tokens_per_step: PerVariant = None, model_flops: PerVariant = None,
          train_tokens: float | None = None, price_per_chip_hour: float | None = None,
          workers: int | None = None, progress: bool | Callable[[int, int, Plan], None] = True
          ) -> Sweep:
    """Plan `build(layout)` for every layout (with `params`: `build(layout, **values)` for
    every layout and every combination of the values) and rank the plans.

    `build(layout)` returns `(jitted, args)`: a jax_trn2.jit function set up for the layout
    (its shardings, remat and `topology=layout.topology`) and its arguments, usually
    jax.ShapeDtypeStructs. `params` sweeps what else the step is built with, e.g.
    `{"batch": [8, 16], "remat": ["none", "full"]}`: each a column of the table.
    `tokens_per_step` gives tokens/s and the training columns (`train_tokens`: time to
    train that many, chip-hours, and the cost at `price_per_chip_hour`); `model_flops`
    (the model's FLOPs per step) gives the model FLOP utilisation and a pipeline's bubble.
    Each is a number, or a function of the parameters giving each variant its own
    (`tokens_per_step=lambda batch, seq: batch * seq`); with tokens_per_step the plans rank
    by expected time per token. `workers`: processes planning in parallel (None: one per
    core, when there are enough plans to pay for starting them; 1: this process).
    `progress`: True prints a line per plan to stderr; a function is called as
    progress(done, total, plan)."""
    jobs = variants(layouts, params)
    check_figures(tokens_per_step, train_tokens, price_per_chip_hour)
    report = _progress_printer if progress is True else progress or None
    started = time.perf_counter()
    plans: list[Plan] = []

    def done(job: Variant, outcome: tuple) -> None:
        plans.append(plan_of(job, outcome, tokens_per_step, model_flops))
        if report is not None:
            report(len(plans), len(jobs), plans[-1])

    for job in jobs:  # marked, not built: the machine cannot hold their mesh
        if job.layout.placement_error:
            done(job, (None, job.layout.placement_error, 0.0, ()))
    count = plan_jobs(functools.partial(build_variant, build),
                      [j for j in jobs if not j.layout.placement_error], workers, done)
    return Sweep(plans, train_tokens=train_tokens, price_per_chip_hour=price_per_chip_hour,
                 wall_seconds=time.perf_counter() - started, workers=count)


def check_figures(tokens_per_step: PerVariant, train_tokens: float | None,
                  price_per_chip_hour: float | None) -> None:
    """Refuse a sweep's figures that cannot go together (a price without tokens to train,
    tokens to train without tokens per step), naming what is missing."""
    if price_per_chip_hour is not None and train_tokens is None:
        raise ValueError("sweep: price_per_chip_hour prices a training run: give "
                         "train_tokens too")
    if train_tokens is not None and tokens_per_step is None:
        raise ValueError("sweep: train_tokens needs tokens_per_step (how many tokens one "
                         "step trains)")


def build_variant(build: Callable[..., tuple[Any, Sequence[Any]]], job: Variant
                  ) -> tuple[Any, Sequence[Any]]:
    """`build(layout, **params)` of one variant (`build(layout)` without parameters)."""
    return build(job.layout, **dict(job.params))


def plan_of(job: Variant, outcome: tuple, tokens_per_step: PerVariant,
            model_flops: PerVariant) -> Plan:
    """The Plan of a variant from its outcome (estimate, error, seconds, warnings), with
    the variant's own tokens per step and model FLOPs."""
    estimate_, error, seconds, warned = outcome[:4]
    return Plan(job.layout, estimate_, error, seconds, job.figure(tokens_per_step),
                job.figure(model_flops), warned, job.params)


def _progress_printer(done: int, total: int, plan: Plan) -> None:
    print(progress_line(done, total, f"{plan.name} on {plan.layout.topology_name}",
                        plan.estimate, plan.error, plan.planned_seconds),
          file=sys.stderr, flush=True)


def progress_line(done: int, total: int, name: str, estimate_: StepEstimate | None,
                  error: str | None, seconds: float) -> str:
    """'[3/24] fsdp 64 on trn2-ultra: 42.46 GiB/device, step 20.62 s expected (planned in
    2.1 s)', or the first line of why it failed."""
    if estimate_ is not None:
        what = (f"{bytes_text(estimate_.peak_bytes)}/device"
                f"{'' if estimate_.fits else ' (does NOT fit)'}, step "
                f"{duration_text(estimate_.step_seconds)} expected")
    else:
        what = f"failed: {error.splitlines()[0][:REASON_CHARS]}"
    return f"[{done}/{total}] {name}: {what} (planned in {seconds:.1f} s)"


def plan_jobs(build: Callable, jobs: Sequence[Any], workers: int | None,
              done: Callable[[Any, tuple], None],
              skip: Callable[[Any], bool] | None = None,
              estimator: Callable[..., Any] = estimate) -> int:
    """Plan every job, `estimator(*build(job), machine)` (default `estimate`: a
    StepEstimate; another estimator may answer with something else that has the topology's
    name as `topology`), calling `done(job, (its answer | None, error | None, seconds,
    warnings))` as each completes; returns the worker processes used (1: this process
    alone). A job for which `skip(job)` is true when its turn comes (asked then, so that it
    can weigh the plans done so far) is not planned. `estimator` runs in the workers: a
    function of a module they can import.

    `workers` processes plan in parallel (spawned: jax's threads do not survive a fork);
    None plans the first job here and starts one per core for the rest if that saves more
    than starting them costs (WORKER_START_SECONDS). A `build` other processes cannot load
    (a lambda, a function defined in a function or in an interactive session) runs here."""
    jobs = list(jobs)
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    done = functools.partial(_raise_unavoidable, jobs, done)
    pending = iter([job for job in jobs])

    def next_job() -> Any:
        return next((job for job in pending if skip is None or not skip(job)), None)

    if not _spawnable(build):
        workers = 1
    if workers is None and jobs:
        first = next_job()
        if first is None:
            return 1
        outcome = _plan_one(build, first, estimator)
        done(first, outcome)
        cores = os.cpu_count() or 1
        saved = outcome[2] * (len(jobs) - 1) * (1 - 1 / cores)
        workers = min(cores, len(jobs) - 1) if cores > 1 and saved > WORKER_START_SECONDS \
            else 1
    workers = max(1, min(workers or 1, len(jobs)))
    if workers == 1:
        while (job := next_job()) is not None:
            done(job, _plan_one(build, job, estimator))
        return 1
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        # as many in flight as workers: each next job is asked `skip` when a worker frees
        running: dict[concurrent.futures.Future, Any] = {}
        try:
            while True:
                while len(running) < workers and (job := next_job()) is not None:
                    running[pool.submit(_plan_one, build, job, estimator)] = job
                if not running:
                    break
                finished, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    done(running.pop(future), future.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return workers


def _raise_unavoidable(jobs: Sequence[Any], done: Callable[[Any, tuple], None], job: Any,
                       outcome: tuple) -> None:
    """Pass `outcome` on to `done`, unless its error is one no job can avoid: a logical
    axis that none of the jobs' layouts has a rule for, raised once here rather than
    printed in every row."""
    axis = outcome[4]
    if axis is not None and not any(axis in dict(_layout_of(j).rules) for j in jobs):
        raise UnknownLogicalAxisError(
            f"no rule maps logical axis {axis!r} in any of the {len(jobs)} layouts, so none "
            f"can be planned; first seen planning {_layout_of(job).name}: {outcome[1]}. "
            f"Give it a rule: Layout.of(..., rules={{{axis!r}: <mesh axes, or () for "
            "never split>}), or grid(..., rules=...)", axis)
    done(job, outcome[:4])


def _layout_of(job: Any) -> Layout:
    """A job's layout: the job itself, or its `layout` (a serving job)."""
    return getattr(job, "layout", job)


def _plan_one(build: Callable, job: Any, estimator: Callable[..., Any] = estimate
              ) -> tuple[StepEstimate | None, str | None, float, tuple[str, ...], str | None]:
    """Build and estimate one job; an exception becomes the plan's error, a warning one of
    its warnings (kept with the plan, not printed: a sweep of 24 layouts would print each
    of XLA's partitioner warnings 24 times). A job is a Layout or has one (`job.layout`).
    The last item is the logical axis without a rule, when that is the error."""
    started = time.perf_counter()
    layout = _layout_of(job)
    unknown_axis = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jitted, args = build(job)
            result = estimator(jitted, args, layout.machine)
            if result.topology != layout.topology_name:
                raise ValueError(f"the step was lowered for topology '{result.topology}', "
                                 f"but the layout is on '{layout.topology_name}': pass "
                                 "topology=layout.topology to jax_trn2.jit")
            outcome = result, None
        except UnknownLogicalAxisError as e:
            outcome, unknown_axis = (None, f"{type(e).__name__}: {e}"), e.axis
        except Exception as e:  # the reason goes in the table; the sweep goes on
            outcome = None, error_reason(layout, e)
    warned = tuple(dict.fromkeys(str(w.message) for w in caught))
    return (*outcome, time.perf_counter() - started, warned, unknown_axis)


# jax's message when a sharding splits a dimension into parts that do not divide it
# (jax._src.sharding's IndivisibleError): the spec, the array axis, the parts, its size.
_INDIVISIBLE = re.compile(r"spec=P\((?P<spec>.*?)\),.*?implies that array axis (?P<dim>\d+) "
                          r"is partitioned (?P<parts>\d+) times, but the dimension size is "
                          r"(?P<size>\d+) \(full shape: (?P<shape>\([\d, ]*\))")


def error_reason(layout: Layout, error: Exception) -> str:
    """`'{type}: {message}'`, led by the layout parameter at fault where the error says
    which: 'tp=8 does not divide heads (12): dimension 1 of a (768, 12, 64) value split
    P('fsdp', 'tp')' before jax's IndivisibleError."""
    reason = f"{type(error).__name__}: {error}"
    match = _INDIVISIBLE.search(str(error))
    if match is None:
        return reason
    try:
        entries = match["spec"].strip().rstrip(",")
        spec = ast.literal_eval(f"({entries},)") if entries else ()
        shape = ast.literal_eval(match["shape"])
    except (ValueError, SyntaxError):
        return reason
    lead = indivisible_text(layout, spec, int(match["dim"]), shape)
    return reason if lead is None else f"{lead}; {reason}"


def indivisible_text(layout: Layout, spec: Sequence[Any], dim: int, shape: Sequence[int],
                     what: str = "value") -> str | None:
    """Why dimension `dim` of a `shape` value split as `spec` (PartitionSpec entries)
    does not divide, led by the layout's axes at fault and the dimension's logical axis
    where the layout knows it: "tp=8 does not divide heads (12): dimension 1 of a (768,
    12, 64) value split P('fsdp', 'tp')"; None when `spec` does not split that
    dimension."""
    entry = spec[dim] if dim < len(spec) else None
    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
    if not axes:
        return None
    parts = math.prod(layout.size(a) for a in axes)
    at_fault = " x ".join(f"{a}={layout.size(a)}" for a in axes)
    verb = "does" if len(axes) == 1 else f"(= {parts} parts) do"
    logical = layout.logical_axis(spec, dim, len(shape))
    split = ", ".join(repr(e) for e in spec)
    where = f"dimension {dim} of a {tuple(shape)} {what} split P({split})"
    if logical is not None:
        return f"{at_fault} {verb} not divide {logical} ({shape[dim]}): {where}"
    return f"{at_fault} {verb} not divide dimension {dim} ({shape[dim]}) of a " \
           f"{tuple(shape)} {what} split P({split})"


def _spawnable(fn: Callable) -> bool:
    """Whether a spawned process can load `fn` (and a functools.partial's arguments):
    pickled by reference, from a module it can import. Functions of an interactive
    session's __main__ (no file to run again) it cannot."""
    interactive = not hasattr(sys.modules["__main__"], "__file__")
    parts = [fn.func, *fn.args, *fn.keywords.values()] if isinstance(fn, functools.partial) \
        else [fn]
    if interactive and any(getattr(p, "__module__", None) == "__main__" for p in parts):
        return False
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True

