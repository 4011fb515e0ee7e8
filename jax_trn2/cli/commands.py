"""The jax-trn2 command line.

    jax-trn2 inspect program.mlir [--topology NAME] [--trace out.json] [--plot out.png]
                     [--fail-link A,B ...] [--fail-chip C ...] [--origin X,Y,Z]

`inspect` lowers a StableHLO file (MLIR text or bytecode, e.g. what
`jax.jit(f).lower(...).as_text()` gives) to a Trn2 program, maps it onto the machine and
prints the listing with estimated times and the cost summary; `--plot` draws the step
(jax_trn2.plot: engines over time, HBM in use, torus link loads; needs matplotlib).

    jax-trn2 compare script.py:function [--args example_args] [--rounding stochastic]

`compare` runs a function on the simulated mesh and on CPU JAX and prints the numerics report
(jax_trn2.numerics).

    jax-trn2 plan script.py:build --grid 64 [--axes dp,fsdp,tp] [--remat none,full] ...

`plan` plans a step under many layouts and prints them ranked (jax_trn2.cli.plan_command).

A subcommand is a function in COMMANDS that adds its parser to the subparsers and sets
`run` (called with the parsed arguments, returning the exit status).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

import jax

import lowering
from jax_trn2 import __version__
from jax_trn2.core.executable import LoadedExecutable
from jax_trn2.core.machines import default_topology, placement_for
from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from jax_trn2.frontend.jit import Jitted, jit
from jax_trn2.reports.numerics import compare
from jax_trn2.cli.plan_command import add_plan
from jax_trn2.core.plot import save_plot
from jax_trn2.cli.scripts import example_arguments, load_target
from mesh.perf import trace
from mesh.machine import (INSTANCE_NAMES, TOPOLOGY_NAMES, ULTRACLUSTER_PREFIX,
                          ULTRASERVER_CLUSTER_PREFIX, Topology, get_topology)

MLIR_BYTECODE_MAGIC = b"ML\xefR"
# CPU devices `jax-trn2 compare` asks CPU JAX for: one per device of the largest preset.
CLI_CPU_DEVICES = max(get_topology(name).num_devices
                      for name in TOPOLOGY_NAMES + INSTANCE_NAMES)


def add_inspect(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="print the Trn2 program of a StableHLO file with estimated times",
        description="Lower a StableHLO module to a Trn2 program, tile its matmuls and map its "
                    "collectives onto the torus, and print the listing with an estimated "
                    "time on every instruction, the step-time summary and the HBM each "
                    "chip needs.")
    parser.add_argument("program", type=Path,
                        help="StableHLO as MLIR text or bytecode, e.g. the output of "
                             "jax.jit(f).lower(...).as_text()")
    parser.add_argument("--topology", type=topology_name, default=None,
                        help=f"the machine: {', '.join(TOPOLOGY_NAMES)} or "
                             f"{ULTRACLUSTER_PREFIX}N (a device per chip), "
                             f"{', '.join(INSTANCE_NAMES)} or {ULTRASERVER_CLUSTER_PREFIX}N "
                             f"(a device per LNC=2 logical core) (default: {DEFAULT_TOPOLOGY}, as "
                             "make_mesh's, or the smallest that holds a larger mesh)")
    parser.add_argument("--trace", type=Path, metavar="OUT.json",
                        help="also write the timeline as Chrome trace-event JSON "
                             "(open in ui.perfetto.dev or chrome://tracing)")
    parser.add_argument("--plot", type=Path, metavar="OUT.png",
                        help="also draw the step: engines busy over time, HBM in use with "
                             "its peak, bytes on each torus link (png, svg or pdf by the "
                             "extension; needs matplotlib: pip install 'jax-trn2[plot]')")
    parser.add_argument("--fail-link", type=chip_pair, action="append", default=[],
                        metavar="A,B", help="the cable between neighbour chips A and B failed "
                                            "(both directions); repeatable")
    parser.add_argument("--fail-chip", type=int, action="append", default=[], metavar="C",
                        help="chip C failed; repeatable")
    parser.add_argument("--origin", type=torus_coordinates, metavar="X,Y,Z",
                        help="place the module's mesh at these torus coordinates, wrapping "
                             "around the torus (e.g. off a failed chip), as "
                             "make_mesh(..., origin=...) does")
    parser.set_defaults(run=inspect)


def topology_name(name: str) -> str:
    """A topology name get_topology knows."""
    try:
        get_topology(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def chip_pair(text: str) -> tuple[int, int]:
    """'0,1' -> (0, 1)."""
    try:
        a, b = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two chip ids as A,B, got {text!r}") from None
    return a, b


def torus_coordinates(text: str) -> tuple[int, ...]:
    """'0,2,0' -> (0, 2, 0)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected torus coordinates as X,Y,Z (one integer per torus axis), got {text!r}"
        ) from None


