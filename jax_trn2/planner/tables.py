"""The plain-text tables a sweep and a serving plan print as, in a planner's units."""

from __future__ import annotations

from typing import Any, Sequence

from mesh.units import byte_unit, bytes_text

HOUR, DAY = 3600.0, 86400.0
REASON_CHARS = 400  # of a failure's reason shown in a table (the whole of it: plan.error)


# (unit, seconds in it, decimals shown, the durations below which it is used)
DURATION_UNITS = (("us", 1e-6, 0, 1e-3), ("ms", 1e-3, 1, 1.0), ("s", 1.0, 2, 2 * HOUR),
                  ("h", HOUR, 1, 2 * DAY), ("days", DAY, 1, float("inf")))
MAX_DECIMALS = 4  # shown by column_durations for a small duration in a column's unit


def _duration_unit(seconds: float) -> tuple[str, float, int, float]:
    return next(u for u in DURATION_UNITS if seconds < u[3])


def duration_text(seconds: float) -> str:
    """A duration in the unit that reads best: '812 us', '41.3 ms', '2.41 s', '3.2 h',
    '12.5 days'."""
    unit, size, decimals, _ = _duration_unit(seconds)
    return f"{seconds / size:,.{decimals}f} {unit}"


def column_durations(seconds: Sequence[float]) -> list[str]:
    """Durations for one table column, all in one unit (the one that reads best for the
    longest), so that they compare at a glance: ['1.6 h', '2.7 h'], not ['5,921.23 s',
    '2.7 h']. When the shortest nonzero one would show fewer than two significant digits,
    the column gets more decimals, up to MAX_DECIMALS."""
    if not seconds:
        return []
    unit, size, decimals, _ = _duration_unit(max(seconds))
    smallest = min((s for s in seconds if s > 0), default=0.0) / size
    while smallest and decimals < MAX_DECIMALS and smallest < 10 ** (1 - decimals):
        decimals += 1
    return [f"{s / size:,.{decimals}f} {unit}" for s in seconds]


def amount_text(x: float) -> str:
    """Three significant digits with a k/M/B/T suffix: '397', '25.4k', '10.5M', '0.0611'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 left: Sequence[int] = (1,)) -> str:
    """Columns padded to their widest cell; columns at positions `left` left-aligned,
    the others right-aligned; a rule under the headers."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    head = line(headers)
    return "\n".join([head, "-" * len(head)] + [line(r) for r in rows])


def fits_text(peak: int, capacity: int) -> str:
    """'yes, 53.5 GiB free' or 'NO, 12.1 GiB over'."""
    if peak <= capacity:
        return f"yes, {bytes_text(capacity - peak)} free"
    return f"NO, {bytes_text(peak - capacity)} over"


