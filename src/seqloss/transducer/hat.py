r"""The hybrid autoregressive transducer's loss (HAT; Variani et al., 2020).

HAT factors the joint's output into a blank probability and a label distribution:
``p(blank) = sigmoid(z_blank)``, ``p(y) = (1 - sigmoid(z_blank)) softmax(z_labels)[y]``,
the labels being every class but the blank. Its arcs on the RNN-T lattice::

    blank(t, u) = logsigmoid(z_blank)
    emit(t, u)  = logsigmoid(-z_blank) + z_y - logsumexp_{c != blank} z_c
                  + delay_penalty * ((T_b - 1) / 2 - t)

(exact: ``log(1 - sigmoid(z)) = logsigmoid(-z)``, no ``log1p(-exp)`` cancellation).

The arcs are computed by tiles (``arc_logprobs``'s row driver, or the Numba row passes
of ``hat_numba`` on CPU: no logits-sized intermediate), the lattice
(``transducer_lattice``'s kernels, RNN-T topology) gives the losses and the arc
occupations, and the occupations become each tile's gradient with respect to the logits
(the row function's vector-Jacobian product in closed form, :func:`hat_vjp`), clamped
(the per-sequence gradient, before any scaling: torchaudio's order) and scaled by the
reduction's weight. On the full joint this is the op ``seqloss::hat_loss``, returning
the loss and that gradient (multiplied by the incoming gradient in the backward, as the
RNN-T op does). From the joint, an ``autograd.Function`` runs the same steps with the
backward deferred, pushing each tile's gradient through the joint as ``from_joint.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from .._core import checks
from .._core.compiler import eager_only
from .._core.dispatch import resolve_backend
from .._core.module import LossModule
from .._core.opdecl import OpDecl
from .._core.ops import _keep_graph, conform_layout
from .._core.reduce import finish, weights
from .._core.types import IntsLike, TransducerReduction
from .arc_logprobs import (
    RowFn,
    RowSpec,
    _labels,
    acc_dtype,
    check_no_transforms,
    default_chunk,
    joint_backward,
    joint_forward,
    make_joint_spec,
    make_spec,
    rows_backward,
    rows_forward,
)
from .checks import transducer_inputs, transducer_values
from .from_joint import _autocast_state, _fake_logits, _setup
from .lattice.op import lattice_impl


def hat_rows(blank: int) -> RowFn:
    """HAT's blank and next-label arc scores of each row (see the module docstring)."""

    def fn(xs: tuple[Tensor, ...], y: Tensor) -> tuple[Tensor, ...]:
        x = xs[0]
        zb = x[:, blank]
        idx = torch.tensor([blank], device=x.device)
        z = torch.logsumexp(x.index_fill(1, idx, float("-inf")), -1)
        return F.logsigmoid(zb), F.logsigmoid(-zb) + x.gather(1, y[:, None])[:, 0] - z

    return fn


def hat_vjp(blank: int):
    """The vector-Jacobian product of :func:`hat_rows`, in closed form (no autograd):
    ``d blank / d z_blank = 1 - s``, ``d emit / d z_blank = -s`` (``s = sigmoid(z_blank)``),
    ``d emit / d z_c = [c = y] - softmax(z_labels)[c]`` for the labels ``c``."""

    def vjp(xs: tuple[Tensor, ...], y: Tensor, gos: list[Tensor | None]) -> list[Tensor]:
        x = xs[0]
        gb, ge = (torch.zeros(x.shape[0], dtype=x.dtype, device=x.device) if g is None
                  else g.to(x.dtype) for g in gos)
        zb = x[:, blank]
        s = torch.sigmoid(zb)
        idx = torch.tensor([blank], device=x.device)
        g = torch.softmax(x.index_fill(1, idx, float("-inf")), -1).mul_(-ge[:, None])
        g.scatter_add_(1, y[:, None], ge[:, None])
        g[:, blank] = gb * (1 - s) - ge * s
        return [g]

    return vjp


@dataclass
class _Cfg:
    spec: RowSpec
    joint: bool
    il: Tensor
    tl: Tensor
    clamp: float
    fastemit_lambda: float
    delay_penalty: float
    reduction: str
    zero_infinity: bool
    backend: str
    compute_grad: bool
    blank: int = 0
    rows: object = None  # hat_numba.Plan: the Numba row passes (CPU logits), else the driver


