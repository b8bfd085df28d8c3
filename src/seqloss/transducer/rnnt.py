"""RNN-Transducer loss (Graves, 2012) on the full joint, padded or packed."""

from __future__ import annotations

import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import resolve_backend
from .._core.module import LossModule
from .._core.types import IntsLike, TransducerReduction
from .checks import transducer_inputs
from .joint.table import rnnt_table
from .op import rnnt_loss_decl, rnnt_loss_inplace, table_loss_decl

_DOC_COMMON = r"""
    The loss of sequence ``b`` is ``-log p(y | x)`` summed over every monotonic path
    through the ``(t, u)`` lattice, ``0 <= t <= T_b``, ``0 <= u <= U_b``::

        alpha(0, 0) = 0
        alpha(t, u) = logaddexp(alpha(t-1, u) + lp[t-1, u, blank],
                                alpha(t, u-1) + lp[t, u-1, y_u])        (t < T_b for the 2nd)
        -loss = alpha(T_b, U_b) = alpha(T_b-1, U_b) + lp[T_b-1, U_b, blank]

    computed exactly in log space with a guarded logaddexp (no epsilon). A sequence
    with no frame is infeasible (``+inf``; 0 with ``zero_infinity=True``; zero
    gradient), as is one whose every path has a ``-inf`` log-probability. NaN or
    ``+inf`` anywhere a sequence reads (``logits[b, t < T_b, u <= U_b, :]``) gives a
    NaN loss and a NaN gradient on that region, for that sequence only; padding
    is never read and gets exactly zero gradient.

    Gradient (computed in the forward pass; the backward only scales it): with
    ``fused_log_softmax=True`` it is taken with respect to the raw logits,
    ``softmax * occupation - arc occupations``; with ``False`` it is the true
    derivative with respect to the given log-probabilities (``-`` the arc
    occupations on the blank and target entries, zero elsewhere). ``clamp > 0``
    clamps each element of the per-sequence gradient to ``[-clamp, clamp]`` before
    the incoming gradient and the reduction's scaling (torchaudio's order).
    ``fastemit_lambda`` (FastEmit, Yu et al., 2021, as NeMo defines it) scales the
    gradient with respect to every emission arc's log-probability by ``1 + λ``
    (blank arcs unchanged) before the log-softmax's chain rule, and the reported
    loss by ``1 + λ``; gradcheck applies only for ``λ = 0``.

    Memory (numba backend; the Triton one follows the same rules): the log-softmax
    normalizers are computed on the fly, in the gradient's own buffer, so the
    gradient is the only logits-sized allocation. ``inplace_grad=True`` writes the
    gradient into the logits' own storage, so the loss allocates nothing of the
    logits' size. Its preconditions: the logits' values are gone after the call
    (they hold the gradient); the logits must require grad; autograd's version
    check raises at backward if another node saved the logits (a joiner's final
    ``nn.Linear`` saves its input, not its output, so it is fine; an activation
    applied after it may not be); eager mode only (not under ``torch.compile``);
    one backward per forward.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: autograd, torch.compile (fullgraph; not with ``inplace_grad``),
    deterministic.
"""


def rnnt_options(clamp: object, reduction: object, fastemit_lambda: object,
                 delay_penalty: object, zero_infinity: object,
                 validate: object) -> tuple[float, str, float, float, bool, bool]:
    """The options :func:`rnnt_loss` and ``rnnt_loss_from_joint`` share, checked once:
    ``(clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)``."""
    return (checks.check_float_arg(clamp, "clamp"),
            checks.check_reduction(reduction, "mean_batch"),
            checks.check_float_arg(fastemit_lambda, "fastemit_lambda", low=0.0),
            checks.check_float_arg(delay_penalty, "delay_penalty"),
            checks.flag(zero_infinity, "zero_infinity"),
            checks.flag(validate, "validate"))


def _loss(
    logits: Tensor, targets: object, logit_lengths: object, target_lengths: object,
    blank: int, clamp: float, reduction: str, fused_log_softmax: bool, fastemit_lambda: float,
    delay_penalty: float, backend: str, validate: bool, zero_infinity: bool, inplace_grad: bool,
    packed: bool,
) -> Tensor:
    tg, il, tl, blank = transducer_inputs(
        logits, targets, logit_lengths, target_lengths, blank, packed=packed
    )
    fused = checks.flag(fused_log_softmax, "fused_log_softmax")
    inplace_grad = checks.flag(inplace_grad, "inplace_grad")
    clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate = rnnt_options(
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)
    name = resolve_backend(backend, logits.device)
    if inplace_grad:
        loss = rnnt_loss_inplace(logits, tg, il, tl, blank, clamp, fused, fastemit_lambda,
                                 delay_penalty, reduction, zero_infinity, name, validate)
    else:
        compute_grad = torch.is_grad_enabled() and logits.requires_grad
        if delay_penalty:
            # The table op (its floats carry the penalty): the RNN-T op's schema, which
            # callers may use directly, stays as it was.
            ints, floats = rnnt_table(logits.shape[-1], blank, clamp, fastemit_lambda,
                                      delay_penalty=delay_penalty).encode()
            loss = table_loss_decl.value(logits, tg, il, tl, ints, floats, fused, reduction,
                                         zero_infinity, name, compute_grad, validate)
        else:
            loss = rnnt_loss_decl.value(logits, tg, il, tl, blank, clamp, fused, fastemit_lambda,
                                        reduction, zero_infinity, name, compute_grad, validate)
    if logits.dtype in (torch.float32, torch.float64):
        loss = loss.to(logits.dtype)
    return loss


