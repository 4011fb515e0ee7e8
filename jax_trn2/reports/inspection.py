"""A program as jax_trn2 studies it, whichever door compiled it: `jax_trn2.inspect` gives a
program jax.jit compiled for the trn2 devices the listing, estimates, memory analysis,
trace and plot that jax_trn2.jit's compiled programs have, through the same class."""

from __future__ import annotations

from typing import Any, Sequence

from jax import tree_util

from jax_trn2.core.executable import LoadedExecutable
from jax_trn2.frontend.jit import Compiled
from jax_trn2.plugin.executable import of as executable_of


class PluginCompiled(Compiled):
    """A program jax.jit compiled for the plugin's devices (`jax.devices("trn2")`), as
    jax_trn2.inspect gives it: jax_trn2.Compiled's listing, estimates, memory analysis,
    trace and plot, of the executable the plugin runs it with. Called, or asked for its
    shardings and formats, it is jax's Compiled."""

    def __init__(self, jax_compiled: Any, executable: LoadedExecutable):
        self.executable = executable
        self._jax_stage = jax_compiled
        self.in_tree = jax_compiled.in_tree
        self.out_tree = jax_compiled.out_tree

    def __call__(self, *args, **kwargs) -> Any:
        return self._jax_stage(*args, **kwargs)

    def call_flat(self, leaves: Sequence[Any]) -> Any:
        args, kwargs = tree_util.tree_unflatten(self.in_tree, leaves)
        return self._jax_stage(*args, **kwargs)

    @property
    def input_shardings(self) -> Any:
        return self._jax_stage.input_shardings

    @property
    def output_shardings(self) -> Any:
        return self._jax_stage.output_shardings

    @property
    def input_formats(self) -> Any:
        return self._jax_stage.input_formats

    @property
    def output_formats(self) -> Any:
        return self._jax_stage.output_formats


def inspect(compiled: Any) -> Any:
    """A program jax.jit compiled for the trn2 devices (`jax.jit(f).lower(*args).compile()`
    with its arguments on `jax.devices("trn2")`), as the jax_trn2.Compiled that
    `jax_trn2.jit(f).lower(*args).compile()` gives: `.as_text()` (the listing with
    estimated times), `.cost_analysis()`, `.memory_analysis()`, `.save_trace(path)` and
    `.plot(path)` of the program the plugin runs. A jax_trn2.Compiled is returned as it is.

        compiled = jax.jit(step).lower(params, batch).compile()
        jax_trn2.inspect(compiled).plot("step.png")
    """
    if isinstance(compiled, Compiled):
        return compiled
    if not callable(getattr(compiled, "runtime_executable", None)):
        stage = "a lowered program: compile it first (.compile())" \
            if callable(getattr(compiled, "compile", None)) else f"a {type(compiled).__name__}"
        raise TypeError(f"jax_trn2.inspect takes a compiled program, "
                        f"jax.jit(f).lower(*args).compile(); got {stage}")
    return PluginCompiled(compiled, executable_of(compiled).loaded)


def listing(compiled: Any) -> str:
    """The Trn2 program of a jax `Compiled` for the trn2 platform, with an estimated start
    and duration on every instruction and the step's summary (what
    `jax_trn2.jit(f).lower(...).compile().as_text()` prints)."""
    return inspect(compiled).as_text()
