"""The jax-trn2 command line.

    jax-trn2 inspect program.mlir [--topology trn2|trn2-ultra|trn2-ultra-max] [--trace out.json]

`inspect` lowers a StableHLO file (MLIR text or bytecode, e.g. what
`jax.jit(f).lower(...).as_text()` gives) to a Trn2 program, maps it onto the machine and
prints the listing with estimated times and the cost summary.

    jax-trn2 compare script.py:function [--args example_args] [--rounding stochastic]

`compare` runs a function on the simulated mesh and on CPU JAX and prints the numerics report
(jax_trn2.numerics).

A subcommand is a function in COMMANDS that adds its parser to the subparsers and sets
`run` (called with the parsed arguments, returning the exit status).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from jax_trn2.executable import LoadedExecutable
from jax_trn2.numerics import add_compare
from mesh import trace
from mesh.topology import TOPOLOGY_NAMES

MLIR_BYTECODE_MAGIC = b"ML\xefR"


def add_inspect(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="print the Trn2 program of a StableHLO file with estimated times",
        description="Lower a StableHLO module to a Trn2 program, tile its matmuls and map its "
                    "collectives onto the torus, and print the listing with an estimated "
                    "time on every instruction and the step-time summary.")
    parser.add_argument("program", type=Path,
                        help="StableHLO as MLIR text or bytecode, e.g. the output of "
                             "jax.jit(f).lower(...).as_text()")
    parser.add_argument("--topology", choices=TOPOLOGY_NAMES, default=None,
                        help="the machine (default: the preset with as many chips as the "
                             "program's mesh, trn2-ultra for 64)")
    parser.add_argument("--trace", type=Path, metavar="OUT.json",
                        help="also write the timeline as Chrome trace-event JSON "
                             "(open in ui.perfetto.dev or chrome://tracing)")
    parser.set_defaults(run=inspect)


def inspect(args: argparse.Namespace) -> int:
    executable = LoadedExecutable.from_stablehlo(args.topology, read_program(args.program))
    estimate = executable.estimate  # the host computation is not compiled: nothing runs
    print(estimate.listing())
    if args.trace is not None:
        trace.write_trace(args.trace, estimate.trace())
        print(f"\ntrace written to {args.trace} (open in ui.perfetto.dev or chrome://tracing)")
    return 0


def read_program(path: Path) -> str | bytes:
    """The file's MLIR: bytes when it is bytecode, else text."""
    data = path.read_bytes()
    return data if data.startswith(MLIR_BYTECODE_MAGIC) else data.decode("utf-8")


COMMANDS = (add_inspect, add_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jax-trn2", description="Run and study JAX programs "
                                     "on a simulated AWS Trainium2 mesh.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (sys.argv[1:] by default); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (OSError, ValueError, NotImplementedError) as e:  # LoweringError is a ValueError
        print(f"jax-trn2 {args.command}: error: {e}", file=sys.stderr)
        return 1
