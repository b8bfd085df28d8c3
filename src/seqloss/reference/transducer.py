r"""Transducer losses in pure PyTorch: the lattice recursion, and RNN-T on top of it.

This module is the reference and, in its docstrings, the **kernel interface** that
every transducer backend exposes with the same names and signatures
(``seqloss.kernels.numba_cpu.transducer``, ``seqloss.kernels.triton_cuda.transducer``):

1. ``transducer_lattice(arc_blank, arc_emit, logit_lengths, target_lengths,
   blank_durations, emit_durations, compute_occupations)
   -> (log_likelihood, occ_blank, occ_emit)``: the core recursion. It knows
   nothing of logits, vocabularies or log-softmax; every transducer flavour
   (RNN-T, multi-blank, TDT, pruned) only builds different arc scores for it
   (a *prologue*) and maps the arc occupations back to its own gradient (an
   *epilogue*).
2. ``rnnt_loss_forward(logits, targets, logit_lengths, target_lengths, blank,
   clamp, fused_log_softmax, fastemit_lambda, compute_grad, grad_buffer, grad_scale)
   -> (loss, grad)``: RNN-T = prologue + ``transducer_lattice`` + epilogue.

The lattice
-----------
For sequence ``b`` with ``T_b`` frames and ``U_b`` target labels, the states are
``(t, u)`` with ``0 <= t <= T_b``, ``0 <= u <= U_b``; ``alpha(0, 0) = 0`` and the
final state is ``(T_b, U_b)``. Arcs leave frames ``t < T_b`` only:

* blank-like arc ``i`` (score ``arc_blank[b, t, u, i]``):
  ``(t, u) -> (t + blank_durations[i], u)``, allowed when ``t + d_i <= T_b``;
* emission arc ``j`` (score ``arc_emit[b, t, u, j]``):
  ``(t, u) -> (t + emit_durations[j], u + 1)``, allowed when ``u < U_b`` and
  ``t + d_j < T_b`` (an emission never ends the utterance: NeMo's multi-blank
  and TDT end on a blank-like arc), or ``t + d_j <= T_b`` with ``emit_can_end``
  (k2's "modified" topology, where a path may end on an emission)::

    alpha(t, u) = logsumexp( { alpha(t - d_i, u)     + arc_blank[t - d_i, u, i]     }_i
                           u { alpha(t - d_j, u - 1) + arc_emit[t - d_j, u - 1, j]  }_j )
    beta(t, u)  = logsumexp( { arc_blank[t, u, i] + beta(t + d_i, u)     }_i
                           u { arc_emit[t, u, j]  + beta(t + d_j, u + 1) }_j ),  beta(T_b, U_b) = 0
    log_likelihood[b] = alpha(T_b, U_b)       (-inf when T_b == 0: no frame, no path)
    occ_blank[b, t, u, i] = exp(alpha(t, u) + arc_blank[t, u, i] + beta(t + d_i, u) - log_likelihood[b])
    occ_emit[b, t, u, j]  = exp(alpha(t, u) + arc_emit[t, u, j]  + beta(t + d_j, u + 1) - log_likelihood[b])

An occupation is the posterior probability that a path takes the arc, i.e.
``d log_likelihood / d arc_score``. Blank durations must be ``>= 1`` and emission
durations ``>= 0``; every arc advances ``t + u``, so anti-diagonals are
independent (the reference iterates over them; a GPU kernel can too).

RNN-T (Graves, 2012) is ``blank_durations = (1,)``, ``emit_durations = (0,)``,
``arc_blank[t, u] = log p(blank | t, u)``, ``arc_emit[t, u] = log p(y_{u+1} | t, u)``.
Multi-blank RNN-T adds blank-like arcs (the big blanks' durations); TDT uses
``blank_durations = durations \ {0}`` and ``emit_durations = durations``, adding the
duration log-probabilities to the arc scores; the pruned RNN-T scatters its
``(B, T, s_range)`` window (first ``u`` of frame ``t`` at ``ranges[b, t, 0]``) into
the ``(B, T, U+1)`` arc grids with ``-inf`` outside, and gathers occupations back.

Conventions shared by every backend
-----------------------------------
* Arc tensors are ``(B, T, U+1, D)`` (``D`` arcs of the kind per state), float32
  or float64 (the accumulation dtype; float64 only for float64 inputs).
  Entries outside a sequence's valid arcs (``t >= T_b``, ``u > U_b``, emissions at
  ``u = U_b``, arcs landing past their limit) are never read and may hold
  anything, NaN included. Occupations there are exactly 0, and so is every
  occupation of a sequence with ``log_likelihood = -inf`` (infeasible).
* The recursion uses a guarded logaddexp: ``-inf`` is an exact zero, no epsilon.
* NaN/``+inf`` detection is the prologue's job (it reads every logit anyway):
  such a sequence gets a NaN loss and a NaN gradient on the region it reads
  (``t < T_b``, ``u <= U_b``, every class); padding gets exactly 0.
"""

