"""lowering.stopped_compile: XLA's compile on a thread of its own, its partitioned module's
dump taken as soon as the partitioner's pipeline is over."""

from __future__ import annotations

import os
import threading

import pytest

from lowering import stopped_compile

PASS, INLINER = "spmd-partitioning", "call-inliner"


def dump(directory: str, number: int, pipeline: str, after: str, before: str) -> None:
    """An empty dump between passes, named as XLA names it (text, then proto)."""
    stem = f"module_0000.jit_f.{number:04d}.{pipeline}.after_{after}.before_{before}"
    for suffix in (".txt", ".hlo.pb"):
        open(os.path.join(directory, stem + suffix), "w").close()


def chosen(directory: str, complete: bool) -> str | None:
    found = stopped_compile.choose_dump(directory, PASS, INLINER, complete)
    return None if found is None else os.path.basename(found).split(".")[2]


def test_the_inliners_dump_after_partitioning_once_a_later_pipeline_dumped(tmp_path):
    d = str(tmp_path)
    open(os.path.join(d, "module_0000.jit_f.before_optimizations.hlo.pb"), "w").close()
    dump(d, 0, "spmd-partitioner", "flatten-call-graph", INLINER)  # (before partitioning)
    dump(d, 1, "spmd-partitioner", INLINER, "shardy-xla")
    dump(d, 2, "spmd-partitioner", PASS, "control-dep-rewriter")
    assert chosen(d, complete=False) is None  # the pipeline may go on
    assert chosen(d, complete=True) == "0002"  # it ended there: the partitioner's own
    dump(d, 3, "spmd-partitioner", INLINER, "pipeline-end")
    assert chosen(d, complete=False) is None
    dump(d, 4, "HLO_passes_through_layout_assignment", "decomposer", INLINER)
    assert chosen(d, complete=False) == "0003"
    assert chosen(str(tmp_path / "empty"), complete=True) is None


def test_the_dump_is_taken_while_the_compile_goes_on_and_its_error_waited_for():
    finish = threading.Event()
    error = ValueError("XLA:CPU has no emitter for op x")

    def compile(directory: str) -> Exception | None:
        dump(directory, 0, "spmd-partitioner", PASS, INLINER)
        dump(directory, 1, "spmd-partitioner", INLINER, "pipeline-end")
        dump(directory, 2, "later", "a", INLINER)
        finish.wait(timeout=30)
        return error

    run = stopped_compile.StoppedCompile(compile)
    ended = []
    run.when_ended(ended.append)
    assert os.path.basename(run.partitioned_dump(PASS, INLINER)).split(".")[2] == "0001"
    assert not ended  # XLA is still compiling
    run.release()
    assert os.path.isdir(run.directory)  # the compile still writes there
    finish.set()
    assert run.failure() is error
    stopped_compile.wait_for_running()
    assert ended == [error]
    assert not os.path.exists(run.directory)


def test_a_compile_that_ends_without_the_dump_says_so():
    run = stopped_compile.StoppedCompile(lambda directory: RuntimeError("rejected"))
    assert run.partitioned_dump(PASS, INLINER) is None
    assert str(run.failure()) == "rejected"
    run.release()
    stopped_compile.wait_for_running()
    assert not os.path.exists(run.directory)


def test_an_exception_of_the_compile_itself_reaches_the_caller():
    def compile(directory: str) -> Exception | None:
        raise KeyboardInterrupt

    run = stopped_compile.StoppedCompile(compile)
    assert run.partitioned_dump(PASS, INLINER) is None
    with pytest.raises(KeyboardInterrupt):
        run.failure()
    run.release()
