"""Simple, smoothed and pruned RNN-T (k2's factored-joint losses) against path enumeration.

The oracle here enumerates k2's own lattice (``p[s, t]`` from ``(s_begin, t_begin)`` to
``(s_end, t_end)``, rnnt_loss.py's docstrings) on scores built from the broadcast joint
``log_softmax(am[t] + lm[s])`` in float64: no logmmexp, no arc shifting, no recursion
shared with the code under test.

Their edges (underflow, narrow windows, unused rows, padding) also against an mpmath
unigram, a loop-by-loop port of fast_rnnt 1.3's ``get_rnnt_prune_ranges`` as its source
reads, and float64 on the same inputs.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqloss
from seqloss import (
    InputError,
    do_rnnt_pruning,
    get_rnnt_prune_ranges,
    rnnt_loss_pruned,
    rnnt_loss_simple,
    rnnt_loss_smoothed,
)

TYPES = ("regular", "modified", "constrained")
F64 = torch.float64


# --------------------------------------------------------------------------- oracle
def k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type):
    """log sum over k2's paths (s0, t0) -> (s1, t1) of the summed px/py scores (DFS)."""
    scores = []

    def walk(s, t, acc):
        if (s, t) == (s1, t1):
            scores.append(torch.stack(acc).sum() if acc else px.sum() * 0)
            return
        if t >= t1:
            return
        if s < s1:
            if rnnt_type == "regular":
                walk(s + 1, t, [*acc, px[s, t]])
            else:
                walk(s + 1, t + 1, [*acc, px[s, t]])
        walk(s, t + 1, [*acc, py[s, t]])

    walk(s0, t0, [])
    if not scores:
        return px.sum() * 0 + float("-inf")
    return torch.logsumexp(torch.stack(scores), 0)


def _finish_px(px, py, rnnt_type, dp, t1):
    S, T = px.shape
    if rnnt_type == "constrained":
        px = px + py[1:]
    if dp:
        px = px + dp * ((t1 - 1) / 2 - torch.arange(T, dtype=px.dtype))[None, :]
    return px


def oracle_simple(lm, am, symbols, term, boundary, rnnt_type, dp=0.0):
    B, T, C = am.shape
    S = lm.shape[1] - 1
    out = []
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in boundary[b])
        lp = torch.log_softmax(am[b][:, None, :] + lm[b][None, :, :], dim=-1)  # (T, S+1, C)
        px = (torch.stack([lp[:, s, int(symbols[b, s])] for s in range(S)]) if S
              else lp.new_zeros(0, T))
        py = lp[:, :, term].T
        px = _finish_px(px, py, rnnt_type, dp, t1)
        out.append(-k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type))
    return torch.stack(out)


def oracle_smoothed(lm, am, symbols, term, boundary, rnnt_type, ls, as_, dp=0.0):
    B, T, C = am.shape
    S = lm.shape[1] - 1
    rows = [lm[b, int(boundary[b, 0]):int(boundary[b, 2]) + 1] for b in range(B)]
    unigram = torch.cat([torch.softmax(r, -1) for r in rows]).mean(0)  # (C,)
    out = []
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in boundary[b])
        joint = torch.log_softmax(am[b][:, None, :] + lm[b][None, :, :], dim=-1)  # (T, S+1, C)
        lm_only = torch.log_softmax(lm[b], -1)[None].expand(T, S + 1, C)
        am_only = torch.log_softmax(am[b] + unigram.log(), -1)[:, None].expand(T, S + 1, C)
        lp = (1 - ls - as_) * joint + ls * lm_only + as_ * am_only
        px = (torch.stack([lp[:, s, int(symbols[b, s])] for s in range(S)]) if S
              else lp.new_zeros(0, T))
        py = lp[:, :, term].T
        px = _finish_px(px, py, rnnt_type, dp, t1)
        out.append(-k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type))
    return torch.stack(out)


def oracle_pruned(logits, symbols, ranges, term, boundary, rnnt_type, dp=0.0):
    B, T, R, C = logits.shape
    S = symbols.shape[1]
    out = []
    ninf = torch.tensor(float("-inf"), dtype=logits.dtype)
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in boundary[b])
        lp = torch.log_softmax(logits[b], -1)  # (T, R, C)
        ext = [int(v) for v in symbols[b]] + [term]
        px_rows, py_rows = [], []
        for s in range(S + 1):
            pxr, pyr = [], []
            for t in range(T):
                k = s - int(ranges[b, t, 0])
                inside = 0 <= k < R
                pxr.append(lp[t, k, ext[s]] if inside else ninf)
                pyr.append(lp[t, k, term] if inside else ninf)
            px_rows.append(torch.stack(pxr))
            py_rows.append(torch.stack(pyr))
        px = torch.stack(px_rows[:S]) if S else lp.new_zeros(0, T)
        py = torch.stack(py_rows)
        px = _finish_px(px, py, rnnt_type, dp, t1)
        out.append(-k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type))
    return torch.stack(out)


