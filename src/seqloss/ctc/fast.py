"""CTC's eager CPU fast lane, the op declaration's ``fast`` hook.

A small batch's forward+backward is mostly per-call glue: at T=20, B=1, C=10 the Numba
kernel takes ~6 us and autograd's engine ~13 us, and the general path's argument
conversions, dispatch and kernel wrapper took ~27 us more (torch's whole call: ~34 us).
``ctc_loss`` hands the call a training loop makes -- a CPU float32/float64 ``(T, B, C)``
tensor, int64 CPU tensors for the targets and lengths, exact types -- straight to the
declaration (``op.ctc_loss_decl.value``), which calls this hook in eager mode only (no
tracing, no functorch transform) with the op's own arguments, the backend resolved.
The hook takes the call when the backend is Numba and the calling thread runs the batch
(``numba_cpu.runs_inline``), runs the backend's lean entry point
(``numba_cpu.ctc_loss_inline``, which checks the values and raises the general path's
errors) and returns ``(loss, grad)``, which the declaration hands on through its lanes'
``autograd.Function``. Any other call returns ``None`` and takes the general path; both
give the same bits (``tests/test_fast_lanes.py``).
"""

from __future__ import annotations

import torch

from .._core import buffers, reduce
from .._core.dispatch import kernel_module

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
_SCALAR = {_F32: torch.empty((), dtype=_F32), _F64: torch.empty((), dtype=_F64)}
_kern = None  # seqloss.ctc.numba_cpu, imported on first use (it imports numba)
_CODES = reduce.CODES


def ctc_fast(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
             reduction, zero_infinity, delay_penalty, backend, compute_grad, validate):
    """``(loss, grad)`` (``grad`` ``None`` unless ``compute_grad``) for the common eager CPU
    call, or ``None`` to take the general path.

    The op's arguments: shapes and types checked, ``reduction`` resolved (no
    ``"mean"``), ``backend`` a concrete name."""
    global _kern
    dt = log_probs.dtype
    il, tl = input_lengths, target_lengths
    T, B, C = log_probs.shape
    if (backend != "numba" or (dt is not _F32 and dt is not _F64) or B == 0
            or targets.dtype is not _I64 or il.dtype is not _I64 or tl.dtype is not _I64
            or not (targets.is_contiguous() and il.is_contiguous() and tl.is_contiguous())):
        return None
    k = _kern
    if k is None:
        k = _kern = kernel_module("ctc", "numba")
    if B > 1 and not k.runs_inline(il.numpy(), tl.numpy()):
        return None
    if log_probs.is_contiguous():
        tb_layout = True
    elif log_probs.transpose(0, 1).is_contiguous():
        tb_layout = False
    else:
        return None
    grad = None
    if compute_grad:
        if T * B * C * dt.itemsize >= buffers.MIN_BYTES:  # long utterances: reused memory
            buf = buffers.empty((T, B, C) if tb_layout else (B, T, C), dt)
            view = buf if tb_layout else buf.transpose(0, 1)
            if view.stride() == log_probs.stride():
                grad = view
        if grad is None:
            # Dense in lp's layout (the kernel's view of it), the fake kernel's strides;
            # empty_like skips torch.empty's argument parsing (0.65 vs 1.3 us).
            grad = torch.empty_like(log_probs)
    red = _CODES[reduction]
    # red 0 (reduce.NONE): the (B,) losses; else the reduction, into a 0-D tensor
    res = log_probs.new_empty((B,)) if red == 0 else torch.empty_like(_SCALAR[dt])
    k.ctc_loss_inline(log_probs, tb_layout, targets, il, tl, blank, fused_log_softmax,
                      delay_penalty, grad, res, red, zero_infinity, validate)
    return res, grad
