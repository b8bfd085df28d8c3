"""seqloss: exact, fast, memory-lean alignment-free sequence losses for PyTorch."""

from __future__ import annotations

from ._core.distributed import distributed_mean
from ._core.errors import InputError
from ._core.grad_clamp import grad_clamp
from .align import ctc_align, multiblank_rnnt_align, rnnt_align, tdt_align
from .ctc import CTCLoss, ctc_loss
from .diagnose import diagnose
from .logmm import logmmexp
from .transducer import (
    MultiBlankRNNTLoss,
    RNNTLoss,
    TDTLoss,
    multiblank_rnnt_loss,
    rnnt_loss,
    rnnt_loss_packed,
    tdt_loss,
    transducer_lattice,
)
from .transducer.arc_logprobs import transducer_arc_logprobs, transducer_arc_logprobs_from_joint
from .transducer.factored import (
    do_rnnt_pruning,
    get_rnnt_prune_ranges,
    rnnt_loss_pruned,
    rnnt_loss_simple,
    rnnt_loss_smoothed,
)
from .transducer.from_joint import (
    multiblank_rnnt_loss_from_joint,
    rnnt_loss_from_joint,
    tdt_loss_from_joint,
)
from .transducer.hat import HATLoss, hat_loss, hat_loss_from_joint

__version__ = "0.1.0"

__all__ = [
    "CTCLoss",
    "HATLoss",
    "InputError",
    "MultiBlankRNNTLoss",
    "RNNTLoss",
    "TDTLoss",
    "ctc_align",
    "ctc_loss",
    "diagnose",
    "distributed_mean",
    "do_rnnt_pruning",
    "get_rnnt_prune_ranges",
    "grad_clamp",
    "hat_loss",
    "hat_loss_from_joint",
    "logmmexp",
    "multiblank_rnnt_align",
    "multiblank_rnnt_loss",
    "multiblank_rnnt_loss_from_joint",
    "rnnt_align",
    "rnnt_loss",
    "rnnt_loss_from_joint",
    "rnnt_loss_packed",
    "rnnt_loss_pruned",
    "rnnt_loss_simple",
    "rnnt_loss_smoothed",
    "tdt_align",
    "tdt_loss",
    "tdt_loss_from_joint",
    "transducer_arc_logprobs",
    "transducer_arc_logprobs_from_joint",
    "transducer_lattice",
]
