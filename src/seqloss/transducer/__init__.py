"""The transducer family: one lattice recursion (``lattice/``) and one table-driven joint
prologue/epilogue (``joint/``) under every transducer loss."""

from .lattice import transducer_lattice
from .rnnt import RNNTLoss, rnnt_loss, rnnt_loss_packed

__all__ = ["RNNTLoss", "rnnt_loss", "rnnt_loss_packed", "transducer_lattice"]
