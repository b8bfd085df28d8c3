"""Brute-force oracles: enumerate every alignment, no recursion involved.

Exponential in the sequence length: for tiny T, C only. Everything in float64,
gradients by autograd through a plain ``logsumexp`` of path scores.
"""

from __future__ import annotations

import itertools

import torch


def _collapse(path: tuple[int, ...], blank: int) -> tuple[int, ...]:
    out = []
    prev = None
    for k in path:
        if k != prev and k != blank:
            out.append(k)
        prev = k
    return tuple(out)


def brute_force_ctc(
    log_probs: torch.Tensor, target: list[int] | tuple[int, ...], blank: int = 0
) -> torch.Tensor:
    """``-log sum_{paths collapsing to target} prod_t exp(log_probs[t, path_t])``.

    Args:
        log_probs: ``(T, C)`` float64 (may require grad) for one sequence.
        target: the label sequence.

    Returns:
        Scalar loss; ``+inf`` when no path collapses to ``target``. Differentiable
        (by autograd) when at least one path exists.
    """
    T, C = log_probs.shape
    target = tuple(int(v) for v in target)
    scores = []
    for path in itertools.product(range(C), repeat=T):
        if _collapse(path, blank) == target:
            scores.append(log_probs[torch.arange(T), torch.tensor(path, dtype=torch.long)].sum())
    if not scores:
        return log_probs.sum() * 0 + float("inf")
    return -torch.logsumexp(torch.stack(scores), dim=0)