# --------------------------------------------------------------------------- inputs
def _inputs(B=3, T=5, S=3, C=5, term=0, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    am = (scale * torch.randn(B, T, C, generator=g, dtype=F64)).requires_grad_()
    lm = (scale * torch.randn(B, S + 1, C, generator=g, dtype=F64)).requires_grad_()
    ids = [c for c in range(C) if c != term]
    symbols = torch.tensor(ids, dtype=torch.int64)[torch.randint(len(ids), (B, S), generator=g)]
    return am, lm, symbols


def _boundary(rnnt_type, T=5, S=3):
    # full; non-zero begins; ends short of the tensors; both
    rows = [[0, 0, S, T], [1, 1, S, T], [0, 0, S - 1, T - 1]]
    if rnnt_type != "regular":
        rows[2] = [1, 0, S - 1, T - 2]
    return torch.tensor(rows, dtype=torch.int64)


def _grads(loss, *xs):
    return torch.autograd.grad(loss.sum(), xs)


def _random_ranges(B, T, S, R, rnnt_type, seed=0):
    g = torch.Generator().manual_seed(seed)
    step = R if rnnt_type == "regular" else 2
    r = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for t in range(1, T):
            r[b, t] = min(r[b, t - 1] + int(torch.randint(step, (1,), generator=g)), S + 1 - R)
    return r[:, :, None] + torch.arange(R)


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("dp", [0.0, 0.3])
def test_simple_against_path_enumeration(rnnt_type, dp):
    am, lm, symbols = _inputs()
    bnd = _boundary(rnnt_type)
    got = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                           delay_penalty=dp, reduction="none")
    want = oracle_simple(lm, am, symbols, 0, bnd, rnnt_type, dp)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(_grads(got, am, lm), _grads(want, am, lm), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_simple_without_boundary_and_termination_symbol_elsewhere(rnnt_type):
    am, lm, symbols = _inputs(B=2, T=4, S=2, C=4, term=3, seed=1)
    got = rnnt_loss_simple(lm, am, symbols, 3, rnnt_type=rnnt_type, reduction="none")
    full = torch.tensor([[0, 0, 2, 4]] * 2)
    want = oracle_simple(lm, am, symbols, 3, full, rnnt_type)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("scales", [(0.1, 0.1), (0.0, 0.25), (0.3, 0.0)])
def test_smoothed_against_path_enumeration(rnnt_type, scales):
    am, lm, symbols = _inputs(seed=2)
    bnd = _boundary(rnnt_type)
    ls, as_ = scales
    got = rnnt_loss_smoothed(lm, am, symbols, 0, ls, as_, boundary=bnd, rnnt_type=rnnt_type,
                             delay_penalty=0.2, reduction="none")
    want = oracle_smoothed(lm, am, symbols, 0, bnd, rnnt_type, ls, as_, 0.2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(_grads(got, am, lm), _grads(want, am, lm), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("R", [2, 3])
def test_pruned_against_path_enumeration(rnnt_type, R):
    B, T, S, C = 3, 5, 3, 5
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, T, R, C, generator=g, dtype=F64, requires_grad=True)
    _, _, symbols = _inputs(seed=3)
    ranges = _random_ranges(B, T, S, R, rnnt_type, seed=4)
    bnd = _boundary(rnnt_type)
    got = rnnt_loss_pruned(logits, symbols, ranges, 0, boundary=bnd, rnnt_type=rnnt_type,
                           delay_penalty=0.1, reduction="none")
    want = oracle_pruned(logits, symbols, ranges, 0, bnd, rnnt_type, 0.1)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-10, atol=1e-10)
    (gg,) = _grads(got[fin], logits)
    (gw,) = _grads(want[fin], logits)
    torch.testing.assert_close(gg, gw, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_return_grad_is_the_occupation_of_px_and_py(rnnt_type):
    am, lm, symbols = _inputs(seed=5)
    bnd = _boundary(rnnt_type)
    loss, (px_grad, py_grad) = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd,
                                                rnnt_type=rnnt_type, reduction="mean",
                                                return_grad=True)
    B, T, _ = am.shape
    S = symbols.shape[1]
    assert px_grad.shape == (B, S, T + 1 if rnnt_type == "regular" else T)
    assert py_grad.shape == (B, S + 1, T)
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in bnd[b])
        lp = torch.log_softmax(am[b][:, None] + lm[b][None], -1).detach()
        px = torch.stack([lp[:, s, int(symbols[b, s])] for s in range(S)])
        py = lp[:, :, 0].T.clone()
        if rnnt_type == "constrained":
            px = px + py[1:]
        if rnnt_type == "regular":
            px = torch.cat((px, px.new_full((S, 1), float("-inf"))), 1)
        px.requires_grad_()
        py.requires_grad_()
        ll = k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type)
        gx, gy = torch.autograd.grad(ll, (px, py))
        torch.testing.assert_close(px_grad[b], gx, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(py_grad[b], gy, rtol=1e-9, atol=1e-12)


def test_seed_case_is_exact():
    # fast_rnnt 1.3 gives 912.66 here (its max-shifted normalizer underflows to tiny);
    # the truth is -log p(blank) = log 2 on each frame.
    am = torch.tensor([[[0.0, -1000.0]]]).requires_grad_()
    lm = torch.tensor([[[-1000.0, 0.0]]]).requires_grad_()
    symbols = torch.zeros(1, 0, dtype=torch.int64)
    loss = rnnt_loss_simple(lm, am, symbols, 0)
    want = oracle_simple(lm.double(), am.double(), symbols, 0, torch.tensor([[0, 0, 0, 1]]),
                         "regular")
    assert abs(float(want.detach()) - math.log(2)) < 1e-12
    # float32: the arc score is a difference of two values near -1000 (ulp 6e-5)
    torch.testing.assert_close(loss.double(), want[0], rtol=0, atol=2e-4)
    got64 = rnnt_loss_simple(lm.detach().double(), am.detach().double(), symbols, 0)
    torch.testing.assert_close(got64, want[0], rtol=0, atol=1e-12)
    loss.backward()
    assert lm.grad.abs().sum() > 0.1  # fast_rnnt's gradient on lm is zero here
    # a longer case with a symbol, at the same scale
    am = torch.tensor([[[0.0, -1000.0, -3.0]] * 3], dtype=F64)
    lm = torch.tensor([[[-1000.0, 0.0, 1.0], [-1000.0, 0.0, -2.0]]], dtype=F64)
    sym = torch.tensor([[2]])
    for rt in TYPES:
        got = rnnt_loss_simple(lm, am, sym, 0, rnnt_type=rt, reduction="none")
        want = oracle_simple(lm, am, sym, 0, torch.tensor([[0, 0, 1, 3]]), rt)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_large_scale_stays_finite_and_exact():
    am, lm, symbols = _inputs(B=2, T=4, S=2, C=6, seed=6, scale=300.0)
    got = rnnt_loss_simple(lm, am, symbols, 0, reduction="none")
    want = oracle_simple(lm, am, symbols, 0, torch.tensor([[0, 0, 2, 4]] * 2), "regular")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-8)


# --------------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("rnnt_type", TYPES)
def test_gradcheck(rnnt_type):
    am, lm, symbols = _inputs(B=2, T=4, S=2, C=4, seed=7)
    bnd = torch.tensor([[0, 0, 2, 4], [1, 1, 2, 4]])

    def simple(lm, am):
        return rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                                delay_penalty=0.1, reduction="sum")

    def smoothed(lm, am):
        return rnnt_loss_smoothed(lm, am, symbols, 0, 0.2, 0.1, boundary=bnd,
                                  rnnt_type=rnnt_type, reduction="mean")

    assert torch.autograd.gradcheck(simple, (lm, am))
    assert torch.autograd.gradcheck(smoothed, (lm, am))
    logits = torch.randn(2, 4, 2, 4, dtype=F64, requires_grad=True)
    ranges = _random_ranges(2, 4, 2, 2, rnnt_type, seed=8)
    assert torch.autograd.gradcheck(
        lambda x: rnnt_loss_pruned(x, symbols, ranges, 0, boundary=bnd, rnnt_type=rnnt_type,
                                   reduction="mean_volume"), (logits,))


# --------------------------------------------------------------------------- structure
def test_simple_equals_full_joint_rnnt_loss():
    am, lm, symbols = _inputs(B=3, T=6, S=4, C=7, seed=9)
    bnd = torch.tensor([[0, 0, 4, 6], [0, 0, 2, 5], [0, 0, 3, 3]])
    logits = am[:, :, None, :] + lm[:, None, :, :]
    want = seqloss.rnnt_loss(logits, symbols, bnd[:, 3], bnd[:, 2], blank=0, reduction="none")
    got = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(_grads(got, am, lm), _grads(want, am, lm), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruned_with_every_position_equals_the_unpruned_loss(rnnt_type):
    am, lm, symbols = _inputs(B=3, T=6, S=4, C=7, seed=10)
    B, T, _ = am.shape
    S = symbols.shape[1]
    bnd = torch.tensor([[0, 0, 4, 6], [1, 0, 3, 5], [0, 1, 4, 6]])
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                                     return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, bnd, S + 1)
    assert torch.equal(ranges, torch.arange(S + 1).expand(B, T, S + 1))
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    got = rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, boundary=bnd, rnnt_type=rnnt_type,
                           delay_penalty=0.2, reduction="none")
    want = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                            delay_penalty=0.2, reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # and on a joint that is not additive, against the full-joint rnnt_loss
    if rnnt_type == "regular":
        logits = torch.randn(B, T, S + 1, 7, dtype=F64)
        got = rnnt_loss_pruned(logits, symbols, ranges, 0, reduction="none")
        want = seqloss.rnnt_loss(logits, symbols, [T] * B, [S] * B, blank=0, reduction="none")
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def _one_hot_occupations(path, S, T, regular):
    """px_grad/py_grad of a single path given as a list of ('e'|'b', s, t)."""
    pxg = torch.zeros(1, S, T + 1 if regular else T, dtype=F64)
    pyg = torch.zeros(1, S + 1, T, dtype=F64)
    for kind, s, t in path:
        (pxg if kind == "e" else pyg)[0, s, t] = 1.0
    return pxg, pyg


def _random_path(S, T, regular, g, max_per_frame):
    while True:
        s = t = n = 0
        path = []
        while (s, t) != (S, T) and t < T:
            if s < S and n < max_per_frame and bool(torch.rand((), generator=g) < 0.5):
                path.append(("e", s, t))
                s, t = s + 1, (t if regular else t + 1)
                n = n + 1 if regular else 0
            else:
                path.append(("b", s, t))
                t += 1
                n = 0
        if (s, t) == (S, T):
            return path


