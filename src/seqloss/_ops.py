"""torch.library registrations: op schemas, fake kernels, autograd.

Each loss is one custom op returning per-sequence ``(loss, grad)``: the gradient
is computed in the forward pass (function merging, as torchaudio does) and the
backward only scales it by the incoming per-sequence gradient. The backend is a
string argument, resolved before the call, so tests can force the Triton kernels
on CPU tensors under ``TRITON_INTERPRET=1``.

Value checks (lengths, ids) run inside the op implementations: those run eagerly
even under ``torch.compile``, so checking there costs no graph break.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _validate
from ._dispatch import kernel_module

NAN = float("nan")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- shared
@torch.library.custom_op("seqloss::scale_grad", mutates_args=())
def scale_grad(grad: Tensor, grad_out: Tensor, batch_dim: int) -> Tensor:
    """``grad * grad_out`` with ``grad_out (B,)`` broadcast along ``grad``'s ``batch_dim``."""
    shape = [1] * grad.dim()
    shape[batch_dim] = grad_out.shape[0]
    g = grad_out.reshape(shape)
    if grad.dtype in (torch.float16, torch.bfloat16):
        return (grad.float() * g.float()).to(grad.dtype)
    return grad * g.to(grad.dtype)


@scale_grad.register_fake
def _(grad: Tensor, grad_out: Tensor, batch_dim: int) -> Tensor:
    return torch.empty_like(grad)


def _no_double_backward(ctx, g):  # noqa: ANN001
    raise RuntimeError(
        "seqloss: double backward is not supported (the loss's gradient is computed "
        "in the forward pass and is not itself differentiable)"
    )


scale_grad.register_autograd(_no_double_backward)


def poison_nonfinite(
    log_probs: Tensor, lengths: Tensor, loss: Tensor, grad: Tensor, time_dim: int, batch_dim: int
) -> tuple[Tensor, Tensor]:
    """NaN loss and gradient for sequences whose read frames hold NaN or ``+inf``.

    The contract is per sequence: any NaN/``+inf`` in a frame before the
    sequence's length, whatever the class, poisons that sequence only; padding
    frames keep exactly zero gradient. ``amax`` propagates NaN, so one reduction
    over the class axis finds both.
    """
    frame_max = log_probs.amax(dim=-1)  # time and batch axes remain
    if time_dim > batch_dim:
        frame_max = frame_max.transpose(0, 1)
    T = frame_max.shape[0]
    valid = torch.arange(T, device=frame_max.device)[:, None] < lengths.to(frame_max.device)[None, :]
    frame_bad = ~(frame_max < float("inf")) & valid
    bad = frame_bad.any(dim=0)
    if not bool(bad.any()):
        return loss, grad
    loss = torch.where(bad, torch.full_like(loss, NAN), loss)
    if grad.numel():
        m = valid & bad[None, :]
        if time_dim > batch_dim:
            m = m.transpose(0, 1)
        grad = torch.where(m.unsqueeze(-1), torch.full_like(grad, NAN), grad)
    return loss, grad


# --------------------------------------------------------------------------- CTC
@torch.library.custom_op("seqloss::ctc_loss", mutates_args=())
def ctc_loss_op(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """Per-sequence CTC loss ``(B,)`` and its gradient ``(T, B, C)`` (or empty).

    ``log_probs (T, B, C)``; ``targets`` padded ``(B, S)`` or concatenated 1-D;
    lengths ``(B,)`` int64. Shapes and dtypes were checked by the caller.
    """
    T, B, C = log_probs.shape
    padded = _validate.ctc_values(
        targets, input_lengths, target_lengths, T, C, blank, validate=validate
    )
    kern = kernel_module("ctc", backend)
    loss, grad = kern.ctc_loss_forward(
        log_probs, padded, input_lengths, target_lengths, blank, fused_log_softmax, compute_grad
    )
    return poison_nonfinite(log_probs, input_lengths, loss, grad, time_dim=0, batch_dim=1)


@ctc_loss_op.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax, backend,
      compute_grad, validate):  # noqa: ANN001
    T, B, C = log_probs.shape
    loss = log_probs.new_empty((B,), dtype=_acc_dtype(log_probs.dtype))
    grad = log_probs.new_empty((T, B, C)) if compute_grad else log_probs.new_empty((0,))
    return loss, grad


def _ctc_setup(ctx, inputs, output):  # noqa: ANN001
    ctx.save_for_backward(output[1])


def _ctc_backward(ctx, grad_loss, _grad_grad):  # noqa: ANN001
    (grad,) = ctx.saved_tensors
    if grad.numel() == 0:
        raise RuntimeError("seqloss: ctc_loss was called with compute_grad=False")
    return scale_grad(grad, grad_loss, 1), None, None, None, None, None, None, None, None


ctc_loss_op.register_autograd(_ctc_backward, setup_context=_ctc_setup)
