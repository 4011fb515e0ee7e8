"""benchmarks/validate.py: published figures rebuilt with the public API; the ideal time
never above a measurement, the expected never below the ideal."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import validate  # noqa: E402

# The quick rows: collectives, the one-core matmul, and a decode of Llama-3 8B on 2 chips.
QUICK = [c for c in validate.CASES if c.kind == "calibration"] + \
    [c for c in validate.CASES if c.name == "Llama-3.1-8B TPOT"]


@pytest.mark.parametrize("case", QUICK, ids=lambda c: f"{c.kind} {c.name}")
def test_ideal_below_the_measurement_and_expected_above_the_ideal(case):
    expected, ideal = validate.estimate(case)
    assert ideal <= case.measured_seconds
    assert ideal <= expected


def test_the_markdown_table_has_a_row_per_case_and_the_summary():
    rows = [(c, 2 * c.measured_seconds, c.measured_seconds / 2) for c in QUICK[:2]]
    text = validate.markdown(rows)
    assert text.count("\n| calibration |") == 2 and "2.00" in text and "0.50" in text
    assert "calibration: 2 figures; expected/measured median 2.00, 0 within +-25%, 2 within " \
           "2x; ideal above the measurement in 0" in text
