"""CTC's eager CPU fast lane: the common small call in a few dozen Python operations.

A small batch's forward+backward is mostly per-call glue: at T=20, B=1, C=10 the Numba
kernel takes ~6 us and autograd's engine ~13 us, and the general path's argument
conversions, dispatch and kernel wrapper took ~27 us more (torch's whole call: ~34 us).
This lane takes the call a training loop makes -- a CPU float32/float64 ``(T, B, C)``
tensor, int64 CPU tensors for the targets and lengths, the Numba backend, no tracing,
no functorch transform, a batch the calling thread runs (``numba_cpu._inline``) --
recognises it with exact-type tests, and calls the general path's own Numba entry
point (which checks the values and raises the same errors) behind an
``autograd.Function`` with the same semantics as ``_core.opdecl._EagerOp``. Any other
call returns ``None`` and takes the general path; both give the same bits
(``tests/test_ctc_fast.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core import buffers, reduce
from .._core.dispatch import _AVAILABLE, kernel_module
from .._core.lanes import (
    compiling,
    freed_graph,
    grad_enabled,
    is_functional,
    numba_chosen,
    scaled_grads,
    transforms_active,
    wrapped,
)
from .._core.ops import _keep_graph, c_apply

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
_SCALAR = {_F32: torch.empty((), dtype=_F32), _F64: torch.empty((), dtype=_F64)}
_kern = None  # seqloss.ctc.numba_cpu, imported on first use (it imports numba)
# CTC's "mean" is torch's: each loss over its target length (at least 1), then the batch
# mean (the public function resolves it with this name too).
MEAN = "mean_target"
_CODES = {**reduce.CODES, "mean": reduce.CODES[MEAN]}


def ctc_fast(log_probs, targets, input_lengths, target_lengths, blank, reduction,
             zero_infinity, fused_log_softmax, backend, validate, delay_penalty=0.0):
    """``ctc_loss`` for the common eager CPU call, or ``None`` to take the general path."""
    global _kern
    dt = log_probs.dtype if type(log_probs) is Tensor else None
    if (dt is None or (dt is not _F32 and dt is not _F64)
            or not log_probs.is_cpu or log_probs.dim() != 3 or type(blank) is not int
            or type(zero_infinity) is not bool or type(fused_log_softmax) is not bool
            or type(validate) is not bool
            # a finite float (inf - inf is NaN); anything else is checked on the general path
            or type(delay_penalty) is not float or delay_penalty - delay_penalty != 0.0
            or type(targets) is not Tensor or targets.dtype is not _I64 or not targets.is_cpu
            or not targets.is_contiguous() or not numba_chosen(backend)):
        return None
    T, B, C = log_probs.shape
    il, tl = input_lengths, target_lengths
    if (B == 0 or not 0 <= blank < C
            or type(il) is not Tensor or il.dtype is not _I64 or not il.is_cpu or il.dim() != 1
            or il.shape[0] != B or not il.is_contiguous()
            or type(tl) is not Tensor or tl.dtype is not _I64 or not tl.is_cpu or tl.dim() != 1
            or tl.shape[0] != B or not tl.is_contiguous()
            or not (targets.dim() == 1 or (targets.dim() == 2 and targets.shape[0] == B))
            or compiling() or transforms_active() or is_functional(log_probs)
            or not _AVAILABLE["numba"]):
        return None
    k = _kern
    if k is None:
        k = _kern = kernel_module("ctc", "numba")
    red = _CODES.get(reduction) if type(reduction) is str else None
    if red is None or (B > 1 and not k._inline(il.numpy(), tl.numpy())):
        return None
    if log_probs.is_contiguous():
        tb_layout = True
    elif log_probs.transpose(0, 1).is_contiguous():
        tb_layout = False
    else:
        return None
    compute_grad = log_probs.requires_grad and grad_enabled()
    grad = None
    gp = 0
    if compute_grad:
        if T * B * C * dt.itemsize >= buffers.MIN_BYTES:  # long utterances: reused memory
            buf = buffers.empty((T, B, C) if tb_layout else (B, T, C), dt)
            view = buf if tb_layout else buf.transpose(0, 1)
            if view.stride() == log_probs.stride():
                grad, gp = view, buf.data_ptr()
        if gp == 0:
            # Dense in lp's layout (the kernel's view of it), the fake kernel's strides;
            # empty_like skips torch.empty's argument parsing (0.65 vs 1.3 us).
            grad = torch.empty_like(log_probs)
            gp = grad.data_ptr()
    # red 0 (reduce.NONE): the (B,) losses; else the reduction, into a 0-D tensor
    res = log_probs.new_empty((B,)) if red == 0 else torch.empty_like(_SCALAR[dt])
    rp = res.data_ptr()
    concat = targets.dim() == 1
    R, S = (1, targets.shape[0]) if concat else targets.shape
    kargs = (k._ZERO[dt], log_probs.data_ptr(), tb_layout, T, B, C, targets.data_ptr(), R, S,
             concat, 0, il.data_ptr(), tl.data_ptr(), blank, fused_log_softmax, delay_penalty,
             compute_grad, gp, rp if red == 0 else 0, 0, 0, int(k._SEGMENT_OVERRIDE), red,
             zero_infinity, 0 if red == 0 else rp, validate, 0, 0)
    spec = (k, kargs, res, grad, targets, il, tl, validate)
    if compute_grad:
        return _apply(spec, log_probs)
    _run(spec, log_probs)
    return res


def _run(spec, lp):
    # numba_cpu.ctc_loss_forward's inline branch, the arguments checked and made (the
    # kernel checks the values: a nonzero return names none, the Python checks do).
    k, kargs = spec[0], spec[1]
    bad = k._ctc_chunk(*kargs)
    if bad < 0:  # a sequence left the fast path
        k._ctc_fallback(*kargs[:-2])
    elif bad:
        T, _, C = lp.shape
        k._raise_bad(spec[4], spec[5], spec[6], T, C, kargs[13])


class _FastCTC(torch.autograd.Function):
    """``_core.opdecl._EagerOp`` for the lane: the same backward rule (``grad_to_hand_on``)
    and autograd semantics, with one output and the gradient kept on ``ctx`` (two
    outputs, ``save_for_backward`` and a detached alias cost ~1.5 us a call here, 4% of
    a B=1 forward+backward)."""

    @staticmethod
    def forward(ctx, spec, lp):
        _run(spec, lp)
        ctx.grad, ctx.validate = spec[3], spec[7]
        ctx.lp = lp  # the input, to attach a create_graph gradient to (see backward)
        return spec[2]

    @staticmethod
    def backward(ctx, grad_loss):
        grad = ctx.grad
        if grad is None:
            raise freed_graph()
        keep = _keep_graph()
        # The usual loss.backward() of a reduced loss: hand the gradient on (see
        # grad_to_hand_on, whose other cases this defers to).
        if (not keep and type(grad_loss) is Tensor and not grad_enabled()
                and grad_loss.dim() == 0 and ctx.validate and not compiling()
                and not wrapped(grad_loss) and grad_loss.item() == 1):
            ctx.grad = ctx.lp = None
            return None, grad
        (out,) = scaled_grads((grad,), (ctx.lp,), grad_loss, 1, ctx.validate)
        if not keep:
            ctx.grad = ctx.lp = None
        return None, out


_apply = c_apply(_FastCTC)
