"""Forced alignment (Viterbi): CTC's own kernels; the transducers' from the lattice."""

from .api import ctc_align
from .transducer import multiblank_rnnt_align, rnnt_align, tdt_align

__all__ = ["ctc_align", "multiblank_rnnt_align", "rnnt_align", "tdt_align"]
