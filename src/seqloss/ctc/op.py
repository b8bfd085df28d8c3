"""``seqloss::ctc_loss``: the CTC op (torch.library), its fake kernel and autograd.

The op returns the (reduced) loss and its gradient, computed in the forward pass; the
backward scales the saved gradient. The declaration (``_core.opdecl``) names an
implementation per kind of backend: ``ctc_loss_impl`` (Python value checks, the NaN
policy and the reduction around the backend's per-sequence kernel) and, for Numba,
whose kernel does all of that itself, ``ctc_loss_checked``; and the eager CPU fast lane
(``fast.ctc_fast``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core.dispatch import kernel_module
from .._core.opdecl import OpDecl
from .._core.ops import _acc_dtype, conform_layout, poison_nonfinite
from .._core.reduce import finish, weights
from .checks import ctc_values
from .fast import ctc_fast


def ctc_loss_impl(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
    delay_penalty: float,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """CTC loss (reduced: ``(B,)`` for ``"none"``, else a scalar) and its gradient.

    ``log_probs (T, B, C)``; ``targets`` padded ``(B, S)`` or concatenated 1-D;
    lengths ``(B,)`` int64. Shapes and dtypes were checked by the caller. The
    gradient ``(T, B, C)`` (empty unless ``compute_grad``) already includes the
    reduction's per-sequence scaling, so ``loss.backward()`` hands it on as it is
    (no second logits-sized tensor).
    """
    T, B, C = log_probs.shape
    kern = kernel_module("ctc", backend)
    padded = ctc_values(targets, input_lengths, target_lengths, T, C, blank, validate=validate)
    loss, grad = kern.ctc_loss_forward(
        log_probs, padded, input_lengths, target_lengths, blank, fused_log_softmax, compute_grad,
        delay_penalty=delay_penalty,
    )
    grad = conform_layout(grad, log_probs)
    loss, grad = poison_nonfinite(log_probs, input_lengths, loss, grad, time_dim=0, batch_dim=1)
    return finish(loss, grad, reduction, zero_infinity,
                  weights=weights(reduction, target_lengths, loss), batch_dim=1)


def ctc_loss_checked(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
    delay_penalty: float,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """``ctc_loss_impl`` for a backend whose ``ctc_loss_forward`` checks the values,
    applies the NaN policy and reduces in one kernel call (the Python checks,
    ``poison_nonfinite`` and ``finish`` cost ~70 us a call, most of a small batch's
    budget)."""
    loss, grad = kernel_module("ctc", backend).ctc_loss_forward(
        log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
        compute_grad, validate=validate, reduction=reduction, zero_infinity=zero_infinity,
        delay_penalty=delay_penalty,
    )
    return loss, conform_layout(grad, log_probs)


def _fake(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax, reduction,
          zero_infinity, delay_penalty, backend, compute_grad, validate):
    T, B, C = log_probs.shape
    shape = (B,) if reduction == "none" else ()
    loss = log_probs.new_empty(shape, dtype=_acc_dtype(log_probs.dtype))
    grad = torch.empty_like(log_probs) if compute_grad else log_probs.new_empty((0,))
    return loss, grad


# The gradient is (T, B, C): its batch axis is 1.
ctc_loss_decl = OpDecl("seqloss::ctc_loss", ctc_loss_impl, _fake, batch_dim=1, fast=ctc_fast,
                       per_backend={"numba": ctc_loss_checked})
ctc_loss_op = ctc_loss_decl.op
