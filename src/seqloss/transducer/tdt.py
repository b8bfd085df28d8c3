"""Token-and-Duration Transducer (Xu et al., 2023): a table on the one joint and lattice.

Two ops: ``seqloss::tdt_loss`` on the joint ``(B, T, U+1, V + D)`` and
``seqloss::tdt_loss_pair`` on the pair ``(token_logits, duration_logits)`` (two
inputs, two gradients; the pair is read where it lies, never concatenated). Both
run the TDT table and, for ``omega > 0``, RNN-T's table on the token logits, and mix
the per-sequence losses and gradients deterministically.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core import checks
from .._core.dispatch import kernel_module, resolve_backend
from .._core.errors import InputError, InputTypeError
from .._core.module import LossModule
from .._core.opdecl import OpDecl
from .._core.ops import _acc_dtype, conform_layout
from .._core.reduce import finish, grad_scale, weights
from .._core.types import IntsLike, TransducerReduction
from .checks import check_durations, resolve_token_blank, transducer_inputs, transducer_values
from .joint.table import JointTable, rnnt_table, tdt_table


# --------------------------------------------------------------------------- the mixture
def _mix(loss_r: Tensor | None, loss_t: Tensor | None, omega: float, g: Tensor | None,
         gd: Tensor | None) -> Tensor:
    """``omega * loss_r + (1 - omega) * loss_t`` (B,) of the branches that ran.

    With both, the gradients ``g``/``gd`` (None: not computed) of a sequence
    infeasible in one branch are zeroed in place: it is infeasible, whatever the
    other branch's gradient. NaN stays NaN.
    """
    if loss_t is None:
        return loss_r
    if loss_r is None:
        return loss_t
    loss = omega * loss_r + (1.0 - omega) * loss_t
    if g is not None:
        dead = loss == float("inf")
        if not checks.host_side(loss) or bool(dead.any()):
            m = dead.view(-1, 1, 1, 1)
            g.masked_fill_(m, 0.0)
            if gd is not None:
                gd.masked_fill_(m, 0.0)
    return loss


def _tdt_forward(
    logits: Tensor | None,
    tok: Tensor,
    dur: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    table: JointTable,
    omega: float,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``omega * L_rnnt(tok) + (1 - omega) * L_tdt``, reduced, and its gradient.

    ``logits`` is the joint (``tok``, ``dur`` its views) or ``None`` for the pair.
    Returns ``(loss, grad, grad_dur)``: for the joint, ``grad`` like ``logits`` and
    ``grad_dur`` ``None``; for the pair, one gradient per tensor. Each branch's
    gradient is clamped on its own (as NeMo's branches are) and scaled by its weight
    inside the kernel (with the reduction's factor where it is one host number).
    """
    pair = logits is None
    V = table.num_tokens
    # The concatenated joint: a wrong len(durations) shifts V, so the message says how.
    what = None if pair else (f"V = logits.size(-1) - len(durations) = {logits.shape[-1]} - "
                              f"{table.num_durations}")
    padded = transducer_values(tok if pair else logits, targets, logit_lengths, target_lengths,
                               table.blank_tokens, validate=validate, num_tokens=V,
                               tokens_what=what)
    scale = grad_scale(reduction, target_lengths)
    ms = 1.0 if scale is None else scale
    kmod = kernel_module("joint", backend)
    g = gd = None
    loss_t = loss_r = None
    if omega < 1.0:
        if pair:
            loss_t, g, gd = kmod.joint_loss_forward_pair(tok, dur, padded, logit_lengths,
                                                         target_lengths, table, True,
                                                         compute_grad, (1.0 - omega) * ms)
        else:
            loss_t, g = kmod.joint_loss_forward(logits, padded, logit_lengths, target_lengths,
                                                table, True, compute_grad, None,
                                                (1.0 - omega) * ms)
    if omega > 0.0:
        rt = rnnt_table(V, table.blank_tokens[0], table.clamp,
                        delay_penalty=table.delay_penalty)
        buf = None
        if omega == 1.0 and compute_grad:
            # RNN-T alone: its gradient straight into the token block; the durations get 0.
            if pair:
                g, gd = torch.empty_like(tok), torch.zeros_like(dur)
                buf = g
            else:
                g = torch.empty_like(logits)
                g[..., V:].zero_()
                buf = g[..., :V]
        loss_r, gr = kmod.joint_loss_forward(tok, padded, logit_lengths, target_lengths, rt, True,
                                             compute_grad, buf, omega * ms)
        if compute_grad and omega < 1.0:
            (g if pair else g[..., :V]).add_(gr)
            del gr
    loss = _mix(loss_r, loss_t, omega, g if compute_grad else None, gd)
    if not compute_grad:
        g = (tok if pair else logits).new_empty(0)
        gd = dur.new_empty(0) if pair else None
    else:
        g = conform_layout(g, tok if pair else logits)
        if pair:
            gd = conform_layout(gd, dur)
    loss, g = finish(loss, g, reduction, zero_infinity,
                     weights=weights(reduction, target_lengths, loss), batch_dim=0,
                     grad_scaled=scale is not None, more=(gd,) if pair else ())
    return loss, g, gd


