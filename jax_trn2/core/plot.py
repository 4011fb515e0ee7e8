"""A picture of one step's estimate: where the time goes and where the bytes go.

    jax_trn2.jit(step).lower(*args).compile().plot("step.png")
    jax-trn2 inspect program.mlir --plot step.png

Three parts, from the estimate's public data (mesh.perf.estimate.ProgramEstimate):
- the engines of a chip over the step (its timeline, loops unrolled into their iterations;
  every chip running the program runs the same one), instructions on the critical path in a
  darker shade, and the HBM traffic of compute instructions on the DMA row;
- the HBM in use on a chip over the step (mesh.memory's liveness), its peak marked;
- the bytes the step's collectives put on each torus link (mesh.perf.collectives'
  routing of each collective's chosen algorithm), drawn on the torus: one panel per plane of
  its first two axes (NeuronLink axes before EFA ones), links in the plane as lines (a ring's
  wraparound link as a stub leaving the last chip and one entering the first), links to the
  next plane as short ticks. A link's colour is the bytes of its busier direction.

matplotlib is an optional dependency (`pip install 'jax-trn2[plot]'`), imported when a plot
is made. Any format matplotlib writes goes, by the file's extension (png, svg, pdf).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from mesh import isa
from mesh.machine import Topology
from mesh.perf.estimate import ProgramEstimate
from mesh.perf.schedule import ALL, ENGINES
from mesh.units import byte_unit, bytes_text

WIDTH_INCHES = 13.0
MAX_PANELS = 16  # torus planes drawn; more would shrink each past reading
PANEL_COLUMNS = 4
IDLE_LINK = "#d9d9d9"  # a link that carries nothing
FAILED = "#d62728"
BUSY = "#4c72b0"  # an engine's work off the critical path
CRITICAL = "#1f2f57"  # and on it
HBM_TRAFFIC = "#a6bddb"  # a compute instruction's HBM traffic on the DMA queue
TICK_ANGLES_DEGREES = (45.0, 135.0, -45.0, -135.0)  # ticks of out-of-plane axes, in order
TICK_LENGTH = 0.4  # of the spacing between chips
LOOPS_LABEL = "loops, branches"  # the span of each; their instructions run on the engines


def save_plot(estimate: ProgramEstimate, path: str | os.PathLike) -> None:
    """Draw `estimate`'s engines over time, HBM in use over time and torus link loads into
    the image file `path` (its format from its extension)."""
    figure_class = _figure_class()
    cables = _cable_bytes(estimate.topology, step_link_bytes(estimate))
    planes = _planes(estimate) if any(cables.values()) else []
    rows = math.ceil(min(len(planes), MAX_PANELS) / PANEL_COLUMNS) if planes else 1
    figure = figure_class(figsize=(WIDTH_INCHES, 6.0 + 3.0 * rows), layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=(6.0, 3.0 * rows))
    engines_axes, hbm_axes = top.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    scale, unit = _time_unit(estimate.step_seconds)
    _draw_engines(engines_axes, estimate, scale)
    _draw_hbm(hbm_axes, estimate, scale, unit)
    _draw_links(bottom, estimate, planes, cables)
    figure.suptitle(f"{estimate.program.name} on {estimate.topology.name}: estimated step "
                    f"{estimate.step_seconds * scale:,.3f} {unit} per chip")
    figure.savefig(path, dpi=100)


def step_link_bytes(estimate: ProgramEstimate) -> np.ndarray:
    """The bytes every torus link carries over one step, [chip, torus axis, direction]
    (ProgramEstimate.link_bytes)."""
    return estimate.link_bytes


def _figure_class() -> Any:
    """matplotlib's Figure (no pyplot: no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("jax_trn2 draws plots with matplotlib, which is not installed: "
                          "pip install 'jax-trn2[plot]' (or pip install matplotlib)") from None
    return Figure


def _time_unit(seconds: float) -> tuple[float, str]:
    """(factor, unit) that shows `seconds` as a number between 1 and 1000 where it can."""
    for factor, unit in ((1e6, "us"), (1e3, "ms")):
        if seconds * factor < 1000:
            return factor, unit
    return 1.0, "s"


