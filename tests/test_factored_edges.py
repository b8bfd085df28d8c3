"""Edges of the factored-joint losses (issue 22): underflow, narrow windows, unused rows, padding.

Oracles: path enumeration of k2's lattice (``test_factored``), an mpmath unigram, a
loop-by-loop port of fast_rnnt 1.3's ``get_rnnt_prune_ranges`` as its source reads, and
float64 on the same inputs.
"""

from __future__ import annotations

import mpmath
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_factored import (
    F64,
    _finish_px,
    _inputs,
    k2_log_likelihood,
    oracle_pruned,
    oracle_simple,
    oracle_smoothed,
)

import seqloss
from seqloss import (
    do_rnnt_pruning,
    get_rnnt_prune_ranges,
    rnnt_loss_pruned,
    rnnt_loss_simple,
    rnnt_loss_smoothed,
)

TYPES = ("regular", "modified", "constrained")
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
    # issue 22's case: the termination symbol's LM probability exp(-110) is 0 in float32,
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
    # issue 22's case: one frame, three symbols, s_range = 2 -- fast_rnnt widens the
    # window to every position (11.84 on the issue's inputs), seqloss gave +inf
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


def test_zero_infinity_occupations_issue_reproducer():
    # issue 22's case: empty target, every termination arc at finfo.min: loss 0, py_grad 1
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
