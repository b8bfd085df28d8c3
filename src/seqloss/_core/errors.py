"""The error types raised for bad input."""

from __future__ import annotations


class InputError(ValueError, RuntimeError):
    """Bad input to a seqloss function.

    A subclass of both ``ValueError`` and ``RuntimeError``, so code written for
    torch's ``RuntimeError`` keeps working. The message names the argument, the
    offending batch index where there is one, and what was expected.
    """


class InputTypeError(TypeError, RuntimeError):
    """An argument of the wrong type or dtype (float lengths, integer logits, ...).

    A ``TypeError`` that is also a ``RuntimeError``: torch raises ``RuntimeError``
    for a wrong dtype, so code written for torch still catches it.
    """