# --- engines -----------------------------------------------------------------------------

def _draw_engines(axes, estimate: ProgramEstimate, scale: float) -> None:
    events = estimate.timeline()  # loops unrolled: their instructions on their engines
    rows = list(ENGINES) + ([ALL] if any(e.engine == ALL for e in events) else [])
    for row, engine in enumerate(rows):
        mine = [e for e in events if e.engine == engine and e.seconds > 0]
        for critical, colour in ((False, BUSY), (True, CRITICAL)):
            bars = [(e.start * scale, e.seconds * scale) for e in mine
                    if (e.cost.optimal_seconds > 0) == critical]
            axes.broken_barh(bars, (row - 0.4, 0.8), color=colour)
        if engine == isa.DMA:  # other engines' HBM traffic occupies the DMA queue too
            traffic = [(e.start * scale, e.hbm_seconds * scale) for e in events
                       if e.hbm_seconds and e.engine not in (isa.DMA, ALL)]
            axes.broken_barh(traffic, (row - 0.4, 0.8), color=HBM_TRAFFIC)
    busy = estimate.busy_seconds()
    step = estimate.step_seconds
    labels = [f"{engine} {busy[engine] / step:.0%}" if engine in busy and step else
              LOOPS_LABEL for engine in rows]
    axes.set_yticks(range(len(rows)), labels)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    chips = len(estimate.placement.device_to_chip) if estimate.placement is not None else 1
    every = f"all {chips} chips of the program run this timeline" if chips > 1 else \
        "the program runs on one chip"
    axes.set_title(f"engines of a chip, busy share ({every})", fontsize=10, loc="left")
    handles = [_patch(BUSY, "instruction"), _patch(CRITICAL, "on the critical path"),
               _patch(HBM_TRAFFIC, "HBM traffic of a compute instruction")]
    axes.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3,
                fontsize=8, frameon=False, borderaxespad=0.2)
    axes.set_xlim(0, max(step * scale, 1e-9))


def _patch(colour: str, label: str):
    from matplotlib.patches import Patch
    return Patch(color=colour, label=label)


# --- HBM ---------------------------------------------------------------------------------

def _draw_hbm(axes, estimate: ProgramEstimate, scale: float, unit: str) -> None:
    memory = estimate.memory
    live = memory.liveness
    stats = memory.stats()
    samples = list(live.samples)
    if not samples or samples[0][0] > 0:  # before anything runs: the arguments
        samples.insert(0, (0.0, stats.argument_size_in_bytes))
    step = estimate.step_seconds
    if samples[-1][0] < step:
        samples.append((step, samples[-1][1]))
    size, size_unit = byte_unit(max(live.peak_bytes, 1))
    times = [t * scale for t, _ in samples]
    used = [b / size for _, b in samples]
    axes.step(times, used, where="post", color=BUSY)
    axes.fill_between(times, used, step="post", color=BUSY, alpha=0.2)
    peak_at = min(max(live.peak_seconds, 0.0), step) * scale  # arguments: before the step
    axes.plot([peak_at], [live.peak_bytes / size], "v", color=FAILED)
    axes.annotate(f"peak {bytes_text(live.peak_bytes)} of {bytes_text(stats.hbm_bytes)}",
                  (peak_at, live.peak_bytes / size), textcoords="offset points",
                  xytext=(6, 4), fontsize=8, color=FAILED)
    axes.set_ylim(0, live.peak_bytes / size * 1.25 if live.peak_bytes else 1)
    axes.set_ylabel(size_unit)
    axes.set_xlabel(f"time ({unit})")
    axes.set_title("HBM in use on a chip", fontsize=10, loc="left")


# --- torus links -------------------------------------------------------------------------

def _plane_axes(topology: Topology) -> list[int]:
    """The torus axes drawn inside a panel: the first two, NeuronLink axes before EFA."""
    order = sorted(range(topology.ndim), key=lambda a: a in topology.efa_axes)
    return order[:2]


