"""Simple, smoothed and pruned RNN-T (k2's factored-joint losses) against path enumeration.

The oracle here enumerates k2's own lattice (``p[s, t]`` from ``(s_begin, t_begin)`` to
``(s_end, t_end)``, rnnt_loss.py's docstrings) on scores built from the broadcast joint
``log_softmax(am[t] + lm[s])`` in float64: no logmmexp, no arc shifting, no recursion
shared with the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

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
