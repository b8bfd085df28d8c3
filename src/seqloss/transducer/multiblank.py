"""Multi-blank RNN-T (Xu et al., 2022): a table on the one joint and lattice."""

from __future__ import annotations

import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import resolve_backend
from .._core.errors import InputError
from .._core.module import LossModule
from .._core.types import IntsLike, TransducerReduction
from .checks import check_durations, transducer_inputs
from .joint.table import multiblank_table
from .op import table_loss_decl


def check_big_blanks(big_blank_durations: object, blank: int, V: int) -> tuple[int, ...]:
    """The big blanks' durations checked (each ``> 1``, distinct, classes below ``blank``,
    the standard blank resolved to ``[0, V)``)."""
    durs = check_durations(big_blank_durations, "big_blank_durations")
    for i, d in enumerate(durs):
        if d <= 1:
            raise InputError(f"big_blank_durations[{i}] = {d} is invalid: a big blank advances "
                             f"more than one frame (duration > 1; the standard blank is the 1)")
    if len(durs) > blank:
        raise InputError(
            f"{len(durs)} big blanks do not fit below blank = {blank}: big blank i is class "
            f"blank - 1 - i, so at most blank = {blank} of them (V = {V} classes)")
    return durs


def multiblank_options(
    big_blank_durations: object, blank: int, V: int, sigma: object, clamp: object,
    reduction: object, fastemit_lambda: object, delay_penalty: object, zero_infinity: object,
    validate: object,
) -> tuple[tuple[int, ...], float, float, str, float, float, bool, bool]:
    """The arguments :func:`multiblank_rnnt_loss` and ``multiblank_rnnt_loss_from_joint``
    share, checked once (``blank`` resolved to ``[0, V)``): ``(durations, sigma, clamp,
    reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)``."""
    return (check_big_blanks(big_blank_durations, blank, V),
            checks.check_float_arg(sigma, "sigma"),
            checks.check_float_arg(clamp, "clamp"),
            checks.check_reduction(reduction, "mean_target"),
            checks.check_float_arg(fastemit_lambda, "fastemit_lambda", low=0.0),
            checks.check_float_arg(delay_penalty, "delay_penalty"),
            checks.flag(zero_infinity, "zero_infinity"),
            checks.flag(validate, "validate"))


