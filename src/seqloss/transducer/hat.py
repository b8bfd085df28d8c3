r"""The hybrid autoregressive transducer's loss (HAT; Variani et al., 2020).

HAT factors the joint's output into a blank probability and a label distribution:
``p(blank) = sigmoid(z_blank)``, ``p(y) = (1 - sigmoid(z_blank)) softmax(z_labels)[y]``,
the labels being every class but the blank. It is a ``JointTable`` (``hat_table`` below:
RNN-T's arcs with the ``"hat"`` normalizer, see ``joint/table.py``), so every backend's joint
prologue, lattice and epilogue compute it: on the full joint the table op
``seqloss::transducer_joint_loss``, from the joint the tiles of ``from_joint.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core.compiler import eager_only
from .._core.dispatch import resolve_backend
from .._core.errors import InputTypeError
from .._core.module import LossModule
from .._core.types import IntsLike, TransducerReduction
from .checks import transducer_inputs
from .from_joint import _Branch, _fake_logits, _run, _setup
from .joint.table import Arc, JointTable, _resolve_blank
from .op import table_loss_decl
from .rnnt import rnnt_options


def hat_table(V: int, blank: int, clamp: float = -1.0, fastemit_lambda: float = 0.0, *,
              delay_penalty: float = 0.0) -> JointTable:
    """HAT (Variani et al., 2020): RNN-T's arcs, the blank normalized by a sigmoid outside
    the labels' softmax (``normalizer="hat"``; ``blank < 0`` counts from the end)."""
    return JointTable(blank_arcs=(Arc(1, token=_resolve_blank(blank, V)),), emit_arcs=(Arc(0),),
                      num_tokens=V, clamp=clamp, fastemit_lambda=fastemit_lambda,
                      delay_penalty=delay_penalty, normalizer="hat")


def _options(clamp: object, reduction: object, fastemit_lambda: object, delay_penalty: object,
             zero_infinity: object, validate: object, chunk_elements: object) -> tuple:
    if chunk_elements is not None and (isinstance(chunk_elements, bool)
                                       or not isinstance(chunk_elements, int)):
        raise InputTypeError(f"chunk_elements must be an int or None, got "
                             f"{type(chunk_elements).__name__}")
    return rnnt_options(clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity,
                        validate)


