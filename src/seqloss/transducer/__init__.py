"""The transducer family: one lattice recursion (``lattice/``) and one table-driven joint
prologue/epilogue (``joint/``) under every transducer loss."""

from .lattice import transducer_lattice
from .multiblank import MultiBlankRNNTLoss, multiblank_rnnt_loss
from .rnnt import RNNTLoss, rnnt_loss, rnnt_loss_packed
from .tdt import TDTLoss, tdt_loss

__all__ = ["MultiBlankRNNTLoss", "RNNTLoss", "TDTLoss", "multiblank_rnnt_loss", "rnnt_loss",
           "rnnt_loss_packed", "tdt_loss", "transducer_lattice"]
