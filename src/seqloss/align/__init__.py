"""Forced alignment (Viterbi) for CTC and RNN-T: public functions, reference and kernels."""

from .api import ctc_align, rnnt_align

__all__ = ["ctc_align", "rnnt_align"]
