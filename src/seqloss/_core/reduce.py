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

The weights: CTC's ``"mean"`` is torch's ``1 / (B max(L_b, 1))``; a transducer's
``"mean"`` is the plain batch mean ``1 / B`` (torchaudio, k2), and
``"mean_volume"`` NeMo's ``1 / sum_b U_b`` (1 when every ``U_b`` is 0).
"""

from __future__ import annotations

import torch

from . import checks


def ctc_mean_weights(target_lengths: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """Per-sequence factors of torch's CTC ``"mean"``: ``1 / (max(L_b, 1) * B)``."""
    B = loss.shape[0]
    return 1.0 / (target_lengths.to(device=loss.device, dtype=loss.dtype).clamp(min=1) * B)


def volume_weight(target_lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """NeMo's ``"mean_volume"`` factor ``1 / sum_b U_b`` (1 when every ``U_b`` is 0), 0-D."""
    return 1.0 / target_lengths.sum().clamp(min=1).to(dtype)


def mean_grad_scale(reduction: str, batch: int) -> float:
    """The factor a kernel can fold into the gradient for free: the batch mean's ``1/B``."""
    return 1.0 / batch if reduction == "mean" and batch > 0 else 1.0


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
        weights: the mean's per-sequence ``(B,)`` or 0-D weights (``None``: a plain
            sum, or ``"none"``).
        batch_dim: the gradient's batch axis (CTC's ``(T, B, C)``: 1; a transducer's: 0;
            a packed gradient gets only 0-D weights).
        grad_scaled: the kernel already applied ``weights`` to the gradient.
        rows: a packed gradient's rows per sequence (``T_b (U_b + 1)``, in order).
        more: further gradients with the same batch axis (the TDT pair's durations),
            zeroed with ``grad`` by ``zero_infinity``; the reduction leaves them alone.
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
    if grad.numel() and not grad_scaled:
        w = weights.to(torch.float64 if grad.dtype == torch.float64 else grad.dtype)
        if fold is not None:
            w = torch.where(fold, 0.0, w)
        if w.dim():
            shape = [1] * grad.dim()
            shape[batch_dim] = w.shape[0]
            w = w.reshape(shape)
        grad.mul_(w)
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