@pytest.mark.parametrize("regular", [True, False])
@pytest.mark.parametrize("s_range", [2, 3, 4])
def test_prune_ranges_cover_a_one_hot_alignment(regular, s_range):
    g = torch.Generator().manual_seed(11)
    S, T = 6, 9
    for _ in range(20):
        # an alignment a window can follow: fewer than s_range emissions a frame
        path = _random_path(S, T, regular, g, s_range - 1)
        pxg, pyg = _one_hot_occupations(path, S, T, regular)
        ranges = get_rnnt_prune_ranges(pxg, pyg, None, s_range)[0]
        R = ranges.shape[1]
        assert torch.equal(ranges, ranges[:, :1] + torch.arange(R))
        r0 = ranges[:, 0]
        d = r0[1:] - r0[:-1]
        assert (d >= 0).all()  # monotone
        assert (d < (R if regular else 2)).all()  # never skips a symbol
        assert r0[0] == 0 and r0[-1] + R - 1 >= S  # start and final states inside
        # every state the alignment visits on a frame lies in that frame's window
        for kind, s, t in path:
            rows = {s, s + 1} if kind == "e" and regular else {s}
            assert r0[t] <= min(rows) and max(rows) <= r0[t] + R - 1, (path, r0.tolist())


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruning_pipeline_is_close_to_the_full_loss(rnnt_type):
    # a peaked additive joint whose likely alignments spread the symbols over the
    # frames: the pruned loss on the same joint matches up to the probability mass
    # that pruning removes, and is never below the full loss
    torch.manual_seed(12)
    B, T, S, C = 2, 12, 5, 8
    symbols = torch.randint(1, C, (B, S))
    am = torch.randn(B, T, C, dtype=F64)
    am[:, :, 0] += 4.0
    for b in range(B):
        for s, t in enumerate((1, 3, 6, 8, 10)):
            am[b, t, symbols[b, s]] += 8.0
    lm = torch.randn(B, S + 1, C, dtype=F64)
    full, (pxg, pyg) = rnnt_loss_simple(lm, am, symbols, 0, rnnt_type=rnnt_type,
                                        reduction="none", return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, None, 4)
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    pruned = rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, rnnt_type=rnnt_type,
                              reduction="none")
    assert torch.isfinite(pruned).all()
    assert (pruned >= full - 1e-9).all()
    assert (pruned - full < 0.25).all()


def test_prune_ranges_with_begins_start_inside():
    # a boundary with non-zero begins: the begin state is inside its frame's window
    am, lm, symbols = _inputs(B=2, T=6, S=4, C=5, seed=13)
    bnd = torch.tensor([[2, 1, 4, 6], [1, 2, 3, 5]])
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, bnd, 2)
    for b in range(2):
        s0, t0, s1, t1 = (int(v) for v in bnd[b])
        assert ranges[b, t0, 0] <= s0 <= ranges[b, t0, -1]
        assert ranges[b, t1 - 1, 0] <= s1 <= ranges[b, t1 - 1, -1]
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    loss = rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, boundary=bnd, reduction="none")
    assert torch.isfinite(loss).all()


# --------------------------------------------------------------------------- policies
def test_reductions_and_empty_batch():
    am, lm, symbols = _inputs(seed=14)
    bnd = _boundary("regular")
    none = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, reduction="none")
    U = (bnd[:, 2] - bnd[:, 0]).sum()
    for red, want in (("sum", none.sum()), ("mean", none.mean()), ("mean_volume", none.sum() / U)):
        torch.testing.assert_close(
            rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, reduction=red), want)
    z = rnnt_loss_simple(lm[:0], am[:0], symbols[:0], 0, reduction="mean")
    assert z.item() == 0.0


def test_padding_is_never_read():
    am, lm, symbols = _inputs(seed=15)
    bnd = torch.tensor([[0, 0, 2, 4], [1, 1, 3, 5], [0, 0, 1, 3]])
    am2, lm2 = am.detach().clone(), lm.detach().clone()
    am2[0, 4:] = float("nan")
    am2[2, 3:] = float("nan")
    lm2[0, 3:] = float("nan")
    lm2[2, 2:] = float("inf")
    symbols2 = symbols.clone()
    symbols2[0, 2] = 99  # past end_symbol: padding, never validated
    am2.requires_grad_()
    lm2.requires_grad_()
    want = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, reduction="none")
    got = rnnt_loss_simple(lm2, am2, symbols2, 0, boundary=bnd, reduction="none")
    torch.testing.assert_close(got, want)
    ga, gl = _grads(got, am2, lm2)
    assert torch.isfinite(ga).all() and torch.isfinite(gl).all()
    assert (ga[0, 4:] == 0).all() and (gl[0, 3:] == 0).all() and (gl[2, 2:] == 0).all()


def test_half_inputs_give_float32_losses():
    am, lm, symbols = _inputs(seed=16)
    got = rnnt_loss_simple(lm.detach().half(), am.detach().half(), symbols, 0, reduction="none")
    assert got.dtype == torch.float32
    want = rnnt_loss_simple(lm.detach().half().double(), am.detach().half().double(), symbols, 0,
                            reduction="none")
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_compile():
    am, lm, symbols = _inputs(seed=17)
    am, lm = am.detach().float().requires_grad_(), lm.detach().float().requires_grad_()
    bnd = _boundary("regular")

    def f(lm, am):
        return rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, reduction="sum")

    want = f(lm, am)
    gw = _grads(want, am, lm)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(lm, am)
    torch.testing.assert_close(got, want)
    for g, w in zip(_grads(got, am, lm), gw, strict=True):
        torch.testing.assert_close(g, w)


# --------------------------------------------------------------------------- errors
def test_errors():
    am, lm, symbols = _inputs(seed=18)
    am, lm = am.detach(), lm.detach()
    B, T, C = am.shape
    S = symbols.shape[1]

    def simple(**kw):
        args = {"lm": lm, "am": am, "symbols": symbols, "termination_symbol": 0}
        args.update(kw)
        return rnnt_loss_simple(**args)

    with pytest.raises(InputError, match="rnnt_type"):
        simple(rnnt_type="weird")
    with pytest.raises(InputError, match=r"boundary\[1, 3\].*end_frame"):
        simple(boundary=torch.tensor([[0, 0, S, T], [0, 0, S, T + 1], [0, 0, S, T]]))
    with pytest.raises(InputError, match=r"boundary\[2, 2\].*end_symbol"):
        simple(boundary=torch.tensor([[0, 0, S, T], [0, 0, S, T], [0, 0, S + 1, T]]))
    with pytest.raises(InputError, match=r"boundary\[0\].*begin_frame"):
        simple(boundary=torch.tensor([[0, 3, S, 2], [0, 0, S, T], [0, 0, S, T]]))
    with pytest.raises(InputError, match=r"boundary must have shape"):
        simple(boundary=torch.zeros(B, 3, dtype=torch.int64))
    bad = symbols.clone()
    bad[1, 2] = C
    with pytest.raises(InputError, match=r"symbols\[1, 2\].*out of range"):
        simple(symbols=bad)
    bad[1, 2] = 0
    with pytest.raises(InputError, match=r"symbols\[1, 2\].*termination_symbol"):
        simple(symbols=bad)
    with pytest.raises(InputError, match="termination_symbol"):
        simple(termination_symbol=C)
    with pytest.raises(InputError, match="lm.size.0"):
        simple(lm=lm[:2])
    with pytest.raises(InputError, match="symbols must have shape"):
        simple(symbols=symbols[:2])
    with pytest.raises(InputError, match="reduction"):
        simple(reduction="avg")
    with pytest.raises(TypeError, match="symbols"):
        simple(symbols=symbols.float())
    with pytest.raises(RuntimeError, match="am"):
        simple(am=am.long())
    with pytest.raises(TypeError):
        simple(boundary=torch.zeros(B, 4))
    # pruning
    _, (pxg, pyg) = simple(return_grad=True)
    with pytest.raises(InputError, match="s_range"):
        get_rnnt_prune_ranges(pxg, pyg, None, 0)
    # a regular window of one row never emits: widened to 2, as fast_rnnt widens it
    assert get_rnnt_prune_ranges(pxg, pyg, None, 1).shape == (B, T, 2)
    with pytest.raises(InputError, match="px_grad must have shape"):
        get_rnnt_prune_ranges(pxg[:, :, :2], pyg, None, 2)
    ranges = get_rnnt_prune_ranges(pxg, pyg, None, 2)
    logits = torch.randn(B, T, 2, C, dtype=F64)
    with pytest.raises(InputError, match="ranges must have shape"):
        rnnt_loss_pruned(logits, symbols, ranges[:, :, :1], 0)
    r2 = ranges.clone()
    r2[1, 3] = torch.tensor([1, 3])
    with pytest.raises(InputError, match=r"ranges\[1, 3\].*consecutive"):
        rnnt_loss_pruned(logits, symbols, r2, 0)
    r2[1, 3] = torch.tensor([S, S + 1])
    with pytest.raises(InputError, match=r"ranges\[1, 3, 0\].*out of range"):
        rnnt_loss_pruned(logits, symbols, r2, 0)
    one = torch.zeros(B, T, 1, dtype=torch.int64)
    for rt in ("regular", "constrained"):
        with pytest.raises(InputError, match=r"too small for batch item 0"):
            rnnt_loss_pruned(logits[:, :, :1], symbols, one, 0, rnnt_type=rt)
    with pytest.raises(InputError, match="batch size"):
        do_rnnt_pruning(am[:2], lm, ranges)
    with pytest.raises(InputError, match="outside"):
        do_rnnt_pruning(am, lm, ranges + S)


