"""The table-driven joint prologue/epilogue in plain PyTorch (float64): the oracle.

Kernel interface shared with ``numba_cpu.py`` and ``triton_cuda.py``::

    joint_loss_forward(logits, targets, logit_lengths, target_lengths, table,
                       fused_log_softmax, compute_grad, grad_buffer=None, grad_scale=1.0)
        -> (loss (B,), grad shaped like logits | empty)
    joint_loss_forward_pair(token_logits, duration_logits, targets, logit_lengths,
                            target_lengths, table, fused_log_softmax, compute_grad,
                            grad_scale=1.0)
        -> (loss (B,), grad like token_logits | empty, grad like duration_logits | empty)
    joint_tile_grad(x, lz, lzd, occ, cls, targets, hat_blank, clamp, gscale, out) -> out

``joint_tile_grad`` is the epilogue alone, on a tile of rows whose occupations are known
(``table.epilogue_weights``): the losses from the joint, ``from_joint.py``, call it per
tile in their backward, and ``joint_loss_forward`` here on the whole joint as one tile
(the reference's one epilogue). See
``table.py`` for the math. The reference materializes log-softmaxes in float64
on a padded copy: the memory rules bind the fast backends, not the oracle.
"""

from __future__ import annotations

import torch

from ..._core.logspace import log_normalizer, softmax_given, sub_normalizer
from ..lattice.reference import transducer_lattice
from .table import JointTable, delay_terms, epilogue_weights

