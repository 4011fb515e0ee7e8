"""Simulated 64-chip mesh vs JAX on 64 CPU host devices: time, first call, memory.

The simulator runs each workload through both of its front doors: `jax_trn2.jit` ("sim")
and plain `jax.jit` over a mesh of `jax.devices("trn2")`, the PJRT plugin ("plugin").

    python benchmarks/run.py               # the full table (takes a few minutes)
    python benchmarks/run.py --quick       # fewer timed calls, no memory children

Steady-state time is the median of several calls after warm-up, every side in this one
process, the sides taking turns call by call. First call is trace + lower + compile + one
run in a fresh child process, after a tiny program has gone through that side once (so it
does not carry the process's start-up), with jax's persistent compilation cache on in a new
directory: "cold" is the first such process (empty cache), "warm" the median of three more
after it (the cache filled by the first, as a notebook restart finds it); each starts its
first call from a full garbage collection. Peak memory is the peak resident set of a fresh
child process that runs one side of one workload.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax

jax.config.update("jax_num_cpu_devices", 64)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax_trn2  # noqa: E402
import lowering  # noqa: E402
from workloads import TRANSFORMER_STACK, WORKLOADS, Workload  # noqa: E402

MESH_SHAPE, MESH_AXES = (4, 4, 4), ("x", "y", "z")
SIDES = ("sim", "jax", "plugin")


def cpu_mesh():
    return jax.make_mesh(MESH_SHAPE, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def trn2_mesh():
    """The simulated chips as a plain jax user meshes them (the 4x4x4 torus, row-major)."""
    return jax.make_mesh(MESH_SHAPE, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                         devices=jax.devices("trn2"))


def _block(tree):
    return jax.block_until_ready(tree)


def prepare(workload: Workload, side: str):
    """(function, inputs) of one side, inputs already where that side takes them, as a
    step's results are when the next step takes them: jax arrays on jax's default CPU
    device for jax_trn2.jit (where its results are; it reads them where they are, where it
    copies a NumPy array in on every call, as jax.jit does), arrays sharded over the mesh's
    devices for jax.jit (the 64 CPU devices, or the 64 simulated chips of the trn2
    plugin)."""
    inputs = workload.inputs(np.random.default_rng(0))
    if side == "sim":
        return (jax_trn2.jit(workload.build(jax_trn2.make_mesh())),
                tuple(jnp.asarray(x) for x in inputs))
    mesh = trn2_mesh() if side == "plugin" else cpu_mesh()
    inputs = tuple(jax.device_put(x, NamedSharding(mesh, spec))
                   for x, spec in zip(inputs, workload.in_specs))
    return jax.jit(workload.build(mesh)), inputs


def warm_up(sides=SIDES) -> None:
    """Run a tiny program through each side once, so that no row's first call pays for the
    process's one-time start-up (jax's backends, MLIR contexts, jax_trn2's imports)."""
    tiny = Workload("warm_up", lambda mesh: jax.shard_map(lambda x: jax.lax.psum(x, "x"),
                                                          mesh=mesh, in_specs=P("x"),
                                                          out_specs=P()),
                    lambda rng: (np.ones((4, 2), np.float32),), (P("x"),))
    for side in sides:
        fn, inputs = prepare(tiny, side)
        _block(fn(*inputs))


def steady_seconds(workload: Workload, calls: int, sides=SIDES) -> dict[str, float]:
    """Each side's median of `calls` calls, after a first call and one more. The sides take
    turns call by call, so that a change in the machine's load (these machines are shared)
    falls on all of them alike rather than on whichever side was running then."""
    prepared = {side: prepare(workload, side) for side in sides}
    for fn, inputs in prepared.values():
        for _ in range(2):
            _block(fn(*inputs))
    times = {side: [] for side in sides}
    for _ in range(calls):
        for side, (fn, inputs) in prepared.items():
            start = time.perf_counter()
            _block(fn(*inputs))
            times[side].append(time.perf_counter() - start)
    return {side: statistics.median(t) for side, t in times.items()}


