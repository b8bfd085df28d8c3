"""``seqloss.transducer_lattice``: checks, backend resolution, the op."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.dispatch import kernel_module, resolve_backend
from ..._core.errors import InputError, InputTypeError
from ..._core.types import IntsLike
from .op import lattice_decl


def _durations(x: object, name: str, low: int) -> list[int]:
    if type(x) is tuple or type(x) is list:  # the common call, without the ABC checks (~1 us)
        for d in x:
            if type(d) is not int or d < low:
                break
        else:
            if x:
                return list(x)
    if isinstance(x, (int, bool)) or not isinstance(x, Sequence) or isinstance(x, (str, bytes)):
        raise InputTypeError(f"{name} must be a sequence of ints, got {type(x).__name__}")
    out = []
    for i, d in enumerate(x):
        if isinstance(d, bool) or not isinstance(d, int):
            raise InputTypeError(f"{name}[{i}] must be an int, got {type(d).__name__}")
        if d < low:
            raise InputError(f"{name}[{i}] = {d} is invalid: expected a duration >= {low}")
        out.append(int(d))
    if not out:
        raise InputError(f"{name} must hold at least one duration")
    return out


_FLOATS = (torch.float32, torch.float64)
_I64 = torch.int64


def _exact_durations(d: object, n: int, low: int) -> list[int] | None:
    if type(d) is not tuple and type(d) is not list or len(d) != n:
        return None
    for x in d:
        if type(x) is not int or x < low:
            return None
    return list(d)


def _common_call(ab, ae, il, tl, bd, ed, can, validate) -> tuple | None:
    """The op's arguments for the common CPU call (exact types: the checks below are then
    all it needs), or ``None`` for the general conversion. After a kernel call the
    caches are cold and every line costs several times its warm time: this keeps the
    small lattice's eager call as short as the fast lane it leads to."""
    if (type(ab) is not Tensor or type(ae) is not Tensor or ab.dtype not in _FLOATS
            or ae.dtype not in _FLOATS or not ab.is_cpu or not ae.is_cpu or ab.dim() != 4
            or ae.dim() != 4 or type(can) is not bool or type(validate) is not bool
            or type(il) is not Tensor or type(tl) is not Tensor or il.dtype is not _I64
            or tl.dtype is not _I64 or not il.is_cpu or not tl.is_cpu or il.dim() != 1
            or tl.dim() != 1):
        return None
    sb, se = ab.shape, ae.shape
    B = sb[0]
    if se[0] != B or se[1] != sb[1] or se[2] != sb[2] or il.shape[0] != B or tl.shape[0] != B:
        return None
    bd = _exact_durations(bd, sb[3], 1)
    ed = _exact_durations(ed, se[3], 0)
    if bd is None or ed is None:
        return None
    return ab, ae, il, tl, bd, ed, can


def _checked_args(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations,
                  emit_durations, emit_can_end, validate) -> tuple[tuple, bool]:
    """The op's arguments ``(arc_blank, arc_emit, il, tl, bd, ed, emit_can_end)`` and
    ``validate`` from any accepted input, or ``InputError``/``InputTypeError`` naming
    the argument."""
    emit_can_end = _validate.flag(emit_can_end, "emit_can_end")
    validate = _validate.flag(validate, "validate")
    _validate.check_float_tensor(arc_blank, "arc_blank")
    _validate.check_float_tensor(arc_emit, "arc_emit")
    _validate.check_ndim(arc_blank, "arc_blank", (3, 4), "(B, T, U+1, Db) or (B, T, U+1)")
    _validate.check_ndim(arc_emit, "arc_emit", (3, 4), "(B, T, U+1, De) or (B, T, U+1)")
    bd = _durations(blank_durations, "blank_durations", 1)
    ed = _durations(emit_durations, "emit_durations", 0)
    # (B, T, U+1): one arc of each kind per state, as transducer_arc_logprobs gives them.
    if arc_blank.dim() == 3:
        if len(bd) != 1:
            raise InputError(f"arc_blank (B, T, U+1) holds one arc per state: blank_durations "
                             f"must hold one duration, got {len(bd)}")
        arc_blank = arc_blank.unsqueeze(3)
    if arc_emit.dim() == 3:
        if len(ed) != 1:
            raise InputError(f"arc_emit (B, T, U+1) holds one arc per state: emit_durations "
                             f"must hold one duration, got {len(ed)}")
        arc_emit = arc_emit.unsqueeze(3)
    sb, se = arc_blank.shape, arc_emit.shape
    if se[0] != sb[0] or se[1] != sb[1] or se[2] != sb[2]:  # (torch.Size slices: ~1 us)
        raise InputError(
            f"arc_emit must have shape (B, T, U+1, De) = {tuple(arc_blank.shape[:3])} + (De,), "
            f"got {tuple(arc_emit.shape)}"
        )
    if arc_emit.device != arc_blank.device:
        raise InputError(f"arc_emit is on {arc_emit.device}, arc_blank on {arc_blank.device}")
    if arc_blank.shape[3] != len(bd):
        raise InputError(
            f"arc_blank.size(3) = {arc_blank.shape[3]} must equal len(blank_durations) = {len(bd)}"
        )
    if arc_emit.shape[3] != len(ed):
        raise InputError(
            f"arc_emit.size(3) = {arc_emit.shape[3]} must equal len(emit_durations) = {len(ed)}"
        )
    B = arc_blank.shape[0]
    device = arc_blank.device
    il = _validate.check_batch(
        _validate.as_index_tensor(logit_lengths, "logit_lengths", device), "logit_lengths", B)
    tl = _validate.check_batch(
        _validate.as_index_tensor(target_lengths, "target_lengths", device), "target_lengths", B)
    return (arc_blank, arc_emit, il, tl, bd, ed, emit_can_end), validate