NEG_INF = float("-inf")
NAN = float("nan")
INF = float("inf")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_offsets(logit_lengths: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    rows = logit_lengths * (target_lengths + 1)
    return torch.cumsum(rows, 0) - rows


def _to_padded(logits: torch.Tensor, Tl: torch.Tensor, Ul: torch.Tensor) -> torch.Tensor:
    """Packed ``(N, V)`` -> padded ``(B, Tmax, Umax+1, V)`` copy (zeros in padding)."""
    B = Tl.shape[0]
    T = int(Tl.max()) if B else 0
    U1 = int(Ul.max()) + 1 if B else 1
    out = logits.new_zeros((B, T, U1, logits.shape[-1]))
    off = _row_offsets(Tl, Ul).tolist()
    for b, (tb, ub) in enumerate(zip(Tl.tolist(), Ul.tolist(), strict=True)):
        rows = logits[off[b] : off[b] + tb * (ub + 1)]
        out[b, :tb, : ub + 1] = rows.reshape(tb, ub + 1, out.shape[-1])  # tb may be 0
    return out


def _from_padded(grad: torch.Tensor, Tl: torch.Tensor, Ul: torch.Tensor) -> torch.Tensor:
    parts = [grad[b, :tb, : ub + 1].reshape(tb * (ub + 1), grad.shape[-1]) for b, (tb, ub) in
             enumerate(zip(Tl.tolist(), Ul.tolist(), strict=True))]
    if not parts:
        return grad.new_zeros((0, grad.shape[-1]))
    return torch.cat(parts, 0)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Guarded: a row of ``-inf`` logits gives ``-inf`` log-probabilities (no arc), not NaN
    (``_core/logspace.py``'s rule, which every other path follows)."""
    return sub_normalizer(x, log_normalizer(x, -1, keepdim=True))


def _arc_scores(x: torch.Tensor, tg: torch.Tensor, Tl: torch.Tensor, table: JointTable,
                fused_log_softmax: bool) -> tuple[torch.Tensor, ...]:
    """The prologue: ``(arc_blank, arc_emit)`` from the padded float64 joint
    ``x (B, T, U+1, V + D)`` (HAT: the labels' log-softmax, the blank's class out of it,
    and the blank's sigmoid)."""
    B, T, U1, _ = x.shape
    U = U1 - 1
    V, D = table.num_tokens, table.num_durations
    xt, xd = x[..., :V], x[..., V : V + D]
    if table.hat:
        if not fused_log_softmax:
            raise ValueError("a 'hat' table takes raw logits (fused_log_softmax=True)")
        # The labels' log-softmax (the blank's class out of it) and the blank's sigmoid.
        hb = table.blank_arcs[0].token
        zb = xt[..., hb]
        lp_t = _log_softmax(xt.index_fill(-1, torch.tensor([hb], device=x.device), NEG_INF))
    else:
        lp_t = _log_softmax(xt) if fused_log_softmax else xt
    lp_d = (_log_softmax(xd) if fused_log_softmax else xd) if D else None
    idx = tg[:, None, :, None].expand(B, T, U, 1)
    lp_y = lp_t[:, :, :U].gather(3, idx)[..., 0] if U else x.new_zeros(B, T, 0)
    lp_y = torch.cat([lp_y, torch.full_like(lp_t[:, :, :1, 0], NEG_INF)], 2) - table.sigma
    if table.hat:
        lp_y = lp_y + torch.nn.functional.logsigmoid(-zb)
    if table.delay_penalty:
        lp_y = lp_y + delay_terms(table.delay_penalty, Tl, T)[..., None]

    def score(base: torch.Tensor, dl: int | None) -> torch.Tensor:
        return base if dl is None else base + lp_d[..., dl]  # type: ignore[index]

    if table.hat:
        arc_blank = (torch.nn.functional.logsigmoid(zb) - table.sigma)[..., None]
    else:
        arc_blank = torch.stack([score(lp_t[..., a.token] - table.sigma, a.duration_logit)
                                 for a in table.blank_arcs], -1)
    arc_emit = torch.stack([score(lp_y, a.duration_logit) for a in table.emit_arcs], -1)
    return arc_blank, arc_emit


def _epilogue(x: torch.Tensor, tg: torch.Tensor, occ_b: torch.Tensor, occ_e: torch.Tensor,
              table: JointTable, fused_log_softmax: bool, grad_scale: float) -> torch.Tensor:
    """The gradient like the padded float64 ``x`` from the arc occupations (``occ_e`` with
    FastEmit's factor), clamped and scaled: ``joint_tile_grad`` on the whole joint as one
    tile (the epilogue of the losses from the joint, per tile)."""
    B = x.shape[0]
    V, D = table.num_tokens, table.num_durations
    cls = tuple(dict.fromkeys(table.blank_tokens))
    occ = epilogue_weights(table, occ_b, occ_e, cls, D)[None]
    xt, xd = x[..., :V], x[..., V : V + D]
    hb = table.blank_arcs[0].token if table.hat else -1
    if table.hat:  # the labels' normalizer, the blank's class out of it
        xt = xt.index_fill(-1, torch.tensor([hb], device=x.device), NEG_INF)
    # not fused (log-probabilities): log Z = +inf, the softmax's share 0
    lz = torch.logsumexp(xt, -1) if fused_log_softmax else torch.full_like(x[..., 0], INF)
    lzd = None
    if D:
        lzd = torch.logsumexp(xd, -1) if fused_log_softmax else torch.full_like(x[..., 0], INF)
    tgu = torch.cat([tg, tg.new_zeros(B, 1)], 1)  # the last row emits nothing (oe = 0)
    return joint_tile_grad(x, lz, lzd, occ, cls, tgu, hb, (table.clamp,),
                           torch.full((1, B), grad_scale, dtype=x.dtype, device=x.device),
                           torch.empty_like(x))


def joint_loss_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    compute_grad: bool,
    grad_buffer: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence transducer loss of ``table`` and its gradient.

    Args:
        logits: padded ``(B, T, U+1, V + D)`` or packed ``(sum_b T_b (U_b+1), V + D)``
            (rows of sequence ``b`` in ``(t, u)`` row-major order), any float dtype
            and layout. Log-probabilities (per block) if not ``fused_log_softmax``.
        targets: ``(B, S)`` int64, ``S >= max U_b``; entries past ``U_b`` never read.
        logit_lengths, target_lengths: ``(B,)`` int64, validated.
        table: the arcs (``table.py``).
        fused_log_softmax: ``logits`` are raw logits (log-softmaxes taken inside).
        compute_grad: also return the gradient (else an empty tensor).
        grad_buffer: optional tensor like ``logits`` to write the gradient into (may
            be ``logits`` itself: the in-place mode).
        grad_scale: multiplies the gradient after the clamp (a reduction's factor).

    Returns:
        ``loss (B,)`` float32 (float64 for float64 input): ``-(1+λ) log p(y|x)``,
        ``+inf`` when infeasible (``T_b = 0`` included), NaN when a read logit is NaN
        or ``+inf``; ``grad`` like ``logits``: zero on padding and for infeasible
        sequences, NaN on the read region of a NaN sequence.
    """
    packed = logits.dim() == 2
    device = logits.device
    out_dtype = _acc_dtype(logits.dtype)
    acc = torch.float64
    Tl = logit_lengths.to(device)
    Ul = target_lengths.to(device)
    B = Tl.shape[0]
    x = _to_padded(logits.to(acc), Tl, Ul) if packed else logits.to(acc)
    _, T, U1, W = x.shape
    U = U1 - 1
    tg = targets.to(device)
    if tg.shape[1] < U:
        tg = torch.cat([tg, tg.new_zeros(B, U - tg.shape[1])], 1)
    tg = tg[:, :U]

    tt = torch.arange(T, device=device)[None, :, None]
    uu = torch.arange(U1, device=device)[None, None, :]
    valid = (tt < Tl[:, None, None]) & (uu <= Ul[:, None, None])  # the region read
    x = torch.where(valid[..., None], x, 0.0)  # padding is never read, whatever it holds
    row_max = x.amax(-1) if W else x.new_zeros(x.shape[:-1])
    bad = ((~(row_max < float("inf"))) & valid).flatten(1).any(1)

    arc_blank, arc_emit = _arc_scores(x, tg, Tl, table, fused_log_softmax)
    ll, occ_b, occ_e = transducer_lattice(
        arc_blank, arc_emit, Tl, Ul, table.blank_durations, table.emit_durations, compute_grad,
        table.emit_can_end,
    )
    scale = 1.0 + table.fastemit_lambda
    loss = torch.where(bad, NAN, -ll * scale).to(out_dtype)
    if not compute_grad:
        return loss, logits.new_empty(0)

    grad = _epilogue(x, tg, occ_b, occ_e * scale, table, fused_log_softmax, grad_scale)
    grad = torch.where(valid[..., None], grad, 0.0)
    grad = torch.where((bad[:, None, None] & valid)[..., None], NAN, grad)
    if packed:
        grad = _from_padded(grad, Tl, Ul)
    if grad_buffer is not None:
        grad_buffer.copy_(grad)
        return loss, grad_buffer
    return loss, grad.to(logits.dtype)


def joint_loss_forward_pair(
    token_logits: torch.Tensor,
    duration_logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    compute_grad: bool,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``joint_loss_forward`` with the duration block as a tensor of its own.

    ``token_logits (..., V)`` and ``duration_logits (..., D)`` (same leading shape,
    dtype and device). The oracle may copy: it concatenates in float64 and splits
    the gradient (the fast backends read the two tensors where they are).
    """
    V = table.num_tokens
    x = torch.cat([token_logits.to(torch.float64), duration_logits.to(torch.float64)], -1)
    loss, grad = joint_loss_forward(x, targets, logit_lengths, target_lengths, table,
                                    fused_log_softmax, compute_grad, None, grad_scale)
    loss = loss.to(_acc_dtype(token_logits.dtype))
    if not compute_grad:
        return loss, token_logits.new_empty(0), duration_logits.new_empty(0)
    return (loss, grad[..., :V].to(token_logits.dtype).contiguous(),
            grad[..., V:].to(duration_logits.dtype).contiguous())


def joint_tile_grad(
    x: torch.Tensor,
    lz: torch.Tensor,
    lzd: torch.Tensor | None,
    occ: torch.Tensor,
    cls: tuple[int, ...],
    targets: torch.Tensor,
    hat_blank: int,
    clamp: tuple[float, ...],
    gscale: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """The joint epilogue on a tile of rows whose arcs' occupations are given.

    Args:
        x: ``(nb, nt, nu, V + D)`` logits, float32 or float64 (the gradient's dtype).
        lz: ``(nb, nt, nu)`` float64 log-normalizer of each row's token block (HAT: of
            its labels); ``-inf``, a row without a finite logit, gives probabilities 0.
        lzd: ``(nb, nt, nu)`` float64 log-normalizer of the duration block, or None
            (``D = 0``).
        occ: ``(K, nb, nt, nu, 3 + len(cls) + D)`` float64, per part of the gradient and
            row: the token block's weight ``w`` (every arc leaving the row), the
            duration block's ``wd``, the emission's occupation ``oe`` (at
            ``targets[b, u]``), each blank-like class's ``ob_i`` (at ``cls[i]``), each
            duration logit's ``od_k``.
        cls: the blank-like classes (HAT: its blank alone).
        targets: ``(nb, nu)`` int64, each row's emission class.
        hat_blank: HAT's blank class (``"hat"`` normalizer), or -1.
        clamp: ``K`` clamps (``<= 0``: none).
        gscale: ``(K, nb)`` float64, each part's factor per sequence.
        out: like ``x``, written; may be ``x`` itself.

    Returns:
        ``out = sum_k clamp_k(g_k) gscale[k, b]``, entries below the smallest normal
        number in magnitude flushed to 0, where per part (``p = exp(x - lz)``)::

            g[c]     = p[c] w - sum_i ob_i [c = cls_i] - oe [c = y]          (c < V)
            g[V + k] = exp(x[V + k] - lzd) wd - od_k                         (k < D)

        (HAT: ``g[c] = p[c] oe - oe [c = y]`` on the labels, ``g[blank] =
        sigmoid(x[blank]) w - ob_0``). Here in float64 on float64 copies of the tile.
    """
    f64 = torch.float64
    V = x.shape[-1] - (occ.shape[-1] - 3 - len(cls))
    xf = x.to(f64)
    idx = targets[:, None, :, None].expand(*x.shape[:3], 1)

    def probs(xb: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # log Z = -inf: no class with a finite logit, probabilities 0 (not NaN)
        return softmax_given(xb, z[..., None])

    p = probs(xf[..., :V], lz)
    pd = probs(xf[..., V:], lzd) if lzd is not None else None
    sig = torch.sigmoid(xf[..., hat_blank]) if hat_blank >= 0 else None
    g = torch.zeros_like(xf)
    for k in range(occ.shape[0]):
        o = occ[k].to(f64)
        w, wd, oe = o[..., 0], o[..., 1], o[..., 2]
        gk = torch.zeros_like(xf)
        if sig is None:
            gk[..., :V] = p * w[..., None]
        else:  # the labels' softmax weighs the emission; the blank's sigmoid, every arc
            gk[..., :V] = p * oe[..., None]
            gk[..., hat_blank] = sig * w
        for i, c in enumerate(cls):
            gk[..., c] -= o[..., 3 + i]
        gk[..., :V].scatter_add_(-1, idx, -oe[..., None])
        if pd is not None:
            gk[..., V:] = pd * wd[..., None] - o[..., 3 + len(cls):]
        if clamp[k] > 0:
            gk = gk.clamp(-clamp[k], clamp[k])
        g += gk * gscale[k].to(f64)[:, None, None, None]
    g = torch.nn.functional.hardshrink(g, torch.finfo(out.dtype).tiny)
    return out.copy_(g)