def first_calls(workload: str, warm_runs: int, sides=SIDES) -> dict[str, tuple[float, float]]:
    """Each side's first call, cold and warm, in seconds: in a fresh child process with jax's
    persistent compilation cache in a new directory (cold), then the median of `warm_runs`
    more children after it (warm: the cache filled by the first). A child's first call is
    one sample of a noisy machine; the sides take turns child by child, as in
    steady_seconds."""
    with contextlib.ExitStack() as stack:
        caches = {side: stack.enter_context(tempfile.TemporaryDirectory(
            prefix="jax_trn2_bench_cache_")) for side in sides}
        runs = {side: [] for side in sides}
        for _ in range(1 + warm_runs):
            for side in sides:
                runs[side].append(
                    _child(["--first", workload, side, caches[side]])["first_seconds"])
        return {side: (t[0], statistics.median(t[1:])) for side, t in runs.items()}


def first_call_child(workload_name: str, side: str, cache_dir: str) -> None:
    """A child's first call of one side, with jax's persistent compilation cache (every
    compiled program written, however small or fast) in `cache_dir`."""
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    warm_up((side,))
    fn, inputs = prepare(_by_name(workload_name), side)
    # From a full collection: the time of one that the process's earlier allocations have
    # made due (about 50 ms, scanning jax's 100,000 objects) then falls on neither side
    gc.collect()
    start = time.perf_counter()
    _block(fn(*inputs))
    print(json.dumps({"first_seconds": time.perf_counter() - start}))