def _planes(estimate: ProgramEstimate) -> list[tuple[int, ...]]:
    """The coordinates along the other axes of each plane holding a chip the program runs
    on, in order."""
    topology = estimate.topology
    others = [a for a in range(topology.ndim) if a not in _plane_axes(topology)]
    chips = estimate.placement.device_to_chip if estimate.placement is not None else (0,)
    return sorted({tuple(topology.coords(c)[a] for a in others) for c in chips})


def _cable_bytes(topology: Topology, loads: np.ndarray) -> dict[tuple[int, int], float]:
    """(chip, axis) -> the bytes of the busier direction of the cable from the chip to its
    next neighbour along the axis, from link loads [chip, axis, direction]. On a ring of 2
    the two chips share one cable (listed once, from coordinate 0), and all a chip sends
    along the axis goes to the other."""
    cables = {}
    for chip in range(topology.num_chips):
        for peer, axis, direction in topology.neighbours(chip):
            if topology.shape[axis] == 2:
                if topology.coords(chip)[axis] == 0:
                    cables[chip, axis] = max(loads[chip, axis].sum(), loads[peer, axis].sum())
            elif direction > 0:
                cables[chip, axis] = max(loads[chip, axis, 1], loads[peer, axis, 0])
    return cables


def _draw_links(subfigure, estimate: ProgramEstimate, planes: list[tuple[int, ...]],
                cables: dict[tuple[int, int], float]) -> None:
    if not planes:
        axes = subfigure.subplots()
        axes.axis("off")
        axes.text(0.5, 0.5, "no collectives move data between chips in this step",
                  ha="center", va="center")
        return
    from matplotlib import cm, colors
    topology = estimate.topology
    most = max(cables.values())
    size, size_unit = byte_unit(most)
    norm = colors.Normalize(0.0, most / size)
    colour_of = lambda load: cm.viridis(norm(load / size)) if load > 0 else IDLE_LINK  # noqa: E731
    shown = planes[:MAX_PANELS]
    grid = subfigure.subplots(math.ceil(len(shown) / PANEL_COLUMNS), PANEL_COLUMNS,
                              squeeze=False)
    for axes, plane in zip(grid.flat, shown):
        _draw_plane(axes, estimate, plane, cables, colour_of)
    for axes in list(grid.flat)[len(shown):]:
        axes.axis("off")
    bar = subfigure.colorbar(cm.ScalarMappable(norm=norm, cmap="viridis"), ax=grid,
                             shrink=0.8)
    bar.set_label(f"{size_unit} per direction (the busier)")
    out_of_plane = [a for a in range(topology.ndim) if a not in _plane_axes(topology)]
    ticks = ", ".join(f"{topology.axis_names[a]} ({TICK_ANGLES_DEGREES[i]:g} deg)"
                      for i, a in enumerate(out_of_plane))
    every_plane = math.prod(topology.shape[a] for a in out_of_plane)
    placement = estimate.placement
    mesh = "" if placement is None else "mesh " + ", ".join(
        f"{name} on {placement.axis_text(i, topology.axis_names)}"
        for i, name in enumerate(placement.axis_names)) + "; "
    subfigure.suptitle(
        "torus links: bytes the step's collectives put on each"
        + (f"; ticks: links to the next plane along {ticks}" if ticks else "")
        + (f"; {len(shown)} of {every_plane} planes shown" if len(shown) < every_plane
           else "")
        + (" (those holding the program's chips)" if len(shown) == len(planes) < every_plane
           else f" (of the {len(planes)} holding the program's chips)"
           if len(shown) < len(planes) else "")
        + f"\n{mesh}filled chips run the program, red: failed", fontsize=10)


