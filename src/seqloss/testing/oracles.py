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


def brute_force_rnnt(
    log_probs: torch.Tensor,
    target: list[int] | tuple[int, ...],
    blank: int,
    *,
    return_occupations: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RNN-T ``-log sum_paths prod exp(arc log-probs)`` by enumerating every lattice path.

    A path through ``(t, u)``, ``0 <= t <= T``, ``0 <= u <= U``, from ``(0, 0)`` to
    ``(T, U)``, is an interleaving of ``T`` blanks (``(t, u) -> (t + 1, u)``,
    scored ``log_probs[t, u, blank]``) and ``U`` emissions (``(t, u) -> (t, u + 1)``,
    scored ``log_probs[t, u, target[u]]``, only while ``t < T``), so it ends on a
    blank. No recursion is involved.

    Args:
        log_probs: ``(T, U + 1, V)`` float64 for one sequence (may require grad).
        target: the ``U`` labels.
        blank: the blank index.
        return_occupations: also return the arcs' posterior occupations,
            ``occ_blank (T, U + 1)`` and ``occ_emit (T, U)`` (sums of path posteriors).

    Returns:
        Scalar loss (``+inf`` with no path, e.g. ``T = 0``), differentiable by
        autograd when finite; with ``return_occupations``, ``(loss, occ_blank, occ_emit)``.
    """
    T, U1, _ = log_probs.shape
    U = len(target)
    assert U1 >= U + 1
    target = [int(v) for v in target]
    scores, arcs = [], []
    if T > 0:
        # The last move is a blank; choose where the U emissions go among the others.
        for emit_pos in itertools.combinations(range(T - 1 + U), U):
            emit_pos = set(emit_pos)
            t = u = 0
            terms, used = [], []
            for k in range(T + U):
                if k in emit_pos:
                    terms.append(log_probs[t, u, target[u]])
                    used.append(("e", t, u))
                    u += 1
                else:
                    terms.append(log_probs[t, u, blank])
                    used.append(("b", t, u))
                    t += 1
            scores.append(torch.stack(terms).sum())
            arcs.append(used)
    if not scores:
        loss = log_probs.sum() * 0 + float("inf")
        if return_occupations:
            z = log_probs.new_zeros
            return loss, z(T, U + 1), z(T, U)
        return loss
    s = torch.stack(scores)
    loss = -torch.logsumexp(s, dim=0)
    if not return_occupations:
        return loss
    post = torch.exp(s.detach() + loss.detach())
    occ_b = log_probs.new_zeros(T, U + 1)
    occ_e = log_probs.new_zeros(T, U)
    if torch.isfinite(loss):
        for p, used in zip(post.tolist(), arcs, strict=True):
            for kind, t, u in used:
                if kind == "b":
                    occ_b[t, u] += p
                else:
                    occ_e[t, u] += p
    return loss, occ_b, occ_e


def brute_force_lattice(
    arc_blank: torch.Tensor,
    arc_emit: torch.Tensor,
    T: int,
    U: int,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    emit_can_end: bool = False,
    *,
    delay_penalty: float = 0.0,
) -> torch.Tensor:
    """``log sum_paths exp(sum of arc scores)`` of one sequence, by listing every path.

    The lattice of ``seqloss.transducer_lattice``: states ``(t, u)``, from ``(0, 0)``
    to ``(T, U)``; from a frame ``t < T``, blank-like arc ``i`` goes to
    ``(t + blank_durations[i], u)`` when that is ``<= T``, emission arc ``j`` to
    ``(t + emit_durations[j], u + 1)`` when ``u < U`` and the frame is ``< T``
    (``<= T`` with ``emit_can_end``). Paths are listed by depth-first search (no
    recursion formula is shared with the kernels). ``delay_penalty`` (k2's) adds
    ``delay_penalty * ((T - 1) / 2 - t)`` to every emission arc leaving frame ``t``.

    Args:
        arc_blank: ``(T', U' + 1, Db)`` float64 (may require grad), ``T' >= T``, ``U' >= U``.
        arc_emit: ``(T', U' + 1, De)``.

    Returns:
        Scalar log-likelihood, ``-inf`` when no path exists (``T = 0`` included);
        differentiable by autograd, so its gradient is the arcs' occupations.
    """
    scores: list[torch.Tensor] = []

    def walk(t: int, u: int, acc: list[torch.Tensor]) -> None:
        if (t, u) == (T, U) and T > 0:
            scores.append(torch.stack(acc).sum() if acc else arc_blank.sum() * 0)
            return
        if t >= T:
            return
        for i, d in enumerate(blank_durations):
            if t + d <= T:
                walk(t + d, u, [*acc, arc_blank[t, u, i]])
        if u < U:
            for j, d in enumerate(emit_durations):
                if t + d < T or (emit_can_end and t + d <= T):
                    arc = arc_emit[t, u, j]
                    if delay_penalty:
                        arc = arc + delay_penalty * ((T - 1) / 2 - t)
                    walk(t + d, u + 1, [*acc, arc])

    walk(0, 0, [])
    if not scores:
        return arc_blank.sum() * 0 + float("-inf")
    return torch.logsumexp(torch.stack(scores), dim=0)
