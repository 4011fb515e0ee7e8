"""XLA's compile of a module up to its partitioned module's dump, the rest of it in the
background.

lowering.partition runs XLA:CPU's compiler only for the module its SPMD partitioner's
pipeline leaves, which XLA dumps. The compile goes on past that dump (XLA:CPU's own passes,
buffer assignment, then code emission up to the stop op, which ends it): about half of
its time on small programs, wasted (a 2x4-mesh elementwise program: the dump at 12 ms of
23). So the compile runs on a thread of its own, and `partitioned_dump` returns as soon
as the partitioner's pipeline is over (a later pipeline's dump is there: XLA writes its
dumps one after another), while XLA finishes on the other core. XLA's error, when the
compile ends otherwise than at the stop, is known only then: `failure` waits for it.
lowering.partition captures XLA's log up to the dump: should XLA abort the process in
the rest of the compile (a failed check), its message goes to stderr as it is.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import glob
import itertools
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Callable

# XLA's compile is polled for its dumps this often, in seconds (a poll, listing a directory
# of a few dozen files, takes tens of microseconds)
_POLL_SECONDS = 0.0005
# a dump between passes: module_0000.jit_f.0003.spmd-partitioner.after_spmd-partitioning.
# before_control-dep-rewriter.hlo.pb (number, pipeline, the pass it follows)
_NUMBERED_DUMP = re.compile(r"\.(\d+)\.([^.]+)\.after_([^.]+)\.")
_RUNNING: set[threading.Thread] = set()  # compiles still going: joined at exit
_RUNNING_LOCK = threading.Lock()


class StoppedCompile:
    """XLA's compile of one module, dumping into a directory of its own, on a thread.

    `run(dump_directory)` compiles and returns XLA's error, or None when the compile
    ended where it was meant to (at the caller's stop op). The directory is removed once
    the compile has ended and the caller has called `release`."""

    def __init__(self, run: Callable[[str], Exception | None]):
        self.directory = tempfile.mkdtemp(prefix="jax_trn2_partition_")
        self._failure: concurrent.futures.Future = concurrent.futures.Future()
        self._holders = 2  # the compile's thread and the caller
        self._lock = threading.Lock()
        thread = threading.Thread(target=self._run, args=(run,),
                                  name="jax-trn2 XLA partitioning", daemon=True)
        with _RUNNING_LOCK:  # (wait_for_running joins only started threads)
            _RUNNING.add(thread)
            thread.start()

    def _run(self, run: Callable[[str], Exception | None]) -> None:
        try:
            self._failure.set_result(run(self.directory))
        except BaseException as error:  # noqa: BLE001 - the caller gets it from `failure`
            self._failure.set_exception(error)
        finally:
            self.release()
            with _RUNNING_LOCK:
                _RUNNING.discard(threading.current_thread())

    def partitioned_dump(self, pass_name: str, inliner: str) -> str | None:
        """The HloProto dump of the partitioned module (see `choose_dump`), once the
        partitioner's pipeline is over, or once the compile has ended; None when XLA
        dumped none."""
        while True:
            ended = self._failure.done()
            found = choose_dump(self.directory, pass_name, inliner, complete=ended)
            if found is not None or ended:
                return found
            time.sleep(_POLL_SECONDS)

    def failure(self) -> Exception | None:
        """XLA's error, waiting for the compile to end (None: it stopped as meant to)."""
        return self._failure.result()

    def when_ended(self, callback: Callable[[Exception | None], None]) -> None:
        """Call `callback` with XLA's error (or None) when the compile ends, on the
        compile's thread (at once, on the caller's, if it has ended); not if the compile
        itself raised."""
        def ended(done: concurrent.futures.Future) -> None:
            if done.exception() is None:
                callback(done.result())
        self._failure.add_done_callback(ended)

    def release(self) -> None:
        """Done with the dumps (the caller's, and the compile's own when it ends): the
        second one removes the directory."""
        with self._lock:
            self._holders -= 1
            last = self._holders == 0
        if last:
            shutil.rmtree(self.directory, ignore_errors=True)


def choose_dump(directory: str, pass_name: str, inliner: str,
                complete: bool) -> str | None:
    """The HloProto dump of the partitioned module, its calls inlined: the dump after the
    call inliner (`inliner`) that follows the partitioner (`pass_name`) in its pipeline,
    else (no calls to inline) the partitioner's. Dumps are numbered in pass order, named by
    pipeline and the passes before and after (the dump regex matches either); the inliner
    also runs before partitioning, and in later pipelines. Unless `complete` (the compile
    has ended), only once a later pipeline's dump is there: the partitioner's pipeline is
    then over and its dumps written whole."""
    numbered = (_NUMBERED_DUMP.search(os.path.basename(path)) for path in
                glob.glob(os.path.join(directory, "*.hlo.pb")))
    dumps = sorted((int(m.group(1)), m.group(2), m.group(3), m.string)
                   for m in numbered if m is not None)
    for i, (_, pipeline, dumped_pass, _) in enumerate(dumps):
        if dumped_pass != pass_name:
            continue
        after = dumps[i + 1:]
        same_pipeline = list(itertools.takewhile(lambda d: d[1] == pipeline, after))
        if not complete and len(same_pipeline) == len(after):
            return None  # the pipeline may not be over
        inlined = [d for d in same_pipeline if d[2] == inliner]
        return os.path.join(directory, (inlined[-1] if inlined else dumps[i])[3])
    return None


@atexit.register
def wait_for_running() -> None:
    """Wait for the compiles still going to end (at exit: XLA's thread would come back to
    a finalized interpreter)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for thread in running:
        thread.join()
