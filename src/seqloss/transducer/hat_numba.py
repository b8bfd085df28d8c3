r"""HAT's passes over the logits on CPU, one row at a time in Numba.

Torch's ops make about ten passes over a tile for HAT's arcs and their gradient
(``index_fill``, ``amax``, ``sub``, ``exp``, ``sum``, ...; 25x the fused RNN-T loss's
time at B=8, T=150, U=40, V=1024). Here each row (the ``V`` logits of one ``(t, u)``
state, in L1) is read once, as ``seqloss.transducer.joint.numba_rows`` does for RNN-T:

- forward: the shift ``m`` and ``s = sum exp(x - m)`` over the labels (every class but
  the blank), ``exp(x - m)`` written into the gradient's buffer, and the arcs in
  float64, ``blank = logsigmoid(z_blank)``, ``emit = logsigmoid(-z_blank) + z_y - m -
  log s``;
- backward, in place in that buffer: ``exp(x_c - m) occ_emit / s`` on the labels minus
  ``occ_emit`` at the next label, ``-occ_blank sigmoid(-z_blank) + occ_emit
  sigmoid(z_blank)`` at the blank, then the clamp and the sequence's factor (subnormal
  products flushed to 0).

Rows are addressed by row slices of flat views of the storage, with the tensors' own
strides (unit stride along the classes). Jobs are blocks of frames of one sequence on
the shared pool (``seqloss._core.numba_pool``), each writing only its own rows
(deterministic). A NaN or ``+inf`` in a row makes its sum, hence its arcs, NaN (the
lattice then poisons the sequence).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from .._core import buffers
from .._core.numba_exp import vexp as _exp
from .._core.numba_pool import own_lines, run_jobs

# No "nnan"/"ninf": NaN must survive into the row's sum. "reassoc" vectorizes the sums.
_FM = {"reassoc", "contract", "nsz", "arcp"}
_ROWS_PER_JOB = 2048
_LANES = 16


@njit(inline="always", cache=True, error_model="numpy")
def _logsigmoid(z):
    return min(z, 0.0) - math.log1p(math.exp(-abs(z)))


@njit(inline="always", cache=True, error_model="numpy")
def _sigmoid(z):
    e = math.exp(-abs(z))
    return 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)


@njit(inline="always", cache=True, error_model="numpy")
def _max(x, lo, hi, m, acc):
    """``max(m, x[lo:hi])`` (with NaN: any value; the row's sum finds it). ``_LANES``
    running maxima, an elementwise select LLVM vectorizes (a max reduction it does not,
    without "nnan")."""
    n = lo + (hi - lo) // _LANES * _LANES
    if n > lo:
        for k in range(_LANES):
            acc[k] = x[lo + k]
        for v in range(lo + _LANES, n, _LANES):
            for k in range(_LANES):
                a = x[v + k]
                acc[k] = a if a > acc[k] else acc[k]
        for k in range(_LANES):
            m = acc[k] if acc[k] > m else m
    for v in range(n, hi):
        m = x[v] if x[v] > m else m
    return m


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _forward_job(x, xo, xsb, xst, xsu, g, go, gsb, gst, gsu, write, V, blank, jb, jt0, jt1, Ub,
                 lab, ab, ae, rs, one, job):
    b = jb[job]
    ub = Ub[b]
    acc = np.empty(_LANES, dtype=x.dtype)
    for t in range(jt0[job], jt1[job]):
        for u in range(ub + 1):
            # Row slices, not flat indices: LLVM then vectorizes the loops.
            o = xo + b * xsb + t * xst + u * xsu
            xr = x[o : o + V]
            m = _max(xr, 0, V, xr[0], acc)
            s = one - one
            og = go + b * gsb + t * gst + u * gsu
            gr = g[og : og + V] if write else g[0:0]
            if not xr[blank] >= m:
                # The max is a label's (or the row holds NaN): one loop over the whole
                # row, then the blank's term taken out. Exact enough: the labels' sum is
                # >= 1 (the max's term) and the blank's term < 1, so the subtraction
                # loses at most a bit.
                if write:  # exp(x - m) kept in the gradient's row: the backward rescales it
                    for c in range(V):
                        e = _exp(xr[c] - m)
                        gr[c] = e
                        s += e
                    s -= gr[blank]
                else:
                    for c in range(V):
                        s += _exp(xr[c] - m)
                    s -= _exp(xr[blank] - m)
            else:
                # The blank is the max: shift by the labels' own max instead, so that
                # their sum neither underflows nor needs the blank's term removed.
                m = xr[1] if blank == 0 else xr[0]
                m = _max(xr, 0, blank, m, acc)
                m = _max(xr, blank + 1, V, m, acc)
                if write:
                    for c in range(blank):
                        e = _exp(xr[c] - m)
                        gr[c] = e
                        s += e
                    for c in range(blank + 1, V):
                        e = _exp(xr[c] - m)
                        gr[c] = e
                        s += e
                else:
                    for c in range(blank):
                        s += _exp(xr[c] - m)
                    for c in range(blank + 1, V):
                        s += _exp(xr[c] - m)
            rs[b, t, u] = s
            zb = np.float64(xr[blank])
            ab[b, t, u] = _logsigmoid(zb)
            if u < ub:
                lse = np.float64(m) + math.log(np.float64(s))
                ae[b, t, u] = _logsigmoid(-zb) + np.float64(xr[lab[b, u]]) - lse


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FM)
def _backward_job(x, xo, xsb, xst, xsu, g, go, gsb, gst, gsu, V, blank, jb, jt0, jt1, Ub, lab,
                  rs, ob, oe, emit_scale, clamp, factor, one, tiny, job):
    """``g`` holds ``exp(x - m)`` on the labels' entries of each row read (the forward's)."""
    b = jb[job]
    ub = Ub[b]
    f = factor[b]
    for t in range(jt0[job], jt1[job]):
        for u in range(ub + 1):
            og = go + b * gsb + t * gst + u * gsu
            gr = g[og : og + V]
            occ_b = ob[b, t, u]
            occ_e = oe[b, t, u] * emit_scale if u < ub else 0.0
            k = occ_e / np.float64(rs[b, t, u])
            vy = 0.0
            if u < ub:  # the next label: its softmax times occ_e, minus occ_e
                vy = np.float64(gr[lab[b, u]]) * k - occ_e
            # Products below the smallest normal number are flushed to 0: a matmul reading
            # subnormals (the joint's backward) runs many times slower on x86.
            if clamp > 0:
                kx = one * k
                cx = one * clamp
                fx = one * f
                for c in range(V):
                    v = gr[c] * kx
                    v = min(max(v, -cx), cx) * fx
                    gr[c] = v if abs(v) >= tiny else v * 0
                vy = min(max(vy, -clamp), clamp)
            else:
                kf = one * (k * f)
                for c in range(V):
                    v = gr[c] * kf
                    gr[c] = v if abs(v) >= tiny else v * 0
            if u < ub:
                gr[lab[b, u]] = vy * f
            zb = np.float64(x[xo + b * xsb + t * xst + u * xsu + blank])
            v = -occ_b * _sigmoid(-zb) + occ_e * _sigmoid(zb)
            if clamp > 0:
                v = min(max(v, -clamp), clamp)
            gr[blank] = v * f


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels take ``x``: float32/float64 on CPU, unit stride on the classes,
    a blank and at least one label."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and x.dim() == 4 and x.shape[-1] >= 2 and x.stride(-1) == 1)


def _one(x: torch.Tensor) -> np.floating:
    return np.float32(1.0) if x.dtype == torch.float32 else np.float64(1.0)


def _flat(x: torch.Tensor) -> tuple[np.ndarray, int]:
    n = x.untyped_storage().nbytes() // x.element_size()
    flat = torch.as_strided(x.detach(), (n,), (1,), 0)
    return flat.numpy(), x.storage_offset()


class Plan:
    """The jobs: blocks of about ``_ROWS_PER_JOB`` rows of one sequence."""

    def __init__(self, Tl: list[int], Ul: list[int], T: int, U1: int) -> None:
        jb, jt0, jt1, cost = [], [], [], []
        for b, (tb, ub) in enumerate(zip(Tl, Ul, strict=True)):
            tb, ub = min(max(tb, 0), T), min(max(ub, 0), U1 - 1)
            step = max(1, _ROWS_PER_JOB // (ub + 1))
            for t0 in range(0, tb, step):
                jb.append(b)
                jt0.append(t0)
                jt1.append(min(t0 + step, tb))
                cost.append((jt1[-1] - t0) * (ub + 1))
        self.jb = own_lines(np.array(jb, dtype=np.int64))
        self.jt0 = own_lines(np.array(jt0, dtype=np.int64))
        self.jt1 = own_lines(np.array(jt1, dtype=np.int64))
        self.Ub = own_lines(np.array([min(max(u, 0), U1 - 1) for u in Ul] or [0],
                                     dtype=np.int64))
        self.cost = cost
        self.padded = any(min(max(t, 0), T) < T or min(max(u, 0), U1 - 1) < U1 - 1
                          for t, u in zip(Tl, Ul, strict=True))


def forward(x: torch.Tensor, labels: torch.Tensor, blank: int, plan: Plan, write: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(arc_blank, arc_emit)`` float64 ``(B, T, U+1)`` (``-inf`` where not read), the
    per-row label sums, and with ``write`` the gradient's buffer holding ``exp(x - m)`` on
    the labels of every row read (zero on the rows not read)."""
    B, T, U1, V = x.shape
    arcs = torch.full((2, B, T, U1), float("-inf"), dtype=torch.float64)
    ab, ae = arcs[0], arcs[1]
    rs = torch.empty((B, T, U1), dtype=x.dtype)  # read back only where written
    g = None
    if write:
        # Reused memory (seqloss._core.buffers): a fresh logits-sized buffer costs a page
        # fault per 4 KiB, more than the row passes' own writes.
        g = buffers.empty(x.shape, x.dtype, like=x)
        if g.stride(-1) != 1:
            g = buffers.empty(x.shape, x.dtype)
        if plan.padded:
            g.zero_()
    xf, xo = _flat(x)
    gf, go = _flat(g) if g is not None else (np.zeros(1, dtype=xf.dtype), 0)
    gst = g.stride() if g is not None else (0, 0, 0, 1)
    sb, st, su, _ = x.stride()
    args = (xf, xo, sb, st, su, gf, go, gst[0], gst[1], gst[2], write, V, blank, plan.jb,
            plan.jt0, plan.jt1, plan.Ub, labels.numpy(), ab.numpy(), ae.numpy(), rs.numpy(),
            _one(x))
    run_jobs(_forward_job, args, range(len(plan.cost)), plan.cost)
    return ab, ae, rs, g


def backward(x: torch.Tensor, labels: torch.Tensor, blank: int, plan: Plan, rs: torch.Tensor,
             g: torch.Tensor, ob: torch.Tensor, oe: torch.Tensor, emit_scale: float,
             clamp: float, factor: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to ``x``, in place in the forward's buffer ``g``: zero on
    rows not read, each sequence's clamped gradient times ``factor[b]`` elsewhere (``ob``,
    ``oe``: float64 occupations)."""
    xf, xo = _flat(x)
    gf, go = _flat(g)
    sb, st, su, _ = x.stride()
    gsb, gst, gsu, _ = g.stride()
    args = (xf, xo, sb, st, su, gf, go, gsb, gst, gsu, x.shape[-1], blank, plan.jb, plan.jt0,
            plan.jt1, plan.Ub, labels.numpy(), rs.numpy(),
            ob.detach().double().contiguous().numpy(), oe.detach().double().contiguous().numpy(),
            float(emit_scale), float(clamp), factor.detach().double().contiguous().numpy(),
            _one(x), _one(x) * np.finfo(_one(x).dtype).tiny)
    run_jobs(_backward_job, args, range(len(plan.cost)), plan.cost)
    return g