def rnnt_loss(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    fused_log_softmax: bool = True,
    *,
    fastemit_lambda: float = 0.0,
    delay_penalty: float = 0.0,
    backend: str = "auto",
    validate: bool = True,
    zero_infinity: bool = False,
    inplace_grad: bool = False,
) -> Tensor:
    return _loss(logits, targets, logit_lengths, target_lengths, blank, clamp, reduction,
                 fused_log_softmax, fastemit_lambda, delay_penalty, backend, validate,
                 zero_infinity, inplace_grad, packed=False)


rnnt_loss.__doc__ = r"""RNN-T loss, a drop-in for :func:`torchaudio.functional.rnnt_loss`.

    Args:
        logits: ``(B, T, U+1, V)`` joint network output (float16, bfloat16, float32,
            float64; any layout). ``T`` and ``U+1`` may exceed the longest sequence
            (padding). Log-probabilities if ``fused_log_softmax=False``.
        targets: ``(B, U)`` int32/int64 labels; entries past a target length are
            padding (never read, never validated).
        logit_lengths: ``(B,)`` frames ``T_b <= T`` (tensor or ints).
        target_lengths: ``(B,)`` labels ``U_b <= min(U, logits.size(2) - 1)``.
        blank: blank index; ``-1`` (default) is ``V - 1``, other negatives count
            from the end too.
        clamp: ``> 0`` clamps the per-sequence gradient elementwise; ``<= 0``: off.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean_batch"``: the plain batch
            mean; ``"mean_target"``: the batch mean of ``loss_b / max(U_b, 1)``;
            ``"mean_volume"``: ``sum_b loss_b / sum_b U_b`` (NeMo's; divisor 1 when
            every ``U_b`` is 0); ``"mean"`` is torchaudio's, ``"mean_batch"``. An empty
            batch gives 0 for every reduction but ``"none"``.
        fused_log_softmax: ``True``: raw logits, log-softmax taken inside.
        fastemit_lambda: FastEmit regularization ``λ >= 0`` (see below).
        delay_penalty: k2's delay penalty: every emission leaving frame ``t`` of
            sequence ``b`` gains ``delay_penalty * ((T_b - 1) / 2 - t)`` in log space
            (``> 0`` favours early emissions; any value, exact in value and gradient).
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``
            (default from ``SEQLOSS_BACKEND``).
        validate: check lengths and ids (a device-to-host sync on CUDA).
        zero_infinity: a ``+inf`` loss (infeasible, or a path score past the float
            range) gives 0 and a zero gradient for that sequence.
        inplace_grad: write the gradient into ``logits``' storage (see Memory).

    Returns:
        The loss: float32 for half inputs, else the input dtype.
""" + _DOC_COMMON


def rnnt_loss_packed(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    fused_log_softmax: bool = True,
    *,
    fastemit_lambda: float = 0.0,
    delay_penalty: float = 0.0,
    backend: str = "auto",
    validate: bool = True,
    zero_infinity: bool = False,
    inplace_grad: bool = False,
) -> Tensor:
    return _loss(logits, targets, logit_lengths, target_lengths, blank, clamp, reduction,
                 fused_log_softmax, fastemit_lambda, delay_penalty, backend, validate,
                 zero_infinity, inplace_grad, packed=True)


rnnt_loss_packed.__doc__ = r"""Packed RNN-T loss: no padding, same results as :func:`rnnt_loss`.

    Args:
        logits: ``(sum_b T_b * (U_b + 1), V)``: sequence ``b``'s rows in ``(t, u)``
            row-major order, sequences in batch order (optimized_transducer's layout).
        targets: padded ``(B, S)`` or concatenated 1-D ``(sum_b U_b,)`` int32/int64.
        logit_lengths, target_lengths, blank, clamp, reduction, fused_log_softmax,
        fastemit_lambda, delay_penalty, backend, validate, zero_infinity, inplace_grad: as in
            :func:`rnnt_loss` (``"mean"`` is torchaudio's ``"mean_batch"`` there too).

    Returns:
        The loss: float32 for half inputs, else the input dtype.
""" + _DOC_COMMON


class RNNTLoss(LossModule):
    """Module wrapper of :func:`rnnt_loss`; the constructor takes its keyword arguments."""

    _defaults = {"blank": -1, "clamp": -1, "reduction": "mean", "fused_log_softmax": True,
                 "fastemit_lambda": 0.0, "delay_penalty": 0.0, "backend": "auto",
                 "validate": True, "zero_infinity": False, "inplace_grad": False}

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1,
        reduction: TransducerReduction = "mean",
        fused_log_softmax: bool = True,
        *,
        fastemit_lambda: float = 0.0,
        delay_penalty: float = 0.0,
        backend: str = "auto",
        validate: bool = True,
        zero_infinity: bool = False,
        inplace_grad: bool = False,
    ) -> None:
        super().__init__(blank=blank, clamp=clamp, reduction=reduction,
                         fused_log_softmax=fused_log_softmax, fastemit_lambda=fastemit_lambda,
                         delay_penalty=delay_penalty, backend=backend, validate=validate,
                         zero_infinity=zero_infinity, inplace_grad=inplace_grad)

    def forward(self, logits: Tensor, targets: Tensor, logit_lengths: IntsLike,
                target_lengths: IntsLike) -> Tensor:
        return rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.blank, self.clamp,
            self.reduction, self.fused_log_softmax, fastemit_lambda=self.fastemit_lambda,
            delay_penalty=self.delay_penalty, backend=self.backend, validate=self.validate,
            zero_infinity=self.zero_infinity, inplace_grad=self.inplace_grad,
        )
