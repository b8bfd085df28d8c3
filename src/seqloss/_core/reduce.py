"""The one policy for ``zero_infinity`` and the reductions, for every loss.

Each loss op computes per-sequence losses and (function merging) their gradient, then
calls :func:`finish`:

- ``zero_infinity``: a ``+inf`` loss becomes 0, and so does that sequence's whole
  gradient (torch's rule). An impossible alignment's gradient is already 0, but a
  feasible path whose score overflows (``finfo.min`` masks) has finite occupations
  and an infinite loss. NaN is never replaced: it means the sequence read a NaN or
  ``+inf`` input.
- ``"none"``: the ``(B,)`` losses; ``"sum"``: their sum; the means: a weighted sum
  with per-sequence (or one) weights. The weights are applied to the gradient here,
  in place in the op's own fresh tensor (or by the kernel, when it can do it for
  free), so that ``loss.backward()`` hands the gradient on as it is. An empty batch
  reduces to 0 for every reduction but ``"none"`` (never NaN: a data-parallel rank
  with no data still joins the backward).

The means, as weights ``d out / d loss_b`` (``U_b``: sequence ``b``'s target length):
``"mean_batch"`` ``1 / B``; ``"mean_target"`` ``1 / (B max(U_b, 1))`` (torch's CTC mean,
NeMo's and transformers' transducer mean); ``"mean_volume"`` NeMo's ``1 / sum_b U_b`` (1
when every ``U_b`` is 0). A sequence ``zero_infinity`` zeroes still counts in ``B`` and
in ``sum_b U_b``, as in torch. ``"mean"`` never reaches this module: each loss resolves it
(``checks.check_reduction``).
"""

from __future__ import annotations

import torch

from . import checks

# Integer codes of the reductions, for kernels that reduce themselves (CTC's Numba one).
NONE, SUM, MEAN_BATCH, MEAN_TARGET, MEAN_VOLUME = 0, 1, 2, 3, 4
CODES = {"none": NONE, "sum": SUM, "mean_batch": MEAN_BATCH, "mean_target": MEAN_TARGET,
         "mean_volume": MEAN_VOLUME}


def seq_weight(code: int, length: int, batch: int, total: int) -> float:
    """Sequence ``b``'s weight for the reduction ``code`` (``length``: ``U_b``; ``total``:
    ``sum_b U_b``), as :func:`weights`; plain arithmetic, so Numba compiles it too."""
    if code == MEAN_BATCH:
        return 1.0 / batch
    if code == MEAN_TARGET:
        return 1.0 / (max(length, 1) * batch)
    if code == MEAN_VOLUME:
        return 1.0 / max(total, 1)
    return 1.0


def length_total(code: int, lengths) -> int:
    """``sum_b U_b`` where the reduction ``code`` needs it (``"mean_volume"``), else 0: the
    ``total`` of :func:`seq_weight`. Plain loops, so Numba compiles it too."""
    total = 0
    if code == MEAN_VOLUME:
        for b in range(lengths.shape[0]):
            total += lengths[b]
    return total


def weighted_sum(code: int, loss, lengths) -> float:
    """``sum_b w_b loss_b`` accumulated in float64, ``w_b`` :func:`seq_weight`'s: the
    reduction of a kernel that reduces its ``(B,)`` losses itself (CTC's Numba kernel
    compiles this function, with ``seq_weight`` compiled too)."""
    B = loss.shape[0]
    total = length_total(code, lengths)
    acc = 0.0
    for b in range(B):
        acc += float(loss[b]) * seq_weight(code, lengths[b], B, total)
    return acc


def weights(reduction: str, target_lengths: torch.Tensor, loss: torch.Tensor
            ) -> torch.Tensor | None:
    """The mean's weights, ``(B,)`` or 0-D in ``loss``'s dtype and device; ``None`` for
    ``"none"`` and ``"sum"``."""
    B = loss.shape[0]
    if reduction == "mean_batch":
        return loss.new_tensor(1.0 / max(B, 1))
    if reduction == "mean_target":
        return 1.0 / (target_lengths.to(device=loss.device, dtype=loss.dtype).clamp(min=1) * B)
    if reduction == "mean_volume":
        return 1.0 / target_lengths.to(loss.device).sum().clamp(min=1).to(loss.dtype)
    if reduction in ("none", "sum"):
        return None
    # "mean" (or a typo) reaching an op would silently sum: the losses resolve it first.
    raise AssertionError(f"seqloss: unresolved reduction {reduction!r}")


