"""Connectionist Temporal Classification: public functions, op, checks, reference and kernels."""

from .api import CTCLoss, ctc_loss

__all__ = ["CTCLoss", "ctc_loss"]
