"""lowering.xla_log: XLA's C++ log captured around a compile and re-reported."""

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lowering import xla_log

REMAT = ("W1127 05:49:07.782372   11230 spmd_partitioner.cc:656] [SPMD] Involuntary full "
         "rematerialization. The compiler cannot go from sharding {devices=[4,16]<=[64] "
         "last_tile_dim_replicate} to {replicated} efficiently for HLO operation %dot.3 = "
         "bf16[64,1024]{1,0} dot(%a, %b), sharding={devices=[4,16]<=[64] "
         "last_tile_dim_replicate}. As the last resort, SPMD will replicate the tensor.")


def test_rematerializations_are_held_back_and_other_lines_pass_on(capfd):
    with xla_log.captured_stderr() as lines:
        os.write(2, f"from C++\n{REMAT}\nsecond line".encode())
    assert lines == [REMAT]
    assert capfd.readouterr().err == "from C++\nsecond line\n"
    os.write(2, b"after\n")  # the descriptor is back
    assert capfd.readouterr().err == "after\n"


# A real failed check in XLA:CPU (jaxlib 0.10.2): a BF16 pmean over one manual axis of two,
# under jax.grad, trips AllReducePromotion, which aborts the process.
ABORTING_PROGRAM = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from lowering import xla_log

mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)

def loss(w):
    mean = jax.shard_map(lambda w: jax.lax.pmean(w * 2, "b"), mesh=mesh, in_specs=P(),
                         out_specs=P(), axis_names={"b"})(w)
    return mean.astype(jnp.float32).sum()

w = jax.device_put(jnp.ones((16, 16), jnp.bfloat16), NamedSharding(mesh, P("a")))
with xla_log.captured_stderr():
    jax.jit(jax.grad(loss)).lower(w).compile()
"""


def test_xla_aborting_inside_the_capture_still_says_why():
    ran = subprocess.run([sys.executable, "-c", ABORTING_PROGRAM], capture_output=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                         cwd=Path(__file__).resolve().parents[2])
    assert ran.returncode == -signal.SIGABRT
    assert xla_log.FATAL_PREFACE in ran.stderr
    assert b"Invalid binary instruction opcode copy" in ran.stderr


def test_rematerializations_become_one_warning_and_other_lines_pass_on(capfd):
    with pytest.warns(UserWarning) as caught:
        xla_log.report(["I0000 something else", REMAT, REMAT.replace("%dot.3", "%dot.4")])
    (warning,) = caught
    text = str(warning.message)
    assert "no efficient way to reshard 2 value(s)" in text
    assert "bf16[64,1024] (%dot.3) from {devices=[4,16]<=[64] last_tile_dim_replicate} to " \
           "{replicated}; bf16[64,1024] (%dot.4)" in text
    assert capfd.readouterr().err == "I0000 something else\n"
    with warnings.catch_warnings(record=True) as again:  # the same values: said already
        warnings.simplefilter("always")
        xla_log.report([REMAT, REMAT.replace("%dot.3", "%dot.4")])
    assert not again


def test_a_value_gathered_for_a_host_callback_is_no_warning(recwarn, capfd):
    to_one_device = REMAT.replace("to {replicated}", "to {maximal device=0}")
    xla_log.report([to_one_device])
    assert not recwarn
    assert capfd.readouterr().err == to_one_device + "\n"  # XLA's line, as on XLA:CPU


def test_no_log_no_warning(recwarn, capfd):
    xla_log.report([])
    assert not recwarn and capfd.readouterr().err == ""
