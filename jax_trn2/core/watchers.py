"""The simulator's own jax work, kept from what a caller installed to watch jax's.

The simulator computes with jax: its lowering folds constants with jax operations, and its
executor runs each program as a jax computation on XLA:CPU. That work is not the caller's,
and what the caller installed to watch what jax does sees the caller's alone, as on any
backend: jax's test-event listener (jax._src.test_util counts device puts, compilations
and lowerings through jax._src.util.test_event) and a replacement of jax's lowering of a
jaxpr's equations (`mlir.jaxpr_subcomp`, which jax's own tests replace to collect the
jaxprs jax lowers). Each is wrapped in place the first time the simulator works while it
is installed (and stays wrapped until the caller sets another), so that other threads'
work still reaches it while one thread's simulator runs.

jax's own lowering function is kept at import, which jax's plugin discovery does
(jax_trn2.plugin.initialize) before a caller's program runs.
"""

from __future__ import annotations

import contextlib
import threading
from functools import update_wrapper
from typing import Any, Iterator

from jax._src import util as jax_util
from jax._src.interpreters import mlir as jax_mlir

# jax's own lowering of a jaxpr's equations, before any caller replaced it
_JAXPR_SUBCOMP = jax_mlir.jaxpr_subcomp
_SIMULATOR_THREAD = threading.local()  # .on: this thread is doing the simulator's work


def installed() -> bool:
    """Whether the caller has installed a watcher (cheap: asked on every run)."""
    return jax_util.test_event_listener is not None or \
        jax_mlir.jaxpr_subcomp is not _JAXPR_SUBCOMP


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """The jax work this thread does inside, kept from the caller's watchers."""
    listener = jax_util.test_event_listener
    if listener is not None and not isinstance(listener, _EventFilter):
        jax_util.test_event_listener = _EventFilter(listener)
    lower = jax_mlir.jaxpr_subcomp
    if lower is not _JAXPR_SUBCOMP and not isinstance(lower, _LoweringFilter):
        jax_mlir.jaxpr_subcomp = _LoweringFilter(lower)
    outer = _on_simulator_thread()
    _SIMULATOR_THREAD.on = True
    try:
        yield
    finally:
        _SIMULATOR_THREAD.on = outer


def _on_simulator_thread() -> bool:
    return getattr(_SIMULATOR_THREAD, "on", False)


class _EventFilter:
    """jax's test-event listener, passed the events of every thread but those doing the
    simulator's work."""

    def __init__(self, listener):
        self.listener = listener

    def __call__(self, name: str, *args: Any) -> None:
        if not _on_simulator_thread():
            self.listener(name, *args)


class _LoweringFilter:
    """jax's lowering of jaxprs as the caller replaced it, for every thread but those doing
    the simulator's work, which lower with jax's own."""

    def __init__(self, replacement):
        self.replacement = replacement
        update_wrapper(self, replacement)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lower = _JAXPR_SUBCOMP if _on_simulator_thread() else self.replacement
        return lower(*args, **kwargs)
