"""``seqloss::rnnt_loss``: the RNN-T op (torch.library), fake kernel, autograd; in-place mode."""

from __future__ import annotations

import torch
from torch import Tensor

from .._core.compiler import eager_only
from .._core.dispatch import kernel_module
from .._core.opdecl import OpDecl
from .._core.ops import _acc_dtype, conform_layout
from .._core.reduce import finish, grad_scale, weights
from .checks import transducer_values
from .joint.table import JointTable, rnnt_table


def _batch_scale(grad_loss: Tensor, B: int, packed: bool, logit_lengths: Tensor,
                 target_lengths: Tensor, rows: int) -> Tensor:
    """Incoming gradient per batch item, or per row of the packed layout (T_b (U_b + 1) rows)."""
    g = grad_loss.expand(B) if grad_loss.dim() == 0 else grad_loss
    if not packed:
        return g
    reps = (logit_lengths * (target_lengths + 1)).to(g.device)
    return torch.repeat_interleave(g, reps, output_size=rows)


def joint_loss_impl(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
    grad_buffer: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Value checks, the backend's table-driven joint, ``zero_infinity`` and the reduction.

    ``reduction`` is an explicit name (``"mean"`` resolved by the caller). The weights
    of a mean are applied to the gradient here, or folded into the kernel's gradient
    (``grad_scale``: free there) where they are one number known on the host, so that
    the usual backward (incoming gradient 1) hands the saved gradient on untouched: no
    second logits-sized tensor.
    """
    padded = transducer_values(
        logits, targets, logit_lengths, target_lengths, table.blank_tokens, validate=validate,
        num_tokens=table.num_tokens,
    )
    scale = grad_scale(reduction, target_lengths)
    loss, grad = kernel_module("joint", backend).joint_loss_forward(
        logits, padded, logit_lengths, target_lengths, table, fused_log_softmax, compute_grad,
        grad_buffer, 1.0 if scale is None else scale,
    )
    if grad_buffer is None:
        grad = conform_layout(grad, logits)
    w = weights(reduction, target_lengths, loss)
    rows = None
    if logits.dim() == 2 and (zero_infinity or (scale is None and w is not None and w.dim())):
        rows = logit_lengths * (target_lengths + 1)
    return finish(loss, grad, reduction, zero_infinity, weights=w, batch_dim=0,
                  grad_scaled=scale is not None, rows=rows)


def rnnt_loss_impl(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    fused_log_softmax: bool,
    fastemit_lambda: float,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """RNN-T loss (reduced: ``(B,)`` for ``"none"``, else a scalar) and its gradient.

    The joint with ``rnnt_table``. ``logits`` padded ``(B, T, U+1, V)`` or packed
    ``(N, V)``; ``targets`` int64 padded ``(B, S)`` (or concatenated 1-D with packed
    logits); lengths ``(B,)`` int64. The gradient is shaped like ``logits`` (empty
    unless ``compute_grad``) and already includes the reduction's scaling. Shapes and
    dtypes were checked by the caller.
    """
    table = rnnt_table(logits.shape[-1], blank, clamp, fastemit_lambda)
    return joint_loss_impl(logits, targets, logit_lengths, target_lengths, table,
                           fused_log_softmax, reduction, zero_infinity, backend, compute_grad,
                           validate)


# --------------------------------------------------------------------------- any table
def table_loss_impl(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    table_ints: list[int],
    table_floats: list[float],
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """The joint loss of any table, flattened for the op schema (``JointTable.encode``)."""
    table = JointTable.decode(table_ints, table_floats)
    return joint_loss_impl(logits, targets, logit_lengths, target_lengths, table,
                           fused_log_softmax, reduction, zero_infinity, backend, compute_grad,
                           validate)


def _transducer_fake(logits: Tensor, logit_lengths: Tensor, reduction: str,
                     compute_grad: bool) -> tuple[Tensor, Tensor]:
    shape = (logit_lengths.shape[0],) if reduction == "none" else ()
    loss = logits.new_empty(shape, dtype=_acc_dtype(logits.dtype))
    grad = torch.empty_like(logits) if compute_grad else logits.new_empty((0,))
    return loss, grad


def _table_fake(logits, targets, logit_lengths, target_lengths, table_ints, table_floats,
                fused_log_softmax, reduction, zero_infinity, backend, compute_grad, validate):
    return _transducer_fake(logits, logit_lengths, reduction, compute_grad)


def _rnnt_fake(logits, targets, logit_lengths, target_lengths, blank, clamp, fused_log_softmax,
               fastemit_lambda, reduction, zero_infinity, backend, compute_grad, validate):
    return _transducer_fake(logits, logit_lengths, reduction, compute_grad)


def per_row(grad_loss: Tensor, grads: tuple[Tensor, ...], lengths: tuple[Tensor, ...]) -> Tensor:
    """The incoming gradient per batch item, or per row of the packed layout (``grads``
    2-D). ``lengths``: the op's ``(logit_lengths, target_lengths)``."""
    g = grads[0]
    return _batch_scale(grad_loss, lengths[0].shape[0], g.dim() == 2, *lengths, g.shape[0])


# The losses of the joint: ``rest`` (after the logits) holds the lengths at 1 and 2.
table_loss_decl = OpDecl("seqloss::transducer_joint_loss", table_loss_impl, _table_fake,
                         batch_scale=per_row, scale_args=(1, 2))
table_loss_op = table_loss_decl.op
rnnt_loss_decl = OpDecl("seqloss::rnnt_loss", rnnt_loss_impl, _rnnt_fake,
                        batch_scale=per_row, scale_args=(1, 2))
rnnt_loss_op = rnnt_loss_decl.op


def rnnt_loss_inplace(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    fused_log_softmax: bool,
    fastemit_lambda: float,
    delay_penalty: float,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    validate: bool,
) -> Tensor:
    """The in-place mode: the gradient overwrites ``logits``' storage (eager: a graph break).

    Not a torch.library op: a custom op may not return an alias of its input,
    and autograd cannot be registered for a mutating one. The in-place writes bump
    ``logits``' version counter, so autograd raises if another node saved
    ``logits`` for its backward (a joiner's final ``Linear`` saves its input, not
    its output, so the usual joiner is fine).
    """
    return _RNNTInplace.apply(logits, targets, logit_lengths, target_lengths, blank, clamp,
                              fused_log_softmax, fastemit_lambda, delay_penalty, reduction,
                              zero_infinity, backend, validate)


# A mutation of the caller's logits cannot be traced: under torch.compile this is a
# graph break (it runs eagerly; fullgraph=True raises).
rnnt_loss_inplace = eager_only(
    rnnt_loss_inplace, "seqloss's in-place rnnt_loss (inplace_grad=True) overwrites the "
    "caller's logits, which torch.compile cannot trace")


class _RNNTInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, blank, clamp,
                fused_log_softmax, fastemit_lambda, delay_penalty, reduction, zero_infinity,
                backend, validate):
        compute_grad = logits.requires_grad
        loss, grad = joint_loss_impl(
            logits, targets, logit_lengths, target_lengths,
            rnnt_table(logits.shape[-1], blank, clamp, fastemit_lambda,
                       delay_penalty=delay_penalty), fused_log_softmax,
            reduction, zero_infinity, backend, compute_grad, validate,
            grad_buffer=logits if compute_grad else None,
        )
        # Held on ctx, not saved: it is logits' own storage, already overwritten.
        ctx.grad = grad.detach() if compute_grad else None
        ctx.packed = logits.dim() == 2
        ctx.lengths = (logit_lengths, target_lengths)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("seqloss: the in-place rnnt_loss gradient was already consumed "
                               "(one backward per forward with inplace_grad=True)")
        if not bool((grad_loss == 1).all()):
            g = _batch_scale(grad_loss, ctx.lengths[0].shape[0], ctx.packed, *ctx.lengths,
                             grad.shape[0])
            shape = [1] * grad.dim()
            shape[0] = g.shape[0]
            g = g.reshape(shape)
            grad.mul_(g.float() if grad.dtype in (torch.float16, torch.bfloat16)
                      else g.to(grad.dtype))
        return (grad, *(None,) * 12)
