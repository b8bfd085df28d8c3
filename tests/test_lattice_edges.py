"""transducer_lattice: non-finite scores on arcs that no complete path takes.

An arc is *live* when some complete path of nonzero probability (every score on it
above ``-inf``) takes it. A dead arc (out of an unreachable state, into a dead end,
or beside a masked ``-inf`` arc on every path through it) has occupation 0, so its
gradient is exactly 0 and the log-likelihood does not depend on it, whatever it holds:
NaN and ``+inf`` included. The oracle lists every path (no recursion shared with the
kernels).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import device_for
from hypothesis import given
from hypothesis import strategies as st

import seqloss
from seqloss.testing import brute_force_lattice

NEG_INF = float("-inf")
NAN = float("nan")

DURATIONS = [((1,), (0,), False), ((1, 2), (0, 1), False), ((1,), (1,), True),
             ((1, 3), (0, 1), True), ((1, 2, 4), (0,), False)]


def _paths(T, U, bd, ed, can):
    """Every complete path as a list of arcs ``(kind, t, u, k)``, kind 0 blank, 1 emit."""
    out = []

    def walk(t, u, acc):
        if (t, u) == (T, U) and T > 0:
            out.append(acc)
            return
        if t >= T:
            return
        for i, d in enumerate(bd):
            if t + d <= T:
                walk(t + d, u, [*acc, (0, t, u, i)])
        if u < U:
            for j, d in enumerate(ed):
                if t + d < T or (can and t + d <= T):
                    walk(t + d, u + 1, [*acc, (1, t, u, j)])

    walk(0, 0, [])
    return out


def _run(ab, ae, il, tl, bd, ed, can, backend):
    dev = device_for(backend)
    a = ab.detach().clone().to(dev).requires_grad_()
    e = ae.detach().clone().to(dev).requires_grad_()
    ll = seqloss.transducer_lattice(a, e, il, tl, bd, ed, emit_can_end=can, backend=backend)
    ga, gb = torch.autograd.grad(ll.sum(), (a, e))
    return ll.cpu(), ga.cpu(), gb.cpu()


def _oracle(ab, ae, T, U, bd, ed, can):
    a = ab.detach().clone().requires_grad_()
    e = ae.detach().clone().requires_grad_()
    if not _paths(T, U, bd, ed, can):  # no path (the oracle's 0 * sum: NaN beside -inf)
        return torch.tensor(NEG_INF, dtype=ab.dtype), torch.zeros_like(a), torch.zeros_like(e)
    ll = brute_force_lattice(a, e, T, U, bd, ed, can)
    if not torch.isfinite(ll):
        return ll.detach(), torch.zeros_like(a), torch.zeros_like(e)
    ga, ge = torch.autograd.grad(ll, (a, e), allow_unused=True, materialize_grads=True)
    return ll.detach(), ga, ge


@pytest.mark.parametrize("backend", ["reference", "numba", "triton"])
def test_nan_on_an_arc_into_a_dead_end_gets_zero_gradient(backend):
    """The issue's case: T = U = 1; the blank out of (0, 0) lands on (1, 0), from which
    the end (1, 1) is unreachable (no emission lands on the last frame)."""
    ab = torch.tensor([[[[NAN], [-0.7]]]], dtype=torch.float64)
    ae = torch.tensor([[[[-0.3], [-0.2]]]], dtype=torch.float64)
    for dt in (torch.float64, torch.float32):
        ll, ga, ge = _run(ab.to(dt), ae.to(dt), [1], [1], (1,), (0,), False, backend)
        # The one path: emit at (0, 0), then blank at (0, 1).
        assert ll.item() == pytest.approx(-1.0, abs=1e-6)
        assert torch.equal(ga, torch.tensor([[[[0.0], [1.0]]]], dtype=dt))
        assert torch.equal(ge, torch.tensor([[[[1.0], [0.0]]]], dtype=dt))


@pytest.mark.parametrize("backend", ["reference", "numba", "triton"])
@pytest.mark.parametrize("bad", [NAN, float("inf")], ids=["nan", "inf"])
def test_bad_arc_out_of_an_unreachable_state(backend, bad):
    """(0, 1) is unreachable when the emission out of (0, 0) is masked; its arcs may
    hold anything and the log-likelihood is the blank-first path's."""
    ab = torch.tensor([[[[-0.5], [bad]], [[-0.25], [-0.125]]]], dtype=torch.float64)
    ae = torch.tensor([[[[NEG_INF], [bad]], [[-1.0], [0.0]]]], dtype=torch.float64)
    ll, ga, ge = _run(ab, ae, [2], [1], (1,), (0,), False, backend)
    assert ll.item() == pytest.approx(-0.5 - 1.0 - 0.125, abs=1e-12)
    assert torch.equal(ga, torch.tensor([[[[1.0], [0.0]], [[0.0], [1.0]]]], dtype=torch.float64))
    assert torch.equal(ge, torch.tensor([[[[0.0], [0.0]], [[1.0], [0.0]]]], dtype=torch.float64))


@st.composite
def _dead_arc_case(draw):
    bd, ed, can = draw(st.sampled_from(DURATIONS))
    B = draw(st.integers(1, 2))
    T = draw(st.integers(1, 4))
    U = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    p_mask = draw(st.sampled_from([0.0, 0.2, 0.4]))
    bad = draw(st.sampled_from([NAN, float("inf"), NEG_INF]))
    il = [draw(st.integers(0, T)) for _ in range(B)]
    tl = [draw(st.integers(0, U)) for _ in range(B)]
    return bd, ed, can, B, T, U, seed, p_mask, bad, il, tl


@pytest.mark.parametrize("backend", ["reference", "numba", "triton"])
@given(case=_dead_arc_case())
def test_property_dead_arcs_never_reach_the_result(backend, case):
    bd, ed, can, B, T, U, seed, p_mask, bad, il, tl = case
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(B, T, U + 1, len(bd), generator=g, dtype=torch.float64)
    ae = torch.randn(B, T, U + 1, len(ed), generator=g, dtype=torch.float64)
    ab.masked_fill_(torch.rand(ab.shape, generator=g) < p_mask, NEG_INF)
    ae.masked_fill_(torch.rand(ae.shape, generator=g) < p_mask, NEG_INF)
    clean_b, clean_e = ab.clone(), ae.clone()
    for b in range(B):
        live = set()
        for path in _paths(il[b], tl[b], bd, ed, can):
            if all((ab if k == 0 else ae)[b, t, u, i] > NEG_INF for k, t, u, i in path):
                live.update(path)
        for k, x in ((0, ab), (1, ae)):
            for t, u, i in itertools.product(range(T), range(U + 1), range(x.shape[-1])):
                # A masked arc stays -inf: it is what keeps the paths through the
                # replaced arcs dead (a path with no masked arc is live, and so are its arcs).
                if ((k, t, u, i) not in live and x[b, t, u, i] > NEG_INF
                        and torch.rand((), generator=g) < 0.7):
                    x[b, t, u, i] = bad
                    # The oracle sees a dead arc as masked: no live path changes.
                    (clean_b if k == 0 else clean_e)[b, t, u, i] = NEG_INF
    ll, ga, ge = _run(ab, ae, il, tl, bd, ed, can, backend)
    for b in range(B):
        want, wa, we = _oracle(clean_b[b], clean_e[b], il[b], tl[b], bd, ed, can)
        if want == NEG_INF:
            assert ll[b] == NEG_INF
        else:
            torch.testing.assert_close(ll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b], wa, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ge[b], we, rtol=1e-12, atol=1e-12)
