"""Where a new program's first result goes through the trn2 plugin, stage by stage.

    JAX_PLATFORMS=trn2,cpu JAX_TRN2_TOPOLOGY=trn2.3xlarge JAX_TRN2_LNC=1 \
        python benchmarks/first_call.py [REPEATS]

Small programs typical of jax's own tests (elementwise, a reduction, a dot, a scan, a
gather; on one device and on a 2x4 mesh with NamedSharding) are each made new REPEATS
times (default 5, at least 2: each round's function has its own constant, so that jax and
the simulator compile it anew; the first round is a warm-up) and timed from jax's lowering
to the first result. The plugin's stages are timed by wrapping the functions that do them
(`install`, which a pytest run of jax's tests can call too); a stage's time includes the
stages it calls (the lowering walk includes partitioning, the plugin's compile all of
them). Prints, per program, the fastest round's stages in ms and XLA:CPU's
whole time for the same program, then the means over the programs.
"""

from __future__ import annotations

import collections
import functools
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import lowering
from jax_trn2.core import executable as core_executable
from jax_trn2.plugin import executable as plugin_executable
from jax_trn2.plugin import signature
from lowering import partition

# stage name -> seconds spent in it during the current round
_SPENT: dict[str, float] = collections.defaultdict(float)


def _timed(stage: str, function: Callable) -> Callable:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _SPENT[stage] += time.perf_counter() - start
    return timed


class _TimedJit:
    """The executor's jitted computation, its trace and lowering and its XLA compile timed."""

    def __init__(self, jitted: Any):
        self.jitted = jitted

    def lower(self, *args: Any) -> Any:
        lowered = _timed("executor trace+lower", self.jitted.lower)(*args)
        return _TimedLowered(lowered)


class _TimedLowered:
    def __init__(self, lowered: Any):
        self.lowered = lowered

    def compiler_ir(self, *args: Any) -> Any:
        return self.lowered.compiler_ir(*args)

    def compile(self, *args: Any) -> Any:
        return _timed("executor XLA compile", self.lowered.compile)(*args)


def _wrap(owner: Any, name: str, stage: str) -> None:
    setattr(owner, name, _timed(stage, getattr(owner, name)))


def install() -> None:
    """Wrap the plugin's stages with timers."""
    _wrap(plugin_executable.Executable, "__init__", "plugin compile (all)")
    _wrap(plugin_executable.Executable, "execute", "first execute")
    _wrap(signature, "signature_module", "optimized program (as_text)")
    _wrap(lowering, "parse_module", "MLIR parse")
    _wrap(lowering, "lower", "lowering walk (with partition)")
    _wrap(partition, "partition", "partition")
    _wrap(core_executable, "plan_program", "planning")
    _wrap(core_executable.LoadedExecutable, "check_memory", "memory check (estimate)")
    _wrap(core_executable, "program_key", "content key")
    compile_program = core_executable.compile_program
    core_executable.compile_program = \
        lambda *a, **k: _TimedJit(compile_program(*a, **k))


def _programs(platform: str) -> dict[str, tuple[Callable[[int], Callable], tuple]]:
    """name -> (a maker of a new function, its arguments on `platform`)."""
    devices = jax.devices(platform)
    one = devices[0]
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8) / 64, one)
    i = jax.device_put(np.arange(8, dtype=np.int32), one)
    mesh = jax.sharding.Mesh(np.array(devices[:8]).reshape(2, 4), ("x", "y"))
    xs = jax.device_put(np.arange(128, dtype=np.float32).reshape(8, 16) / 128,
                        NamedSharding(mesh, P("x", "y")))
    # each maker takes the round's number k, a constant of the program: each round's
    # program is new to jax and to the simulator's caches
    return {
        "sin(v) @ v.T + k": (lambda k: lambda v: jnp.sin(v) @ v.T + k, (x,)),
        "elementwise": (lambda k: lambda v: jnp.exp(v) * k - jnp.tanh(v), (x,)),
        "reduction": (lambda k: lambda v: jnp.sum(v, axis=1) + jnp.max(v) * k, (x,)),
        "scan": (lambda k: lambda v: jax.lax.scan(lambda c, r: (c + r * k, c * r), v[0],
                                                  v)[0], (x,)),
        "gather": (lambda k: lambda v, j: v[j, (j + k) % 8], (x, i)),
        "2x4 elementwise": (lambda k: lambda v: jnp.cos(v) + k, (xs,)),
        "2x4 reduction": (lambda k: lambda v: jnp.sum(v, axis=0) * k, (xs,)),
        "2x4 dot": (lambda k: lambda v: v @ v.T + k, (xs,)),
    }


def first_result(make: Callable[[int], Callable], args: tuple, k: int) -> dict[str, float]:
    """The stages (seconds) of a new jitted function's (made with constant `k`) lowering,
    compile and first call."""
    _SPENT.clear()
    function = jax.jit(make(k))
    start = time.perf_counter()
    lowered = function.lower(*args)
    _SPENT["jax trace+lower (user)"] = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    _SPENT["jax compile (all)"] = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    _SPENT["first call (all)"] = time.perf_counter() - start
    _SPENT["total"] = sum(_SPENT[k] for k in ("jax trace+lower (user)", "jax compile (all)",
                                               "first call (all)"))
    return dict(_SPENT)


def profile(platform: str, repeats: int) -> dict[str, dict[str, float]]:
    """Per program, its fastest round's stages (seconds) on `platform`."""
    best: dict[str, dict[str, float]] = {}
    for name, (make, args) in _programs(platform).items():
        rounds = [first_result(make, args, k) for k in range(1, repeats + 1)][1:]
        best[name] = min(rounds, key=lambda stages: stages["total"])
    return best


def main() -> None:
    jax.config.update("jax_num_cpu_devices", 8)  # for the 2x4 mesh on XLA:CPU
    repeats = max(2, int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    install()
    trn2 = profile("trn2", repeats)
    cpu = profile("cpu", repeats)
    stages = list(dict.fromkeys(s for stages in trn2.values() for s in stages))
    for name in trn2:
        print(f"\n{name}: XLA:CPU {cpu[name]['total'] * 1e3:.1f} ms")
        for stage in stages:
            print(f"  {stage:34s} {trn2[name].get(stage, 0.0) * 1e3:8.2f} ms")
    print("\nmean over programs (ms):")
    for stage in stages:
        mean = np.mean([trn2[n].get(stage, 0.0) for n in trn2]) * 1e3
        print(f"  {stage:34s} {mean:8.2f}")
    print(f"  {'XLA:CPU total':34s} {np.mean([cpu[n]['total'] for n in cpu]) * 1e3:8.2f}")


if __name__ == "__main__":
    main()