def inspect(args: argparse.Namespace) -> int:
    program = read_program(args.program)
    topology, chips = machine(program, args)
    executable = LoadedExecutable.from_stablehlo(topology, program, device_assignment=chips,
                                                 module_name=str(args.program))
    estimate = executable.estimate  # the host computation is not compiled: nothing runs
    print(estimate.listing())
    if args.trace is not None:
        trace.write_trace(args.trace, trace.chrome_trace(estimate))
        print(f"\ntrace written to {args.trace} (open in ui.perfetto.dev or chrome://tracing)")
    if args.plot is not None:
        save_plot(estimate, args.plot)
        print(f"\nplot written to {args.plot}")
    return 0


def machine(program: str | bytes, args: argparse.Namespace
            ) -> tuple[Topology | str | None, tuple[int, ...] | None]:
    """The topology `inspect` runs `program` on (--topology, else default_topology of its
    mesh) with the --fail-link and --fail-chip faults, and the chip of each logical
    device when --origin moves the mesh (None: the default placement)."""
    if not (args.fail_link or args.fail_chip or args.origin is not None):
        return args.topology, None
    mesh = lowering.lower(program, module_name=str(args.program)).mesh
    # The module's own mesh, not one this process's make_mesh remembers a machine for.
    topology = get_topology(args.topology) if args.topology is not None else \
        default_topology(mesh.axis_sizes)
    try:
        for a, b in args.fail_link:
            topology = topology.with_failed_cable(a, b)
        topology = topology.with_overrides(
            failed_chips=topology.failed_chips | set(args.fail_chip))
        if args.origin is None:
            return topology, None
        placement = placement_for(topology, mesh.axis_sizes, mesh.axis_names, args.origin)
    except ValueError as e:
        if args.topology is not None:
            raise
        # Chip ids and coordinates are the topology's: say it was chosen, not given.
        raise ValueError(f"{e} (no --topology given: {topology.name} is the default for "
                         f"the module's {mesh.num_devices}-device mesh; choose another with "
                         "--topology NAME)") from None
    return topology, placement.device_ids


def read_program(path: Path) -> str | bytes:
    """The file's MLIR: bytes when it is bytecode, else text."""
    data = path.read_bytes()
    return data if data.startswith(MLIR_BYTECODE_MAGIC) else data.decode("utf-8")


def add_compare(subparsers) -> None:
    """Add the `compare` subcommand to jax_trn2.cli's parser."""
    parser = subparsers.add_parser(
        "compare", help="run a function on the simulated mesh and on CPU JAX; print the "
                        "numerics report",
        description="Run script.py:function on the simulated Trainium2 mesh and on CPU JAX "
                    "and print, per output, the largest errors (absolute and in ULPs of the "
                    "output dtype), the fraction bit-exact and the worst element.")
    parser.add_argument("target", help="script.py:function (a plain or jax_trn2.jit function)")
    parser.add_argument("--args", dest="args_function", default="example_args",
                        help="function in the same script that returns the arguments: a tuple "
                             "of positional arguments, or (args, kwargs) (default: "
                             "%(default)s; not needed by a function without parameters)")
    parser.add_argument("--rounding", choices=("nearest", "stochastic"), default=None,
                        help="rounding mode for a plain function (default: nearest)")
    parser.add_argument("--seed", type=int, default=0, help="stochastic rounding seed")
    parser.set_defaults(run=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    """`jax-trn2 compare script.py:function`: print the numerics report; returns 0.
    ValueError (OSError for a missing script) says what is wrong with the target."""
    try:
        jax.config.update("jax_num_cpu_devices", CLI_CPU_DEVICES)
    except RuntimeError:
        pass  # JAX already runs (compare called in-process): _cpu_placement checks the count
    script, fun = load_target(args.target)
    if args.rounding is not None:
        if isinstance(fun, Jitted):
            raise ValueError(f"{args.target} is a jax_trn2.jit function with its own rounding "
                             "mode; --rounding applies to plain functions")
        fun = jit(fun, rounding=args.rounding, seed=args.seed)
    call_args, call_kwargs = example_arguments(script, fun, args.args_function, args.target)
    print(compare(fun, *call_args, **call_kwargs))
    return 0


COMMANDS = (add_inspect, add_compare, add_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax-trn2", description="Run and study JAX programs "
                                     "on a simulated AWS Trainium2 mesh.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (sys.argv[1:] by default); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # the reader went away (`jax-trn2 inspect ... | head`): stop
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        return 1
    # LoweringError is a ValueError; ImportError: an optional dependency (matplotlib)
    except (OSError, ValueError, NotImplementedError, ImportError) as e:
        print(f"jax-trn2 {args.command}: error: {e}", file=sys.stderr)
        return 1
