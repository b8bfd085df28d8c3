r"""The table-driven joint on CPU: torch's vectorized passes over the logits, Numba on the lattice.

Implements ``joint_loss_forward`` and ``joint_loss_forward_pair`` of
``seqloss.transducer.joint.reference`` (same signatures and semantics) for any
``JointTable``: RNN-T, multi-blank, TDT. Both read the token block and the duration
block through views of their own (``_forward``), so TDT's pair of tensors is never
concatenated.

Where the time goes: the loss is bound by one ``exp`` per logit. The installed
llvmlite has no vector math library, so a Numba ``exp`` is scalar (~10x slower
than torch's vectorized one); the passes over the logits are therefore torch ops,
chunked over frames so that each chunk stays in cache between its passes, and only
the ``(B, T, U+1)`` lattice runs in Numba: one GIL-free function per (sequence,
direction) or sequence, on the shared thread pool (:func:`seqloss._core.numba_pool.run_jobs`:
fork-safe, the same result whatever the thread count).

Memory: the normalizers are computed on the fly in the gradient's own buffer
(``exp(x - max)`` written there, summed, then rescaled in place by the
occupation weight in the epilogue), so the gradient is the only logits-sized
allocation, and none at all when the caller passes ``grad_buffer=logits``.
Half-precision inputs use chunk-sized float32 temporaries instead (their
gradient buffer is too coarse to hold the exponentials), at the price of a
second ``exp`` pass.
"""

from __future__ import annotations

import torch

from ..lattice.numba_cpu import transducer_lattice
from .table import JointTable

NEG_INF = float("-inf")
NAN = float("nan")
# Elements per chunk of a sequence's logits (16 MiB in float32, within L3): a chunk written by
# one pass is still in cache for the next (L2/L3-sized on current x86 parts).
CHUNK_ELEMS = 1 << 22


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _seq_view(x: torch.Tensor, b: int, tb: int, ub: int, off: int) -> torch.Tensor:
    """Sequence ``b``'s read region as a ``(T_b, U_b+1, V)`` view (padded or packed)."""
    if x.dim() == 4:
        return x[b, :tb, : ub + 1]
    return x[off : off + tb * (ub + 1)].unflatten(0, (tb, ub + 1))