def transducer_lattice(
    arc_blank: Tensor,
    arc_emit: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank_durations: Sequence[int] = (1,),
    emit_durations: Sequence[int] = (0,),
    *,
    emit_can_end: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    r"""The transducer lattice recursion: the log-likelihood of every path, differentiably.

    Args:
        arc_blank: ``(B, T, U+1, Db)`` scores of the blank-like arcs; arc ``i`` goes
            ``(t, u) -> (t + blank_durations[i], u)``, allowed when ``t + d_i <= T_b``.
            ``(B, T, U+1)`` is one arc per state (``Db = 1``).
        arc_emit: ``(B, T, U+1, De)`` scores of the emission arcs; arc ``j`` goes
            ``(t, u) -> (t + emit_durations[j], u + 1)``, allowed when ``u < U_b``
            and ``t + e_j < T_b`` (``<= T_b`` with ``emit_can_end``). ``(B, T, U+1)``
            is one arc per state (``De = 1``).
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= U``.
        blank_durations: ``Db`` frame advances, each ``>= 1`` (RNN-T: ``(1,)``).
        emit_durations: ``De`` frame advances, each ``>= 0`` (RNN-T: ``(0,)``).
        emit_can_end: let an emission land on the final frame (k2's "modified"
            topology, where the path may end on an emission).
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check the lengths (a device-to-host sync on CUDA); ``False``
            skips the check and every other value read.

    Returns:
        ``(B,)`` log-likelihoods: float32 for half inputs, else the arcs' dtype.

    Arcs leave frames ``t < T_b`` only; paths run from ``(0, 0)`` to ``(T_b, U_b)``::

        alpha(0, 0) = 0
        alpha(t, u) = logsumexp({alpha(t - d_i, u) + arc_blank[t - d_i, u, i]}_i
                                u {alpha(t - e_j, u - 1) + arc_emit[t - e_j, u - 1, j]}_j)
        log_likelihood = alpha(T_b, U_b)        (-inf when no path exists or T_b = 0)

    in a guarded log space (no epsilon). The gradient with respect to each arc is
    its occupation (the posterior probability that a path takes it); zero for a
    sequence with no path, and for every entry no path reads (frames ``t >= T_b``,
    rows ``u > U_b``, emissions at ``u = U_b``), which may hold anything, NaN
    included. alpha and beta in float64 whatever the arcs' dtype (a float32
    gradient is within ~2e-7 of float64's at T = 4000), each result rounded once.

    RNN-T is ``blank_durations=(1,)``, ``emit_durations=(0,)`` with
    ``arc_blank = log p(blank)`` and ``arc_emit = log p(y_{u+1})``: the two outputs of
    :func:`seqloss.transducer_arc_logprobs`, so
    ``transducer_lattice(*transducer_arc_logprobs(logits, targets, T, U), T, U)`` is
    ``-rnnt_loss(logits, targets, T, U, reduction="none")``.

    Backends: reference (any device), numba (CPU), triton (CUDA).
    Properties: autograd (double backward raises), torch.compile (fullgraph).
    """
    common = _common_call(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations,
                          emit_durations, emit_can_end, validate)
    if common is not None:
        compute_grad = torch.is_grad_enabled() and (arc_blank.requires_grad
                                                    or arc_emit.requires_grad)
        return lattice_decl.value(*common, resolve_backend(backend, arc_blank.device),
                                  compute_grad, validate)
    args, validate = _checked_args(arc_blank, arc_emit, logit_lengths, target_lengths,
                                   blank_durations, emit_durations, emit_can_end, validate)
    compute_grad = torch.is_grad_enabled() and (arc_blank.requires_grad or arc_emit.requires_grad)
    return lattice_decl.value(*args, resolve_backend(backend, arc_blank.device), compute_grad,
                              validate)


def lattice_viterbi(
    arc_blank: Tensor,
    arc_emit: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank_durations: tuple[int, ...],
    emit_durations: tuple[int, ...],
    emit_can_end: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """The lattice in the max-plus semiring: ``(score (B,) float64, frames (B, U), emit_arcs
    (B, U))`` of the best paths (``transducer_viterbi`` of ``reference.py``).

    Arcs float32 or float64 (float64 accumulation), lengths ``(B,)`` int64 on the arcs'
    device, validated by the caller; ``backend`` a concrete name. Not differentiable.
    """
    if backend == "triton":  # Triton's max-plus kernels live beside its log-semiring ones
        from .triton_viterbi import transducer_viterbi
    else:
        transducer_viterbi = kernel_module("lattice", backend).transducer_viterbi
    return transducer_viterbi(arc_blank, arc_emit, logit_lengths, target_lengths,
                              tuple(blank_durations), tuple(emit_durations), bool(emit_can_end))
