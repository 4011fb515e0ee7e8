"""Simulated 64-chip mesh vs JAX on 64 CPU host devices: time, first call, memory.

    python benchmarks/run.py               # the full table (takes a few minutes)
    python benchmarks/run.py --quick       # fewer timed calls, no memory children

Steady-state time is the median of several calls after warm-up, both sides in this one
process; first call is trace + lower + compile + one run; peak memory is the peak resident
set of a fresh child process that runs one side of one workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 64)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax_trn2  # noqa: E402
import lowering  # noqa: E402
from workloads import TRANSFORMER_STACK, WORKLOADS, Workload  # noqa: E402

MESH_SHAPE, MESH_AXES = (4, 4, 4), ("x", "y", "z")


def cpu_mesh():
    return jax.make_mesh(MESH_SHAPE, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _block(tree):
    return jax.block_until_ready(tree)


def prepare(workload: Workload, side: str):
    """(function, inputs) of one side, inputs placed as that side wants them: host arrays for
    the simulator, arrays already sharded over the 64 CPU devices for JAX."""
    inputs = workload.inputs(np.random.default_rng(0))
    if side == "sim":
        return jax_trn2.jit(workload.build(jax_trn2.make_mesh())), inputs
    mesh = cpu_mesh()
    inputs = tuple(jax.device_put(x, NamedSharding(mesh, spec))
                   for x, spec in zip(inputs, workload.in_specs))
    return jax.jit(workload.build(mesh)), inputs


def time_side(workload: Workload, side: str, calls: int) -> dict:
    fn, inputs = prepare(workload, side)
    start = time.perf_counter()
    _block(fn(*inputs))
    first = time.perf_counter() - start
    _block(fn(*inputs))  # warm-up
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        _block(fn(*inputs))
        times.append(time.perf_counter() - start)
    return {"first": first, "steady": statistics.median(times)}


def program_stats(workload: Workload) -> dict:
    """Chips, Trn2 instructions and FLOPs (all chips) of the simulated program."""
    inputs = workload.inputs(np.random.default_rng(0))
    lowered = jax_trn2.jit(workload.build(jax_trn2.make_mesh())).lower(*inputs)
    program = lowered.program
    stats = {"chips": program.mesh.num_devices, "ops": len(program.instructions)}
    compiled = lowered.compile()
    if hasattr(compiled, "cost_analysis"):
        stats["flops"] = compiled.cost_analysis()["flops"] * program.mesh.num_devices
    return stats


def peak_memory_mib(workload: str, side: str) -> float:
    """Peak resident set of a child process running one side of one workload."""
    out = subprocess.run([sys.executable, __file__, "--child", workload, side],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_rss_mib"]


def child(workload_name: str, side: str) -> None:
    workload = _by_name(workload_name)
    fn, inputs = prepare(workload, side)
    for _ in range(3):
        _block(fn(*inputs))
    print(json.dumps({"peak_rss_mib": peak_rss_kib() / 1024}))


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: a child starts
    with its parent's maximum there, which would hide its own."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status (peak memory needs Linux)")


def _by_name(name: str) -> Workload:
    for w in WORKLOADS + (TRANSFORMER_STACK,):
        if w.name == name:
            return w
    raise SystemExit(f"unknown workload {name}")


def lowering_scaling(sizes=(1_000, 10_000, 50_000)) -> list[tuple[int, float]]:
    """Seconds to lower a StableHLO module of about n ops (to Trn2, no execution)."""
    results = []
    for n in sizes:
        def chain(x, n=n):
            for _ in range(n // 6):  # 2 constants, 2 broadcasts, a multiply and an add
                x = x * 1.0001 + 0.5
            return x

        text = jax.jit(chain).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).as_text()
        module = lowering.parse_module(text)
        ops = sum(1 for _ in module.body.operations[0].regions[0].blocks[0].operations)
        start = time.perf_counter()
        lowering.lower(module)
        results.append((ops, time.perf_counter() - start))
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, no memory")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--only", nargs="+", metavar="WORKLOAD", help="run these workloads only")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    calls = 3 if args.quick else args.calls

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, jax {jax.__version__}")
    header = ("| workload | chips | ops | GFLOP | sim ms | jax ms | ratio | sim first s "
              "| jax first s | first ratio | sim MiB | jax MiB | mem ratio |")
    print(header)
    print("|---" * 13 + "|")
    for workload in WORKLOADS + (TRANSFORMER_STACK,):
        if args.only and workload.name not in args.only:
            continue
        sim = time_side(workload, "sim", calls)
        ref = time_side(workload, "jax", calls)
        stats = program_stats(workload)
        mem = ("-", "-", "-")
        if not args.quick:
            s, j = peak_memory_mib(workload.name, "sim"), peak_memory_mib(workload.name, "jax")
            mem = (f"{s:.0f}", f"{j:.0f}", f"{s / j:.2f}")
        gflop = f"{stats['flops'] / 1e9:.1f}" if "flops" in stats else "-"
        print(f"| {workload.name} | {stats['chips']} | {stats['ops']} | {gflop} "
              f"| {sim['steady'] * 1e3:.1f} | {ref['steady'] * 1e3:.1f} "
              f"| {sim['steady'] / ref['steady']:.2f} | {sim['first']:.2f} | {ref['first']:.2f} "
              f"| {sim['first'] / ref['first']:.2f} | {mem[0]} | {mem[1]} | {mem[2]} |",
              flush=True)

    if args.only:
        return
    print("\nlowering time (StableHLO -> Trn2 program):")
    for ops, seconds in lowering_scaling():
        print(f"  {ops:>6} ops: {seconds:.2f} s ({seconds / ops * 1e6:.0f} us/op)")


if __name__ == "__main__":
    main()
