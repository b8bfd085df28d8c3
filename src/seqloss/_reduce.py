"""Reductions, done outside the kernels on the per-sequence losses."""

from __future__ import annotations

import torch


def reduce_ctc(loss: torch.Tensor, target_lengths: torch.Tensor, reduction: str) -> torch.Tensor:
    """torch's CTC reduction: ``"mean"`` is the batch mean of ``loss_b / max(L_b, 1)``."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    denom = target_lengths.to(device=loss.device, dtype=loss.dtype).clamp(min=1)
    return (loss / denom).mean()


def reduce_transducer(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """Transducer reduction: ``"mean"`` is the plain batch mean (torchaudio, k2)."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean()