# --------------------------------------------------------------------------- fast_rnnt
@pytest.mark.parametrize("rnnt_type", TYPES)
def test_against_fast_rnnt(rnnt_type):
    fast_rnnt = pytest.importorskip("fast_rnnt")
    am, lm, symbols = _inputs(seed=19)
    am, lm = am.detach().float(), lm.detach().float()
    bnd = _boundary(rnnt_type)
    kw = ({"rnnt_type": rnnt_type}
          if "rnnt_type" in fast_rnnt.rnnt_loss_simple.__code__.co_varnames
          else {"modified": rnnt_type == "modified"})
    if "modified" in kw and rnnt_type == "constrained":
        pytest.skip("this fast_rnnt has no constrained topology")
    want, (pxg, pyg) = fast_rnnt.rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd,
                                                  reduction="none", return_grad=True, **kw)
    got, (gx, gy) = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                                     reduction="none", return_grad=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx, pxg, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gy, pyg, rtol=1e-4, atol=1e-4)
    r_got = get_rnnt_prune_ranges(gx, gy, bnd, 2)
    if rnnt_type == "regular":
        assert torch.equal(r_got, fast_rnnt.get_rnnt_prune_ranges(pxg, pyg, bnd, 2))
    else:
        # Deliberately not k2's score (see get_rnnt_prune_ranges): one state per frame, so
        # the window's score is the state occupation, emissions included. Each frame's
        # window then holds the frame's most occupied state, which k2's may not.
        occ = gy + torch.cat((gx, gx.new_zeros(gx.shape[0], 1, gx.shape[2])), dim=1)
        best = occ.argmax(dim=1)  # (B, T)
        inside = (r_got[..., 0] <= best) & (best < r_got[..., 0] + 2)
        for b in range(bnd.shape[0]):
            t1 = int(bnd[b, 3]) - 1  # the last frame starts at end_symbol - s_range + 1
            assert inside[b, :t1].all()


def test_pruned_padding_frames_are_never_read():
    B, T, S, C, R = 2, 6, 3, 5, 2
    g = torch.Generator().manual_seed(20)
    logits = torch.randn(B, T, R, C, generator=g, dtype=F64)
    _, _, symbols = _inputs(B=B, T=T, S=S, C=C, seed=20)
    ranges = _random_ranges(B, T, S, R, "regular", seed=21)
    ranges[0, 3:] = torch.arange(S + 1 - R, S + 1)  # the final state in frame 3
    bnd = torch.tensor([[0, 0, S, 4], [0, 0, S, T]])
    want = rnnt_loss_pruned(logits, symbols, ranges, 0, boundary=bnd, reduction="none")
    bad = logits.clone()
    bad[0, 4:] = float("nan")
    bad.requires_grad_()
    got = rnnt_loss_pruned(bad, symbols, ranges, 0, boundary=bnd, reduction="none")
    torch.testing.assert_close(got, want)
    (gr,) = _grads(got, bad)
    assert torch.isfinite(gr).all() and (gr[0, 4:] == 0).all()


# --------------------------------------------------------------------------- backends, registry
def test_every_backend_against_path_enumeration(pruned_backend):
    am, lm, symbols = _inputs(seed=22)
    bnd = _boundary("constrained")
    for rt in TYPES:
        got = rnnt_loss_simple(lm, am, symbols, 0, boundary=bnd, rnnt_type=rt, reduction="none",
                               backend=pruned_backend)
        want = oracle_simple(lm, am, symbols, 0, bnd, rt)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        logits = torch.randn(3, 5, 2, 5, dtype=F64)
        ranges = _random_ranges(3, 5, 3, 2, rt, seed=23)
        got = rnnt_loss_pruned(logits, symbols, ranges, 0, boundary=bnd, rnnt_type=rt,
                               reduction="none", backend=pruned_backend)
        want = oracle_pruned(logits, symbols, ranges, 0, bnd, rt)
        fin = torch.isfinite(want)
        assert torch.equal(fin, torch.isfinite(got))
        torch.testing.assert_close(got[fin], want[fin], rtol=1e-10, atol=1e-10)


def test_registry_entry_diagnose_and_bench():
    from seqloss._core import registry
    from seqloss.bench import pruned as bench_pruned

    fam = registry.family("pruned")
    assert fam.loss_fn() is seqloss.rnnt_loss_pruned
    assert fam.bench_module() is bench_pruned
    am, lm, symbols = _inputs(B=2, T=6, S=3, C=5, seed=24)
    am, lm = am.detach(), lm.detach()
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, symbols, 0, return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, None, 2)
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    logits = (am_p + lm_p).clone()
    logits[1, 2, 0, 3] = float("nan")
    rep = seqloss.diagnose("pruned", logits, symbols, ranges, 0)
    assert rep.sequences[0].status == "ok" and rep.nonfinite == [1]
    want = rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, reduction="none")
    assert abs(rep.sequences[0].loss - float(want[0])) < 1e-4
    rows = bench_pruned.run(bench_pruned.cases("tiny"), repeat=1, memory=False, log=None)
    assert {r["impl"] for r in rows} >= {"seqloss pipeline", "seqloss full-joint"}
    assert any(p["peer"] == "seqloss full-joint" for p in bench_pruned.pair_rows(rows))


