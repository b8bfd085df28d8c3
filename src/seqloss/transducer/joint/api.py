"""``joint_loss``: the transducer loss of any ``JointTable`` (the variants' functions call it)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._core import checks
from ..._core.dispatch import resolve_backend
from ..._core.types import IntsLike
from ..checks import transducer_inputs
from ..op import table_loss_decl
from .table import JointTable


def joint_loss(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    table: JointTable,
    *,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    """The loss of the transducer ``table`` describes, on the full joint.

    ``logits`` padded ``(B, T, U+1, V + D)`` or packed ``(N, V + D)`` (``D``:
    ``table.num_durations``); everything else as :func:`seqloss.rnnt_loss`. A
    variant (multi-blank, TDT, ...) is a table plus a call to this function (``"mean"``:
    ``"mean_batch"``; the variants resolve their own ``"mean"`` first): the
    prologue, the lattice and the epilogue are shared by every backend.
    """
    packed = logits.dim() == 2
    tg, il, tl, _ = transducer_inputs(logits, targets, logit_lengths, target_lengths,
                                      table.blank_tokens[0], packed=packed)
    reduction = checks.check_reduction(reduction, "mean_batch")
    name = resolve_backend(backend, logits.device)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    ints, floats = table.encode()
    loss = table_loss_decl.value(logits, tg, il, tl, ints, floats, bool(fused_log_softmax),
                                 reduction, bool(zero_infinity), name, compute_grad,
                                 bool(validate))
    if logits.dtype in (torch.float32, torch.float64):
        loss = loss.to(logits.dtype)
    return loss
