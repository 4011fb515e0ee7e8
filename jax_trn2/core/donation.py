"""Donation, as both front doors do it: which arguments a program takes over, the refusal
of a donated argument passed twice in one call, and the deletion of the donated ones after
the call (jax_trn2.jit on its global arrays, the plugin on each device's buffers).

Plain Python on purpose: the plugin imports it while jax starts its backends.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def donated_inputs(program: Any) -> tuple[int, ...]:
    """The positions of `program`'s inputs (a mesh.isa.Program) whose buffers it writes
    into: aliased to a result or a buffer donor (isa.Program.donated_inputs), the ones
    jax.jit hands to XLA to reuse and deletes after the call."""
    return tuple(sorted({position for position, _ in program.donated_inputs}))


def check_used_once(arguments: Sequence[Any], donated: Sequence[int],
                    name: Callable[[int], str]) -> None:
    """ValueError if an argument at a `donated` position is also passed (the same object)
    at another position of the same call: the program would write over a value it still
    reads. jax refuses it too (PJRT's Execute for f(x, x) with x donated). `name(i)`: how
    the error names argument i."""
    for i in donated:
        again = next((k for k, other in enumerate(arguments)
                      if k != i and other is arguments[i]), None)
        if again is not None:
            raise ValueError(
                f"Attempt to donate a buffer which is also used by the same call: {name(i)} "
                f"is donated, and the same array is passed again as {name(again)} (a donated "
                "buffer can be used once per call: pass a copy, jnp.copy(x))")


def delete_donated(arguments: Sequence[Any], donated: Sequence[int]) -> None:
    """Delete the arguments at the `donated` positions once the call has run (their
    `delete()`: a jax Array, or a plugin buffer), as jax.jit and PJRT do: a later use
    raises jax's "Array has been deleted" error."""
    for i in donated:
        arguments[i].delete()
