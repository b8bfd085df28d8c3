"""``rnnt_loss_simple``, ``rnnt_loss_smoothed``, ``rnnt_loss_pruned``: k2's losses, exactly.

Each is an arc table (``arcs.py``) fed to the transducer lattice; the additive
joint's normalizer goes through ``seqloss.logmmexp``. Shapes, defaults and
``rnnt_type`` semantics are k2/fast_rnnt's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.dispatch import resolve_backend
from ..._core.errors import InputError, InputTypeError
from ..._core.reduce import reduce_losses
from . import arcs, checks

MEAN = "mean_batch"  # fast_rnnt's and k2's "mean": the plain batch mean

_TYPES_DOC = r"""
    ``rnnt_type`` (k2's): ``"regular"``, an emission stays on its frame and the
    termination symbol moves to the next one; ``"modified"``, every frame emits
    exactly one symbol or the termination symbol (an emission also moves on);
    ``"constrained"``, as ``"modified"``, but emitting ``y`` given context ``h`` on
    frame ``t`` also pays the termination symbol given ``h y`` on frame ``t``.
    In k2's notation (``p[s_begin, t_begin] = 0``, ``-loss = p[s_end, t_end]``)::

        regular:      p[s, t] = logaddexp(p[s-1, t]   + px[s-1, t],   p[s, t-1] + py[s, t-1])
        modified:     p[s, t] = logaddexp(p[s-1, t-1] + px[s-1, t-1], p[s, t-1] + py[s, t-1])
        constrained:  as modified with px[s, t] + py[s+1, t] for px[s, t]

    where ``px[s, t]`` is the log-probability of symbol ``s`` on frame ``t`` after
    ``s`` symbols and ``py[s, t]`` that of the termination symbol; no emission leaves
    the last frame in ``"regular"``. ``delay_penalty`` adds
    ``delay_penalty * ((t_end - 1) / 2 - t)`` to every ``px[s, t]`` (k2 issue 955;
    any value is applied: k2 ignores values <= 0). The recursion is
    ``seqloss.transducer_lattice`` on the arcs ``arc_emit[b, t, s] = px[b, s, t]``,
    ``arc_blank[b, t, s] = py[b, s, t]`` of the sub-lattice the boundary cuts out.

    ``boundary`` ``(B, 4)`` int64 rows ``[begin_symbol, begin_frame, end_symbol,
    end_frame]`` (``None``: ``[0, 0, S, T]``); positions outside them are padding,
    never read (NaN allowed) and get exactly zero gradient.
    ``reduction``: ``"none"`` ``(B,)``, ``"sum"``, ``"mean_batch"`` (the plain batch
    mean), ``"mean_target"`` (the batch mean of ``loss_b / max(U_b, 1)``) or
    ``"mean_volume"`` (``sum_b loss_b / sum_b U_b``; divisor 1 when every ``U_b`` is 0),
    with ``U_b = end_symbol - begin_symbol``; ``"mean"`` is fast_rnnt's and k2's,
    ``"mean_batch"``. Losses are float32 for half inputs, else the inputs' dtype.
    A sequence with no frame or no path has loss ``+inf`` (0 with ``zero_infinity``)
    and zero gradient: an impossible alignment, as in CTC. Fewer frames than symbols
    in the modified/constrained topologies (at most one symbol a frame) is one; k2
    asserts there.

    Errors: ``InputError`` (a ``ValueError`` and ``RuntimeError``) naming the
    argument and batch index for a boundary outside the tensors, symbols out of
    range or equal to ``termination_symbol``, an unknown ``rnnt_type`` or reduction,
    and shape or batch mismatches; ``TypeError`` (also a ``RuntimeError``) for wrong dtypes.

    Backends: reference (any device), numba (CPU), triton (CUDA), for the lattice
    and ``logmmexp``.
    Properties: autograd, torch.compile, no epsilon (exact at any scale).
"""


def _grads(occ_emit: Tensor, occ_blank: Tensor, S: int, rnnt_type: str) -> tuple[Tensor, Tensor]:
    """k2's ``(px_grad (B, S, T[+1]), py_grad (B, S+1, T))`` from the lattice's occupations."""
    px_grad = occ_emit[:, :, :S].transpose(1, 2)
    if rnnt_type == "regular":
        px_grad = torch.cat((px_grad, px_grad.new_zeros((px_grad.shape[0], S, 1))), dim=2)
    return px_grad.contiguous(), occ_blank.transpose(1, 2).contiguous()


def _factored_inputs(lm: Tensor, am: Tensor, symbols: object, termination_symbol: object,
                     boundary: object, rnnt_type: object, reduction: object,
                     delay_penalty: object) -> tuple:
    _validate.check_float_tensor(lm, "lm")
    _validate.check_float_tensor(am, "am")
    _validate.check_ndim(lm, "lm", (3,), "(B, S + 1, C)")
    _validate.check_ndim(am, "am", (3,), "(B, T, C)")
    if am.dtype != lm.dtype:
        raise InputTypeError("am and lm must have the same dtype, "
                             f"got am {am.dtype} and lm {lm.dtype}")
    if am.device != lm.device:
        raise InputError(f"am is on {am.device}, lm on {lm.device}: expected one device")
    B, T, C = am.shape
    checks.check_same_batch(lm, "lm", B, "am is (B, T, C)")
    if lm.shape[2] != C:
        raise InputError(f"lm.size(2) = {lm.shape[2]} must equal am.size(2) (C) = {C}")
    S = lm.shape[1] - 1
    if S < 0:
        raise InputError("lm must have shape (B, S + 1, C) with at least one position, "
                         "got S + 1 = 0")
    sym = checks.check_symbols(symbols, B, S, am.device)
    term = checks.check_termination(termination_symbol, C)
    bnd = checks.check_boundary(boundary, B, am.device)
    rt = checks.check_rnnt_type(rnnt_type)
    reduction = _validate.check_reduction(reduction, MEAN)
    dp = _validate.check_float_arg(delay_penalty, "delay_penalty")
    return B, T, C, S, sym, term, bnd, rt, reduction, dp


def _finish(emit: Tensor, blank: Tensor, lens: Tensor, rt: str, bnd: Tensor | None, dp: float,
            T: int, S: int, reduction: str, return_grad: bool, name: str, validate: bool,
            zero_infinity: bool = False) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
    if dp != 0.0:
        emit = emit + arcs.delay_penalty_term(dp, lens, T, emit.dtype)
    ll, oe, ob = arcs.run_lattice(emit, blank, lens, rt, bnd is not None, name, validate,
                                  return_grad)
    nll = -ll
    if zero_infinity:
        # 0 instead of +inf, and no gradient: torch.where stops autograd's; the returned
        # occupations are zeroed too, as a path whose score overflowed has finite ones.
        inf = nll == float("inf")
        nll = torch.where(inf, 0.0, nll)
        if return_grad:
            oe = torch.where(inf[:, None, None], 0.0, oe)
            ob = torch.where(inf[:, None, None], 0.0, ob)
    loss = reduce_losses(nll, reduction, lens[:, 2])  # lens[:, 2]: U_b
    if return_grad:
        return loss, _grads(oe, ob, S, rt)
    return loss


def _unpadded(lm: Tensor, am: Tensor, lens: Tensor, bnd: Tensor | None) -> tuple[Tensor, Tensor]:
    """The compute dtype, and 0 in the padding a boundary leaves (it may hold NaN)."""
    dt = arcs.compute_dtype(am.dtype)
    lm, am = lm.to(dt), am.to(dt)
    if bnd is None:
        return lm, am
    # frames [begin_frame, end_frame), positions [begin_symbol, end_symbol]
    return arcs.mask_padding(lm, lens, 1, 0, 2, 1), arcs.mask_padding(am, lens, 1, 1, 3, 0)


def rnnt_loss_simple(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    boundary: Tensor | None = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: str = "mean",
    return_grad: bool = False,
    *,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
    r"""The RNN-T loss of an additive joiner ``am[t] + lm[s]``, exact (k2's "simple" loss).

    ``log p(c | t, s) = am[b, t, c] + lm[b, s, c] - log sum_c' exp(am[b, t, c'] + lm[b, s, c'])``,
    the normalizer computed by ``seqloss.logmmexp(am, lm^T)`` in O(B·T·S) memory,
    without k2's ``finfo.tiny`` (k2 gives 912.66 for ``am = [0, -1000]``,
    ``lm = [-1000, 0]``, whose true per-frame normalizer is ``log 2 - 1000``). An ``am``
    frame or an ``lm`` row of ``-inf`` leaves no path (``+inf``; 0 with ``zero_infinity``).

    Args:
        lm: ``(B, S + 1, C)`` prediction-network part of the unnormalized logits.
        am: ``(B, T, C)`` encoder part.
        symbols: ``(B, S)`` int64 symbols, ``0 <= id < C``, never the termination symbol.
        termination_symbol: the blank, ``0 <= termination_symbol < C``.
        boundary: ``(B, 4)`` int64 or ``None`` (see below).
        rnnt_type: ``"regular"``, ``"modified"`` or ``"constrained"``.
        delay_penalty: k2's delay penalty.
        reduction: ``"none"``, ``"sum"``, ``"mean_batch"``, ``"mean_target"``,
            ``"mean_volume"`` or ``"mean"`` (fast_rnnt's: ``"mean_batch"``); see below.
        return_grad: also return k2's ``(px_grad, py_grad)``, the occupations
            (``d(-loss_b)/d px``, ``d(-loss_b)/d py`` of the ``"none"`` losses):
            ``px_grad (B, S, T + 1)`` (regular; its column ``T`` is 0) or ``(B, S, T)``,
            ``py_grad (B, S + 1, T)``, for ``get_rnnt_prune_ranges``.
        zero_infinity: a sequence whose loss is ``+inf`` (no path, e.g. ``T_b = 0``, or
            a path whose score overflows) gets loss 0 and zero gradient (``px_grad`` and
            ``py_grad`` included).
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check the values of ``boundary`` and ``symbols`` (a device sync on
            CUDA); ``False`` skips every value read.

    Returns:
        The loss, or ``(loss, (px_grad, py_grad))`` with ``return_grad``.
    """
    return_grad = _validate.flag(return_grad, "return_grad")
    zero_infinity = _validate.flag(zero_infinity, "zero_infinity")
    validate = _validate.flag(validate, "validate")
    B, T, C, S, sym, term, bnd, rt, reduction, dp = _factored_inputs(
        lm, am, symbols, termination_symbol, boundary, rnnt_type, reduction, delay_penalty)
    name = resolve_backend(backend, am.device)
    lens, sym_ext = checks.bounds(bnd, sym, None, T, C, term, rt, 0, validate)
    lm, am = _unpadded(lm, am, lens, bnd)
    emit, blank = arcs.simple_arcs(lm, am, sym_ext, term, rt, name)
    return _finish(emit, blank, lens, rt, bnd, dp, T, S, reduction, return_grad, name,
                   validate, zero_infinity)


def rnnt_loss_smoothed(
    lm: Tensor,
    am: Tensor,
    symbols: Tensor,
    termination_symbol: int,
    lm_only_scale: float = 0.1,
    am_only_scale: float = 0.1,
    boundary: Tensor | None = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: str = "mean",
    return_grad: bool = False,
    *,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
    r"""k2's smoothed simple loss: the joint mixed with LM-only and AM-only scores.

    Every arc score is ``(1 - lm_only_scale - am_only_scale) * joint +
    lm_only_scale * lm_only + am_only_scale * am_only`` with ``joint`` the simple
    loss's log-probability, ``lm_only = lm[s, c] - logsumexp_c lm[s]`` and
    ``am_only = am[t, c] + log u[c] - logsumexp_c (am[t] + log u)``, ``u`` the LM's
    softmax averaged over the positions the batch reads (``begin_symbol <= s <=
    end_symbol`` of every sequence; all of them without a boundary, as k2). So
    the unigram, and hence each loss, depends on the whole batch, as in k2.

    Args:
        lm, am, symbols, termination_symbol, boundary, rnnt_type, delay_penalty,
        reduction, return_grad, zero_infinity, backend, validate: as ``rnnt_loss_simple``.
        lm_only_scale: weight of the LM-only scores.
        am_only_scale: weight of the AM-only (unigram-LM) scores.
    """
    return_grad = _validate.flag(return_grad, "return_grad")
    zero_infinity = _validate.flag(zero_infinity, "zero_infinity")
    validate = _validate.flag(validate, "validate")
    B, T, C, S, sym, term, bnd, rt, reduction, dp = _factored_inputs(
        lm, am, symbols, termination_symbol, boundary, rnnt_type, reduction, delay_penalty)
    ls = checks.check_scale(lm_only_scale, "lm_only_scale")
    as_ = checks.check_scale(am_only_scale, "am_only_scale")
    name = resolve_backend(backend, am.device)
    lens, sym_ext = checks.bounds(bnd, sym, None, T, C, term, rt, 0, validate)
    lm, am = _unpadded(lm, am, lens, bnd)
    emit, blank = arcs.smoothed_arcs(lm, am, sym_ext, term, rt, ls, as_, lens, name)
    return _finish(emit, blank, lens, rt, bnd, dp, T, S, reduction, return_grad, name,
                   validate, zero_infinity)


def rnnt_loss_pruned(
    logits: Tensor,
    symbols: Tensor,
    ranges: Tensor,
    termination_symbol: int,
    boundary: Tensor | None = None,
    rnnt_type: str = "regular",
    delay_penalty: float = 0.0,
    reduction: str = "mean",
    use_hat_loss: bool = False,
    *,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    r"""The RNN-T loss on a pruned joint: each frame sees ``s_range`` symbol positions only.

    ``logits[b, t, k]`` is the joiner's output at symbol position
    ``ranges[b, t, k]`` (``ranges`` from ``get_rnnt_prune_ranges``: consecutive
    positions ``r, ..., r + s_range - 1``); every lattice arc outside the windows is
    impossible. With ``s_range = S + 1`` (every position) this is the full-joint
    RNN-T loss.

    Args:
        logits: ``(B, T, s_range, C)`` unnormalized joiner output (log-softmax'd here;
            a row of ``-inf`` is a state with no way out, as in ``rnnt_loss``).
        symbols: ``(B, S)`` int64 symbols.
        ranges: ``(B, T, s_range)`` int64 window positions, ``0 <= r <= S + 1 - s_range``.
        use_hat_loss: k2's HAT loss (hybrid autoregressive transducer): with
            ``z_b = logits[..., termination_symbol]``, the termination symbol's
            log-probability is ``logsigmoid(z_b)`` and symbol ``y``'s
            ``logsigmoid(-z_b) + log_softmax(z without z_b)[y]``, a softmax over every
            class but the termination symbol (no ``log1p(-exp)`` cancellation). A row
            whose labels are all ``-inf`` emits no label; ``+inf`` gives NaN.
        termination_symbol, boundary, rnnt_type, delay_penalty, reduction, zero_infinity,
        backend, validate: as ``rnnt_loss_simple`` (``validate`` also checks ``ranges``).
            ``s_range`` must be ``>= 2`` for the regular and constrained topologies
            when a sequence has a symbol (``InputError`` naming it). Windows that
            do not reach a sequence's final state leave it no path (``+inf``);
            ``get_rnnt_prune_ranges`` widens a regular ``s_range`` too small for a
            sequence as fast_rnnt does, so its ranges always reach it.
    """
    use_hat_loss = _validate.flag(use_hat_loss, "use_hat_loss")
    zero_infinity = _validate.flag(zero_infinity, "zero_infinity")
    validate = _validate.flag(validate, "validate")
    _validate.check_float_tensor(logits, "logits")
    _validate.check_ndim(logits, "logits", (4,), "(B, T, s_range, C)")
    B, T, R, C = logits.shape
    sym = symbols
    if not isinstance(sym, Tensor) or sym.dtype not in _validate.INDEX_DTYPES:
        checks.check_symbols(sym, B, 0, logits.device)  # raises the type error
    _validate.check_ndim(sym, "symbols", (2,), "(B, S)")
    S = sym.shape[1]
    sym = checks.check_symbols(sym, B, S, logits.device)
    if not isinstance(ranges, Tensor) or ranges.dtype not in _validate.INDEX_DTYPES:
        raise InputTypeError("ranges must be an int64 (or int32) tensor of shape (B, T, s_range)")
    if tuple(ranges.shape) != (B, T, R):
        raise InputError(
            f"ranges must have shape (B, T, s_range) = {(B, T, R)} (logits is (B, T, s_range, C) "
            f"{tuple(logits.shape)}), got {tuple(ranges.shape)}"
        )
    if R < 1 or R > S + 1:
        raise InputError(f"s_range = logits.size(2) = {R} is invalid: "
                         f"expected 1 <= s_range <= S + 1 = {S + 1}")
    ranges = ranges.to(device=logits.device, dtype=torch.int64)
    term = checks.check_termination(termination_symbol, C)
    bnd = checks.check_boundary(boundary, B, logits.device)
    rt = checks.check_rnnt_type(rnnt_type)
    reduction = _validate.check_reduction(reduction, MEAN)
    dp = _validate.check_float_arg(delay_penalty, "delay_penalty")
    name = resolve_backend(backend, logits.device)
    lens, sym_ext = checks.bounds(bnd, sym, ranges, T, C, term, rt, R, validate)
    logits = logits.to(arcs.compute_dtype(logits.dtype))
    emit, blank = arcs.pruned_arcs(logits, ranges, sym_ext, term, rt, use_hat_loss, name)
    return _finish(emit, blank, lens, rt, bnd, dp, T, S, reduction, False, name, validate,
                   zero_infinity)


for _f in (rnnt_loss_simple, rnnt_loss_smoothed, rnnt_loss_pruned):
    _f.__doc__ = (_f.__doc__ or "") + _TYPES_DOC
