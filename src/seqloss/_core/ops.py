"""The op boundary shared by every loss: how an op is called, and what its backward returns.

Each loss is one op returning per-sequence ``(loss, grad)``: the gradient is computed
in the forward pass (function merging, as torchaudio does) and the backward only
scales it by the incoming per-sequence gradient (``grad_to_hand_on``). How an op is
declared, registered and called is ``_core.opdecl``; these are the pieces it and the
fast lanes share. The backend is a string argument, resolved before the call, so
tests can force the Triton kernels on CPU tensors under ``TRITON_INTERPRET=1``.

Value checks (lengths, ids) run inside the op implementations: those run eagerly
even under ``torch.compile``, so checking there costs no graph break.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import checks
from . import torch_compat as tc

NAN = float("nan")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- shared
def _scale_grad(grad: Tensor, grad_out: Tensor, batch_dim: int) -> Tensor:
    """``grad * grad_out`` with ``grad_out (B,)`` broadcast along ``grad``'s ``batch_dim``."""
    shape = [1] * grad.dim()
    shape[batch_dim] = grad_out.shape[0]
    g = grad_out.reshape(shape)
    if grad.dtype in (torch.float16, torch.bfloat16):
        return (grad.float() * g.float()).to(grad.dtype)
    return grad * g.to(grad.dtype)


scale_grad = tc.custom_op("seqloss::scale_grad", _scale_grad, mutates_args=())


@scale_grad.register_fake
def _(grad: Tensor, grad_out: Tensor, batch_dim: int) -> Tensor:
    return torch.empty_like(grad)


DOUBLE_BACKWARD = ("seqloss: double backward is not supported (the loss's gradient is "
                   "computed in the forward pass and is not itself differentiable)")


def _no_double_backward(ctx, g):
    raise RuntimeError(DOUBLE_BACKWARD)


scale_grad.register_autograd(_no_double_backward)


# Whether the running backward keeps the graph (``retain_graph=True``; True where torch
# does not say: the safe answer, a fresh product instead of the saved gradient).
_keep_graph = tc.graph_task_keeps_graph


def _all_ones(g: Tensor) -> bool:
    # .item() of a CPU scalar is 0.2 us (of the 0-stride expand ``loss.sum()``'s backward
    # sends, 1.2 us), a CPU vector through numpy ~4 us, torch's ``(g == 1).all()`` ~9 us
    # (each a sync on CUDA).
    if g.numel() <= 1:
        return g.numel() == 0 or g.item() == 1
    if g.dim() == 1 and g.stride(0) == 0:  # one value, expanded: read it once
        return g.as_strided((), ()).item() == 1
    if checks.host_side(g) and g.dtype in (torch.float32, torch.float64):
        return bool((g.detach().numpy() == 1).all())
    return bool((g == 1).all())


def grad_to_hand_on(grad: Tensor, grad_loss: Tensor, batch_dim: int, validate: bool,
                    batch_scale=None) -> Tensor:
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
    return grads_to_hand_on((grad,), grad_loss, batch_dim, validate, batch_scale)[0]


def grads_to_hand_on(grads: tuple[Tensor, ...], grad_loss: Tensor, batch_dim: int,
                     validate: bool, batch_scale=None) -> tuple[Tensor, ...]:
    """``grad_to_hand_on`` for several saved gradients of one op (one incoming gradient,
    so one decision and one value check for all of them)."""
    if (validate and not torch.is_grad_enabled() and not _is_traced(grad_loss)
            and not _keep_graph() and _all_ones(grad_loss)):
        return tuple(g.detach() for g in grads)
    if batch_scale is not None:
        s = batch_scale(grad_loss)
    else:
        s = grad_loss.expand(grads[0].shape[batch_dim]) if grad_loss.dim() == 0 else grad_loss
    if not torch.is_grad_enabled() and not _is_traced(s):
        # Nothing can differentiate the product (no create_graph, no tracing): the op's
        # only purpose, its double-backward error, is moot, and an eager call of a
        # custom op imports torch._dynamo (~2.5 s of a first call).
        return tuple(_scale_grad(g, s, batch_dim) for g in grads)
    return tuple(scale_grad(g, s, batch_dim) for g in grads)


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

    The policy is one for every loss (API.md, "Values"); this is its implementation
    for losses whose kernel does not read every class of every frame (CTC's fast path
    reads only the labels' columns). The transducer joints read every logit in their
    prologue anyway, so they apply the same rule there, at no extra pass.

    The contract is per sequence: any NaN/``+inf`` in a frame before the
    sequence's length, whatever the class, poisons that sequence only; padding
    frames keep exactly zero gradient. ``amax`` propagates NaN, so one reduction
    over the class axis finds both. ``grad`` (the kernel's own fresh tensor) is
    updated in place. On CPU the masking is skipped when nothing is bad; on CUDA it
    always runs, so no device-to-host sync happens here.
    """
    frame_max = log_probs.detach().amax(dim=-1)  # time and batch axes remain
    if checks.host_side(log_probs):
        fm = frame_max.numpy() if frame_max.dtype in (torch.float32, torch.float64) else (
            frame_max.float().numpy())
        if (fm < np.inf).all():
            return loss, grad  # the common case: one check, no masks
    if time_dim > batch_dim:
        frame_max = frame_max.transpose(0, 1)
    T = frame_max.shape[0]
    valid = (torch.arange(T, device=frame_max.device)[:, None]
             < lengths.to(frame_max.device)[None, :])
    frame_bad = ~(frame_max < float("inf")) & valid
    bad = frame_bad.any(dim=0)
    if checks.host_side(log_probs) and not bool(bad.any()):
        return loss, grad
    loss = loss.masked_fill(bad, NAN)
    if grad.numel():
        m = valid & bad[None, :]
        if time_dim > batch_dim:
            m = m.transpose(0, 1)
        grad.masked_fill_(m.unsqueeze(-1), NAN)
    return loss, grad


def _functorch_wrapped(t: Tensor) -> bool:
    return tc.is_functorch_wrapped(t)


def c_apply(cls: type[torch.autograd.Function]):
    """``cls``'s C++ ``apply``, without ``Function.apply``'s Python wrapper (~1 us a call,
    which binds default arguments for ``setup_context`` and unwraps dead functorch
    wrappers: neither applies with no functorch transform active). Call it through
    ``apply_eagerly``."""
    return tc.c_apply(cls)


def apply_eagerly(cls: type[torch.autograd.Function], fast, *args):
    """``cls.apply(*args)``; ``fast`` (``c_apply(cls)``) when no functorch transform is active."""
    if not tc.functorch_transforms_active():
        return fast(*args)
    return cls.apply(*args)


def batch_product(grad: Tensor, grad_loss: Tensor, batch_dim: int) -> Tensor:
    """``grad * grad_loss`` with ``grad_loss`` (a scalar or ``(B,)``) on ``batch_dim``."""
    shape = [1] * grad.dim()
    if grad_loss.dim():
        shape[batch_dim] = grad_loss.shape[0]
    return grad * grad_loss.reshape(shape).to(grad.dtype)


def _is_traced(t: Tensor) -> bool:
    """True while tracing (compile, fake/functional tensors, functorch): no value reads then."""
    return (
        torch.compiler.is_compiling()
        or isinstance(t, tc.TRACED_TENSORS)
        or tc.is_functional_tensor(t)
        or tc.is_functorch_wrapped(t)
    )