@pytest.mark.parametrize("loss_name", ["simple", "smoothed", "pruned"])
def test_zero_infinity(loss_name):
    """A sequence without frames (boundary end_frame 0): +inf, or 0 with zero_infinity;
    zero gradient either way; the other sequences unchanged."""
    am, lm, symbols = _inputs(B=2, T=5, S=3, C=6, seed=12)
    bnd = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 0]])
    S = symbols.shape[1]
    ranges = torch.arange(S + 1).expand(2, 5, S + 1).contiguous()

    def run(zi):
        a = am.detach().clone().requires_grad_()
        m = lm.detach().clone().requires_grad_()
        if loss_name == "simple":
            loss = rnnt_loss_simple(m, a, symbols, 0, boundary=bnd, reduction="none",
                                    zero_infinity=zi)
        elif loss_name == "smoothed":
            loss = rnnt_loss_smoothed(m, a, symbols, 0, boundary=bnd, reduction="none",
                                      zero_infinity=zi)
        else:
            am_p, lm_p = do_rnnt_pruning(a, m, ranges)
            loss = rnnt_loss_pruned(am_p + lm_p, symbols, ranges, 0, boundary=bnd,
                                    reduction="none", zero_infinity=zi)
        ga, gm = torch.autograd.grad(loss[0] + torch.where(loss[1].isinf(), 0.0, loss[1]),
                                     (a, m))
        return loss.detach(), ga, gm

    plain, ga0, gm0 = run(False)
    zeroed, ga1, gm1 = run(True)
    assert plain[1].item() == float("inf") and zeroed[1].item() == 0.0
    assert torch.equal(plain[0], zeroed[0]) and torch.isfinite(plain[0])
    assert torch.equal(ga0, ga1) and torch.equal(gm0, gm1)
    assert (ga1[1] == 0).all()
    if loss_name != "smoothed":  # there lm[1] enters every loss through the batch's unigram
        assert (gm1[1] == 0).all()


@pytest.mark.parametrize("rnnt_type", ["modified", "constrained"])
def test_fewer_frames_than_symbols_is_an_impossible_alignment(rnnt_type):
    """One symbol per frame at most: T_b < S_b has no path: +inf (0 with zero_infinity)
    and zero gradient, the other sequences as without it (k2 asserts instead)."""
    am, lm, symbols = _inputs(B=2, T=5, S=3, C=6, seed=13)
    bnd = torch.tensor([[0, 0, 3, 5], [0, 0, 3, 2]])
    for zi in (False, True):
        a = am.detach().clone().requires_grad_()
        loss = rnnt_loss_simple(lm, a, symbols, 0, boundary=bnd, rnnt_type=rnnt_type,
                                reduction="none", zero_infinity=zi)
        assert loss[1].item() == (0.0 if zi else float("inf"))
        (g,) = torch.autograd.grad(loss[0], a)
        assert (g[1] == 0).all()
        want = rnnt_loss_simple(lm[:1], am[:1], symbols[:1], 0, boundary=bnd[:1],
                                rnnt_type=rnnt_type, reduction="none")
        torch.testing.assert_close(loss[:1], want, rtol=0, atol=0)


# --------------------------------------------------------------------------- edges
NAN = float("nan")


# --------------------------------------------------------------------------- smoothed: unigram
def _oracle_smoothed_mp(lm, am, symbols, term, boundary, rnnt_type, ls, as_):
    """k2's smoothed loss by path enumeration, the unigram's log-mean-exp in mpmath (60 digits)."""
    B, T, C = am.shape
    S = lm.shape[1] - 1
    rows = torch.cat([torch.log_softmax(lm[b, int(boundary[b, 0]):int(boundary[b, 2]) + 1], -1)
                      for b in range(B)]).detach()
    with mpmath.workdps(60):
        log_uni = torch.tensor(
            [float(mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in rows[:, c])
                              / rows.shape[0])) for c in range(C)], dtype=F64)
    out = []
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in boundary[b])
        joint = torch.log_softmax(am[b][:, None, :] + lm[b][None, :, :], dim=-1)
        lm_only = torch.log_softmax(lm[b], -1)[None].expand(T, S + 1, C)
        am_only = torch.log_softmax(am[b] + log_uni, -1)[:, None].expand(T, S + 1, C)
        lp = (1 - ls - as_) * joint + ls * lm_only + as_ * am_only
        px = torch.stack([lp[:, s, int(symbols[b, s])] for s in range(S)])
        py = lp[:, :, term].T
        px = _finish_px(px, py, rnnt_type, 0.0, t1)
        out.append(-k2_log_likelihood(px, py, s0, t0, s1, t1, rnnt_type))
    return torch.stack(out)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("scales", [(0.1, 0.1), (0.0, 0.25)])
def test_smoothed_unigram_does_not_underflow_in_float32(rnnt_type, scales):
    # the termination symbol's LM probability exp(-110) is 0 in float32,
    # so a probability-domain unigram gives log 0 on every termination arc
    lm = torch.tensor([[[-110.0, 0.0, 0.0], [-110.0, 0.0, 0.0]]])
    am = torch.zeros(1, 3, 3)
    sym = torch.tensor([[1]])
    bnd = torch.tensor([[0, 0, 1, 3]])
    ls, as_ = scales
    out = {}
    for dt in (torch.float32, F64):
        m, a = lm.to(dt).requires_grad_(), am.to(dt).requires_grad_()
        loss = rnnt_loss_smoothed(m, a, sym, 0, ls, as_, rnnt_type=rnnt_type, reduction="sum")
        out[dt] = (loss, *torch.autograd.grad(loss, (m, a)))
    # float64 holds exp(-110): its probability-domain oracle is exact here
    want = oracle_smoothed(lm.double(), am.double(), sym, 0, bnd, rnnt_type, ls, as_).sum()
    torch.testing.assert_close(out[F64][0], want, rtol=1e-12, atol=0)
    for got, ref in zip(out[torch.float32], out[F64], strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)


def test_smoothed_unigram_beyond_float64_underflow():
    # a class at -1000 below the others: exp underflows in float64 too
    am, lm, sym = _inputs(B=2, T=4, S=2, C=4, seed=31)
    lm = lm.detach().clone()
    lm[:, :, 0] -= 1000.0  # the termination symbol
    lm[1, :, 2] -= 1000.0
    lm.requires_grad_()
    bnd = torch.tensor([[0, 0, 2, 4], [0, 0, 2, 4]])
    for rt in TYPES:
        got = rnnt_loss_smoothed(lm, am, sym, 0, 0.1, 0.2, rnnt_type=rt, reduction="none")
        want = _oracle_smoothed_mp(lm, am, sym, 0, bnd, rt, 0.1, 0.2)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert torch.autograd.gradcheck(
            lambda m, a, rt=rt: rnnt_loss_smoothed(m, a, sym, 0, 0.1, 0.2, rnnt_type=rt,
                                                   reduction="sum"), (lm, am))


