"""Connectionist Temporal Classification (Graves et al., 2006)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import resolve_backend
from .._core.lanes import cpu_backend
from .._core.module import LossModule
from .._core.opdecl import apply_lane as _apply_lane
from .._core.opdecl import eager as _eager
from .._core.types import REDUCTIONS, IntsLike, Reduction
from . import fast
from .checks import ctc_inputs
from .op import ctc_loss_decl

# CTC's "mean" is torch's: each loss over its target length (at least 1), then the batch
# mean.
MEAN = "mean_target"
_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
_REDUCTIONS = frozenset(REDUCTIONS)
_grad_enabled = torch.is_grad_enabled


def _checked_call(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                  zero_infinity, fused_log_softmax, delay_penalty, backend,
                  validate) -> Tensor:
    """The loss of any call: each argument checked and converted, then the op."""
    checks.check_float_tensor(log_probs, "log_probs")
    delay_penalty = checks.check_float_arg(delay_penalty, "delay_penalty")
    reduction = checks.check_reduction(reduction, MEAN)
    zero_infinity = checks.flag(zero_infinity, "zero_infinity")
    fused_log_softmax = checks.flag(fused_log_softmax, "fused_log_softmax")
    validate = checks.flag(validate, "validate")
    blank = checks.int_arg(blank, "blank")
    log_probs, tg, il, tl, unbatched = ctc_inputs(
        log_probs, targets, input_lengths, target_lengths, blank
    )
    device = log_probs.device
    name = resolve_backend(backend, device)
    compute_grad = torch.is_grad_enabled() and log_probs.requires_grad
    # Unbatched input gives a scalar for every reduction (torch's behaviour); with
    # one sequence "sum" is that scalar and the means weigh it as a batch of one.
    op_reduction = ("sum" if reduction == "none" else reduction) if unbatched else reduction
    loss = ctc_loss_decl.value(log_probs, tg, il, tl, blank, fused_log_softmax, op_reduction,
                               zero_infinity, delay_penalty, name, compute_grad, validate)
    if loss.dtype != log_probs.dtype and log_probs.dtype in (torch.float32, torch.float64):
        loss = loss.to(log_probs.dtype)
    return loss


def ctc_loss(
    log_probs: Tensor,
    targets: Tensor | Sequence[int] | Sequence[Sequence[int]],
    input_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = 0,
    reduction: Reduction = "mean",
    zero_infinity: bool = False,
    *,
    fused_log_softmax: bool = False,
    delay_penalty: float = 0.0,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    r"""CTC loss, a drop-in for :func:`torch.nn.functional.ctc_loss`.

    Args:
        log_probs: ``(T, B, C)`` or unbatched ``(T, C)`` log-probabilities
            (float16, bfloat16, float32, float64; any layout, e.g. a transposed
            ``(B, T, C)`` tensor). With ``fused_log_softmax=True``: unnormalized logits.
        targets: padded ``(B, S)`` or concatenated 1-D ``(sum(target_lengths),)``
            int32/int64 ids (unbatched: ``(S,)``). Entries past a target length are
            padding: never read, never validated.
        input_lengths: ``(B,)`` frames per sequence, ``<= T`` (tensor or ints).
        target_lengths: ``(B,)`` labels per sequence.
        blank: the blank class, ``0 <= blank < C``.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean_batch"``: the plain batch
            mean; ``"mean_target"``: the batch mean of ``loss_b / max(L_b, 1)`` (``L_b``
            the target length); ``"mean_volume"``: ``sum_b loss_b / sum_b L_b`` (divisor 1
            when every ``L_b`` is 0); ``"mean"`` is torch's, ``"mean_target"``. An empty
            batch gives 0 for every reduction but ``"none"``.
        zero_infinity: a ``+inf`` loss (an impossible alignment, or a path score past
            the float range) gives 0 and a zero gradient for that sequence, as torch.
        fused_log_softmax: take the log-softmax inside; the gradient is then with
            respect to the logits directly (``softmax - occupation``), as warp-ctc.
        delay_penalty: k2's latency penalty: every frame ``t`` a path spends on a
            label (a non-blank extended label) gains ``delay_penalty * ((T_b - 1) / 2 - t)``
            in log space, so a positive value favours emitting early. Any finite value.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``
            (default from ``SEQLOSS_BACKEND``).
        validate: check lengths and ids (a device-to-host sync on CUDA). ``False``
            skips the value checks at the caller's risk (e.g. for CUDA graphs).

    Returns:
        The loss: float32 for half inputs, else the input dtype.

    The loss of sequence ``b`` is ``-log p(l | x)`` over the extended labels
    ``l'`` = (blank, l_1, blank, ..., l_L, blank)::

        alpha[t, s] = lp[t, l'_s] + logaddexp(alpha[t-1, s], alpha[t-1, s-1],
                                              alpha[t-1, s-2] if l'_s != blank, l'_s != l'_{s-2})
        -loss = logaddexp(alpha[T_b - 1, 2L], alpha[T_b - 1, 2L - 1])

    computed exactly in log space, with no epsilon. An impossible alignment (too
    few frames for the labels and their repeats) gives ``+inf`` and a zero
    gradient; NaN or ``+inf`` in a read frame gives NaN for that sequence only.

    Gradient: the true derivative with respect to ``log_probs``, minus the state
    occupation (penalized, with a delay penalty), so :func:`torch.autograd.gradcheck`
    passes. torch returns ``exp(log_probs) - occupation`` instead, which is right
    only when a ``log_softmax`` sits upstream; through an upstream ``log_softmax`` both give
    the same gradient on the logits.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: autograd, torch.compile (fullgraph), deterministic.
    """
    # The common CPU call (exact types: these checks are then all it needs) goes straight
    # to the op, whose fast lane takes it: _checked_call's conversions cost more than a
    # small batch's kernel (and a call to a helper here, ~0.15 us, 1% of a T = 20 call).
    if (type(log_probs) is Tensor and log_probs.is_cpu and log_probs.dim() == 3
            and (log_probs.dtype is _F32 or log_probs.dtype is _F64)
            and type(targets) is Tensor and targets.dtype is _I64 and targets.is_cpu
            and type(input_lengths) is Tensor and input_lengths.dtype is _I64
            and input_lengths.is_cpu and input_lengths.dim() == 1
            and type(target_lengths) is Tensor and target_lengths.dtype is _I64
            and target_lengths.is_cpu and target_lengths.dim() == 1
            and type(blank) is int and type(zero_infinity) is bool
            and type(fused_log_softmax) is bool and type(validate) is bool
            # a finite float (inf - inf is NaN); anything else _checked_call checks
            and type(delay_penalty) is float and delay_penalty - delay_penalty == 0.0
            and type(reduction) is str and reduction in _REDUCTIONS):
        T, B, C = log_probs.shape
        if (0 <= blank < C and input_lengths.shape[0] == B and target_lengths.shape[0] == B
                and (targets.dim() == 1 or (targets.dim() == 2 and targets.shape[0] == B))):
            reduction = MEAN if reduction == "mean" else reduction
            name = cpu_backend(backend)
            compute_grad = log_probs.requires_grad and _grad_enabled()
            # The declaration's hook, called as its value() would (eagerly; the exact
            # types above rule out traced tensors), its checks made here: the lane. A call
            # it declines (a batch for the pool, a strided layout) value() takes.
            if name == "numba" and ctc_loss_decl.fast is fast.ctc_fast and _eager(log_probs):
                out = fast.ctc_lane(log_probs, targets, input_lengths, target_lengths, blank,
                                    fused_log_softmax, reduction, zero_infinity,
                                    delay_penalty, compute_grad, validate)
                if out is not None:  # as value() hands it on (a call less: ~0.2 us)
                    if not compute_grad:
                        return out[0]
                    return _apply_lane((ctc_loss_decl, out, validate), log_probs)
            return ctc_loss_decl.value(
                log_probs, targets, input_lengths, target_lengths, blank, fused_log_softmax,
                reduction, zero_infinity, delay_penalty, name, compute_grad, validate)
    return _checked_call(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                         zero_infinity, fused_log_softmax, delay_penalty, backend, validate)


class CTCLoss(LossModule):
    """Module wrapper of :func:`ctc_loss`; constructor takes its keyword arguments."""

    _defaults = {"blank": 0, "reduction": "mean", "zero_infinity": False,
                 "fused_log_softmax": False, "delay_penalty": 0.0, "backend": "auto",
                 "validate": True}

    def __init__(
        self,
        blank: int = 0,
        reduction: Reduction = "mean",
        zero_infinity: bool = False,
        *,
        fused_log_softmax: bool = False,
        delay_penalty: float = 0.0,
        backend: str = "auto",
        validate: bool = True,
    ) -> None:
        super().__init__(blank=blank, reduction=reduction, zero_infinity=zero_infinity,
                         fused_log_softmax=fused_log_softmax,
                         delay_penalty=checks.check_float_arg(delay_penalty, "delay_penalty"),
                         backend=backend, validate=validate)

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths: IntsLike,
                target_lengths: IntsLike) -> Tensor:
        return ctc_loss(
            log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
            self.zero_infinity, fused_log_softmax=self.fused_log_softmax,
            delay_penalty=self.delay_penalty, backend=self.backend, validate=self.validate,
        )