def _child(args: list[str]) -> dict:
    """The JSON line a child process of this script prints last."""
    out = subprocess.run([sys.executable, __file__, *args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def program_stats(workload: Workload, gemm_rates: dict[str, float]) -> dict:
    """Chips, Trn2 instructions, FLOPs (all chips) of the simulated program, and the host's
    limit: the seconds its distinct matmul FLOPs take at the host's GEMM rates."""
    inputs = workload.inputs(np.random.default_rng(0))
    lowered = jax_trn2.jit(workload.build(jax_trn2.make_mesh())).lower(*inputs)
    program = lowered.program
    stats = {"chips": program.mesh.num_devices, "ops": len(program.instructions)}
    compiled = lowered.compile()
    stats["flops"] = compiled.cost_analysis()["flops"] * program.mesh.num_devices
    stats["limit_seconds"] = sum(flops / gemm_rates[dtype] for dtype, flops in
                                 distinct_matmul_flops(compiled.executable.program).items())
    return stats


def distinct_matmul_flops(program, times: int = 1) -> dict[str, float]:
    """Matmul FLOPs the executor computes, by host GEMM type ('bfloat16' or 'float32'): a
    matmul's per-chip FLOPs times the number of distinct copies of its result (the product
    of the mesh axes it varies along; replicated work is done once), loop bodies times
    their trip count."""
    from mesh import isa
    totals: dict[str, float] = {"bfloat16": 0.0, "float32": 0.0}
    sizes = program.mesh.axis_sizes  # `varying` holds mesh axis indices
    for instr in program.instructions:
        if isinstance(instr, isa.Matmul):
            lhs, rhs = (program.values[v].type for v in instr.ins)
            k = int(np.prod([lhs.shape[d] for d in instr.lhs_contract], dtype=np.int64))
            out = program.values[instr.outs[0]]
            copies = int(np.prod([sizes[a] for a in out.varying], dtype=np.int64))
            host = "bfloat16" if {lhs.dtype, rhs.dtype} <= BF16_HOST else "float32"
            totals[host] += times * 2.0 * out.type.size * k * copies
        trips = getattr(instr, "trip_count", None) or 1
        for programs in isa.subprogram_fields(instr).values():
            for sub in programs[:1]:  # a loop body, or one branch of a conditional
                for dtype, flops in distinct_matmul_flops(sub, times * trips).items():
                    totals[dtype] += flops
    return totals


# Operand types the executor multiplies with host BF16 GEMMs (mesh.isa.kernels.matmul).
BF16_HOST = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4"}


def host_gemm_rates(n: int = 2048, calls: int = 10) -> dict[str, float]:
    """FLOP/s of one n x n x n GEMM on this host, FP32 accumulation, BF16 and FP32 inputs:
    the fastest of `calls` (a limit is what the host can reach; its BF16 rate varies by up
    to 2x from call to call on these shared machines), on a CPU client of one device
    (XLA:CPU runs a GEMM slower on the 64-device client this process makes for JAX)."""
    rates = {}
    device = lowering.host.host_devices(1)[0]
    for dtype in ("bfloat16", "float32"):
        a = jax.device_put(np.ones((n, n), dtype), device)
        gemm = jax.jit(lambda a, b: jax.lax.dot(a, b, precision=jax.lax.Precision.HIGHEST,
                                                preferred_element_type=jnp.float32))
        _block(gemm(a, a))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            _block(gemm(a, a))
            times.append(time.perf_counter() - start)
        rates[dtype] = 2.0 * n ** 3 / min(times)
    return rates


def peak_memory_mib(workload: str, side: str) -> float:
    """Peak resident set of a child process running one side of one workload."""
    return _child(["--child", workload, side])["peak_rss_mib"]


def memory_child(workload_name: str, side: str) -> None:
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
    parser.add_argument("--first", nargs=3, metavar=("WORKLOAD", "SIDE", "CACHE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return memory_child(*args.child)
    if args.first:
        return first_call_child(*args.first)
    calls = 5 if args.quick else args.calls

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, jax {jax.__version__}"
          + (f", GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']}"
             if os.environ.get("GLIBC_TUNABLES") else ""))
    rates = host_gemm_rates()
    print(f"host GEMM (2048^3, FP32 accumulation): BF16 {rates['bfloat16'] / 1e9:.0f} GFLOP/s, "
          f"FP32 {rates['float32'] / 1e9:.0f} GFLOP/s")
    header = ("| workload | chips | ops | GFLOP | sim ms | jax ms | ratio | of limit "
              "| sim cold s | jax cold s | cold ratio | sim warm s | jax warm s | warm ratio "
              "| sim MiB | jax MiB | mem ratio | plugin ms | plugin/sim | plugin warm s "
              "| plugin/sim warm |")
    print(header)
    print("|---" * 21 + "|")
    warm_up()
    for workload in WORKLOADS + (TRANSFORMER_STACK,):
        if args.only and workload.name not in args.only:
            continue
        steady = steady_seconds(workload, calls)
        sim, ref, plugin = (steady[side] for side in SIDES)
        first = first_calls(workload.name, warm_runs=3)
        (sim_cold, sim_warm), (jax_cold, jax_warm), (_, plugin_warm) = (
            first[side] for side in SIDES)
        stats = program_stats(workload, rates)
        mem = ("-", "-", "-")
        if not args.quick:
            s, j = peak_memory_mib(workload.name, "sim"), peak_memory_mib(workload.name, "jax")
            mem = (f"{s:.0f}", f"{j:.0f}", f"{s / j:.2f}")
        gflop = f"{stats['flops'] / 1e9:.1f}"
        # the share of the host's limit reached: distinct matmul time at the GEMM rate / sim
        limit = f"{stats['limit_seconds'] / sim:.0%}"
        print(f"| {workload.name} | {stats['chips']} | {stats['ops']} | {gflop} "
              f"| {sim * 1e3:.1f} | {ref * 1e3:.1f} | {sim / ref:.2f} | {limit} "
              f"| {sim_cold:.2f} | {jax_cold:.2f} | {sim_cold / jax_cold:.2f} "
              f"| {sim_warm:.2f} | {jax_warm:.2f} | {sim_warm / jax_warm:.2f} "
              f"| {mem[0]} | {mem[1]} | {mem[2]} "
              f"| {plugin * 1e3:.1f} | {plugin / sim:.2f} | {plugin_warm:.2f} "
              f"| {plugin_warm / sim_warm:.2f} |", flush=True)

    if args.only:
        return
    print("\nlowering time (StableHLO -> Trn2 program):")
    for ops, seconds in lowering_scaling():
        print(f"  {ops:>6} ops: {seconds:.2f} s ({seconds / ops * 1e6:.0f} us/op)")


if __name__ == "__main__":
    main()