def multiblank_rnnt_loss(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    big_blank_durations: list[int] | tuple[int, ...],
    blank: int = -1,
    sigma: float = 0.0,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    fastemit_lambda: float = 0.0,
    *,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    tg, il, tl, blank = transducer_inputs(logits, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    (durs, sigma, clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity,
     validate) = multiblank_options(big_blank_durations, blank, logits.shape[-1], sigma, clamp,
                                    reduction, fastemit_lambda, delay_penalty, zero_infinity,
                                    validate)
    name = resolve_backend(backend, logits.device)
    table = multiblank_table(logits.shape[-1], blank, durs, sigma, clamp, fastemit_lambda,
                             delay_penalty=delay_penalty)
    ints, floats = table.encode()
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    loss = table_loss_decl.value(logits, tg, il, tl, ints, floats, True, reduction,
                                 zero_infinity, name, compute_grad, validate)
    if logits.dtype in (torch.float32, torch.float64):
        loss = loss.to(logits.dtype)
    return loss


multiblank_rnnt_loss.__doc__ = r"""Multi-blank RNN-T loss (Xu et al., 2022), NeMo's conventions.

    Args:
        logits: ``(B, T, U+1, V)`` joint output (float16, bfloat16, float32, float64;
            any layout): the ``V`` classes hold the labels, the standard blank and the
            big blanks. ``T`` and ``U+1`` may exceed the longest sequence (padding).
        targets: ``(B, U)`` int32/int64 labels (a list works too); entries past a target
            length are padding. A label equal to the standard blank or a big blank is an
            error.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= min(U, logits.size(2) - 1)``.
        big_blank_durations: the big blanks' frame advances, each ``> 1``, distinct
            (e.g. ``[2, 4, 8]``); big blank ``i`` is class ``blank - 1 - i``.
        blank: the standard blank (advances one frame); ``-1`` (default) is ``V - 1``,
            other negatives count from the end too.
        sigma: logit under-normalization (NeMo): subtracted from every arc's
            log-probability (blanks, big blanks and labels), so every step of a path
            costs ``sigma`` and paths through big blanks gain.
        clamp: ``> 0`` clamps each element of the per-sequence gradient with respect to
            the logits to ``[-clamp, clamp]`` (before the reduction's scaling); ``<= 0``:
            off.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean_batch"`` (the plain batch
            mean); ``"mean_target"`` (the batch mean of ``loss_b / max(U_b, 1)``);
            ``"mean_volume"`` (``sum_b loss_b / sum_b U_b``; divisor 1 when every ``U_b``
            is 0); ``"mean"`` is NeMo's, ``"mean_target"``.
        fastemit_lambda: FastEmit ``λ >= 0``: the gradient through every label emission
            is scaled by ``1 + λ``, and the loss by ``1 + λ`` (NeMo's definition).
        delay_penalty: k2's delay penalty: every label emission leaving frame ``t`` of
            sequence ``b`` gains ``delay_penalty * ((T_b - 1) / 2 - t)`` in log space
            (``> 0`` favours early emissions; any value, exact in value and gradient).
        zero_infinity: a ``+inf`` loss (no frame, every path through a ``-inf``
            log-probability, or a path score past the float range) gives 0 and a zero
            gradient for that sequence.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check lengths and ids (a device-to-host sync on CUDA).

    Returns:
        The loss: float32 for half inputs, else the input dtype.

    The lattice: from ``(t, u)``, the standard blank goes to ``(t + 1, u)``, big blank
    ``i`` to ``(t + d_i, u)`` (allowed when ``t + d_i <= T_b``), a label to
    ``(t, u + 1)``; the path ends at ``(T_b, U_b)`` on a blank-like arc, as in NeMo.
    One table on the shared joint prologue/epilogue and ``transducer_lattice``: the
    same memory rules as :func:`seqloss.rnnt_loss` (the gradient is the only
    logits-sized allocation), autograd, ``torch.compile`` (fullgraph), deterministic.
"""


class MultiBlankRNNTLoss(LossModule):
    """Module wrapper of :func:`multiblank_rnnt_loss`; constructor takes its keyword arguments."""

    _defaults = {"big_blank_durations": None, "blank": -1, "sigma": 0.0, "clamp": -1,
                 "reduction": "mean", "fastemit_lambda": 0.0, "delay_penalty": 0.0,
                 "zero_infinity": False, "backend": "auto", "validate": True}

    def __init__(
        self,
        big_blank_durations: list[int] | tuple[int, ...],
        blank: int = -1,
        sigma: float = 0.0,
        clamp: float = -1,
        reduction: TransducerReduction = "mean",
        fastemit_lambda: float = 0.0,
        *,
        delay_penalty: float = 0.0,
        zero_infinity: bool = False,
        backend: str = "auto",
        validate: bool = True,
    ) -> None:
        super().__init__(big_blank_durations=big_blank_durations, blank=blank, sigma=sigma,
                         clamp=clamp, reduction=reduction, fastemit_lambda=fastemit_lambda,
                         delay_penalty=delay_penalty, zero_infinity=zero_infinity,
                         backend=backend, validate=validate)

    def forward(self, logits: Tensor, targets: Tensor, logit_lengths: IntsLike,
                target_lengths: IntsLike) -> Tensor:
        return multiblank_rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.big_blank_durations,
            self.blank, self.sigma, self.clamp, self.reduction, self.fastemit_lambda,
            delay_penalty=self.delay_penalty, zero_infinity=self.zero_infinity,
            backend=self.backend, validate=self.validate,
        )
