r"""Arc tables of the factored-joint losses, and the lattice under them.

k2/fast_rnnt reduce every flavour to ``px (B, S, T[+1])`` (a symbol's score) and
``py (B, S+1, T)`` (the termination symbol's) fed to one recursion. Here the same
scores are laid out as the arcs of ``seqloss.transducer_lattice``, ``(B, T, S+1)``
(time first), with ``arc_emit[b, t, s] = px[b, s, t]`` and
``arc_blank[b, t, s] = py[b, s, t]``:

* ``regular``: an emission stays on its frame (``emit_durations=(0,)``); the path
  ends on the last frame's termination symbol. k2's ``px[:, :, T]`` column
  (``-inf``) is the lattice's own rule that no emission leaves frame ``T_b``.
* ``modified``: an emission advances one frame (``emit_durations=(1,)``) and may
  end the path (``emit_can_end=True``): every frame emits one symbol or the
  termination symbol.
* ``constrained``: as ``modified``, but an emission of ``y`` on frame ``t`` also
  pays the termination symbol from the next context on the same frame:
  ``arc_emit[t, s] += arc_blank[t, s + 1]`` (k2's ``px += py[:, 1:]``).

A boundary ``[s_begin, t_begin, s_end, t_end]`` is a sub-lattice: the arcs are
shifted so that ``(t_begin, s_begin)`` becomes the lattice's ``(0, 0)``, with
``T_b = t_end - t_begin`` and ``U_b = s_end - s_begin``; the occupations are
shifted back. The delay penalty (k2 issue 955) adds
``delay_penalty * ((t_end - 1) / 2 - t)`` to every emission on absolute frame ``t``.

No epsilon anywhere: the additive joint's normalizer
``log sum_c exp(am[t, c] + lm[s, c])`` is ``seqloss.logmmexp(am, lm^T)``, exact
at any scale (k2 adds ``finfo.tiny`` to a max-shifted matmul, which underflows
when the two maxima sit on different classes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._core import checks
from ..._core.dispatch import kernel_module
from ..._core.logspace import log_normalizer, softmax_given, sub_normalizer
from ..._core.ops import _is_traced
from ..lattice.op import lattice_decl

NEG_INF = float("-inf")


def _logmmexp(a: Tensor, b: Tensor, backend: str) -> Tensor:
    if a.shape[0] == 0 or a.shape[1] == 0 or b.shape[2] == 0:  # an empty result
        return torch.logsumexp(a[:, :, :, None] + b[:, None, :, :], dim=2)
    from ...logmm import logmmexp  # the logmm family (imported at call time: no cycle)

    return logmmexp(a, b, backend=backend)


class _FlushSubnormalGrad(torch.autograd.Function):
    """Identity; the backward sets gradient entries below ``finfo.tiny`` in magnitude to 0.

    The normalizer's incoming gradient is a sum of arc occupations, most of them far
    below float32's normal range on a long lattice; subnormal operands make CPU
    matmuls (logmmexp's backward) 30-80x slower (measured: 6 ms with normal values,
    171-524 ms with subnormal ones, B=8 T=300 S=60 C=500). The change is below
    ``finfo.tiny`` per entry, what flush-to-zero hardware does anyway.
    """

    @staticmethod
    def forward(x):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass  # the setup_context form, for torch.func

    @staticmethod
    def backward(ctx, g):
        return g.masked_fill(g.abs() < torch.finfo(g.dtype).tiny, 0.0)


def mask_padding(x: Tensor, lens: Tensor, dim: int, lo_col: int, n_col: int, extra: int) -> Tensor:
    """``x`` with 0 at the positions of axis ``dim`` outside ``[lo, lo + n + extra)``.

    Padding may hold anything (NaN included) and must get exactly zero gradient; a
    normalizer mixes a whole frame (row) and its backward multiplies the zero
    occupation there by ``exp(NaN)``, so the padding is replaced before, by
    ``where`` (whose backward gives exactly 0 there).
    """
    n = x.shape[dim]
    if checks.host_side(lens) and not _is_traced(lens) and not _is_traced(x):
        # No padding (every sequence spans the whole axis): nothing to replace. Two
        # (B, T, C)-sized passes less, and as many in the backward (~1.5 ms of the
        # pruned pipeline, B=8 T=300 S=60 C=500).
        if all(r[lo_col] == 0 and r[n_col] + extra == n for r in lens.tolist()):
            return x
    i = torch.arange(n, device=x.device)[None, :]
    lo = lens[:, lo_col:lo_col + 1]
    keep = (i >= lo) & (i < lo + lens[:, n_col:n_col + 1] + extra)  # (B, n)
    keep = keep.reshape(keep.shape[0], *([1] * (dim - 1)), n, *([1] * (x.dim() - dim - 1)))
    return torch.where(keep, x, x.new_zeros(()))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half inputs are scored in float32 (the loss is float32 for them, API.md)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _constrain(emit: Tensor, blank: Tensor) -> Tensor:
    # k2's "constrained": px += py[:, 1:] -- the emission pays the forced termination
    # symbol of the next context on the same frame. Row S emits nothing (-inf pad).
    pad = blank.new_full((*blank.shape[:2], 1), NEG_INF)
    return emit + torch.cat((blank[:, :, 1:], pad), dim=2)


def delay_penalty_term(delay_penalty: float, lens: Tensor, T: int, dtype: torch.dtype) -> Tensor:
    """``(B, T, 1)``: ``delay_penalty * ((t_end - 1) / 2 - t)`` on absolute frame ``t``."""
    t_end = (lens[:, 1] + lens[:, 3]).to(dtype)
    t = torch.arange(T, device=lens.device, dtype=dtype)
    return (delay_penalty * ((t_end[:, None] - 1) / 2 - t[None, :]))[:, :, None]


def simple_arcs(lm: Tensor, am: Tensor, sym_ext: Tensor, term: int, rnnt_type: str,
                backend: str) -> tuple[Tensor, Tensor]:
    """``(arc_emit, arc_blank)``, ``(B, T, S+1)``, of the additive joint ``am[t] + lm[s]``."""
    B, T, _ = am.shape
    S1 = lm.shape[1]
    norm = _logmmexp(am, lm.transpose(1, 2), backend)  # (B, T, S+1): log sum_c e^{am + lm}
    if norm.requires_grad:
        norm = _FlushSubnormalGrad.apply(norm)
    # One gather per side (each gather's backward is a zero-filled input-sized scatter):
    # sym_ext's last column is the termination symbol, so am_sym[..., S] is am[..., term].
    am_sym = am.gather(2, sym_ext[:, None, :].expand(B, T, S1))  # am[b, t, y_{s+1}]
    cols = torch.stack((sym_ext, torch.full_like(sym_ext, term)), dim=2)
    lm_g = lm.gather(2, cols).transpose(1, 2)  # (B, 2, S+1): lm[b, s, y_{s+1}], lm[b, s, term]
    # norm = -inf: an am frame or an lm row of -inf, every class -inf; no arc leaves the
    # state (-inf, not -inf - -inf: logspace's rule)
    emit = sub_normalizer(am_sym + lm_g[:, :1], norm)
    blank = sub_normalizer(am_sym[:, :, S1 - 1:] + lm_g[:, 1:], norm)
    if rnnt_type == "constrained":
        emit = _constrain(emit, blank)
    return emit, blank


def _log_unigram(log_probs: Tensor, read: Tensor) -> Tensor:
    """``log mean_{(b, s) read} softmax(lm[b, s])``, ``(C,)``, in log space throughout.

    The mean of the probabilities underflows (a class at ``lm - max = -110`` has
    ``p = 0`` in float32, so ``log 0`` and a NaN gradient); here each class is a
    log-sum-exp over the read positions, shifted by its own maximum. A class no read
    position allows (``-inf`` everywhere) is ``-inf`` with exactly zero gradient:
    torch's ``logsumexp`` would give it ``exp(-inf - -inf)``, NaN.
    """
    C = log_probs.shape[2]
    # where(), not a product: a padding row may hold anything (NaN included).
    x = torch.where(read[:, :, None], log_probs, NEG_INF).reshape(-1, C)
    m = x.detach().amax(dim=0) if x.shape[0] else x.new_zeros(C)
    m = torch.where(torch.isfinite(m), m, 0.0)  # the sum's value does not depend on it
    total = torch.exp(x - m).sum(dim=0)
    some = total > 0
    log_total = torch.log(torch.where(some, total, 1.0)) + m
    count = read.sum().clamp(min=1).to(x.dtype)
    return torch.where(some, log_total, NEG_INF) - torch.log(count)


def smoothed_arcs(lm: Tensor, am: Tensor, sym_ext: Tensor, term: int, rnnt_type: str,
                  lm_only_scale: float, am_only_scale: float, lens: Tensor, backend: str
                  ) -> tuple[Tensor, Tensor]:
    r"""k2's smoothed arcs: the log-linear mix of the joint, LM-only and AM-only scores.

    ``(1 - l - a) * joint + l * (lm log-softmax) + a * (am + log unigram, normalized)``
    where the unigram is the LM's softmax averaged over every position a sequence
    reads (``s_begin <= s <= s_end``; with no boundary, every position of the batch,
    as k2), computed in log space (``_log_unigram``). A term whose scale is 0 is left
    out (k2 multiplies by ``1e-20`` instead, so that ``0 * -inf`` is not NaN).
    """
    B, T, _ = am.shape
    S1 = lm.shape[1]
    combined = 1.0 - lm_only_scale - am_only_scale
    terms_e, terms_b = [], []
    am_sym = am.gather(2, sym_ext[:, None, :].expand(B, T, S1))
    lm_sym = lm.gather(2, sym_ext[:, :, None]).transpose(1, 2)  # (B, 1, S+1)
    if combined != 0.0:
        emit, blank = simple_arcs(lm, am, sym_ext, term, "regular", backend)
        terms_e.append(combined * emit)
        terms_b.append(combined * blank)
    # Rows of -inf (an lm row, an am frame): log-probabilities -inf, softmax 0 (their
    # share of the unigram), zero gradient (logspace's rule).
    lm_lse = log_normalizer(lm, dim=2)  # (B, S+1)
    if lm_only_scale != 0.0:
        terms_e.append(lm_only_scale * sub_normalizer(lm_sym, lm_lse[:, None, :]))
        terms_b.append(lm_only_scale * sub_normalizer(lm[:, None, :, term], lm_lse[:, None, :]))
    if am_only_scale != 0.0:
        s = torch.arange(S1, device=lm.device)[None, :]
        read = (s >= lens[:, :1]) & (s <= lens[:, :1] + lens[:, 2:3])  # (B, S+1)
        log_uni = _log_unigram(sub_normalizer(lm, lm_lse[:, :, None]), read)
        am_norm = log_normalizer(am + log_uni, dim=2)  # (B, T)
        terms_e.append(am_only_scale * sub_normalizer(am_sym + log_uni[sym_ext][:, None, :],
                                                      am_norm[:, :, None]))
        terms_b.append(am_only_scale * sub_normalizer(am[:, :, term, None] + log_uni[term],
                                                      am_norm[:, :, None]).expand(B, T, S1))
    emit = terms_e[0]
    for x in terms_e[1:]:
        emit = emit + x
    blank = terms_b[0]
    for x in terms_b[1:]:
        blank = blank + x
    blank = blank.expand(B, T, S1)
    if rnnt_type == "constrained":
        emit = _constrain(emit, blank)
    return emit, blank


class _WindowLogProbs(torch.autograd.Function):
    """``(log_softmax(logits)[..., sym], log_softmax(logits)[..., term])`` of a pruned joint.

    Only two classes of each row are read, so the log-softmax is never materialized:
    the forward keeps the row's log-normalizer, the backward is
    ``-(g_x + g_y) softmax + g_x [c = sym] + g_y [c = term]`` in one logits-sized
    buffer. A row whose two incoming gradients are 0 (padding, unreachable states)
    gets exactly 0, whatever it holds (NaN included). A row holding ``+inf`` gives NaN
    arcs (the API's rule), also when the ``+inf`` sits in a class neither arc takes.
    """

    @staticmethod
    def forward(logits, sym, term, rows):
        if rows:  # the Numba backend's one read of the window (see _window_rows)
            px, py, lz = kernel_module("joint", "numba").window_arcs(logits, sym[..., 0], term)
            return px, py, lz.to(logits.dtype)
        lse = torch.logsumexp(logits, dim=3)  # (B, T, R); -inf for a row of -inf
        # a row of -inf has no arc out of it: -inf, not -inf - -inf (logspace's rule)
        px = sub_normalizer(logits.gather(3, sym)[..., 0], lse)
        py = sub_normalizer(logits[..., term], lse)
        # lse is +inf only for a row holding +inf; finite - inf would be a silent -inf arc
        pinf = lse == float("inf")
        nan = torch.full((), float("nan"), dtype=px.dtype, device=px.device)
        px, py = torch.where(pinf, nan, px), torch.where(pinf, nan, py)
        return px, py, lse  # lse: saved, not differentiable (the setup_context form)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, sym, term, _ = inputs
        lse = output[2]
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(logits, sym, lse)
        ctx.term = term
        # A row holding NaN or +inf has a non-finite normalizer; only such rows can turn a
        # zero incoming gradient into NaN (0 * exp(NaN)), so only they are masked.
        # Under tracing (torch.compile, torch.func) or on a device, always mask: no value read.
        if lse.numel() and checks.host_side(lse) and not _is_traced(lse):
            ctx.nonfinite_rows = not bool(torch.isfinite(lse).all())
        else:
            ctx.nonfinite_rows = bool(lse.numel())

    @staticmethod
    def backward(ctx, gx, gy, _glse):
        logits, sym, lse = ctx.saved_tensors
        gx = torch.zeros_like(lse) if gx is None else gx
        gy = torch.zeros_like(lse) if gy is None else gy
        w = gx + gy
        # softmax 0 on a row of -inf, not exp(-inf - -inf) = NaN (logspace's rule)
        grad = softmax_given(logits, lse[..., None]).mul_(-w[..., None])
        grad.scatter_add_(3, sym, gx[..., None])
        grad[..., ctx.term] += gy
        if ctx.nonfinite_rows:
            grad.masked_fill_(((w == 0) & (gx == 0) & ~torch.isfinite(lse))[..., None], 0.0)
        return grad, None, None, None


def _window_rows(logits: Tensor, backend: str) -> bool:
    """Whether ``_WindowLogProbs``'s forward reads the window with the Numba backend's row
    kernel (``window_arcs``: one pass, where torch's ``logsumexp`` makes four over a
    window-sized temporary; B=8 T=300 R=5 C=500, 2 threads: 2.8 -> 2.2 ms). The backward
    stays torch's: the joint's Numba epilogue on the window (``joint_tile_grad``), 15%
    faster alone, is no faster inside the pruned pipeline's backward, between torch's
    parallel ops (on torch's own OpenMP team too: the pipeline 31.5-33.8 ms against
    31.0-32.4)."""
    if backend != "numba" or _is_traced(logits) or logits.device.type != "cpu":
        return False
    return (logits.dtype in (torch.float32, torch.float64) and logits.numel() > 0
            and (logits.shape[3] <= 1 or logits.stride(3) == 1))


def _label_lse(logits: Tensor, term: int) -> Tensor:
    """``log sum_{c != term} exp(logits[..., c])``; ``-inf`` when no label is left (C = 1)."""
    lo = torch.logsumexp(logits[..., :term], dim=-1)  # an empty slice gives -inf
    hi = torch.logsumexp(logits[..., term + 1:], dim=-1)
    return torch.logaddexp(lo, hi)


def hat_log_probs(logits: Tensor, term: int) -> Tensor:
    """Every class's HAT log-probability, ``(..., C)`` (for reports; the loss reads two)."""
    zb = logits[..., term]
    lp = logits - _label_lse(logits, term)[..., None] + F.logsigmoid(-zb)[..., None]
    lp[..., term] = F.logsigmoid(zb)
    return lp


class _HatWindowLogProbs(torch.autograd.Function):
    r"""The HAT arcs of a pruned joint (k2's ``use_hat_loss``), ``(px, py)``, ``(B, T, R)``.

    ``py = logsigmoid(z_b)`` and ``px = z_y - log sum_{c != b} exp(z_c) + logsigmoid(-z_b)``
    with ``z_b = logits[..., term]``: the blank is a Bernoulli, the labels a softmax over
    every class but the blank, scaled by ``1 - sigmoid(z_b)``. ``logsigmoid(-z_b)`` is
    ``log(1 - sigmoid(z_b))`` without cancellation (``log1p(-exp(logsigmoid(z_b)))`` is
    ``-inf`` from ``z_b`` = 38 in float64, 17.5 in float32, and inexact well before). A
    row whose labels are all ``-inf`` has ``px = -inf`` (no label can be emitted; its
    blank stays valid), and so does a window position whose symbol is the termination
    symbol (only padding and the final row, never read). A row holding ``+inf`` gives NaN
    arcs (the API's rule for ``+inf`` input), NaN gives NaN. The backward, in one
    logits-sized buffer::

        d/dz_c = -g_x softmax_labels(z)_c + g_x [c = y]   (c != b)
        d/dz_b = g_y sigmoid(-z_b) - g_x sigmoid(z_b)

    and exactly 0 on a row whose two incoming gradients are 0 (whatever it holds).
    """

    @staticmethod
    def forward(logits, sym, term):
        zb = logits[..., term]
        lse = _label_lse(logits, term)  # (B, T, R)
        px = sub_normalizer(logits.gather(3, sym)[..., 0], lse) + F.logsigmoid(-zb)
        px = torch.where(sym[..., 0] == term, NEG_INF, px)
        py = F.logsigmoid(zb)
        pinf = (lse == float("inf")) | (zb == float("inf"))
        nan = torch.full((), float("nan"), dtype=px.dtype, device=px.device)
        return torch.where(pinf, nan, px), torch.where(pinf, nan, py), lse

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, sym, term = inputs
        lse = output[2]
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(logits, sym, lse)
        ctx.term = term
        # As _WindowLogProbs: only a row with a non-finite label normalizer or blank logit
        # can turn zero incoming gradients into NaN; mask always when no value can be read.
        if lse.numel() and checks.host_side(lse) and not _is_traced(lse):
            zb = logits[..., term]
            ctx.nonfinite_rows = not bool((torch.isfinite(lse) & torch.isfinite(zb)).all())
        else:
            ctx.nonfinite_rows = bool(lse.numel())

    @staticmethod
    def backward(ctx, gx, gy, _glse):
        logits, sym, lse = ctx.saved_tensors
        term = ctx.term
        gx = torch.zeros_like(lse) if gx is None else gx
        gy = torch.zeros_like(lse) if gy is None else gy
        no_label = lse == NEG_INF
        # px is a constant -inf there: no gradient flows through it.
        gx = torch.where((sym[..., 0] == term) | no_label, 0.0, gx)
        # softmax over the labels; a row with none has softmax 0 (not exp(-inf + inf)).
        grad = softmax_given(logits, lse[..., None]).mul_(-gx[..., None])
        grad.scatter_add_(3, sym, gx[..., None])
        zb = logits[..., term]
        grad[..., term] = gy * torch.sigmoid(-zb) - gx * torch.sigmoid(zb)
        if ctx.nonfinite_rows:
            bad = ~(torch.isfinite(lse) | no_label) | ~torch.isfinite(zb)
            grad.masked_fill_(((gx == 0) & (gy == 0) & bad)[..., None], 0.0)
        return grad, None, None


def pruned_arcs(logits: Tensor, ranges: Tensor, sym_ext: Tensor, term: int, rnnt_type: str,
                hat: bool = False, backend: str = "reference") -> tuple[Tensor, Tensor]:
    """The pruned joint's window scattered into ``(B, T, S+1)`` arcs, ``-inf`` outside it.

    ``logits[b, t, k]`` is the joint at symbol position ``ranges[b, t, k]``
    (consecutive from ``ranges[b, t, 0]``); ``hat``: the HAT normalization
    (``_HatWindowLogProbs``) instead of the log-softmax; ``backend``: the resolved
    backend (see ``_window_rows``).
    """
    B, T, R, _ = logits.shape
    S1 = sym_ext.shape[1]
    win_sym = sym_ext.gather(1, ranges.reshape(B, T * R)).reshape(B, T, R, 1)
    if hat:
        px, py, _ = _HatWindowLogProbs.apply(logits, win_sym, term)
    else:
        px, py, _ = _WindowLogProbs.apply(logits, win_sym, term, _window_rows(logits, backend))
    full = logits.new_full((B, T, S1), NEG_INF)
    emit = full.scatter(2, ranges, px)
    blank = full.scatter(2, ranges, py)
    if rnnt_type == "constrained":
        emit = _constrain(emit, blank)
    return emit, blank


def _shift(x: Tensor, s0: Tensor, t0: Tensor) -> Tensor:
    """``x[b, t + t0_b, s + s0_b]`` (clamped: what falls off is never read)."""
    B, T, S1 = x.shape
    ti = (torch.arange(T, device=x.device)[None, :] + t0[:, None]).clamp(max=T - 1)
    x = x.gather(1, ti[:, :, None].expand(B, T, S1))
    si = (torch.arange(S1, device=x.device)[None, :] + s0[:, None]).clamp(max=S1 - 1)
    return x.gather(2, si[:, None, :].expand(B, T, S1))


def _unshift(x: Tensor, s0: Tensor, t0: Tensor) -> Tensor:
    """The inverse of :func:`_shift` on occupations (zero before the begins)."""
    B, T, S1 = x.shape
    ti = torch.arange(T, device=x.device)[None, :] - t0[:, None]
    si = torch.arange(S1, device=x.device)[None, :] - s0[:, None]
    x = x.gather(1, ti.clamp(min=0)[:, :, None].expand(B, T, S1))
    x = x.gather(2, si.clamp(min=0)[:, None, :].expand(B, T, S1))
    keep = (ti >= 0)[:, :, None] & (si >= 0)[:, None, :]
    return torch.where(keep, x, x.new_zeros(()))


def _has_begins(lens: Tensor, boundary_given: bool) -> bool:
    if not boundary_given:
        return False
    if torch.compiler.is_compiling() or lens.device.type != "cpu":
        return True  # no host read: always shift
    return bool((lens[:, :2] != 0).any())


def run_lattice(emit: Tensor, blank: Tensor, lens: Tensor, rnnt_type: str, boundary_given: bool,
                backend: str, validate: bool, occupations: bool
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(log_likelihood (B,), occ_emit, occ_blank)``, occupations ``(B, T, S+1)`` or None."""
    shifted = _has_begins(lens, boundary_given) and emit.shape[1] > 0
    s0, t0 = lens[:, 0], lens[:, 1]
    if shifted:
        emit, blank = _shift(emit, s0, t0), _shift(blank, s0, t0)
    need = occupations or (torch.is_grad_enabled() and (emit.requires_grad or blank.requires_grad))
    ed = [0] if rnnt_type == "regular" else [1]
    ll, ob, oe = lattice_decl(blank[..., None], emit[..., None], lens[:, 3], lens[:, 2], [1],
                              ed, rnnt_type != "regular", backend, bool(need), bool(validate))
    if not occupations:
        return ll, None, None
    # Fresh tensors: the lattice's backward may hand its saved occupations on as they are.
    oe, ob = oe.detach()[..., 0], ob.detach()[..., 0]
    if shifted:
        return ll, _unshift(oe, s0, t0), _unshift(ob, s0, t0)
    return ll, oe.clone(), ob.clone()