def test_smoothed_masked_class_has_zero_gradient():
    # a class the LM forbids everywhere (-inf) is absent from every softmax: the loss and
    # gradients equal those of the problem without that class, and it gets exactly 0
    am, lm, sym = _inputs(B=2, T=4, S=2, C=5, seed=32)
    sym = sym.clamp(max=3)  # class 4 is never a symbol
    am, lm = am.detach(), lm.detach()
    masked = lm.clone()
    masked[:, :, 4] = -float("inf")
    a, m = am.clone().requires_grad_(), masked.requires_grad_()
    a4, m4 = am[:, :, :4].clone().requires_grad_(), lm[:, :, :4].clone().requires_grad_()
    for rt in TYPES:
        got = rnnt_loss_smoothed(m, a, sym, 0, 0.1, 0.1, rnnt_type=rt, reduction="sum")
        want = rnnt_loss_smoothed(m4, a4, sym, 0, 0.1, 0.1, rnnt_type=rt, reduction="sum")
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        ga, gm = torch.autograd.grad(got, (a, m))
        wa, wm = torch.autograd.grad(want, (a4, m4))
        assert (ga[:, :, 4] == 0).all() and (gm[:, :, 4] == 0).all()
        torch.testing.assert_close(ga[:, :, :4], wa, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gm[:, :, :4], wm, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- pruned: narrow windows
def fast_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range):
    """fast_rnnt 1.3's ``get_rnnt_prune_ranges`` (regular topology), step by step as its
    source reads: widen ``s_range`` to ``max_b (S_b - 1) // T_b + 2``, cap it at ``S + 1``,
    score each window, start the last frame at ``S_b - s_range + 1``, then the monotone
    lower bound, the ``s_range - 1`` step bound and the start at 0."""
    B, S, _ = px_grad.shape
    T = py_grad.shape[2]
    need = max((int(boundary[b, 2]) - 1) // int(boundary[b, 3]) + 2 for b in range(B))
    R = max(s_range, need)
    R = S + 1 if R > S else R
    out = []
    for b in range(B):
        s_end, t_end = int(boundary[b, 2]), int(boundary[b, 3])
        x = []
        for t in range(T):
            if t < t_end - 1:
                scores = [sum(float(py_grad[b, s + k, t]) for k in range(R))
                          - (float(px_grad[b, s - 1, t]) if s else 0.0) for s in range(S + 2 - R)]
                x.append(scores.index(max(scores)))
            else:
                x.append(max(s_end - R + 1, 0))
        for t in range(T - 2, -1, -1):
            x[t] = min(x[t], x[t + 1])
        y = [(R - 1) * t - x[t] for t in range(T)]
        for t in range(T - 2, -1, -1):
            y[t] = min(y[t], y[t + 1])
        x = [(R - 1) * t - max(v, 0) for t, v in enumerate(y)]
        out.append([[r + k for k in range(R)] for r in x])
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("joiner", ["additive", "tanh"])
def test_pruned_window_too_small_is_widened_as_fast_rnnt(joiner):
    # one frame, three symbols, s_range = 2: fast_rnnt widens the window to every
    # position (11.84 on its inputs); a window kept at 2 would give +inf
    am, lm, sym = _inputs(B=1, T=1, S=3, C=10, seed=33)
    sym = torch.tensor([[1, 2, 3]])
    bnd = torch.tensor([[0, 0, 3, 1]])
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, sym, 0, boundary=bnd, return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, bnd, 2)
    assert torch.equal(ranges, fast_rnnt_prune_ranges(pxg, pyg, bnd, 2))
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    logits = am_p + lm_p if joiner == "additive" else torch.tanh(am_p + lm_p) * 3
    got = rnnt_loss_pruned(logits, sym, ranges, 0, boundary=bnd, reduction="none")
    want = oracle_pruned(logits, sym, ranges, 0, bnd, "regular")
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (gg,) = torch.autograd.grad(got.sum(), am, retain_graph=True)
    (gw,) = torch.autograd.grad(want.sum(), am)
    torch.testing.assert_close(gg, gw, rtol=1e-10, atol=1e-12)
    # one frame: the only path emits the three symbols, then the termination symbol
    lp = torch.log_softmax(logits[0, 0], -1)
    by_hand = -(lp[0, 1] + lp[1, 2] + lp[2, 3] + lp[3, 0])
    torch.testing.assert_close(got[0], by_hand, rtol=1e-12, atol=1e-12)
    if joiner == "additive":
        torch.testing.assert_close(got, oracle_simple(lm, am, sym, 0, bnd, "regular"),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("s_range", [1, 2, 3])
def test_prune_ranges_match_fast_rnnt_where_it_widens(s_range):
    # sequences with fewer frames than symbols beside ordinary ones (k2's boundaries: begins 0)
    am, lm, sym = _inputs(B=4, T=5, S=6, C=7, seed=34)
    bnd = torch.tensor([[0, 0, 6, 2], [0, 0, 3, 5], [0, 0, 4, 1], [0, 0, 5, 3]])
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, sym, 0, boundary=bnd, return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, bnd, s_range)
    assert torch.equal(ranges, fast_rnnt_prune_ranges(pxg, pyg, bnd, s_range))
    assert ranges.shape[2] == 5  # (4 - 1) // 1 + 2
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    got = rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, boundary=bnd, reduction="none")
    want = oracle_pruned(am_p + lm_p, sym, ranges, 0, bnd, "regular")
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), T=st.integers(1, 4), S=st.integers(1, 5), s_range=st.integers(1, 3))
def test_property_widened_regular_windows_always_keep_a_path(data, T, S, s_range):
    # any boundary, begins included: every sequence with a frame keeps a path, and the
    # pruned loss is the path enumeration of its windows
    B = 2
    rows = []
    for _ in range(B):
        s0 = data.draw(st.integers(0, S))
        t0 = data.draw(st.integers(0, T - 1))
        rows.append([s0, t0, data.draw(st.integers(s0, S)), data.draw(st.integers(t0 + 1, T))])
    bnd = torch.tensor(rows)
    am, lm, sym = _inputs(B=B, T=T, S=S, C=4, seed=data.draw(st.integers(0, 2**16)))
    _, (pxg, pyg) = rnnt_loss_simple(lm, am, sym, 0, boundary=bnd, return_grad=True)
    ranges = get_rnnt_prune_ranges(pxg, pyg, bnd, s_range)
    am_p, lm_p = do_rnnt_pruning(am, lm, ranges)
    got = rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, boundary=bnd, reduction="none")
    want = oracle_pruned(am_p + lm_p, sym, ranges, 0, bnd, "regular")
    assert torch.isfinite(want).all(), (rows, ranges[:, :, 0].tolist())
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- pruned: window rows
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_window_arcs_match_float64_log_softmax(dtype):
    """The Numba backend's one read of a pruned window (``window_arcs``, the forward of
    ``rnnt_loss_pruned`` on CPU) against torch's float64 log-softmax: wide logits, a
    row of ``-inf`` but one class, a NaN row, a ``+inf`` row and a row of ``-inf``
    (``-inf`` arcs and log-normalizer: a state with no way out), in a permuted layout."""
    from seqloss.transducer.joint.numba_cpu import window_arcs

    g = torch.Generator().manual_seed(71)
    B, T, R, C = 2, 7, 3, 37
    x = (40 * torch.randn(B, R, T, C, generator=g, dtype=F64)).transpose(1, 2)  # (B, T, R, C)
    x[0, 1, 0] = -math.inf
    x[0, 1, 0, 5] = 3.0
    x[0, 2, 1, 7] = NAN
    x[1, 3, 2, 0] = math.inf
    x[1, 4, 0] = -math.inf
    sym = torch.randint(0, C, (B, T, R), generator=g)
    term = 4
    xd = x.to(dtype)
    assert not xd.is_contiguous() and xd.stride(3) == 1
    px, py, lz = window_arcs(xd, sym, term)
    dead = (x == -math.inf).all(3)
    # torch's log-softmax, -inf on the row of -inf (torch's gives NaN there)
    lp = torch.log_softmax(xd.double(), dim=3).masked_fill(dead[..., None], -math.inf)
    want_x = lp.gather(3, sym[..., None])[..., 0]
    want_y = lp[..., term]
    eps = 2e-7 if dtype == torch.float32 else 1e-15
    assert bool(dead.any()) and (lz[dead] == -math.inf).all()
    for got, want in ((px, want_x), (py, want_y)):
        assert got.dtype == dtype
        nan = torch.isnan(want) | torch.isnan(x.double()).any(3) | (x == math.inf).any(3)
        assert torch.equal(torch.isnan(got), nan)
        assert (got[dead] == -math.inf).all()
        fin = ~nan & torch.isfinite(want)
        torch.testing.assert_close(got.double()[fin], want[fin], rtol=eps, atol=eps * 100)
        assert torch.equal(got[~nan & ~torch.isfinite(want)], want[~nan & ~torch.isfinite(want)]
                           .to(dtype))
    ok = torch.isfinite(x).all(3)
    # float64, from the row's shift and its sum in x's dtype (as torch's logsumexp)
    torch.testing.assert_close(lz[ok], torch.logsumexp(xd.double(), dim=3)[ok], rtol=eps,
                               atol=eps * 10)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