def sweep_table(sweep: Any) -> str:
    """A jax_trn2.plan.Sweep as text: a header saying what the columns mean, the ranked
    plans, then the layouts that failed and why."""
    plans = [p for p in sweep.plans if p.ok]
    failed = [p for p in sweep.plans if not p.ok]
    topologies = {p.layout.topology_name for p in sweep.plans}
    with_model = any(p.model_flops is not None for p in plans)
    with_tokens = any(p.tokens_per_step for p in plans)
    with_bubble = any(p.bubble is not None for p in plans)
    run_tokens = sweep.train_tokens if with_tokens else None
    param_names = list(dict.fromkeys(k for p in sweep.plans for k, _ in p.params))
    headers = ["#", "layout"] + param_names + (["topology"] if len(topologies) > 1 else []) + [
        "devices", "peak HBM/device", "fits", "step (expected)", "ideal", "MFU exp/ideal"]
    if with_tokens:
        headers += ["tokens/s", "per device"]
    headers += ["peak: donated + args + out + temp", "exposed comm",
                "comm by kind: count, total (exposed)", "busiest link", "busiest engine"]
    if with_bubble:
        headers += ["bubble (formula)"]
    if run_tokens:
        headers += ["time to train", "chip-hours"] + (
            ["cost"] if sweep.price_per_chip_hour is not None else [])
    headers += ["planned in"]
    estimates = [p.estimate for p in plans]
    steps = column_durations([e.step_seconds for e in estimates])
    ideals = column_durations([e.ideal_step_seconds for e in estimates])
    exposed = column_durations([e.exposed_communication_seconds for e in estimates])
    runs = [p.training(run_tokens, sweep.price_per_chip_hour) for p in plans] \
        if run_tokens else []
    run_times = column_durations([run.seconds for run in runs])
    rows = []
    for rank, plan in enumerate(plans, 1):
        e = plan.estimate
        mfu, ideal_mfu = (plan.model_mfu(), plan.model_mfu(ideal=True)) if with_model \
            else (e.mfu, e.ideal_mfu)
        given = dict(plan.params)
        row = [str(rank), plan.layout.name] + [str(given.get(k, "-")) for k in param_names] + (
            [plan.layout.topology_name] if len(topologies) > 1 else []) + [
            str(e.devices), bytes_text(e.peak_bytes), fits_text(e.peak_bytes, e.hbm_bytes),
            steps[rank - 1], ideals[rank - 1],
            f"{mfu:.1%} / {ideal_mfu:.1%}" if mfu is not None else "-"]
        if with_tokens:
            rate = plan.tokens_per_second
            row += [amount_text(rate), amount_text(plan.tokens_per_second_per_device)] if rate \
                else ["-", "-"]
        share = e.busiest_seconds / e.step_seconds if e.step_seconds else 0.0
        row += [peak_split_cell(e.peak_split), exposed[rank - 1],
                communication_cell(e.communication),
                bytes_text(e.busiest_links[0][1]) if e.busiest_links else "-",
                f"{e.busiest_engine} {share:.0%}"]
        if with_bubble:
            bubble, formula = plan.bubble, plan.gpipe_bubble
            row += ["-" if bubble is None else f"{bubble:.1%}" + (
                f" ({formula:.1%})" if formula is not None else "")]
        if run_tokens:
            run = runs[rank - 1]
            row += [run_times[rank - 1], amount_text(run.chip_hours)] + (
                [amount_text(run.cost)] if run.cost is not None else [])
        row += [f"{plan.planned_seconds:.1f} s"]
        rows.append(row)
    lines = [_sweep_header(sweep, with_model, run_tokens), ""]
    if rows:
        lines += [format_table(headers, rows), "", str(sweep.recommendation)]
    for plan in failed:
        what = "not placed" if plan.layout.placement_error else "failed"
        lines.append(f"{what}  {plan.name} on {plan.layout.topology_name}: "
                     f"{reason_text(plan.error)}")
    warned = [rank for rank, plan in enumerate(sweep.plans, 1) if plan.warnings]
    if warned:
        lines.append(f"warnings while planning #{', #'.join(map(str, warned))} (XLA's "
                     "partitioner, say): each plan's .warnings")
    return "\n".join(lines)


# Short names of collective kinds in a table cell.
KIND_ABBREVIATIONS = {"all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR",
                      "all-to-all": "A2A", "collective-permute": "CP"}


def peak_split_cell(split: Any) -> str:
    """'12.3 + 0.0 + 0.0 + 19.8 GiB': a mesh.memory.PeakSplit in the unit of its total,
    to a tenth of it (a hundredth below 10 units)."""
    size, unit = byte_unit(split.total)
    decimals = 2 if split.total / size < 10 else 1
    parts = (split.donated_arguments, split.other_arguments, split.outputs, split.temporaries)
    return " + ".join(f"{n / size:,.{decimals}f}" for n in parts) + f" {unit}"


def communication_cell(communication: Sequence[Any]) -> str:
    """'AG 80x 1.20 s (0.10 s), RS 80x 0.90 s (0.31 s)': each kind's collectives (most
    time first), their total time and the part no other engine hides."""
    if not communication:
        return "-"
    return ", ".join(f"{KIND_ABBREVIATIONS.get(t.kind, t.kind)} {t.count}x "
                     f"{duration_text(t.seconds)} ({duration_text(t.exposed_seconds)})"
                     for t in communication)


def reason_text(error: str) -> str:
    """A failure's reason on one line, its tail past REASON_CHARS cut: reasons lead with
    their cause (the layout parameter at fault), so the cut loses only detail."""
    reason = " ".join(error.split())
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 3] + "..."