def _chunks(tb: int, ub: int, V: int):  # noqa: ANN202
    step = max(1, CHUNK_ELEMS // max(1, (ub + 1) * V))
    for t0 in range(0, tb, step):
        yield t0, min(tb, t0 + step)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Guarded log-softmax of a small block (the duration logits): a row of ``-inf`` stays ``-inf``."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(m == NEG_INF, 0.0, m)
    log_z = torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    return torch.where(log_z == NEG_INF, NEG_INF, (x - m) - log_z)


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
    """See ``seqloss.transducer.joint.reference.joint_loss_forward``."""
    V, D = table.num_tokens, table.num_durations
    grad = None
    if compute_grad:
        grad = grad_buffer if grad_buffer is not None else torch.empty_like(logits)
    loss = _forward(logits[..., :V] if D else logits, logits[..., V:] if D else None,
                    targets, logit_lengths, target_lengths, table, fused_log_softmax,
                    None if grad is None else (grad[..., :V] if D else grad),
                    None if grad is None or not D else grad[..., V:], grad_scale,
                    # A caller's buffer may be the logits themselves (in place): then the
                    # duration logits are read once, before any gradient is written.
                    rows=logits if D and grad_buffer is None else None,
                    grad_rows=grad if D and grad_buffer is None else None,
                    reread_durations=grad_buffer is None)
    return loss, (grad if grad is not None else logits.new_empty(0))


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
    """See ``seqloss.transducer.joint.reference.joint_loss_forward_pair``."""
    gt = torch.empty_like(token_logits) if compute_grad else None
    gd = torch.empty_like(duration_logits) if compute_grad else None
    loss = _forward(token_logits, duration_logits, targets, logit_lengths, target_lengths,
                    table, fused_log_softmax, gt, gd, grad_scale)
    if not compute_grad:
        return loss, token_logits.new_empty(0), duration_logits.new_empty(0)
    return loss, gt, gd


def _forward(
    logits: torch.Tensor,
    dur_logits: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    table: JointTable,
    fused_log_softmax: bool,
    grad: torch.Tensor | None,
    grad_dur: torch.Tensor | None,
    grad_scale: float,
    *,
    rows: torch.Tensor | None = None,
    grad_rows: torch.Tensor | None = None,
    reread_durations: bool = True,
) -> torch.Tensor:
    """The loss; the gradient written into ``grad`` (token block) and ``grad_dur``.

    ``logits`` is the token block ``(..., V)`` and ``dur_logits`` the duration block
    ``(..., D)`` (``None`` when ``D = 0``): views of one joint, or two tensors. No
    gradient when ``grad`` is ``None``. ``rows``/``grad_rows``: the joint and its
    gradient whole, when the blocks are their views: the elementwise passes then run
    over whole (contiguous) rows, whose duration columns are scratch until the
    duration gradient overwrites them (a row of the token view alone is misaligned:
    ~1.5x slower passes). ``reread_durations``: the epilogue recomputes the duration
    log-probabilities from ``dur_logits`` (False: keeps them from the prologue, for a
    gradient written over the logits).
    """
    dtype = logits.dtype
    acc = _acc_dtype(dtype)
    half = dtype in (torch.float16, torch.bfloat16)
    packed = logits.dim() == 2
    V, D = table.num_tokens, table.num_durations
    clamp, sigma = table.clamp, table.sigma
    Tl = logit_lengths.tolist()
    Ul = target_lengths.tolist()
    B = len(Tl)
    T = max(Tl, default=0) if packed else logits.shape[1]
    U1 = max(Ul, default=0) + 1
    offs = [0] * B
    for b in range(1, B):
        offs[b] = offs[b - 1] + Tl[b - 1] * (Ul[b - 1] + 1)
    tg = targets.cpu()
    tok = table.blank_tokens
    uniq = sorted(set(tok))  # TDT: its blank arcs all score one class, gathered once
    tok_col = [uniq.index(c) for c in tok]
    b_dl = [a.duration_logit for a in table.blank_arcs]
    e_dl = [a.duration_logit for a in table.emit_arcs]
    Db, De = len(tok), len(e_dl)

    # The lattice runs in float64 whatever the input: arc scores of -2e4 (logits of
    # 1e4) keep their small parts, and Numba's scalar log/exp cost the same.
    lat = torch.float64
    arc_blank = torch.empty((B, T, U1, Db), dtype=lat)
    arc_emit = torch.empty((B, T, U1, De), dtype=lat)
    # Per row of the token block: the shift m (the max, 0 for a row of -inf) and
    # sum(exp(x - m)). Log-probs are (x - m) - log(sum), never x - (m + log(sum)):
    # with logits of 1e4 the latter loses float32's last digits to the rounding.
    row_max = torch.empty((B, T, U1), dtype=acc)
    row_sum = torch.empty((B, T, U1), dtype=acc)
    bad = [False] * B
    kept_dur: list[torch.Tensor | None] = [None] * B

    # ---- prologue: normalizers on the fly, arc scores, NaN/+inf detection
    for b in range(B):
        tb, ub = Tl[b], Ul[b]
        if tb == 0:
            continue
        x = _seq_view(logits, b, tb, ub, offs[b])
        idx = tg[b, :ub].to(x.device)[None, :, None].expand(tb, ub, 1)
        # Gather before the buffer (maybe the logits themselves) is overwritten.
        xb = x[..., uniq].to(acc, copy=True)  # (tb, ub+1, distinct blank classes)
        xe = x[:, :ub].gather(2, idx)[..., 0].to(acc)
        any_bad = False
        ld = None
        if D:
            # (T_b, U_b+1, D) duration log-probs, float64; not kept (recomputed in the
            # epilogue, bit for bit): the lattice's peak holds no copy of them.
            xd = _seq_view(dur_logits, b, tb, ub, offs[b]).to(lat, copy=True)
            any_bad = not bool((xd.amax(-1) < float("inf")).all())  # NaN/+inf poisons the row
            ld = _log_softmax(xd) if fused_log_softmax else xd
            if not reread_durations:
                kept_dur[b] = ld
        g = _seq_view(grad, b, tb, ub, offs[b]) if grad is not None else None
        xr = _seq_view(rows, b, tb, ub, offs[b]) if rows is not None else None
        gr = _seq_view(grad_rows, b, tb, ub, offs[b]) if grad_rows is not None else None
        for t0, t1 in _chunks(tb, ub, V):
            xc = x[t0:t1]
            m = xc.amax(-1).to(acc)  # NaN/+inf anywhere poisons the row
            any_bad |= bool((~(m < float("inf"))).any())
            if not fused_log_softmax:
                continue
            # A row of -inf logits has no arc out of it: shift by 0, sum 0, log_z -inf.
            m = torch.where(m == NEG_INF, 0.0, m)
            if g is not None and not half:
                if gr is not None:  # whole rows (their duration columns: scratch)
                    gcr = gr[t0:t1]
                    torch.sub(xr[t0:t1], m[..., None], out=gcr)
                    gcr.exp_()
                    gc = gcr[..., :V]
                else:
                    gc = g[t0:t1]
                    torch.sub(xc, m[..., None], out=gc)
                    gc.exp_()
                s = gc.sum(-1, dtype=acc)
            else:
                s = torch.exp(xc.to(acc) - m[..., None]).sum(-1)
            row_sum[b, t0:t1, : ub + 1] = s
            row_max[b, t0:t1, : ub + 1] = m
        bad[b] = any_bad
        xb, xe = xb.to(lat), xe.to(lat)
        if fused_log_softmax:
            m = row_max[b, :tb, : ub + 1].to(lat)
            s = row_sum[b, :tb, : ub + 1].to(lat)
            ls = torch.log(s)
            # A row of -inf logits (s = 0) has no arc out of it.
            xb = torch.where(s[..., None] == 0, NEG_INF, (xb - m[..., None]) - ls[..., None])
            xe = torch.where(s[:, :ub] == 0, NEG_INF, (xe - m[:, :ub]) - ls[:, :ub])
        if sigma:
            xb = xb - sigma
            xe = xe - sigma
        for i, dl in enumerate(b_dl):
            xi = xb[..., tok_col[i]]
            arc_blank[b, :tb, : ub + 1, i] = xi if dl is None else xi + ld[..., dl]
        for j, dl in enumerate(e_dl):
            arc_emit[b, :tb, :ub, j] = xe if dl is None else xe + ld[:, :ub, dl]

    # ---- core recursion
    compute_grad = grad is not None
    ll, occ_b, occ_e = transducer_lattice(
        arc_blank, arc_emit, logit_lengths, target_lengths, table.blank_durations,
        table.emit_durations, compute_grad, table.emit_can_end, occupation_dtype=acc,
    )
    del arc_blank, arc_emit
    scale = 1.0 + table.fastemit_lambda
    loss = (-ll * scale).to(acc)
    if any(bad):
        loss = torch.where(torch.tensor(bad), NAN, loss)
    loss = loss.to(logits.device)
    if grad is None:
        return loss

    # ---- epilogue: occupations -> gradient, in the buffer holding exp(x - m)
    llist = ll.tolist()
    for b in range(B):
        tb, ub = Tl[b], Ul[b]
        if not packed:
            for gg in (grad, grad_dur):
                if gg is not None:
                    gg[b, tb:].zero_()
                    gg[b, :tb, ub + 1 :].zero_()
        if tb == 0:
            continue
        g = _seq_view(grad, b, tb, ub, offs[b])
        gd = _seq_view(grad_dur, b, tb, ub, offs[b]) if D else None
        gr = _seq_view(grad_rows, b, tb, ub, offs[b]) if grad_rows is not None else None
        if bad[b] or llist[b] == NEG_INF:
            fill = NAN if bad[b] else 0.0
            g.fill_(fill)
            if gd is not None:
                gd.fill_(fill)
            continue
        # Occupations in the accumulation dtype (float64 for float64 input); their sums,
        # and the small duration block, in float64.
        ob = occ_b[b, :tb, : ub + 1]  # (tb, ub+1, Db)
        oe = occ_e[b, :tb, :ub]  # (tb, ub, De), FastEmit's (1 + λ) not yet applied
        oe_sum = oe.sum(-1, dtype=lat)
        if scale != 1.0:
            oe_sum *= scale
        total = ob.sum(-1, dtype=lat)
        total[:, :ub] += oe_sum
        oe_tok = oe_sum.to(acc)
        idx = tg[b, :ub].to(g.device)[None, :, None]
        g_dur = None
        if D:
            ld = kept_dur[b]
            if ld is None:
                ld = _seq_view(dur_logits, b, tb, ub, offs[b]).to(lat)
                ld = _log_softmax(ld) if fused_log_softmax else ld
            # The duration block: small, computed whole in float64.
            g_dur = torch.exp(ld) * total[..., None] if fused_log_softmax else torch.zeros_like(ld)
            for i, dl in enumerate(b_dl):
                if dl is not None:
                    g_dur[..., dl] -= ob[..., i]
            for j, dl in enumerate(e_dl):
                if dl is not None:
                    g_dur[:, :ub, dl] -= oe[..., j] * scale if scale != 1.0 else oe[..., j]
            if clamp > 0:
                g_dur = g_dur.clamp(-clamp, clamp)
            if grad_scale != 1.0:
                g_dur = g_dur * grad_scale
        if fused_log_softmax:
            s = row_sum[b, :tb, : ub + 1]
            # softmax * occupation = exp(x - m) * (occupation / sum exp(x - m)).
            w = torch.where(s > 0, total.to(acc) / s, 0.0)
            x = _seq_view(logits, b, tb, ub, offs[b]) if half else None
            m = row_max[b, :tb, : ub + 1]
            # Per blank class, the summed occupation of its arcs (TDT: every blank arc
            # scores the one blank class): one subtraction per class and chunk.
            per_class: dict[int, torch.Tensor] = {}
            for i, c in enumerate(tok):
                per_class[c] = ob[..., i] if c not in per_class else per_class[c] + ob[..., i]
            for t0, t1 in _chunks(tb, ub, V):
                if half:
                    gc = gcw = torch.exp(x[t0:t1].to(acc) - m[t0:t1, :, None])
                    gc.mul_(w[t0:t1, :, None])
                else:
                    # Whole rows where the blocks are views of one joint (the duration
                    # columns are overwritten below).
                    gcw = gr[t0:t1] if gr is not None else g[t0:t1]
                    gcw.mul_(w[t0:t1, :, None].to(gcw.dtype))
                    gc = gcw[..., :V] if gr is not None else gcw
                for c, o in per_class.items():
                    gc[..., c] -= o[t0:t1].to(gc.dtype)
                if ub:
                    gc[:, :ub].scatter_add_(2, idx.expand(t1 - t0, ub, 1),
                                            -oe_tok[t0:t1, :, None].to(gc.dtype))
                if clamp > 0:
                    gcw.clamp_(-clamp, clamp)
                if grad_scale != 1.0:
                    gcw.mul_(grad_scale)
                if half:
                    g[t0:t1].copy_(gc)
        else:
            # The true derivative: minus the occupation of the arcs scoring each entry
            # (the clamp and the scale act on those values directly).
            g.zero_()
            per_class = {}
            for i, c in enumerate(tok):  # TDT: several blank arcs score the one blank class
                per_class[c] = ob[..., i] if c not in per_class else per_class[c] + ob[..., i]
            oe_c = oe_tok.clamp(max=clamp) if clamp > 0 else oe_tok
            for c, o in per_class.items():
                o = o.clamp(max=clamp) if clamp > 0 else o
                g[..., c] = -(o * grad_scale).to(g.dtype)
            oe_c = oe_c * grad_scale
            if ub:
                g[:, :ub].scatter_(2, idx.expand(tb, ub, 1), -oe_c[..., None].to(g.dtype))
        if D:
            gd.copy_(g_dur)
    return loss
