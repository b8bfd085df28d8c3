"""CTC's eager CPU fast lane, the op declaration's ``fast`` hook.

A small batch's forward+backward is mostly per-call glue: at T=20, B=1, C=10 the Numba
kernel takes ~6 us and autograd's engine ~13 us, and the general path's argument
conversions, dispatch and kernel wrapper took ~27 us more (torch's whole call: ~34 us).
``ctc_loss`` hands the call a training loop makes -- a CPU float32/float64 ``(T, B, C)``
tensor, int64 CPU tensors for the targets and lengths, exact types -- straight to the
lane (``ctc_lane``, what the hook calls once its own checks pass), and the declaration
(``op.ctc_loss_decl.value``) calls the hook, ``ctc_fast``, in eager mode only (no
tracing, no functorch transform) with the op's own arguments, the backend resolved.
The lane is the Numba backend's ``ctc_loss_lane``: it takes the call when the calling
thread runs the batch (``numba_cpu.runs_inline``), checks the values (raising the
general path's errors) and returns ``(loss, grad)``, which the declaration hands on
through its lanes' ``autograd.Function``. Any other call returns ``None`` and takes the
general path; both give the same bits (``tests/test_fast_lanes.py``).
"""

from __future__ import annotations

import torch

from .._core.dispatch import kernel_module

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64


def _load(*args):
    # numba_cpu imports numba (~0.5 s): on the first call, not at import
    global ctc_lane
    ctc_lane = kernel_module("ctc", "numba").ctc_loss_lane
    return ctc_lane(*args)


# ``ctc_lane(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
# reduction, zero_infinity, delay_penalty, compute_grad, validate)``: ``ctc_fast`` for a
# caller that made its checks (the Numba backend; float32/float64 log_probs, int64
# targets and lengths, all on the CPU): ``(loss, grad)`` or ``None``.
ctc_lane = _load


def ctc_fast(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
             reduction, zero_infinity, delay_penalty, backend, compute_grad, validate):
    """``(loss, grad)`` (``grad`` ``None`` unless ``compute_grad``) for the common eager CPU
    call, or ``None`` to take the general path.

    The op's arguments: shapes and types checked, ``reduction`` resolved (no
    ``"mean"``), ``backend`` a concrete name."""
    dt = log_probs.dtype
    if (backend != "numba" or (dt is not _F32 and dt is not _F64)
            or targets.dtype is not _I64 or input_lengths.dtype is not _I64
            or target_lengths.dtype is not _I64):
        return None
    return ctc_lane(log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
                    reduction, zero_infinity, delay_penalty, compute_grad, validate)
