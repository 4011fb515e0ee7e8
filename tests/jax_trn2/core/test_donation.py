"""jax_trn2.core.donation, the one donation path of both front doors: which inputs a
program takes over, the refusal of a donated argument passed twice, the deletion after."""

from __future__ import annotations

import types

import numpy as np
import pytest

import jax_trn2
from jax_trn2.core import donation

X = np.ones((4, 8), np.float32)


class Donor:
    """An argument that records its deletion (as a jax Array or a plugin buffer would)."""

    def __init__(self):
        self.deletions = 0

    def delete(self) -> None:
        self.deletions += 1


def test_the_donated_inputs_are_the_aliased_ones_in_order_once_each():
    program = types.SimpleNamespace(donated_inputs=((2, 0), (0, 1), (2, 1)))
    assert donation.donated_inputs(program) == (0, 2)


def test_the_donated_inputs_of_a_lowered_program_are_the_donated_arguments():
    step = jax_trn2.jit(lambda a, b, c: (a + b, c * 2), donate_argnums=(0, 2))
    assert donation.donated_inputs(step.lower(X, X, X).program) == (0, 2)
    assert donation.donated_inputs(jax_trn2.jit(lambda a: a * 2).lower(X).program) == ()


def test_a_donated_argument_passed_again_is_refused_naming_both():
    a, b = Donor(), Donor()
    with pytest.raises(ValueError, match="Attempt to donate a buffer which is also used by "
                                         "the same call: arg 1 is donated, and the same "
                                         "array is passed again as arg 2"):
        donation.check_used_once([b, a, a], [1], lambda i: f"arg {i}")


@pytest.mark.parametrize("arguments, donated", [
    ([Donor(), Donor()], [0, 1]),  # different objects, donated both
    ((same := Donor(), same), []),  # the same object twice, neither donated
], ids=["different", "not-donated"])
def test_arguments_used_once_or_not_donated_pass(arguments, donated):
    donation.check_used_once(arguments, donated, str)


def test_equal_values_are_not_the_same_argument():
    donation.check_used_once([X, X.copy()], [0], str)


def test_the_donated_arguments_are_deleted_and_the_others_kept():
    arguments = [Donor(), Donor(), Donor()]
    donation.delete_donated(arguments, [0, 2])
    assert [a.deletions for a in arguments] == [1, 0, 1]
