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

import numpy as np
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from . import _validate
from ._dispatch import kernel_module
from ._reduce import ctc_mean_weights, reduce_transducer, volume_weight

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


def _keep_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``)."""
    f = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)  # noqa: SLF001
    return True if f is None else bool(f())


def _all_ones(g: Tensor) -> bool:
    # .item() of a CPU scalar is ~1 us, a torch reduction ~8 us (both sync on CUDA).
    return g.item() == 1 if g.numel() == 1 else bool((g == 1).all())


def grad_to_hand_on(grad: Tensor, grad_loss: Tensor, batch_dim: int, validate: bool,
                    batch_scale=None) -> Tensor:  # noqa: ANN001
    """The gradient a loss op's backward returns: the saved one times the incoming one.

    The usual ``loss.backward()`` on a reduced loss has an incoming gradient of 1:
    the saved gradient then goes on as it is (detached, so ``autograd.grad`` gives a
    plain tensor), with no second logits-sized tensor. That is safe only when nothing
    can see the saved tensor again: not while the graph is kept (``retain_graph``: a
    leaf's ``.grad`` would alias it, and ``x.grad.zero_()`` would change the next
    backward), nor under ``create_graph`` or tracing. Otherwise the product is a
    fresh tensor, through ``scale_grad`` (whose backward raises the double-backward
    error). The value check is a sync on CUDA: ``validate=False`` skips it.
    """
    if (validate and not torch.is_grad_enabled() and not _is_traced(grad_loss)
            and not _keep_graph() and _all_ones(grad_loss)):
        return grad.detach()
    if batch_scale is not None:
        g = batch_scale(grad_loss)
    else:
        g = grad_loss.expand(grad.shape[batch_dim]) if grad_loss.dim() == 0 else grad_loss
    return scale_grad(grad, g, batch_dim)


def conform_layout(grad: Tensor, like: Tensor) -> Tensor:
    """``grad`` with the strides ``torch.empty_like(like)`` has, as the fake kernels promise.

    The kernels follow the input's layout when they can (a transposed ``(B, T, C)``
    input gets a transposed gradient); an input of any other layout gets whatever
    the kernel made, so match the fake kernel's rule here (a copy, rare).
    """
    if grad.numel() == 0 or grad.stride() == like.stride():
        return grad
    want = torch.empty_like(like, device="meta").stride()
    if grad.stride() == want:
        return grad
    return torch.empty_like(like, dtype=grad.dtype).copy_(grad)


def poison_nonfinite(
    log_probs: Tensor, lengths: Tensor, loss: Tensor, grad: Tensor, time_dim: int, batch_dim: int
) -> tuple[Tensor, Tensor]:
    """NaN loss and gradient for sequences whose read frames hold NaN or ``+inf``.

    The contract is per sequence: any NaN/``+inf`` in a frame before the
    sequence's length, whatever the class, poisons that sequence only; padding
    frames keep exactly zero gradient. ``amax`` propagates NaN, so one reduction
    over the class axis finds both. ``grad`` (the kernel's own fresh tensor) is
    updated in place. On CPU the masking is skipped when nothing is bad; on CUDA it
    always runs, so no device-to-host sync happens here.
    """
    frame_max = log_probs.amax(dim=-1)  # time and batch axes remain
    if log_probs.device.type == "cpu":
        fm = frame_max.numpy() if frame_max.dtype in (torch.float32, torch.float64) else (
            frame_max.float().numpy())
        if (fm < np.inf).all():
            return loss, grad  # the common case: one check, no masks
    if time_dim > batch_dim:
        frame_max = frame_max.transpose(0, 1)
    T = frame_max.shape[0]
    valid = torch.arange(T, device=frame_max.device)[:, None] < lengths.to(frame_max.device)[None, :]
    frame_bad = ~(frame_max < float("inf")) & valid
    bad = frame_bad.any(dim=0)
    if log_probs.device.type == "cpu" and not bool(bad.any()):
        return loss, grad
    loss = loss.masked_fill(bad, NAN)
    if grad.numel():
        m = valid & bad[None, :]
        if time_dim > batch_dim:
            m = m.transpose(0, 1)
        grad.masked_fill_(m.unsqueeze(-1), NAN)
    return loss, grad


def _functorch_wrapped(t: Tensor) -> bool:
    return torch._C._functorch.is_functorch_wrapped_tensor(t)  # noqa: SLF001


def _loss_backward(ctx, grad_loss: Tensor | None) -> Tensor | None:  # noqa: ANN001
    if grad_loss is None:
        return None
    (grad,) = ctx.saved_tensors
    if _functorch_wrapped(grad_loss):
        g = grad_loss if ctx.per_batch is None else ctx.per_batch(grad_loss)
        return batch_product(grad, g, ctx.batch_dim)
    return grad_to_hand_on(grad, grad_loss, ctx.batch_dim, ctx.validate, ctx.per_batch)


class _EagerLoss(torch.autograd.Function):
    """A loss op's implementation in eager mode: the same function as the registered op,
    behind a plain ``autograd.Function``.

    Why not the ``torch.library`` op everywhere: its Python dispatch costs ~30 us per
    call (measured: 32 us for an op with an empty body, against 8 us for this), most
    of a small batch's budget. Under ``torch.compile`` and any other tracing the
    registered op is used (its fake kernel and autograd formula are what the compiler
    needs). The old-style ``forward(ctx, ...)``: ``setup_context`` costs an
    ``inspect.signature`` per call, so only the ``torch.func`` twin below has one.
    """

    @staticmethod
    def forward(ctx, impl, batch_dim, per_batch, x, *rest):  # noqa: ANN001, ANN205
        out = impl(x, *rest)
        ctx.batch_dim, ctx.per_batch, ctx.validate = batch_dim, per_batch, rest[-1]
        ctx.n_rest = len(rest)
        # The gradient output stays "differentiable" on purpose: saved and unpacked, it
        # is attached to this node, so under create_graph the product through
        # scale_grad is too, and a double backward meets its clear error. No incoming
        # gradient is ever materialized for it (no logits-sized zeros).
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(out[1])
        return out

    @staticmethod
    def backward(ctx, grad_loss, _grad_grad):  # noqa: ANN001, ANN205
        return (None, None, None, _loss_backward(ctx, grad_loss), *(None,) * ctx.n_rest)


class _FuncLoss(torch.autograd.Function):
    """``_EagerLoss`` for ``torch.func`` transforms (grad, vjp, jacrev), which need
    ``setup_context``; ``vmap`` and ``jvp`` are not supported."""

    @staticmethod
    def forward(impl, batch_dim, per_batch, x, *rest):  # noqa: ANN001, ANN205
        return impl(x, *rest)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
        ctx.batch_dim, ctx.per_batch, ctx.validate = inputs[1], inputs[2], inputs[-1]
        ctx.n_rest = len(inputs) - 4
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(output[1])

    backward = _EagerLoss.backward


def call_loss_op(op, impl, batch_dim: int, per_batch, x: Tensor, *rest) -> tuple[Tensor, Tensor]:  # noqa: ANN001
    """Run a loss: the registered ``op`` while tracing, ``impl`` behind an
    ``autograd.Function`` eagerly.

    ``rest`` ends with ``(..., compute_grad, validate)``; ``per_batch`` maps the
    incoming gradient to one factor per slice of ``batch_dim`` (``None``: it already
    is, or is a scalar).
    """
    if torch.compiler.is_compiling():
        return op(x, *rest)
    if _functorch_wrapped(x):
        return _FuncLoss.apply(impl, batch_dim, per_batch, x, *rest)
    if isinstance(x, (FakeTensor, FunctionalTensor)) or torch._is_functional_tensor(x):  # noqa: SLF001
        return op(x, *rest)
    if not rest[-2]:  # no gradient wanted: no autograd wrapper either
        return impl(x, *rest)
    return _EagerLoss.apply(impl, batch_dim, per_batch, x, *rest)


def batch_product(grad: Tensor, grad_loss: Tensor, batch_dim: int) -> Tensor:
    """``grad * grad_loss`` with ``grad_loss`` (a scalar or ``(B,)``) on ``batch_dim``."""
    shape = [1] * grad.dim()
    if grad_loss.dim():
        shape[batch_dim] = grad_loss.shape[0]
    return grad * grad_loss.reshape(shape).to(grad.dtype)


# --------------------------------------------------------------------------- CTC
def ctc_loss_impl(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused_log_softmax: bool,
    reduction: str,
    zero_infinity: bool,
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
    padded = _validate.ctc_values(
        targets, input_lengths, target_lengths, T, C, blank, validate=validate
    )
    kern = kernel_module("ctc", backend)
    loss, grad = kern.ctc_loss_forward(
        log_probs, padded, input_lengths, target_lengths, blank, fused_log_softmax, compute_grad
    )
    grad = conform_layout(grad, log_probs)
    loss, grad = poison_nonfinite(log_probs, input_lengths, loss, grad, time_dim=0, batch_dim=1)
    if zero_infinity:
        # The gradient of an impossible alignment is already exactly zero.
        loss = loss.masked_fill(loss == float("inf"), 0.0)
    if reduction == "mean":
        w = ctc_mean_weights(target_lengths, loss)
        if grad.numel():
            grad.mul_(w.to(grad.dtype)[None, :, None] if grad.dtype != torch.float64 else w[None, :, None])
        return (loss * w).sum(), grad
    if reduction == "sum":
        return loss.sum(), grad
    return loss, grad


ctc_loss_op = torch.library.custom_op("seqloss::ctc_loss", ctc_loss_impl, mutates_args=())


@ctc_loss_op.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax, reduction,
      zero_infinity, backend, compute_grad, validate):  # noqa: ANN001
    T, B, C = log_probs.shape
    shape = (B,) if reduction == "none" else ()
    loss = log_probs.new_empty(shape, dtype=_acc_dtype(log_probs.dtype))
    grad = torch.empty_like(log_probs) if compute_grad else log_probs.new_empty((0,))
    return loss, grad


def _ctc_setup(ctx, inputs, output):  # noqa: ANN001
    # No zeros for the (non-differentiable) gradient output's incoming gradient.
    ctx.set_materialize_grads(False)
    ctx.compute_grad = inputs[-2]
    ctx.validate = inputs[-1]
    ctx.save_for_backward(output[1])


def _ctc_backward(ctx, grad_loss, _grad_grad):  # noqa: ANN001
    (grad,) = ctx.saved_tensors
    nones = (None,) * 10
    if grad_loss is None:
        return (None, *nones)
    if not ctx.compute_grad:
        raise RuntimeError("seqloss: ctc_loss was called with compute_grad=False")
    return (grad_to_hand_on(grad, grad_loss, 1, ctx.validate), *nones)


ctc_loss_op.register_autograd(_ctc_backward, setup_context=_ctc_setup)


# --------------------------------------------------------------------------- transducers
def _is_traced(t: Tensor) -> bool:
    """True while tracing (compile, fake/functional tensors, functorch): no value reads then."""
    return (
        torch.compiler.is_compiling()
        or isinstance(t, (FakeTensor, FunctionalTensor))
        or torch._is_functional_tensor(t)  # noqa: SLF001
        or torch._C._functorch.is_functorch_wrapped_tensor(t)  # noqa: SLF001
    )


def _batch_scale(grad_loss: Tensor, B: int, packed: bool, logit_lengths: Tensor,
                 target_lengths: Tensor, rows: int) -> Tensor:
    """Incoming gradient per batch item, or per row of the packed layout (T_b (U_b + 1) rows)."""
    g = grad_loss.expand(B) if grad_loss.dim() == 0 else grad_loss
    if not packed:
        return g
    reps = (logit_lengths * (target_lengths + 1)).to(g.device)
    return torch.repeat_interleave(g, reps, output_size=rows)


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
    grad_buffer: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Value checks, the backend's ``rnnt_loss_forward``, ``zero_infinity`` and the reduction.

    The ``"mean"`` reduction's ``1/B`` is folded into the gradient here (the
    kernel's ``grad_scale``), so that the usual backward (incoming gradient 1)
    hands the saved gradient on untouched: no second logits-sized tensor.
    """
    padded = _validate.transducer_values(
        logits, targets, logit_lengths, target_lengths, blank, validate=validate
    )
    B = logit_lengths.shape[0]
    grad_scale = 1.0 / B if reduction == "mean" and B > 0 else 1.0
    kern = kernel_module("transducer", backend)
    loss, grad = kern.rnnt_loss_forward(
        logits, padded, logit_lengths, target_lengths, blank, clamp, fused_log_softmax,
        fastemit_lambda, compute_grad, grad_buffer, grad_scale,
    )
    if grad_buffer is None:
        grad = conform_layout(grad, logits)
    if reduction == "mean_volume" and grad.numel():
        # 1 / sum_b U_b, applied to our own fresh gradient (no host sync for the divisor).
        grad.mul_(volume_weight(target_lengths, torch.float64).to(grad.dtype))
    if zero_infinity:
        loss = torch.where(loss == float("inf"), torch.zeros_like(loss), loss)
    return reduce_transducer(loss, reduction, target_lengths), grad


@torch.library.custom_op("seqloss::rnnt_loss", mutates_args=())
def rnnt_loss_op(
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

    ``logits`` padded ``(B, T, U+1, V)`` or packed ``(N, V)``; ``targets`` int64 padded
    ``(B, S)`` (or concatenated 1-D with packed logits); lengths ``(B,)`` int64.
    The gradient is shaped like ``logits`` (empty unless ``compute_grad``) and already
    includes the reduction's scaling. Shapes and dtypes were checked by the caller.
    """
    return rnnt_loss_impl(
        logits, targets, logit_lengths, target_lengths, blank, clamp, fused_log_softmax,
        fastemit_lambda, reduction, zero_infinity, backend, compute_grad, validate,
    )


@rnnt_loss_op.register_fake
def _(logits, targets, logit_lengths, target_lengths, blank, clamp, fused_log_softmax,
      fastemit_lambda, reduction, zero_infinity, backend, compute_grad, validate):  # noqa: ANN001
    shape = (logit_lengths.shape[0],) if reduction == "none" else ()
    loss = logits.new_empty(shape, dtype=_acc_dtype(logits.dtype))
    grad = torch.empty_like(logits) if compute_grad else logits.new_empty((0,))
    return loss, grad


def _rnnt_setup(ctx, inputs, output):  # noqa: ANN001
    # The gradient output gets no incoming gradient: do not let autograd materialize
    # a logits-sized tensor of zeros for it (a whole extra allocation and fill).
    ctx.set_materialize_grads(False)
    ctx.packed = inputs[0].dim() == 2
    ctx.compute_grad = inputs[-2]
    ctx.validate = inputs[-1]
    ctx.save_for_backward(output[1], inputs[2], inputs[3])


def _rnnt_backward(ctx, grad_loss, _grad_grad):  # noqa: ANN001
    grad, logit_lengths, target_lengths = ctx.saved_tensors
    nones = (None,) * 12
    if grad_loss is None:  # only the (non-differentiable) gradient output was used
        return (None, *nones)
    if not ctx.compute_grad:
        raise RuntimeError("seqloss: rnnt_loss was called with compute_grad=False")
    B = logit_lengths.shape[0]
    return (grad_to_hand_on(
        grad, grad_loss, 0, ctx.validate,
        lambda g: _batch_scale(g, B, ctx.packed, logit_lengths, target_lengths, grad.shape[0]),
    ), *nones)


rnnt_loss_op.register_autograd(_rnnt_backward, setup_context=_rnnt_setup)


# A mutation of the caller's logits cannot be traced: under torch.compile this is a
# graph break (it runs eagerly; fullgraph=True raises).
@torch.compiler.disable
def rnnt_loss_inplace(
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
                              fused_log_softmax, fastemit_lambda, reduction, zero_infinity,
                              backend, validate)


class _RNNTInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, blank, clamp,  # noqa: ANN001, ANN205
                fused_log_softmax, fastemit_lambda, reduction, zero_infinity, backend, validate):
        compute_grad = logits.requires_grad
        loss, grad = rnnt_loss_impl(
            logits, targets, logit_lengths, target_lengths, blank, clamp, fused_log_softmax,
            fastemit_lambda, reduction, zero_infinity, backend, compute_grad, validate,
            grad_buffer=logits if compute_grad else None,
        )
        # Held on ctx, not saved: it is logits' own storage, already overwritten.
        ctx.grad = grad.detach() if compute_grad else None
        ctx.packed = logits.dim() == 2
        ctx.lengths = (logit_lengths, target_lengths)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: ANN001, ANN205
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("seqloss: the in-place rnnt_loss gradient was already consumed "
                               "(one backward per forward with inplace_grad=True)")
        if not bool((grad_loss == 1).all()):
            g = _batch_scale(grad_loss, ctx.lengths[0].shape[0], ctx.packed, *ctx.lengths, grad.shape[0])
            shape = [1] * grad.dim()
            shape[0] = g.shape[0]
            g = g.reshape(shape)
            grad.mul_(g.float() if grad.dtype in (torch.float16, torch.bfloat16) else g.to(grad.dtype))
        return (grad, *(None,) * 11)