def test_pruned_numba_window_matches_reference(rnnt_type):
    """The pruned loss's CPU window path (Numba forward) against the reference backend's
    torch ops, float32, a transposed window: loss and gradient."""
    g = torch.Generator().manual_seed(72)
    B, T, S, C, R = 3, 12, 5, 29, 3
    sym = torch.randint(1, C, (B, S), generator=g)
    ranges = torch.zeros(B, T, R, dtype=torch.int64)
    for b in range(B):
        start = torch.linspace(0, S + 1 - R, T).round().long()
        ranges[b] = start[:, None] + torch.arange(R)
    bnd = torch.tensor([[0, 0, S, T], [0, 0, S - 1, T - 2], [1, 1, S, T]])
    base = 5 * torch.randn(B, R, T, C, generator=g)
    res = []
    for backend in ("numba", "reference"):
        x = base.clone().transpose(1, 2).requires_grad_()
        loss = rnnt_loss_pruned(x, sym, ranges, 0, boundary=bnd, rnnt_type=rnnt_type,
                                reduction="none", backend=backend)
        res.append((loss, *torch.autograd.grad(loss.sum(), x)))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(res[0][1], res[1][1], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- pruned: unused rows
# (rnnt_type, T, S, ranges of every frame, boundary, NaN rows (t, k)): states no complete
# path visits -- dead ends (too few frames left for the symbols), unreachable states, and
# window positions past end_symbol
UNUSED = [
    ("modified", 3, 2, [[0, 1]] * 3, [0, 0, 2, 3], [(2, 0), (0, 1)]),
    ("constrained", 3, 2, [[0, 1, 2]] * 3, [0, 0, 2, 3], [(2, 0), (0, 2)]),
    ("modified", 3, 2, [[0, 1, 2]] * 3, [0, 0, 2, 3], [(0, 1), (0, 2), (1, 2), (2, 0)]),
    ("regular", 2, 2, [[0, 1], [1, 2]], [0, 0, 1, 2], [(1, 1)]),
]


@pytest.mark.parametrize("case", range(len(UNUSED)))
def test_pruned_nan_row_no_path_takes_gets_zero_gradient(pruned_backend, case):
    rt, T, S, r, bnd, rows = UNUSED[case]
    R = len(r[0])
    g = torch.Generator().manual_seed(35 + case)
    clean = torch.randn(1, T, R, 5, generator=g, dtype=F64)
    sym = torch.tensor([[1, 2, 3][:S]])
    ranges = torch.tensor([r])
    bnd = torch.tensor([bnd])
    assert not set(rows) & _visited_rows(ranges[0], S, T, bnd[0].tolist(), rt)
    bad = clean.clone()
    for t, k in rows:
        bad[0, t, k] = NAN
    out = []
    for x in (clean, bad):
        x = x.clone().requires_grad_()
        loss = rnnt_loss_pruned(x, sym, ranges, 0, boundary=bnd, rnnt_type=rt, reduction="sum",
                                backend=pruned_backend)
        out.append((loss, *torch.autograd.grad(loss, x)))
    want = oracle_pruned(clean, sym, ranges, 0, bnd, rt)[0]
    assert torch.isfinite(want)
    torch.testing.assert_close(out[0][0], want, rtol=1e-10, atol=1e-10)
    assert torch.equal(out[1][0], out[0][0])
    for t, k in rows:
        assert (out[0][1][0, t, k] == 0).all()
    assert torch.equal(out[1][1], out[0][1])


def _visited_rows(ranges, S, T, bnd, rt):
    """(t, k) of every window row some complete path reads, by enumeration."""
    s0, t0, s1, t1 = bnd
    used = set()

    def row(s, t):
        k = s - int(ranges[t, 0])
        return (t, k) if 0 <= k < ranges.shape[1] else None

    def walk(s, t, acc):
        if (s, t) == (s1, t1):
            used.update(acc)
            return
        if t >= t1 or row(s, t) is None:
            return
        if s < s1:
            nxt = (s + 1, t) if rt == "regular" else (s + 1, t + 1)
            extra = [row(s + 1, t)] if rt == "constrained" else []
            if None not in extra:
                walk(*nxt, [*acc, row(s, t), *extra])
        walk(s, t + 1, [*acc, row(s, t)])

    walk(s0, t0, [])
    return used


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), rt=st.sampled_from(TYPES), T=st.integers(1, 4), S=st.integers(0, 3),
       garbage=st.sampled_from([NAN, float("inf"), -float("inf")]))
def test_property_pruned_rows_no_path_reads_never_reach_a_gradient(data, rt, T, S, garbage):
    R = data.draw(st.integers(1 if rt == "modified" or S == 0 else 2, S + 1))
    step = R if rt == "regular" else 2
    r0 = [0]
    for _ in range(1, T):
        r0.append(min(r0[-1] + data.draw(st.integers(0, step - 1)), S + 1 - R))
    ranges = torch.tensor(r0)[:, None] + torch.arange(R)
    s1 = data.draw(st.integers(0, S))
    t1 = data.draw(st.integers(1, T))
    bnd = [0, 0, s1, t1]
    used = _visited_rows(ranges, S, T, bnd, rt)
    unused = [(t, k) for t in range(T) for k in range(R) if (t, k) not in used]
    if not used or not unused:
        return
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    clean = torch.randn(1, T, R, 4, generator=g, dtype=F64)
    bad = clean.clone()
    for t, k in unused:
        bad[0, t, k, data.draw(st.integers(0, 3))] = garbage
    sym = torch.randint(1, 4, (1, S), generator=g)
    kw = {"boundary": torch.tensor([bnd]), "rnnt_type": rt, "reduction": "sum"}
    out = []
    for x in (clean, bad):
        x = x.clone().requires_grad_()
        loss = rnnt_loss_pruned(x, sym, ranges[None], 0, **kw)
        out.append((loss, *torch.autograd.grad(loss, x)))
    want = oracle_pruned(clean, sym, ranges[None], 0, kw["boundary"], rt)[0]
    torch.testing.assert_close(out[0][0], want, rtol=1e-10, atol=1e-10)
    assert torch.equal(out[1][0], out[0][0])
    assert torch.equal(out[1][1], out[0][1])
    for t, k in unused:
        assert (out[1][1][0, t, k] == 0).all()


# --------------------------------------------------------------------------- fewer frames
@pytest.mark.parametrize("rnnt_type", ["modified", "constrained"])
@pytest.mark.parametrize("loss_name", ["simple", "smoothed", "pruned"])
def test_fewer_frames_than_symbols_is_inf_with_zero_gradient(loss_name, rnnt_type):
    """At most one symbol a frame: T_b < U_b has no path, +inf (0 with zero_infinity) and
    zero gradient, as any impossible alignment; the other sequence is its enumeration."""
    am, lm, sym = _inputs(B=2, T=5, S=3, C=6, seed=36)
    am, lm = am.detach(), lm.detach()
    bnd = torch.tensor([[0, 0, 3, 5], [0, 0, 3, 2]])
    S = sym.shape[1]
    ranges = torch.arange(S + 1).expand(2, 5, S + 1).contiguous()
    if loss_name == "simple":
        want0 = oracle_simple(lm, am, sym, 0, bnd, rnnt_type)[0]
    elif loss_name == "smoothed":
        want0 = oracle_smoothed(lm, am, sym, 0, bnd, rnnt_type, 0.1, 0.1)[0]
    else:
        want0 = oracle_pruned(am[:, :, None] + lm[:, None], sym, ranges, 0, bnd, rnnt_type)[0]
    for zi in (False, True):
        a, m = am.clone().requires_grad_(), lm.clone().requires_grad_()
        if loss_name == "simple":
            loss = rnnt_loss_simple(m, a, sym, 0, boundary=bnd, rnnt_type=rnnt_type,
                                    reduction="none", zero_infinity=zi)
        elif loss_name == "smoothed":
            loss = rnnt_loss_smoothed(m, a, sym, 0, boundary=bnd, rnnt_type=rnnt_type,
                                      reduction="none", zero_infinity=zi)
        else:
            am_p, lm_p = do_rnnt_pruning(a, m, ranges)
            loss = rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, boundary=bnd,
                                    rnnt_type=rnnt_type, reduction="none", zero_infinity=zi)
        assert loss[1].item() == (0.0 if zi else float("inf"))
        torch.testing.assert_close(loss[0], want0, rtol=1e-10, atol=1e-10)
        # the impossible sequence's own loss gives no gradient at all
        ga, gm = torch.autograd.grad(loss[1], (a, m), retain_graph=True)
        assert (ga == 0).all() and (gm == 0).all()
        ga, gm = torch.autograd.grad(loss[0], (a, m))
        assert (ga[1] == 0).all()
        if loss_name != "smoothed":  # there lm[1] enters sequence 0 through the unigram
            assert (gm[1] == 0).all()