def hat_loss(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    *,
    fastemit_lambda: float = 0.0,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    chunk_elements: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    clamp, reduction, lam, dp, zero_infinity, validate = _options(
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate, chunk_elements)
    tg, il, tl, blank = transducer_inputs(logits, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    name = resolve_backend(backend, logits.device)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    ints, floats = hat_table(logits.shape[-1], blank, clamp, lam, delay_penalty=dp).encode()
    loss = table_loss_decl.value(logits, tg, il, tl, ints, floats, True, reduction, zero_infinity,
                                 name, compute_grad, validate)
    if logits.dtype in (torch.float32, torch.float64):
        loss = loss.to(logits.dtype)
    return loss


_DOC_COMMON = r"""
    The loss of sequence ``b`` is ``-log`` of the sum over every RNN-T path
    ``(0, 0) -> (T_b, U_b)`` of the product of its arcs' probabilities, with HAT's
    ``p(blank) = sigmoid(z_blank)`` and ``p(y) = (1 - sigmoid(z_blank))
    softmax(z_{c != blank})[y]``; ``delay_penalty`` adds ``delay_penalty * ((T_b - 1)
    / 2 - t)`` to every emission at frame ``t`` (k2's). Computed exactly in log space
    (``log(1 - sigmoid(z)) = logsigmoid(-z)``), the lattice by
    :func:`seqloss.transducer_lattice`'s kernels on ``backend``.

    ``clamp > 0`` clamps each element of the per-sequence gradient with respect to the
    logits to ``[-clamp, clamp]`` before the incoming gradient and the reduction's
    scaling (torchaudio's order). ``fastemit_lambda`` scales the gradient with respect to
    every emission arc's score by ``1 + λ`` and the reported loss by ``1 + λ`` (NeMo's
    FastEmit); gradcheck applies for ``λ = 0``. A sequence with no frame is infeasible
    (``+inf``, 0 with ``zero_infinity``, zero gradient). NaN or ``+inf`` in the rows a
    sequence reads gives that sequence a NaN loss and gradient; padding is never read
    and gets exactly zero gradient.

    Memory: the arcs and occupations ``(B, T, U+1)``; the logits' gradient is the only
    logits-sized allocation (from the joint: one tile of at most ``chunk_elements``
    logits instead). ``hat_loss`` is the ``torch.library`` op
    ``seqloss::transducer_joint_loss`` on HAT's table (``torch.compile`` with
    ``fullgraph=True``; the gradient is formed in the forward pass, as ``rnnt_loss``
    forms it); ``hat_loss_from_joint`` runs eagerly, as the other losses from the joint
    (a graph break: it re-runs the joint in its backward). Double backward raises.
"""

hat_loss.__doc__ = r"""HAT loss on the full joint ``logits (B, T, U+1, V)``.

    Args:
        logits: ``(B, T, U+1, V)`` joint output (float16, bfloat16, float32, float64).
        targets: ``(B, U)`` int32/int64 labels; entries past a target length are padding.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= U``.
        blank: blank index (``-1``: ``V - 1``; negatives count from the end).
        clamp: ``> 0`` clamps the per-sequence gradient elementwise; ``<= 0``: off.
        reduction: ``"none"``, ``"sum"``, ``"mean_batch"``, ``"mean_target"``,
            ``"mean_volume"``; ``"mean"`` is torchaudio's ``"mean_batch"``.
        fastemit_lambda: FastEmit's ``λ >= 0``.
        delay_penalty: k2's latency penalty (any value).
        zero_infinity: an infinite loss gives 0 and a zero gradient.
        chunk_elements: accepted for :func:`hat_loss_from_joint`'s sake (an int or
            ``None``); the full joint's passes hold no tile.
        backend: the backend (``"auto"``, ``"reference"``, ``"numba"``,
            ``"triton"``).
        validate: check lengths and ids (a device-to-host sync on CUDA).

    Returns:
        The loss: float32 for half inputs, else the input dtype.
""" + _DOC_COMMON


def hat_loss_from_joint(
    encoder_out: Tensor,
    predictor_out: Tensor,
    joint: object,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    *,
    fastemit_lambda: float = 0.0,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    chunk_elements: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    clamp, reduction, lam, dp, zero_infinity, validate = _options(
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate, None)
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    tg, il, tl, blank = transducer_inputs(fake, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    name = resolve_backend(backend, encoder_out.device)
    V = probe.shape[-1]
    table = hat_table(V, blank, clamp, lam, delay_penalty=dp)
    return _run(encoder_out, predictor_out, joint, probe, chunk, is_module, params, fake, tg, il,
                tl, [_Branch(table, 1.0)], V, 0, reduction, zero_infinity, name, validate)


hat_loss_from_joint.__doc__ = r"""HAT loss from the joint network, never materialized.

    Equals :func:`hat_loss` on ``joint(encoder_out, predictor_out)`` (value, and the
    gradients with respect to ``encoder_out``, ``predictor_out`` and the joint's
    parameters), holding at most ``chunk_elements`` logits at once. ``encoder_out``,
    ``predictor_out``, ``joint`` and ``chunk_elements`` as in
    :func:`seqloss.rnnt_loss_from_joint` (each tile recomputed in the backward under
    the forward's RNG and autocast state; padding never passed to the joint); the other
    arguments as in :func:`hat_loss`.
""" + _DOC_COMMON

_EAGER = ("seqloss's HAT loss from the joint runs eagerly: its backward re-runs the joint, "
          "which torch.compile cannot trace")
hat_loss_from_joint = eager_only(hat_loss_from_joint, _EAGER)


class HATLoss(LossModule):
    """Module wrapper of :func:`hat_loss`; the constructor takes its keyword arguments."""

    _defaults = {"blank": -1, "clamp": -1, "reduction": "mean", "fastemit_lambda": 0.0,
                 "delay_penalty": 0.0, "zero_infinity": False, "chunk_elements": None,
                 "backend": "auto", "validate": True}

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1,
        reduction: TransducerReduction = "mean",
        *,
        fastemit_lambda: float = 0.0,
        delay_penalty: float = 0.0,
        zero_infinity: bool = False,
        chunk_elements: int | None = None,
        backend: str = "auto",
        validate: bool = True,
    ) -> None:
        super().__init__(blank=blank, clamp=clamp, reduction=reduction,
                         fastemit_lambda=fastemit_lambda, delay_penalty=delay_penalty,
                         zero_infinity=zero_infinity, chunk_elements=chunk_elements,
                         backend=backend, validate=validate)

    def forward(self, logits: Tensor, targets: Tensor, logit_lengths: IntsLike,
                target_lengths: IntsLike) -> Tensor:
        return hat_loss(logits, targets, logit_lengths, target_lengths, self.blank, self.clamp,
                        self.reduction, fastemit_lambda=self.fastemit_lambda,
                        delay_penalty=self.delay_penalty, zero_infinity=self.zero_infinity,
                        chunk_elements=self.chunk_elements, backend=self.backend,
                        validate=self.validate)


__all__ = ["HATLoss", "hat_loss", "hat_loss_from_joint"]
