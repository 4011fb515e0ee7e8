"""benchmarks/jax_conformance.py: its junit parsing, table and differences on a fake
report, without running jax's tests."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import jax_conformance as jc  # noqa: E402

# As pytest writes it: a pass, a failure, an error in setup, a skip.
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4">
<testcase classname="tests.memories_test.MemoriesTest" name="test_a" time="0.1"/>
<testcase classname="tests.memories_test.MemoriesTest" name="test_b" time="0.2">
  <failure message="ValueError: no pinned_host&#10;more">traceback</failure></testcase>
<testcase classname="tests.memories_test.MemoriesTest" name="test_c" time="0.0">
  <error message="">Traceback\n  line\nRuntimeError: setup broke</error></testcase>
<testcase classname="tests.memories_test.OtherTest" name="test_d" time="0.0">
  <skipped type="pytest.skip" message="Skipped: tpu only">skip</skipped></testcase>
</testsuite></testsuites>"""


def run_of(outcomes: dict[str, str], seconds: float) -> jc.FileRun:
    return jc.FileRun(tuple(jc.CaseResult(t, o, f"why {t}") for t, o in outcomes.items()),
                      seconds)


def test_junit_cases_are_passed_failed_or_skipped_with_their_message():
    results = jc.parse_junit(JUNIT)
    assert [(r.test_id, r.outcome) for r in results] == [
        ("MemoriesTest::test_a", "passed"), ("MemoriesTest::test_b", "failed"),
        ("MemoriesTest::test_c", "failed"), ("OtherTest::test_d", "skipped")]
    assert results[1].message == "ValueError: no pinned_host"
    assert results[2].message == "RuntimeError: setup broke"


def test_the_table_counts_each_platform_and_the_differences_list_the_cpu_passes():
    memories, array = jc.resolve_files(["memories_test", "array_test"])
    runs = {
        memories: {"trn2": run_of({"A::a": "passed", "A::b": "failed", "A::c": "failed"}, 6),
                   "cpu": run_of({"A::a": "passed", "A::b": "passed", "A::c": "skipped"}, 2)},
        array: {"trn2": run_of({"B::x": "skipped"}, 3),
                "cpu": run_of({"B::x": "passed"}, 1)},
    }
    text = jc.table(runs, jc.PLATFORMS)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}
    assert rows["memories_test"] == ["1/2/0", "6", "2/0/1", "2"]
    assert rows["array_test"] == ["0/0/1", "3", "1/0/0", "1"]
    assert rows["total"] == ["1/2/1", "9", "3/0/1", "3"]
    assert "wall time trn2 / cpu: 3.00x" in text
    assert jc.differences(runs).splitlines() == [
        "1 tests pass on the CPU, fail on trn2:", "  memories_test: A::b: why A::b",
        "1 tests fail on trn2, skipped on the CPU:", "  memories_test: A::c: why A::c"]


def test_files_by_default_name_or_path_and_the_command_ands_the_k_expressions(tmp_path):
    api, custom = jc.resolve_files(["api_test", "tests/x_test.py::XTest"])
    assert (api.k, custom.path, custom.test_class) == ("jit", "tests/x_test.py", "XTest")
    command = jc.pytest_command(api, tmp_path, tmp_path / "a.xml", "not slow")
    assert command[command.index("-k") + 1] == "(jit) and (not slow)"
    assert f"{tmp_path}/tests/x_test.py::XTest" in \
        jc.pytest_command(custom, tmp_path, tmp_path / "a.xml", None)


def test_a_checkout_of_another_jax_version_is_refused(tmp_path):
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "version.py").write_text('_version = "0.4.1"\n')
    with pytest.raises(SystemExit, match="jax 0.4.1 but jax .* is installed"):
        jc.check_checkout(tmp_path, [])