def tdt_loss_impl(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    table_ints: list[int],
    table_floats: list[float],
    omega: float,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """TDT on the joint ``(B, T, U+1, V + D)``: the reduced loss and the gradient."""
    table = JointTable.decode(table_ints, table_floats)
    V = table.num_tokens
    loss, g, _ = _tdt_forward(logits, logits[..., :V], logits[..., V:], targets, logit_lengths,
                              target_lengths, table, omega, reduction, zero_infinity, backend,
                              compute_grad, validate)
    return loss, g


def tdt_pair_loss_impl(
    token_logits: Tensor,
    duration_logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    table_ints: list[int],
    table_floats: list[float],
    omega: float,
    reduction: str,
    zero_infinity: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """TDT on the pair: the reduced loss and one gradient per tensor."""
    table = JointTable.decode(table_ints, table_floats)
    loss, g, gd = _tdt_forward(None, token_logits, duration_logits, targets, logit_lengths,
                               target_lengths, table, omega, reduction, zero_infinity, backend,
                               compute_grad, validate)
    return loss, g, gd


def _loss_fake(x: Tensor, logit_lengths: Tensor, reduction: str) -> Tensor:
    shape = (logit_lengths.shape[0],) if reduction == "none" else ()
    return x.new_empty(shape, dtype=_acc_dtype(x.dtype))


def _tdt_fake(logits, targets, logit_lengths, target_lengths, table_ints, table_floats, omega,
              reduction, zero_infinity, backend, compute_grad, validate):
    grad = torch.empty_like(logits) if compute_grad else logits.new_empty((0,))
    return _loss_fake(logits, logit_lengths, reduction), grad


def _pair_fake(token_logits, duration_logits, targets, logit_lengths, target_lengths, table_ints,
               table_floats, omega, reduction, zero_infinity, backend, compute_grad, validate):
    if compute_grad:
        gt, gd = torch.empty_like(token_logits), torch.empty_like(duration_logits)
    else:
        gt, gd = token_logits.new_empty((0,)), duration_logits.new_empty((0,))
    return _loss_fake(token_logits, logit_lengths, reduction), gt, gd


tdt_loss_decl = OpDecl("seqloss::tdt_loss", tdt_loss_impl, _tdt_fake)
tdt_loss_op = tdt_loss_decl.op
tdt_pair_decl = OpDecl("seqloss::tdt_loss_pair", tdt_pair_loss_impl, _pair_fake, n_diff=2)
tdt_pair_loss_op = tdt_pair_decl.op


# --------------------------------------------------------------------------- public
def check_tdt_durations(durations: object) -> tuple[int, ...]:
    """TDT's ``durations``: distinct, ascending, ``>= 0``, containing 0 and 1."""
    durs = check_durations(durations, "durations")
    for i in range(1, len(durs)):
        if durs[i] <= durs[i - 1]:
            raise InputError(f"durations must be ascending, got {list(durs)} (durations[{i}] = "
                             f"{durs[i]} <= durations[{i - 1}] = {durs[i - 1]})")
    if durs and durs[0] < 0:
        raise InputError(f"durations[0] = {durs[0]} is negative: frame advances are >= 0")
    if 0 not in durs or 1 not in durs:
        raise InputError("durations must contain 0 and 1 (TDT's RNN-T-like steps), "
                         f"got {list(durs)}")
    return durs


def tdt_options(sigma: object, omega: object, clamp: object, reduction: object,
                delay_penalty: object, zero_infinity: object,
                validate: object) -> tuple[float, float, float, str, float, bool, bool]:
    """The options :func:`tdt_loss` and ``tdt_loss_from_joint`` share, checked once:
    ``(sigma, omega, clamp, reduction, delay_penalty, zero_infinity, validate)``."""
    sigma = checks.check_float_arg(sigma, "sigma")
    omega = checks.check_float_arg(omega, "omega", low=0.0)
    if omega > 1.0:
        raise InputError(f"omega = {omega} is invalid: expected 0 <= omega <= 1 (the weight of "
                         f"the RNN-T loss in the mixture)")
    return (sigma, omega, checks.check_float_arg(clamp, "clamp"),
            checks.check_reduction(reduction, "mean_target"),
            checks.check_float_arg(delay_penalty, "delay_penalty"),
            checks.flag(zero_infinity, "zero_infinity"), checks.flag(validate, "validate"))


def _split(logits: object, D: int) -> tuple[Tensor | None, Tensor, Tensor]:
    """``(joint or None, token logits, duration logits)`` after the metadata checks."""
    if isinstance(logits, (tuple, list)):
        if len(logits) != 2:
            raise InputError(f"logits as a pair must be (token_logits, duration_logits), got "
                             f"{len(logits)} tensors")
        tok, dur = logits
        checks.check_float_tensor(tok, "logits[0] (token_logits)")
        checks.check_float_tensor(dur, "logits[1] (duration_logits)")
        checks.check_ndim(tok, "logits[0] (token_logits)", (4,), "(B, T, U+1, V)")
        checks.check_ndim(dur, "logits[1] (duration_logits)", (4,), "(B, T, U+1, D)")
        if dur.dtype != tok.dtype:
            raise InputTypeError(f"the pair's dtypes differ: token_logits {tok.dtype}, "
                                 f"duration_logits {dur.dtype}")
        if dur.device != tok.device:
            raise InputError(f"the pair's devices differ: token_logits on {tok.device}, "
                             f"duration_logits on {dur.device}")
        if dur.shape[:3] != tok.shape[:3]:
            raise InputError(f"duration_logits must have shape (B, T, U+1, D) = "
                             f"{(*tok.shape[:3], D)} like token_logits {tuple(tok.shape)}, got "
                             f"{tuple(dur.shape)}")
        if dur.shape[-1] != D:
            raise InputError(f"duration_logits.size(-1) = {dur.shape[-1]} must equal "
                             f"len(durations) = {D}")
        return None, tok, dur
    checks.check_float_tensor(logits, "logits")
    checks.check_ndim(logits, "logits", (4,), "(B, T, U+1, V + D)")
    W = logits.shape[-1]
    if W <= D:
        raise InputError(f"logits.size(-1) = {W} must be V + D: V >= 1 token logits then "
                         f"D = len(durations) = {D} duration logits")
    return logits, logits[..., : W - D], logits[..., W - D :]


def tdt_loss(
    logits: Tensor | tuple[Tensor, Tensor],
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    durations: list[int] | tuple[int, ...],
    blank: int = -1,
    sigma: float = 0.0,
    omega: float = 0.0,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    *,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    durs = check_tdt_durations(durations)
    joint, tok, dur = _split(logits, len(durs))
    V = tok.shape[-1]
    blank = resolve_token_blank(blank, V)
    tg, il, tl, _ = transducer_inputs(tok, targets, logit_lengths, target_lengths, blank,
                                      packed=False)
    sigma, omega, clamp, reduction, delay_penalty, zero_infinity, validate = tdt_options(
        sigma, omega, clamp, reduction, delay_penalty, zero_infinity, validate)
    name = resolve_backend(backend, tok.device)
    table = tdt_table(V, blank, durs, sigma, clamp, delay_penalty=delay_penalty)
    ints, floats = table.encode()
    rest = (tg, il, tl, ints, floats, omega, reduction, zero_infinity, name)
    if joint is not None:
        compute_grad = torch.is_grad_enabled() and joint.requires_grad
        loss = tdt_loss_decl.value(joint, *rest, compute_grad, validate)
    else:
        compute_grad = torch.is_grad_enabled() and (tok.requires_grad or dur.requires_grad)
        loss = tdt_pair_decl.value(tok, dur, *rest, compute_grad, validate)
    if tok.dtype in (torch.float32, torch.float64):
        loss = loss.to(tok.dtype)
    return loss


tdt_loss.__doc__ = r"""Token-and-Duration Transducer loss (Xu et al., 2023), NeMo's conventions.

    Args:
        logits: the joint ``(B, T, U+1, V + D)``: the ``V`` token logits (the blank
            among them) then the ``D = len(durations)`` duration logits; or the pair
            ``(token_logits (B, T, U+1, V), duration_logits (B, T, U+1, D))`` (same
            dtype and device), read where it lies (never concatenated), with a
            gradient for each. float16, bfloat16, float32 or float64, any layout.
        targets: ``(B, U)`` int32/int64 labels in ``[0, V)``, never the blank; entries
            past a target length are padding.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= min(U, logits.size(2) - 1)``.
        durations: the frame advances the duration logits stand for, ascending,
            distinct, containing 0 and 1 (e.g. ``[0, 1, 2, 3, 4]``).
        blank: the blank among the token logits; ``-1`` (default) is ``V - 1``.
        sigma: logit under-normalization (NeMo): subtracted from every arc's token
            log-probability (blank and labels; not from the duration
            log-probabilities), so every step costs ``sigma`` and longer steps gain.
        omega: the weight of the RNN-T loss on the token logits (standard blank, no
            ``sigma``, the same ``clamp``) in the deterministic mixture
            ``omega * L_rnnt + (1 - omega) * L_tdt`` (values and gradients): the
            expectation of NeMo's random per-batch switch. ``0 <= omega <= 1``.
        clamp: ``> 0`` clamps each element of each branch's per-sequence gradient
            with respect to the logits to ``[-clamp, clamp]``; ``<= 0``: off.
        reduction: ``"none"`` -> ``(B,)``; ``"sum"``; ``"mean_batch"`` (the plain batch
            mean); ``"mean_target"`` (the batch mean of ``loss_b / max(U_b, 1)``);
            ``"mean_volume"`` (``sum_b loss_b / sum_b U_b``; divisor 1 when every ``U_b``
            is 0); ``"mean"`` is NeMo's and transformers', ``"mean_target"``.
        delay_penalty: k2's delay penalty: every label emission leaving frame ``t`` of
            sequence ``b`` (whatever its duration; in both branches of the ``omega``
            mixture) gains ``delay_penalty * ((T_b - 1) / 2 - t)`` in log space (``> 0``
            favours early emissions; any value, exact in value and gradient).
        zero_infinity: a ``+inf`` loss (infeasible, or a path score past the float
            range) gives 0 and a zero gradient for that sequence.
        backend: ``"auto"``, ``"reference"``, ``"numba"`` or ``"triton"``.
        validate: check lengths and ids (a device-to-host sync on CUDA).

    Returns:
        The loss: float32 for half inputs, else the input dtype.

    The lattice: from ``(t, u)``, a blank with duration ``d >= 1`` goes to
    ``(t + d, u)`` (allowed when ``t + d <= T_b``) and scores
    ``lp_tok[blank] - sigma + lp_dur[d]``; the label ``y_{u+1}`` with duration
    ``e >= 0`` goes to ``(t + e, u + 1)`` (allowed when ``t + e < T_b``) and scores
    ``lp_tok[y] - sigma + lp_dur[e]``. As in NeMo (``TDTLossPytorch`` and its CUDA
    kernel), a path ends on a blank landing exactly on ``T_b``; a label cannot land
    on ``T_b``. One table on the shared joint prologue/epilogue and
    ``transducer_lattice``; autograd, ``torch.compile`` (fullgraph), deterministic.
    Memory: with ``omega = 0`` or 1 the gradient is the only logits-sized allocation;
    with ``0 < omega < 1`` the RNN-T branch adds one token-logits-sized temporary.
"""


class TDTLoss(LossModule):
    """Module wrapper of :func:`tdt_loss`; the constructor takes its keyword arguments."""

    _defaults = {"durations": None, "blank": -1, "sigma": 0.0, "omega": 0.0, "clamp": -1,
                 "reduction": "mean", "delay_penalty": 0.0, "zero_infinity": False,
                 "backend": "auto", "validate": True}

    def __init__(
        self,
        durations: list[int] | tuple[int, ...],
        blank: int = -1,
        sigma: float = 0.0,
        omega: float = 0.0,
        clamp: float = -1,
        reduction: TransducerReduction = "mean",
        *,
        delay_penalty: float = 0.0,
        zero_infinity: bool = False,
        backend: str = "auto",
        validate: bool = True,
    ) -> None:
        super().__init__(durations=durations, blank=blank, sigma=sigma, omega=omega, clamp=clamp,
                         reduction=reduction, delay_penalty=delay_penalty,
                         zero_infinity=zero_infinity, backend=backend, validate=validate)

    def forward(self, logits: Tensor | tuple[Tensor, Tensor], targets: Tensor,
                logit_lengths: IntsLike, target_lengths: IntsLike) -> Tensor:
        return tdt_loss(logits, targets, logit_lengths, target_lengths, self.durations, self.blank,
                        self.sigma, self.omega, self.clamp, self.reduction,
                        delay_penalty=self.delay_penalty, zero_infinity=self.zero_infinity,
                        backend=self.backend, validate=self.validate)
