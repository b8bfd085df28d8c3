"""Reductions, done outside the kernels on the per-sequence losses (by the ops)."""

from __future__ import annotations

import torch


def ctc_mean_weights(target_lengths: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """Per-sequence factors of torch's CTC ``"mean"``: ``1 / (max(L_b, 1) * B)``.

    The op applies them to the losses and, in the forward pass, to the gradient.
    """
    B = loss.shape[0]
    return 1.0 / (target_lengths.to(device=loss.device, dtype=loss.dtype).clamp(min=1) * B)


def reduce_transducer(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """Transducer reduction: ``"mean"`` is the plain batch mean (torchaudio, k2)."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean()
