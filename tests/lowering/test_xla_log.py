"""lowering.xla_log: XLA's C++ log captured around a compile and re-reported."""

import os
import warnings

import pytest

from lowering import xla_log

REMAT = ("W1127 05:49:07.782372   11230 spmd_partitioner.cc:656] [SPMD] Involuntary full "
         "rematerialization. The compiler cannot go from sharding {devices=[4,16]<=[64] "
         "last_tile_dim_replicate} to {replicated} efficiently for HLO operation %dot.3 = "
         "bf16[64,1024]{1,0} dot(%a, %b), sharding={devices=[4,16]<=[64] "
         "last_tile_dim_replicate}. As the last resort, SPMD will replicate the tensor.")


def test_what_goes_to_file_descriptor_2_is_captured(capfd):
    with xla_log.captured_stderr() as lines:
        os.write(2, b"from C++\nsecond line\n")
    assert lines == ["from C++", "second line"]
    assert capfd.readouterr().err == ""
    os.write(2, b"after\n")  # the descriptor is back
    assert capfd.readouterr().err == "after\n"


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


def test_no_log_no_warning(recwarn, capfd):
    xla_log.report([])
    assert not recwarn and capfd.readouterr().err == ""