def _draw_plane(axes, estimate: ProgramEstimate, plane: tuple[int, ...],
                cables: dict[tuple[int, int], float], colour_of) -> None:
    topology = estimate.topology
    inside = _plane_axes(topology)
    others = [a for a in range(topology.ndim) if a not in inside]
    running = set(estimate.placement.device_to_chip) if estimate.placement is not None \
        else {0}
    sizes = [topology.shape[a] for a in inside] + [1] * (2 - len(inside))

    def chip_at(u: int, v: int) -> int:
        coords = [0] * topology.ndim
        for axis, value in zip(inside, (u, v)):
            coords[axis] = value
        for axis, value in zip(others, plane):
            coords[axis] = value
        return topology.chip_id(coords)

    for u in range(sizes[0]):
        for v in range(sizes[1]):
            chip = chip_at(u, v)
            for k, axis in enumerate(inside):
                if (chip, axis) not in cables:
                    continue
                _draw_cable(axes, (u, v), k, sizes[k], cables[chip, axis],
                            colour_of, _failed(topology, chip, axis))
            for i, axis in enumerate(others):
                if (chip, axis) in cables:
                    angle = math.radians(TICK_ANGLES_DEGREES[i % len(TICK_ANGLES_DEGREES)])
                    end = (u + TICK_LENGTH * math.cos(angle), v + TICK_LENGTH * math.sin(angle))
                    axes.plot([u, end[0]], [v, end[1]], color=colour_of(cables[chip, axis]),
                              linewidth=3, zorder=1)
            failed = chip in topology.failed_chips
            axes.scatter([u], [v], s=60, zorder=3, marker="s",
                         color=FAILED if failed else "black" if chip in running else "white",
                         edgecolors="black", linewidths=0.8)
    axes.set_xlim(-0.7, sizes[0] - 0.3)
    axes.set_ylim(-0.7, sizes[1] - 0.3)
    axes.set_aspect("equal")
    names = [topology.axis_names[a] for a in inside]
    axes.set_xticks(range(sizes[0]))
    axes.set_yticks(range(sizes[1]))
    axes.set_xlabel(names[0] if names else "")
    axes.set_ylabel(names[1] if len(names) > 1 else "")
    axes.set_title(", ".join(f"{topology.axis_names[a]}={c}" for a, c in zip(others, plane))
                   or "the torus", fontsize=9)


def _draw_cable(axes, at: tuple[int, int], k: int, size: int, load: float, colour_of,
                failed: bool) -> None:
    """The cable from the chip at `at` to its +1 neighbour along in-plane direction k: a
    line, or for the wraparound cable of a ring, a stub out of the last chip and a stub into
    the first."""
    step = np.eye(2)[k]
    start = np.array(at, dtype=float)
    style = dict(color=FAILED if failed else colour_of(load), linewidth=3,
                 linestyle="--" if failed else "-", zorder=2)
    if at[k] + 1 < size:
        end = start + step
        axes.plot([start[0], end[0]], [start[1], end[1]], **style)
        return
    out, into = start + 0.45 * step, start - at[k] * step
    axes.plot([start[0], out[0]], [start[1], out[1]], **style)
    axes.plot([into[0] - 0.45 * step[0], into[0]], [into[1] - 0.45 * step[1], into[1]], **style)


def _failed(topology: Topology, chip: int, axis: int) -> bool:
    """Whether the cable from `chip` to its +1 neighbour along `axis` cannot carry data."""
    peer = next(p for p, a, d in topology.neighbours(chip) if a == axis and d > 0)
    return not (topology.link_usable(chip, peer) and topology.link_usable(peer, chip))


# --- a sweep of layouts ------------------------------------------------------------------

SWEEP_WIDTH_INCHES = 10.0
KEY_WIDTH_INCHES = 3.0  # the key of ranks and layouts beside the plot
LOG_SCALE_RANGE = 20.0  # peak HBM spanning more than this factor: a log axis
MAX_LABEL_CHARS = 40
KEY_LINES = 48  # layouts the key names; the table has the rest
SWEEP_DPI = 100


def save_sweep_plot(sweep: Any, path: str | os.PathLike) -> None:
    """Draw a jax_trn2.plan.Sweep into the image file `path` (sweep_figure)."""
    sweep_figure(sweep).savefig(path, dpi=SWEEP_DPI)