from __future__ import annotations

import torch


NEG_INF = float("-inf")
NAN = float("nan")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


from ..transducer.lattice.reference import transducer_lattice  # noqa: E402,F401


# --------------------------------------------------------------------------- RNN-T
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
    for b, (tb, ub) in enumerate(zip(Tl.tolist(), Ul.tolist())):
        out[b, :tb, : ub + 1] = logits[off[b] : off[b] + tb * (ub + 1)].reshape(tb, ub + 1, -1)
    return out


def _from_padded(grad: torch.Tensor, Tl: torch.Tensor, Ul: torch.Tensor) -> torch.Tensor:
    parts = [grad[b, :tb, : ub + 1].reshape(tb * (ub + 1), -1) for b, (tb, ub) in
             enumerate(zip(Tl.tolist(), Ul.tolist()))]
    if not parts:
        return grad.new_zeros((0, grad.shape[-1]))
    return torch.cat(parts, 0)


def rnnt_loss_forward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    clamp: float,
    fused_log_softmax: bool,
    fastemit_lambda: float,
    compute_grad: bool,
    grad_buffer: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence RNN-T loss and its gradient (prologue + lattice + epilogue).

    Args:
        logits: padded ``(B, T, U+1, V)`` or packed ``(sum_b T_b (U_b+1), V)`` (rows of
            sequence ``b`` in ``(t, u)`` row-major order, sequences in batch order),
            any float dtype and layout. Log-probabilities if not ``fused_log_softmax``.
        targets: ``(B, S)`` int64, ``S >= max U_b``; entries past ``U_b`` are never read.
        logit_lengths, target_lengths: ``(B,)`` int64, validated (padded: ``T_b <= T``,
            ``U_b <= U``; packed: the rows add up).
        blank: blank index in ``[0, V)``; no target equals it.
        clamp: ``> 0``: clamp each gradient element to ``[-clamp, clamp]``.
        fused_log_softmax: ``logits`` are raw logits (log-softmax taken inside).
        fastemit_lambda: FastEmit ``λ``: emission arcs' occupations count ``1 + λ``
            times in the gradient, and the loss is ``-(1 + λ) log p``.
        compute_grad: also return the gradient (else an empty tensor).
        grad_buffer: optional tensor shaped and typed like ``logits`` to write the
            gradient into (may be ``logits`` itself: the in-place mode); ``None``
            allocates one.
        grad_scale: multiplies the returned gradient after the clamp (the ``"mean"``
            reduction's ``1/B``, folded in so the backward need not copy it).

    Returns:
        ``loss (B,)`` float32 (float64 for float64 input): ``-(1+λ) log p(y|x)``,
        ``+inf`` when infeasible (incl. ``T_b = 0``), NaN when a read logit is NaN or
        ``+inf``. ``grad`` shaped and typed like ``logits``: ``d loss_b / d logits``
        with the clamp applied, times ``grad_scale``, zero on padding (``t >= T_b``, ``u > U_b``) and for
        infeasible sequences, NaN on the read region of a NaN sequence.

    Fused gradient (per state ``(t, u)``, ``o_b``/``o_e`` the blank/emission
    occupations, ``s = softmax(logits[b, t, u])``)::

        grad[v] = s[v] (o_b + (1+λ) o_e) - o_b [v = blank] - (1+λ) o_e [v = y_{u+1}]

    Not fused: ``grad[blank] = -o_b``, ``grad[y_{u+1}] = -(1+λ) o_e``, 0 elsewhere.

    The reference works in float64 on a padded copy (it materializes the
    log-softmax; the memory rules bind the fast backends, not the oracle).
    """
    packed = logits.dim() == 2
    device = logits.device
    out_dtype = _acc_dtype(logits.dtype)
    acc = torch.float64
    Tl = logit_lengths.to(device)
    Ul = target_lengths.to(device)
    B = Tl.shape[0]
    x = _to_padded(logits.to(acc), Tl, Ul) if packed else logits.to(acc)
    _, T, U1, V = x.shape
    U = U1 - 1
    tg = targets.to(device)
    if tg.shape[1] < U:
        tg = torch.cat([tg, tg.new_zeros(B, U - tg.shape[1])], 1)
    tg = tg[:, :U]

    tt = torch.arange(T, device=device)[None, :, None]
    uu = torch.arange(U1, device=device)[None, None, :]
    valid = (tt < Tl[:, None, None]) & (uu <= Ul[:, None, None])  # the region read
    x = torch.where(valid[..., None], x, 0.0)  # padding is never read, whatever it holds
    row_max = x.amax(-1) if V else x.new_zeros(x.shape[:-1])
    bad = ((~(row_max < float("inf"))) & valid).flatten(1).any(1)

    idx = tg[:, None, :, None].expand(B, T, U, 1)
    x_emit = x[:, :, :U].gather(3, idx)[..., 0] if U else x.new_zeros(B, T, 0)
    if fused_log_softmax:
        # Guarded normalizer: a row of -inf logits has no arc out of it (not NaN).
        m = torch.where(row_max == NEG_INF, 0.0, row_max)
        log_z = torch.log(torch.exp(x - m[..., None]).sum(-1)) + m
        lp_blank = torch.where(log_z == NEG_INF, NEG_INF, x[..., blank] - log_z)
        lz = log_z[:, :, :U]
        lp_emit = torch.where(lz == NEG_INF, NEG_INF, x_emit - lz)
    else:
        lp_blank = x[..., blank]
        lp_emit = x_emit
    arc_blank = lp_blank[..., None]
    arc_emit = torch.cat([lp_emit, torch.full_like(lp_blank[:, :, :1], NEG_INF)], 2)[..., None]
    ll, occ_b, occ_e = transducer_lattice(arc_blank, arc_emit, Tl, Ul, (1,), (0,), compute_grad)
    scale = 1.0 + fastemit_lambda
    loss = -ll * scale
    loss = torch.where(bad, NAN, loss).to(out_dtype)
    if not compute_grad:
        return loss, logits.new_empty(0)

    ob = occ_b[..., 0]
    oe = occ_e[..., 0] * scale
    if fused_log_softmax:
        sm = torch.where(log_z[..., None] == NEG_INF, 0.0, torch.exp(x - log_z[..., None]))
        grad = sm * (ob + oe)[..., None]
    else:
        grad = torch.zeros_like(x)
    grad[..., blank] -= ob
    if U:
        grad[:, :, :U].scatter_add_(3, idx, -oe[:, :, :U, None])
    if clamp > 0:
        grad = grad.clamp(-clamp, clamp)
    if grad_scale != 1.0:
        grad = grad * grad_scale
    grad = torch.where(valid[..., None], grad, 0.0)
    grad = torch.where((bad[:, None, None] & valid)[..., None], NAN, grad)
    if packed:
        grad = _from_padded(grad, Tl, Ul)
    if grad_buffer is not None:
        grad_buffer.copy_(grad)
        return loss, grad_buffer
    return loss, grad.to(logits.dtype)
