"""One simulated 256-chip training step run by 1, 2 and 4 processes (jax.distributed on
localhost, gloo CPU collectives): wall time, peak host memory and where the time goes.

    python benchmarks/scale_out.py                  # the table, over 1, 2 and 4 processes
    python benchmarks/scale_out.py --processes 2    # one job only
    python benchmarks/scale_out.py --door plugin    # plain jax.jit on the trn2 devices

Each process has one CPU device; `jax_trn2.jit(step, executor_devices=jax.devices())`
splits the simulation (its leading mesh axis, the simulated chips) over the devices of all
processes, and XLA:CPU runs each process's share, joined by gloo. With `--door plugin`,
plain jax.jit runs the step on a mesh of jax.devices("trn2") (the plugin's, split over
the processes in blocks), each process passing and getting back its own devices' shards,
and the plugin runs the simulation over the processes' CPU devices the same way. The step:
a two-layer MLP, BF16, data-parallel over 16 and tensor-parallel over 16 chips of
trn2-ultracluster-4 (4 UltraServers, 256 chips), auto-partitioned by XLA from
NamedShardings.

Per process: the first call (trace, lower, compile, run), the median step time of the
calls after it, peak resident memory (ru_maxrss), and, from a jax.profiler trace of one
step, the time inside XLA's collectives between devices (the cross-process transfers and
the wait for the slowest process: intervals of all-gather, all-reduce, all-to-all,
collective-permute and reduce-scatter thunks, merged across threads) and the rest
(the arithmetic, and jax's dispatch).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH_SHAPE, MESH_AXES = (16, 16), ("data", "model")
TOPOLOGY = "trn2-ultracluster-4"  # 256 chips
BATCH, D_MODEL, D_HIDDEN = 2048, 1024, 4096
STEPS = 3  # timed calls after the first
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
               "reduce-scatter")


def worker(process_id: int, port: str, processes: int, door: str) -> dict:
    """One process of a job: its measurements."""
    if door == "plugin":  # the plugin's devices: the chips of the simulated machine
        os.environ.update(JAX_TRN2_TOPOLOGY=TOPOLOGY)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 1)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=processes, process_id=process_id,
                               initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    sys.path.insert(0, ROOT)
    import jax_trn2

    if door == "plugin":
        from jax.sharding import AxisType
        trn2 = jax.devices("trn2")
        assert len(trn2) == MESH_SHAPE[0] * MESH_SHAPE[1], trn2
        mesh = jax.make_mesh(MESH_SHAPE, MESH_AXES, devices=trn2,
                             axis_types=(AxisType.Auto,) * len(MESH_SHAPE))
    else:
        mesh = jax_trn2.make_mesh(MESH_SHAPE, MESH_AXES, topology=TOPOLOGY)

    def loss(params, x, y):
        h = jax.nn.relu(jnp.dot(x, params["w1"], preferred_element_type=jnp.float32))
        out = jnp.dot(h.astype(jnp.bfloat16), params["w2"], preferred_element_type=jnp.float32)
        return jnp.mean((out - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: (p - 0.01 * g).astype(p.dtype), params, grads), value

    weights = {"w1": NamedSharding(mesh, P(None, "model")),
               "w2": NamedSharding(mesh, P("model", None))}
    batch = NamedSharding(mesh, P("data"))
    shardings = dict(in_shardings=(weights, batch, batch),
                     out_shardings=(weights, NamedSharding(mesh, P())))
    train = jax.jit(step, **shardings) if door == "plugin" else \
        jax_trn2.jit(step, **shardings, executor_devices=jax.devices("cpu"))
    rng = np.random.default_rng(0)
    params = {"w1": (rng.standard_normal((D_MODEL, D_HIDDEN)) * 0.02).astype(jnp.bfloat16),
              "w2": (rng.standard_normal((D_HIDDEN, D_MODEL)) * 0.02).astype(jnp.bfloat16)}
    x = rng.standard_normal((BATCH, D_MODEL)).astype(jnp.bfloat16)
    y = rng.standard_normal((BATCH, D_MODEL)).astype(np.float32)
    if door == "plugin":  # each process puts its own devices' shards
        params, x, y = jax.device_put((params, x, y), (weights, batch, batch))

    start = time.perf_counter()
    params, value = jax.block_until_ready(train(params, x, y))
    first = time.perf_counter() - start
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        params, value = jax.block_until_ready(train(params, x, y))
        times.append(time.perf_counter() - start)
    collectives, wall = _profiled_step(lambda: jax.block_until_ready(train(params, x, y)))
    jax.distributed.shutdown()  # (together: the first process holds the job's service)
    return {"process": process_id, "first_s": first, "step_s": statistics.median(times),
            "profiled_s": wall, "collectives_s": collectives,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _profiled_step(run) -> tuple[float, float]:
    """(seconds inside collective thunks, merged over threads; wall seconds) of run()."""
    import jax
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory, create_perfetto_trace=True)
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        jax.profiler.stop_trace()
        (path,) = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e.get("name", "").startswith(COLLECTIVES))
    total, end = 0.0, float("-inf")
    for begin, finish in spans:  # the union of the intervals (microseconds)
        if finish > end:
            total += finish - max(begin, end)
            end = finish
    return total / 1e6, wall


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job(processes: int, door: str) -> list[dict]:
    """Run a job of `processes` processes on localhost; each one's measurements."""
    port = free_port()
    workers = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), port,
                                 str(processes), door], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for i in range(processes)]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=1800)
        if w.returncode != 0:
            raise RuntimeError(f"a process of the {processes}-process job failed:\n"
                               + err[-3000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def table(rows: list[tuple[int, list[dict]]]) -> str:
    lines = ["| processes | process | first call (s) | step (s) | in collectives (s) | "
             "rest: arithmetic, dispatch (s) | peak host memory (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for processes, results in rows:
        for r in results:
            lines.append(f"| {processes} | {r['process']} | {r['first_s']:.1f} | "
                         f"{r['step_s']:.2f} | {r['collectives_s']:.2f} | "
                         f"{r['profiled_s'] - r['collectives_s']:.2f} | "
                         f"{r['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--door", choices=("jit", "plugin"), default="jit",
                        help="jax_trn2.jit with executor_devices (default), or plain jax.jit "
                             "on the plugin's trn2 devices")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # one process of a job
        process_id, port, processes, door = args.worker
        print(json.dumps(worker(int(process_id), port, int(processes), door)), flush=True)
    else:
        rows = []
        for processes in args.processes:
            rows.append((processes, job(processes, args.door)))
            print(f"{processes} process(es) done", file=sys.stderr, flush=True)
        door = "jax.jit on the trn2 plugin" if args.door == "plugin" else \
            "jax_trn2.jit(executor_devices=...)"
        print(f"{MESH_SHAPE[0] * MESH_SHAPE[1]} simulated chips ({TOPOLOGY}), MLP {BATCH}x"
              f"{D_MODEL}x{D_HIDDEN} BF16, {door}, one CPU device per process; "
              f"{os.cpu_count()} host cores")
        print(table(rows))


if __name__ == "__main__":
    main()