def sweep_figure(sweep: Any) -> Any:
    """A matplotlib Figure of a jax_trn2.plan.Sweep: each planned layout's expected step
    time (a dot; its ideal step a tick below it, joined by a line) against its peak HBM
    per device (a chip, or a logical NeuronCore on the instance presets), layouts that fit
    in one colour and those that do not in another, a device's HBM capacity a vertical
    line, each point labelled with its rank in the sweep's table
    (points whose labels would overlap share one label: '3, 7') and a key of ranks and
    layouts beside the plot (failed layouts have no point)."""
    plans = [p for p in sweep.plans if p.ok]
    if not plans:
        raise ValueError("the sweep has no planned layout to draw (every one failed)")
    figure = _figure_class()(figsize=(SWEEP_WIDTH_INCHES + KEY_WIDTH_INCHES, 6.0),
                             layout="constrained", dpi=SWEEP_DPI)
    axes, key = figure.subplots(1, 2, width_ratios=(SWEEP_WIDTH_INCHES, KEY_WIDTH_INCHES))
    scale, unit = _time_unit(max(p.estimate.step_seconds for p in plans))
    size, size_unit = byte_unit(max(p.estimate.peak_bytes for p in plans))
    for fits, colour, label in ((True, BUSY, "fits"), (False, FAILED, "does not fit")):
        chosen = [p for p in plans if p.fits == fits]
        if not chosen:
            continue
        peaks = [p.estimate.peak_bytes / size for p in chosen]
        for p, x in zip(chosen, peaks):
            axes.plot([x, x], [p.estimate.ideal_step_seconds * scale,
                               p.estimate.step_seconds * scale], color=colour, alpha=0.4)
        axes.plot(peaks, [p.estimate.ideal_step_seconds * scale for p in chosen], "_",
                  color=colour, markersize=10)
        axes.plot(peaks, [p.estimate.step_seconds * scale for p in chosen], "o",
                  color=colour, label=f"{label} (expected step; ideal: tick)")
    capacity = plans[0].estimate.hbm_bytes
    axes.axvline(capacity / size, color=FAILED, linestyle="--")
    axes.annotate(f"HBM per device {bytes_text(capacity)}", (capacity / size, 1.0),
                  xycoords=("data", "axes fraction"), textcoords="offset points",
                  xytext=(-4, -12), fontsize=8, color=FAILED, ha="right")
    peaks = [p.estimate.peak_bytes for p in plans] + [capacity]
    if max(peaks) / max(min(peaks), 1) > LOG_SCALE_RANGE:
        axes.set_xscale("log")
    axes.set_xlabel(f"peak HBM per device ({size_unit})")
    axes.set_ylabel(f"step time ({unit})")
    axes.set_ylim(bottom=0)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title(f"{len(plans)} layouts planned: step time against peak HBM per device "
                   f"(rank in the sweep's table)", fontsize=10, loc="left")
    ranked = [(rank, p) for rank, p in enumerate(sweep.plans, 1) if p.ok]
    _label_points(figure, axes, [([rank], (p.estimate.peak_bytes / size,
                                           p.estimate.step_seconds * scale))
                                 for rank, p in ranked])
    _draw_key(key, ranked)
    return figure


def _label_points(figure: Any, axes: Any, groups: list[tuple[list[int], tuple]]) -> None:
    """Label each point with its rank; two labels that overlap once drawn are merged into
    one at the first's point ('3, 7'), until none overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw_without_rendering()  # the constrained layout settles the axes
    while True:
        texts = [axes.annotate(", ".join(map(str, ranks)), point, textcoords="offset points",
                               xytext=(4, 3), fontsize=7) for ranks, point in groups]
        boxes = [t.get_window_extent(renderer) for t in texts]
        pair = next(((i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                     if boxes[i].overlaps(boxes[j])), None)
        if pair is None:
            return
        for t in texts:
            t.remove()
        i, j = pair
        groups[i] = (groups[i][0] + groups[j][0], groups[i][1])
        del groups[j]


def _draw_key(key: Any, ranked: list[tuple[int, Any]]) -> None:
    """The ranks and names of the planned layouts, as the table lists them."""
    key.axis("off")
    lines = [f"{rank:>3}  {p.name[:MAX_LABEL_CHARS]}" for rank, p in ranked[:KEY_LINES]]
    if len(ranked) > KEY_LINES:
        lines.append(f"     ... {len(ranked) - KEY_LINES} more: the sweep's table")
    key.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace",
             fontsize=7, transform=key.transAxes)
