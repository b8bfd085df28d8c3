"""Guarded log-space primitives (no epsilon: ``-inf`` is an exact zero).

The rule for a row without a finite entry (a frame, a lattice state, a window row
whose logits or log-probabilities are all ``-inf``): it is a state with no way out.
Its log-normalizer is ``-inf``; its log-probabilities are ``-inf`` (never
``-inf - -inf`` = NaN); its probabilities are 0 (never ``exp(NaN)``); it passes no
gradient back. Paths then avoid it, so a loss is what the rest of the lattice gives
(``+inf`` and a zero gradient where no path remains). Every path that normalizes a
row follows it: torch code through the functions below, Numba kernels through
``_core/numba_logspace.py``, Triton kernels by the same ``where`` written where they
normalize (a device-function call per frame costs milliseconds in the interpreter).
NaN or ``+inf`` in a row is not this case: the normalizer is then NaN or ``+inf`` and
the row's sequence alone gets NaN.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
INF = float("inf")


def logaddexp(*xs: torch.Tensor) -> torch.Tensor:
    """``log(sum(exp(x)))`` elementwise over the arguments; all ``-inf`` gives ``-inf``.

    The shift is replaced by 0 where the maximum is ``-inf`` so that no
    ``-inf - -inf`` NaN appears; NaN and ``+inf`` propagate.
    """
    m = xs[0]
    for x in xs[1:]:
        m = torch.maximum(m, x)
    shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    total = torch.exp(xs[0] - shift)
    for x in xs[1:]:
        total = total + torch.exp(x - shift)
    return torch.log(total) + shift


def _dead_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``(..., 1, ...)``: whether the row along ``dim`` has no entry above ``-inf``
    (an empty row has none)."""
    if x.shape[dim] == 0:
        shape = list(x.shape)
        shape[dim] = 1
        return torch.ones(shape, dtype=torch.bool, device=x.device)
    return x.detach().amax(dim, keepdim=True) == NEG_INF


def log_normalizer(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``logsumexp`` along ``dim``: ``-inf`` for a row of ``-inf``, whose entries get a
    zero gradient (torch's ``logsumexp`` gives them ``0 * exp(-inf - -inf)`` = NaN).

    The dead rows' entries are replaced by 0 before the sum (``where``: its backward
    gives exactly 0 there) and the result by ``-inf`` after. NaN and ``+inf`` propagate.
    """
    if not (torch.is_grad_enabled() and x.requires_grad):
        return torch.logsumexp(x, dim, keepdim)  # the same value, no gradient to guard
    dead = _dead_rows(x, dim)
    z = torch.logsumexp(torch.where(dead, 0.0, x), dim, keepdim=True)
    z = torch.where(dead, NEG_INF, z)
    return z if keepdim else z.squeeze(dim)


def sub_normalizer(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``x - z`` for entries ``x`` of rows whose log-normalizer ``z`` (broadcast against
    ``x``) is given: ``-inf`` where ``z = -inf`` (every entry of the row is ``-inf``,
    so ``x`` is), not NaN, with a zero gradient to ``x`` and ``z`` there."""
    dead = z == NEG_INF
    return torch.where(dead, NEG_INF, x - torch.where(dead, 0.0, z))


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``log_softmax`` along ``dim`` with the rule above: a row of ``-inf`` gives
    ``-inf`` (torch's gives NaN) and passes a zero gradient back."""
    dead = _dead_rows(x, dim)
    return torch.where(dead, NEG_INF, torch.log_softmax(torch.where(dead, 0.0, x), dim))


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``softmax`` along ``dim`` with the rule above: 0 on a row of ``-inf`` (torch's
    gives NaN), which passes a zero gradient back."""
    dead = _dead_rows(x, dim)
    return torch.where(dead, 0.0, torch.softmax(torch.where(dead, 0.0, x), dim))


def softmax_given(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``exp(x - z)``, the probabilities of rows whose log-normalizer ``z`` (broadcast
    against ``x``) is given: 0 on a row with ``z = -inf`` (``z`` taken as ``+inf``), not
    ``exp(-inf - -inf)`` = NaN. For backward passes written out by hand."""
    return torch.sub(x, z.masked_fill(z == NEG_INF, INF)).exp_()
