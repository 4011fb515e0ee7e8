"""`jax-trn2 plan`: sweep the layouts of a step from a shell (jax_trn2.plan.sweep).

    jax-trn2 plan script.py:build --grid 64 --axes dp,fsdp,tp --max dp=4,tp=8
                  --remat none,full --tokens-per-step 524288 --model-flops 3.3e17
                  --train-tokens 15e12 --price 2.5 --plot sweep.png --json rows.json
    jax-trn2 plan script.py:build --layout fsdp=64 --layout dp=4,fsdp=4,tp=4
    jax-trn2 plan script.py:build --grid 1024 --param batch=256 --param batch=512 --search

`build(layout)` in the script returns `(jitted, args)` for a jax_trn2.plan.Layout, as for
jax_trn2.plan.sweep (`build(layout, **values)` with --param); the script is imported as a module (its `if __name__ ==
"__main__":` block does not run), so worker processes can import it too.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

from jax_trn2.planner import plan
from jax_trn2.planner.layout import KINDS, Layout, grid
from jax_trn2.planner.search import search
from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from jax_trn2.cli.scripts import load_target


def add_plan(subparsers) -> None:
    """Add the `plan` subcommand to jax_trn2.cli's parser."""
    parser = subparsers.add_parser(
        "plan", help="plan a step under many layouts; print them ranked",
        description="Build script.py:build(layout) for every layout, partition, lower and "
                    "estimate each, and print the plans ranked: peak HBM per device and "
                    "whether it fits, step time (expected and ideal), MFU, tokens/s, "
                    "exposed communication, the busiest engine, time and cost to train, and "
                    "why a layout failed; then the recommendation: the fastest layout that "
                    "fits and why the next ones lost. A device is a chip on the whole-chip "
                    "presets (trn2, trn2-ultra), a logical NeuronCore on the instances "
                    "(trn2.48xlarge: 64 devices of 24 GiB, tp on the cores of a chip).")
    parser.add_argument("target", help="script.py:build, a function of a jax_trn2.plan.Layout "
                                       "returning (jax_trn2.jit function, args)")
    parser.add_argument("--layout", type=layout_axes, action="append", default=[],
                        metavar="AXIS=SIZE,...", help="a layout's mesh axes, e.g. "
                        f"dp=4,fsdp=4,tp=4 (axes: {', '.join(KINDS)} or others the build "
                        "knows); repeatable")
    parser.add_argument("--grid", type=int, metavar="DEVICES",
                        help="every layout of DEVICES devices over --axes (64 fill a "
                             "trn2.48xlarge, 16 chips x 4 logical cores)")
    parser.add_argument("--axes", type=names, default=("dp", "fsdp", "tp"),
                        help="the mesh axes of --grid (default: dp,fsdp,tp)")
    parser.add_argument("--max", type=layout_axes, default=(), metavar="AXIS=SIZE,...",
                        help="largest size of some --grid axes, e.g. tp=8")
    parser.add_argument("--remat", type=names, default=("none",),
                        help="remat policies the build applies, 'none' for none (default: "
                             "none), e.g. none,full")
    parser.add_argument("--topology", action="append", default=[],
                        help=f"the machine (repeatable; default: {DEFAULT_TOPOLOGY})")
    parser.add_argument("--microbatches", type=int, help="a pipeline's microbatches")
    parser.add_argument("--schedule", help="a pipeline schedule the build knows (e.g. 1f1b)")
    parser.add_argument("--param", type=param, action="append", default=[],
                        metavar="NAME=VALUE", help="a value of a parameter build takes as a "
                        "keyword, build(layout, NAME=VALUE): a Python literal (64, 'full', "
                        "None) or else the text; repeat a NAME for more values, each "
                        "combination planned (e.g. --param batch=64 --param batch=128)")
    parser.add_argument("--search", action="store_true",
                        help="prune what cannot fit or cannot win before planning it in full "
                             "(jax_trn2.plan.search), for large spaces")
    parser.add_argument("--tokens-per-step", type=float, help="tokens one step trains")
    parser.add_argument("--model-flops", type=float,
                        help="the model's FLOPs per step (model FLOP utilisation, bubble)")
    parser.add_argument("--train-tokens", type=float, help="tokens to train: time, "
                                                             "chip-hours and cost of the run")
    parser.add_argument("--price", type=float, metavar="PER_CHIP_HOUR",
                        help="price of a chip-hour, for the cost of the run (no default)")
    parser.add_argument("--workers", type=int, help="planning processes (default: one per "
                                                    "core, when it pays)")
    parser.add_argument("--plot", type=Path, metavar="OUT.png",
                        help="also draw step time against peak HBM per device (needs "
                             "matplotlib: pip install 'jax-trn2[plot]')")
    parser.add_argument("--json", type=Path, metavar="OUT.json",
                        help="also write the rows (one object per plan) as JSON")
    parser.set_defaults(run=plan_command)


def layout_axes(text: str) -> tuple[tuple[str, int], ...]:
    """'dp=4,tp=8' -> (('dp', 4), ('tp', 8))."""
    try:
        pairs = [part.split("=") for part in text.split(",")]
        return tuple((name.strip(), int(size)) for name, size in pairs)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected AXIS=SIZE pairs separated by commas (dp=4,tp=8), got {text!r}") from None


def param(text: str) -> tuple[str, Any]:
    """'batch=64' -> ('batch', 64); 'remat=full' -> ('remat', 'full'): the value a Python
    literal, else the text as it is."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with NAME a keyword of build (batch=64), got {text!r}")
    try:
        return name.strip(), ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return name.strip(), value.strip()


def params(pairs: list[tuple[str, Any]]) -> dict[str, list[Any]] | None:
    """--param's (name, value) pairs as a sweep's params: each name's values in order."""
    swept: dict[str, list[Any]] = {}
    for name, value in pairs:
        swept.setdefault(name, []).append(value)
    return swept or None


def names(text: str) -> tuple[str, ...]:
    """'dp,fsdp' -> ('dp', 'fsdp')."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def candidates(args: argparse.Namespace) -> list[Layout]:
    """The layouts the arguments name: every --layout, and --grid's, for every remat
    policy and topology."""
    remats = tuple(None if r == "none" else r for r in args.remat)
    topologies = tuple(args.topology) or (DEFAULT_TOPOLOGY,)
    options = dict(microbatches=args.microbatches, schedule=args.schedule)
    layouts = [Layout.of(remat=remat, topology=topology, **options, **dict(axes))
               for axes in args.layout for topology in topologies for remat in remats]
    if args.grid is not None:
        layouts += grid(args.grid, args.axes, remats, topologies, dict(args.max), **options)
    if not layouts:
        raise ValueError("give layouts to plan: --layout dp=4,tp=16 (repeatable) or "
                         "--grid CHIPS")
    return layouts


def plan_command(args: argparse.Namespace) -> int:
    """`jax-trn2 plan script.py:build ...`: print the ranked table; returns 0."""
    _, build = load_target(args.target)
    run = search if args.search else plan.sweep
    table = run(build, candidates(args), params=params(args.param),
                tokens_per_step=args.tokens_per_step, model_flops=args.model_flops,
                train_tokens=args.train_tokens, price_per_chip_hour=args.price,
                workers=args.workers, progress=True)
    print(table)
    if args.plot is not None:
        table.plot(args.plot)
        print(f"\nplot written to {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps(table.rows(), indent=1))
        print(f"rows written to {args.json}")
    return 0