def _sweep_header(sweep: Any, with_model: bool, run_tokens: float | None) -> str:
    count = len(sweep.plans)
    where = f"{sweep.workers} worker processes" if sweep.workers > 1 else "this process"
    lines = [f"{count} layout{'s' if count != 1 else ''} planned in {sweep.wall_seconds:.1f} s "
             f"({where}); ranked: fitting first, then by expected step time"]
    lines.append(devices_text({p.layout.machine for p in sweep.plans}))
    lines.append("step: expected (with the Neuron runtime's measured costs) and ideal (the "
                 "hardware's limits); " + (
                     "MFU: the model's FLOPs (as given) over the devices' BF16 peak for the "
                     "step" if with_model else
                     "MFU: the devices' matmuls, recomputation left out, at their dtype's "
                     "peak"))
    lines.append("peak: what holds the peak HBM per device at its instant (donated arguments, "
                 "other arguments, outputs, temporaries); comm: AG all-gather, RS "
                 "reduce-scatter, AR all-reduce, A2A all-to-all, CP collective-permute; "
                 "busiest link: bytes per step on the busiest torus link")
    if run_tokens:
        price = sweep.price_per_chip_hour
        lines.append(f"time to train {amount_text(run_tokens)} tokens" + (
            f"; cost at {price:,.4g} per chip-hour" if price is not None else
            "; no price per chip-hour given, so no cost"))
    return "\n".join(lines)


def devices_text(machines: Any) -> str:
    """What a device is on each machine: 'a device: a chip on trn2 (96.00 GiB)', or on the
    machines as rented 'an LNC=2 logical core of a chip on trn2.48xlarge (4 per chip,
    24.00 GiB)'."""
    kinds = []
    for machine in sorted(machines, key=lambda m: m.name):
        memory = bytes_text(machine.device.hbm_bytes)
        kinds.append(f"a chip on {machine.name} ({memory})" if machine.lnc is None else
                     f"an {machine.device_kind} of a chip on {machine.name} "
                     f"({machine.devices_per_chip} per chip, {memory})")
    return "a device: " + "; ".join(kinds)


def serving_table(table: Any) -> str:
    """A jax_trn2.serving.ServingTable as text: per layout and batch, time to first token
    and per output token (expected / ideal), decode tokens/s, KV cache and peak HBM per
    device, the largest batch that fits; then the steps that failed and why."""
    plans = table.plans
    topologies = {p.layout.topology_name for p in plans}
    headers = ["layout"] + (["topology"] if len(topologies) > 1 else []) + [
        "devices", "batch", "TTFT exp / ideal", "per token exp / ideal", "tokens/s",
        "per device", "KV cache/device", "peak HBM/device", "fits", "max batch"]
    rows, failed = [], []
    for p in plans:
        row = [p.layout.name] + ([p.layout.topology_name] if len(topologies) > 1 else []) + [
            str(p.devices), str(p.batch)]
        row += [_pair(p.prefill), _pair(p.decode)]
        if p.decode is not None:
            peak = max(e.peak_bytes for e in (p.prefill, p.decode) if e is not None)
            row += [amount_text(p.tokens_per_second), amount_text(p.tokens_per_second_per_device),
                    bytes_text(p.kv_cache_bytes), bytes_text(peak),
                    fits_text(peak, p.decode.hbm_bytes).split(",")[0]]
        else:
            row += ["-"] * 5
        row.append("-" if p.max_batch is None else f"{p.max_batch:,}")
        rows.append(row)
        failed += [f"failed  {p.layout.name}, batch {p.batch}: {reason_text(e)}"
                   for e in p.errors]
    warned = [f"{p.layout.name}, batch {p.batch}" for p in plans if p.warnings]
    notes = [f"warnings while planning {'; '.join(warned)} (XLA's partitioner, say): each "
             "plan's .warnings"] if warned else []
    where = f"{table.workers} worker processes" if table.workers > 1 else "this process"
    first = plans[0]
    lines = [f"{table.planned} steps planned in {table.wall_seconds:.1f} s ({where}); prompt "
             f"{first.prompt_tokens:,} tokens, KV cache of {first.kv_length:,} positions",
             "TTFT: the prefill step; per token: one decode step; exp: expected (with the "
             "Neuron runtime's measured costs), ideal: the hardware's limits; tokens/s: "
             "decoding; max batch: the largest decode batch that fits at this KV length",
             devices_text({p.layout.machine for p in plans}), "",
             format_table(headers, rows, left=(0,))]
    return "\n".join(lines + failed + notes)


def _pair(e: Any) -> str:
    return "-" if e is None else \
        f"{duration_text(e.step_seconds)} / {duration_text(e.ideal_step_seconds)}"