# --------------------------------------------------------------------------- padding garbage
GARBAGE = st.sampled_from([NAN, float("inf"), -float("inf"), 1e300, -1e300])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), loss_name=st.sampled_from(["simple", "smoothed", "pruned"]),
       rt=st.sampled_from(TYPES), T=st.integers(1, 5), S=st.integers(0, 3), ga=GARBAGE,
       gl=GARBAGE)
def test_property_padding_garbage_never_reaches_a_gradient(data, loss_name, rt, T, S, ga, gl):
    """Garbage outside each boundary (frames before begin_frame or from end_frame, symbol
    positions before begin_symbol or past end_symbol) changes no loss and no gradient, and
    gets exactly zero gradient."""
    B = 2
    rows = []
    for _ in range(B):
        s0 = data.draw(st.integers(0, S))
        t0 = data.draw(st.integers(0, T))
        rows.append([s0, t0, data.draw(st.integers(s0, S)), data.draw(st.integers(t0, T))])
    bnd = torch.tensor(rows)
    seed = data.draw(st.integers(0, 2**16))
    am, lm, sym = _inputs(B=B, T=T, S=S, C=4, seed=seed)
    am, lm = am.detach(), lm.detach()
    frame_pad = torch.stack([(torch.arange(T) < r[1]) | (torch.arange(T) >= r[3]) for r in rows])
    pos_pad = torch.stack([(torch.arange(S + 1) < r[0]) | (torch.arange(S + 1) > r[2])
                           for r in rows])
    am_bad = torch.where(frame_pad[:, :, None], ga, am)
    lm_bad = torch.where(pos_pad[:, :, None], gl, lm)
    ranges = torch.arange(S + 1).expand(B, T, S + 1).contiguous()  # every position

    def run(a, m):
        a, m = a.clone().requires_grad_(), m.clone().requires_grad_()
        kw = {"boundary": bnd, "rnnt_type": rt, "reduction": "none"}
        if loss_name == "simple":
            loss = rnnt_loss_simple(m, a, sym, 0, **kw)
        elif loss_name == "smoothed":
            loss = rnnt_loss_smoothed(m, a, sym, 0, 0.1, 0.2, **kw)
        else:
            # the joiner's output is garbage wherever its frame or position is padding
            am_p, lm_p = do_rnnt_pruning(a, m, ranges)
            loss = rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, **kw)
        w = torch.where(torch.isfinite(loss), torch.arange(1.0, B + 1, dtype=F64), 0.0)
        return (loss, *torch.autograd.grad((torch.where(w > 0, loss, 0.0) * w).sum(), (a, m)))

    want = run(am, lm)
    got = run(am_bad, lm_bad)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
    assert (got[1][frame_pad] == 0).all() and (got[2][pos_pad] == 0).all()


# ------------------------------------------------------------------------ zero_infinity, px_grad
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("loss_name", ["simple", "smoothed"])
def test_zero_infinity_zeroes_returned_occupations_of_overflowed_sequence(loss_name, rnnt_type,
                                                                           dtype):
    """A feasible path whose score overflows (every termination arc of sequence 0 at
    ``finfo.min``) has loss ``+inf`` and finite occupations; with ``zero_infinity`` its
    loss is 0 and its ``px_grad``/``py_grad`` are 0, as its autograd gradient is; the
    other sequence's outputs are those of the call without the flag."""
    am, lm, sym = _inputs(B=2, T=3, S=1, C=3, seed=41)
    am, lm = am.detach().to(dtype), lm.detach().to(dtype)
    am[0, :, 0] = torch.finfo(dtype).min  # the termination symbol, every frame of sequence 0
    kw = dict(rnnt_type=rnnt_type, reduction="none", return_grad=True)
    fn = rnnt_loss_simple if loss_name == "simple" else rnnt_loss_smoothed
    ref, (rpx, rpy) = fn(lm, am, sym, 0, **kw)
    assert ref[0].item() == float("inf") and torch.isfinite(ref[1])  # the premise
    a, m = am.clone().requires_grad_(), lm.clone().requires_grad_()
    loss, (px, py) = fn(m, a, sym, 0, zero_infinity=True, **kw)
    assert loss[0].item() == 0.0 and torch.equal(loss[1], ref[1])
    assert not px[0].any() and not py[0].any()
    assert torch.equal(px[1], rpx[1]) and torch.equal(py[1], rpy[1])
    ga, gm = torch.autograd.grad(loss.sum(), (a, m))
    assert not ga[0].any()
    if loss_name == "simple":  # the smoothed unigram couples lm across the batch
        assert not gm[0].any()


def test_zero_infinity_occupations_of_an_empty_target_at_finfo_min():
    # empty target, every termination arc at finfo.min: loss 0, py_grad 1
    am = torch.zeros(1, 3, 3)
    am[0, :, 0] = torch.finfo(torch.float32).min
    empty = torch.zeros(1, 0, dtype=torch.int64)
    loss, (px, py) = rnnt_loss_simple(torch.zeros(1, 1, 3), am, empty, 0, return_grad=True,
                                      zero_infinity=True)
    assert loss.item() == 0.0 and px.shape == (1, 0, 4) and py.shape == (1, 1, 3)
    assert not py.any()


# --------------------------------------------------------------------------- diagnose("pruned")
@pytest.mark.parametrize("zi", [False, True, torch.tensor(True)], ids=["off", "on", "tensor"])
def test_diagnose_pruned_reports_zero_infinity(zi):
    """``zero_infinity`` reaches the report and its verdicts: a frameless sequence (1)
    and one whose windows miss the final state (2) are flagged whether their loss is
    ``+inf`` or the 0 that ``zero_infinity`` makes of it; sequence 0 is ok."""
    on = bool(zi)
    g = torch.Generator().manual_seed(42)
    logits = torch.randn(3, 3, 2, 4, generator=g, dtype=F64)
    sym = torch.tensor([[1, 2], [1, 2], [1, 2]])
    ranges = torch.tensor([0, 1, 1]).repeat(3, 1)[:, :, None] + torch.arange(2)
    ranges[2] = torch.tensor([0, 1])  # every frame [0, 1]: the final state 2 is never in it
    bnd = torch.tensor([[0, 0, 2, 3], [0, 0, 2, 0], [0, 0, 2, 3]])
    want = rnnt_loss_pruned(logits, sym, ranges, 0, boundary=bnd, reduction="none",
                            zero_infinity=on)
    inf = 0.0 if on else float("inf")
    assert torch.isfinite(want[0]) and want[1:].tolist() == [inf, inf]
    rep = seqloss.diagnose("pruned", logits, sym, ranges, 0, boundary=bnd, zero_infinity=zi)
    assert rep.zero_infinity is on and rep.to_dict()["zero_infinity"] is on
    assert [s.loss for s in rep.sequences] == want.tolist()
    assert [s.status for s in rep.sequences] == ["ok", "infeasible", "warning"]
    tail = "loss 0 (zero_infinity)" if on else "+inf loss"
    assert tail in rep.sequences[1].verdict and tail in rep.sequences[2].verdict
    assert "miss the start or final state" in rep.sequences[2].verdict