def _losses(cfg: _Cfg, ab: Tensor, ae: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence losses ``(B,)`` and the arc occupations ``(B, T, U+1)`` from the arcs."""
    if cfg.delay_penalty:
        T = ae.shape[1]
        tt = torch.arange(T, device=ae.device, dtype=torch.float64)
        Tb = cfg.il.to(device=ae.device, dtype=torch.float64)
        off = cfg.delay_penalty * ((Tb[:, None] - 1) / 2 - tt[None, :])
        ae = ae + off[:, :, None].to(ae.dtype)
    ll, ob, oe = lattice_impl(ab[..., None], ae[..., None], cfg.il, cfg.tl, [1], [0], False,
                              cfg.backend, cfg.compute_grad, False)
    scale = 1.0 + cfg.fastemit_lambda
    loss = -ll * scale if scale != 1.0 else -ll
    if not cfg.compute_grad:
        return loss, ob, oe
    return loss, ob[..., 0], oe[..., 0]


def _forward(st: object, cfg: _Cfg, inputs: tuple[Tensor, ...]) -> Tensor:
    """The reduced loss; keeps on ``st`` what :func:`_backward` needs."""
    spec = cfg.spec
    st.stats = None
    if cfg.joint:
        st.states = []
        st.autocast = _autocast_state()
        ab, ae = joint_forward(spec, inputs[0], inputs[1], st.states)
    elif cfg.rows is not None:
        from . import hat_numba

        ab, ae, rs, g = hat_numba.forward(inputs[0], spec.labels, cfg.blank, cfg.rows,
                                          cfg.compute_grad)
        st.stats = [rs, g]
    else:
        ab, ae = rows_forward(spec, inputs)
    loss, ob, oe = _losses(cfg, ab, ae)
    del ab, ae
    B = loss.shape[0]
    # w: d out / d loss_b (0 for a sequence zero_infinity zeroes)
    out, w = finish(loss, loss.new_ones((B,)), cfg.reduction, cfg.zero_infinity,
                    weights=weights(cfg.reduction, cfg.tl, loss), batch_dim=0)
    st.w = w
    st.occ = (ob, oe)
    return out


def _backward(st: object, cfg: _Cfg, inputs: tuple[Tensor, ...], grad_loss: Tensor,
              needs: tuple[bool, ...], keep: bool) -> tuple[Tensor | None, ...]:
    """The gradients with respect to ``inputs`` (``keep``: the graph is retained, so the
    Numba path's buffer is copied, not rescaled in place)."""
    if not cfg.compute_grad:
        raise RuntimeError("seqloss: hat_loss was called without a gradient wanted")
    ob, oe = st.occ
    B = st.w.shape[0]
    m = (grad_loss.expand(B) if grad_loss.dim() == 0 else grad_loss).to(ob.dtype)
    m = m * st.w.to(ob.dtype)
    scale = 1.0 + cfg.fastemit_lambda
    clamp = cfg.clamp
    if st.stats is not None:
        from . import hat_numba

        rs, g = st.stats
        # The kernel rescales the forward's buffer in place: a retained graph keeps a
        # copy; otherwise st lets go of it, so autograd takes it as the leaf's .grad
        # without a copy.
        if keep:
            g = g.clone()
        else:
            st.stats = None
        return (hat_numba.backward(inputs[0], cfg.spec.labels, cfg.blank, cfg.rows, rs, g, ob,
                                   oe, scale, clamp, m),)
    grad_outs = [-ob, -oe * scale if scale != 1.0 else -oe]

    def post(g: Tensor, tile: tuple[int, ...], i: int) -> Tensor:
        if clamp > 0:
            g = g.clamp_(-clamp, clamp)
        return g.mul_(m[tile[0]:tile[1], None, None, None])

    if cfg.joint:
        enc, pred, *params = inputs
        ge, gp, gparams = joint_backward(cfg.spec, enc, pred, params, needs, st.states,
                                         st.autocast, grad_outs, post)
        return (ge, gp, *gparams)
    return tuple(rows_backward(cfg.spec, inputs, grad_outs, needs, post))


class _HAT(torch.autograd.Function):
    """From the joint: the joint is re-run in the backward (eager by design)."""

    @staticmethod
    def forward(ctx, cfg: _Cfg, *inputs):
        out = _forward(ctx, cfg, inputs)
        ctx.cfg = cfg
        ctx.save_for_backward(*inputs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        return (None, *_backward(ctx, ctx.cfg, ctx.saved_tensors, grad_loss,
                                 ctx.needs_input_grad[1:], _keep_graph()))


# --------------------------------------------------------------------------- the op
def hat_loss_impl(logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor,
                  blank: int, clamp: float, fastemit_lambda: float, delay_penalty: float,
                  reduction: str, zero_infinity: bool, chunk: int, backend: str,
                  compute_grad: bool, validate: bool) -> tuple[Tensor, Tensor]:
    """HAT's reduced loss and its gradient (the reduction's weights included; empty
    unless ``compute_grad``): the value checks, the arcs, the lattice, the gradient."""
    il, tl = logit_lengths, target_lengths
    padded = transducer_values(logits, targets, il, tl, blank, validate=validate)
    B, T, U1, V = logits.shape
    spec = make_spec(hat_rows(blank), _labels(padded, B, U1, logits.device), il, tl, T, U1,
                     acc_dtype(logits.dtype), V, chunk)
    spec.vjp = hat_vjp(blank)
    cfg = _Cfg(spec, False, il, tl, clamp, fastemit_lambda, delay_penalty, reduction,
               zero_infinity, backend, compute_grad, blank)
    if backend == "numba":
        from . import hat_numba

        if hat_numba.usable(logits):
            cfg.rows = hat_numba.Plan(spec.Tl, spec.Ul, T, U1)
    st = SimpleNamespace()
    out = _forward(st, cfg, (logits,)).to(acc_dtype(logits.dtype))
    if not compute_grad:
        return out, logits.new_empty((0,))
    (grad,) = _backward(st, cfg, (logits,), torch.ones((), dtype=out.dtype, device=out.device),
                        (True,), keep=False)
    return out, conform_layout(grad, logits)


def _hat_fake(logits, targets, logit_lengths, target_lengths, blank, clamp, fastemit_lambda,
              delay_penalty, reduction, zero_infinity, chunk, backend, compute_grad, validate):
    shape = (logit_lengths.shape[0],) if reduction == "none" else ()
    loss = logits.new_empty(shape, dtype=acc_dtype(logits.dtype))
    grad = torch.empty_like(logits) if compute_grad else logits.new_empty((0,))
    return loss, grad


hat_loss_decl = OpDecl("seqloss::hat_loss", hat_loss_impl, _hat_fake)
hat_loss_op = hat_loss_decl.op


def _options(clamp: object, reduction: object, fastemit_lambda: object, delay_penalty: object,
             zero_infinity: object, validate: object) -> tuple:
    return (checks.check_float_arg(clamp, "clamp"),
            checks.check_reduction(reduction, "mean_batch"),
            checks.check_float_arg(fastemit_lambda, "fastemit_lambda", low=0.0),
            checks.check_float_arg(delay_penalty, "delay_penalty"),
            checks.flag(zero_infinity, "zero_infinity"),
            checks.flag(validate, "validate"))


def _finish_dtype(loss: Tensor, dtype: torch.dtype) -> Tensor:
    return loss.to(acc_dtype(dtype))


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
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)
    tg, il, tl, blank = transducer_inputs(logits, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    name = resolve_backend(backend, logits.device)
    chunk = default_chunk(logits.device, chunk_elements)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    return hat_loss_decl.value(logits, tg, il, tl, blank, clamp, lam, dp, reduction,
                               zero_infinity, chunk, name, compute_grad, validate)


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

    Memory: the arcs and occupations ``(B, T, U+1)`` and one tile of at most
    ``chunk_elements`` logits (``None``: ``2**20`` on CPU, ``2**24`` on CUDA); the
    logits' gradient is the only logits-sized allocation. ``hat_loss`` is the
    ``torch.library`` op ``seqloss::hat_loss`` (``torch.compile`` with ``fullgraph=True``;
    the gradient is formed in the forward pass, as ``rnnt_loss`` forms it);
    ``hat_loss_from_joint`` runs eagerly (a graph break: it re-runs the joint in its
    backward). Double backward raises.
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
        chunk_elements: the most logits a tile holds (whole rows).
        backend: the lattice's backend (``"auto"``, ``"reference"``, ``"numba"``,
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
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    tg, il, tl, blank = transducer_inputs(fake, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    name = resolve_backend(backend, encoder_out.device)
    padded = transducer_values(fake, tg, il, tl, blank, validate=validate)
    device = encoder_out.device
    spec = make_joint_spec(hat_rows(blank), joint, _labels(padded, B, U1, device), il, tl, T,
                           U1, acc_dtype(probe.dtype), probe.shape[-1], chunk, is_module)
    check_no_transforms("hat_loss_from_joint")
    compute_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (encoder_out, predictor_out, *params))
    cfg = _Cfg(spec, True, il, tl, clamp, lam, dp, reduction, zero_infinity, name, compute_grad)
    return _finish_dtype(_HAT.apply(cfg, encoder_out, predictor_out, *params), probe.dtype)


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
