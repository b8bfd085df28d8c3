"""Reductions, done outside the kernels on the per-sequence losses (by the ops)."""

from __future__ import annotations

import torch


def ctc_mean_weights(target_lengths: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """Per-sequence factors of torch's CTC ``"mean"``: ``1 / (max(L_b, 1) * B)``.

    The op applies them to the losses and, in the forward pass, to the gradient.
    """
    B = loss.shape[0]
    return 1.0 / (target_lengths.to(device=loss.device, dtype=loss.dtype).clamp(min=1) * B)


def volume_weight(target_lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """NeMo's ``"mean_volume"`` factor ``1 / sum_b U_b`` (1 when every ``U_b`` is 0), 0-D."""
    return 1.0 / target_lengths.sum().clamp(min=1).to(dtype)


def reduce_transducer(loss: torch.Tensor, reduction: str,
                      target_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Transducer reduction: ``"mean"`` is the plain batch mean (torchaudio, k2);
    ``"mean_volume"`` is ``sum_b loss_b / sum_b U_b``. An empty batch reduces to 0."""
    if reduction == "none":
        return loss
    if reduction == "mean" and loss.numel():
        return loss.mean()
    if reduction == "mean_volume":
        assert target_lengths is not None
        return loss.sum() * volume_weight(target_lengths.to(loss.device), loss.dtype)
    return loss.sum()