def reduce_losses(loss: torch.Tensor, reduction: str, target_lengths: torch.Tensor
                  ) -> torch.Tensor:
    """The reduction of per-sequence losses ``(B,)`` that autograd differentiates (the
    factored losses, whose gradient flows through torch ops): :func:`weights` applied by
    plain tensor ops; no ``zero_infinity`` (those losses take none)."""
    if reduction == "none":
        return loss
    w = weights(reduction, target_lengths, loss)
    return loss.sum() if w is None else (loss * w).sum()


def grad_scale(reduction: str, target_lengths: torch.Tensor) -> float | None:
    """The factor of every sequence's gradient where it is one number known on the host
    (``"mean_batch"``; ``"mean_volume"`` with host-side lengths), for a kernel to apply for
    free; ``None`` otherwise (:func:`finish` then applies :func:`weights`)."""
    B = target_lengths.shape[0]
    if reduction == "mean_batch":
        return 1.0 / max(B, 1)
    if reduction == "mean_volume" and checks.host_side(target_lengths):
        return 1.0 / max(int(target_lengths.sum()), 1)
    return None


def finish(
    loss: torch.Tensor,
    grad: torch.Tensor,
    reduction: str,
    zero_infinity: bool,
    *,
    weights: torch.Tensor | None,
    batch_dim: int,
    grad_scaled: bool = False,
    rows: torch.Tensor | None = None,
    more: tuple[torch.Tensor, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``zero_infinity`` and the reduction of per-sequence ``loss (B,)`` and its ``grad``.

    Args:
        weights: the mean's per-sequence ``(B,)`` or 0-D weights (:func:`weights`;
            ``None``: a plain sum, or ``"none"``).
        batch_dim: the gradient's batch axis (CTC's ``(T, B, C)``: 1; a transducer's: 0).
        grad_scaled: the kernel already applied ``weights`` to the gradients.
        rows: a packed gradient's rows per sequence (``T_b (U_b + 1)``, in order).
        more: further gradients with the same batch axis (the TDT pair's durations),
            zeroed and weighted with ``grad``.
    """
    fold = None
    if zero_infinity:
        dead = loss == float("inf")
        loss = loss.masked_fill(dead, 0.0)
        if (weights is not None and not grad_scaled and rows is None and not more
                and not checks.host_side(dead)):
            # On a device the weights' multiply below zeroes them too: no extra pass over
            # the gradient (finite there: a NaN or +inf input makes the loss NaN).
            fold = dead
        else:
            zero_sequences(dead, (grad, *more), batch_dim, rows)
    if reduction == "none":
        return loss, grad
    if weights is None:
        return loss.sum(), grad
    if not grad_scaled:
        for g in (grad, *more):
            if not g.numel():
                continue
            w = weights.to(torch.float64 if g.dtype == torch.float64 else g.dtype)
            if fold is not None:
                w = torch.where(fold, 0.0, w)
            if w.dim() and rows is not None:  # packed (N, V): per row
                w = torch.repeat_interleave(w, rows.to(w.device), output_size=g.shape[0])
                w = w[:, None]
            elif w.dim():
                shape = [1] * g.dim()
                shape[batch_dim] = w.shape[0]
                w = w.reshape(shape)
            g.mul_(w)
    return (loss * weights).sum(), grad


def zero_sequences(dead: torch.Tensor, grads: tuple[torch.Tensor, ...], batch_dim: int,
                   rows: torch.Tensor | None = None) -> None:
    """Zero, in place, the gradients of the sequences ``dead (B,)`` marks.

    On the host only when some sequence is marked (the usual case costs one check); on
    a device always, so no device-to-host sync happens (one masked pass).
    """
    grads = tuple(g for g in grads if g.numel())
    if not grads or (checks.host_side(dead) and not bool(dead.any())):
        return
    for g in grads:
        if rows is not None:  # packed (N, V): sequence b owns rows[b] consecutive rows
            m = torch.repeat_interleave(dead, rows.to(dead.device), output_size=g.shape[0])
            g.masked_fill_(m[:, None], 0.0)
            continue
        shape = [1] * g.dim()
        shape[batch_dim] = dead.shape[0]
        g.masked_fill_(dead.reshape(shape), 0.0)
