"""seqloss.transducer_lattice: every backend against brute-force path enumeration, and
non-finite scores on arcs no complete path takes (dead arcs)."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import device_for, other_backend
from hypothesis import given
from hypothesis import strategies as st

import seqloss
from seqloss.testing import brute_force_lattice

NEG_INF = float("-inf")
NAN = float("nan")

DURATIONS = [
    # (blank_durations, emit_durations, emit_can_end)
    pytest.param((1,), (0,), False, id="rnnt"),
    pytest.param((1, 2, 4), (0,), False, id="big-blanks"),
    pytest.param((1, 2), (0, 1, 2), False, id="tdt-like"),
    pytest.param((2,), (0, 1), False, id="no-unit-blank"),
    pytest.param((1,), (1,), True, id="modified-emit-can-end"),
    pytest.param((1, 3), (0, 1), True, id="tdt-emit-can-end"),
]


def _arcs(B, T, U, bd, ed, *, seed=0, dtype=torch.float64, device="cpu", pad_t=1, pad_u=1):
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(B, T + pad_t, U + 1 + pad_u, len(bd), generator=g, dtype=torch.float64)
    ae = torch.randn(B, T + pad_t, U + 1 + pad_u, len(ed), generator=g, dtype=torch.float64)
    return ab.to(device=device, dtype=dtype), ae.to(device=device, dtype=dtype)


def _oracle(ab, ae, il, tl, bd, ed, can):
    """Per-sequence log-likelihood and occupations by brute force (float64, CPU)."""
    lls, gbs, ges = [], [], []
    for b in range(ab.shape[0]):
        a = ab[b].detach().cpu().double().requires_grad_()
        e = ae[b].detach().cpu().double().requires_grad_()
        ll = brute_force_lattice(a, e, int(il[b]), int(tl[b]), bd, ed, can)
        if torch.isfinite(ll):
            ga, ge = torch.autograd.grad(ll, (a, e), allow_unused=True, materialize_grads=True)
        else:
            ga, ge = torch.zeros_like(a), torch.zeros_like(e)
        lls.append(ll.detach())
        gbs.append(ga)
        ges.append(ge)
    return torch.stack(lls), torch.stack(gbs), torch.stack(ges)


def _run(ab, ae, il, tl, bd, ed, can, backend):
    ab = ab.detach().clone().requires_grad_()
    ae = ae.detach().clone().requires_grad_()
    ll = seqloss.transducer_lattice(ab, ae, il, tl, bd, ed, emit_can_end=can, backend=backend)
    # A -inf log-likelihood still has a gradient: its occupations, all zero.
    ga, ge = torch.autograd.grad(ll.sum(), (ab, ae))
    return ll, ga, ge


@pytest.mark.parametrize(("bd", "ed", "can"), DURATIONS)
def test_brute_force(lattice_backend, bd, ed, can):
    dev = device_for(lattice_backend)
    B, T, U = 4, 5, 3
    ab, ae = _arcs(B, T, U, bd, ed, device=dev)
    il = torch.tensor([5, 4, 3, 0])
    tl = torch.tensor([3, 0, 2, 1])
    ll, ga, ge = _run(ab, ae, il, tl, bd, ed, can, lattice_backend)
    want, wa, we = _oracle(ab, ae, il, tl, bd, ed, can)
    torch.testing.assert_close(ll.cpu(), want, rtol=1e-10, atol=1e-10)
    assert ll[3].item() == NEG_INF  # no frame: no path
    torch.testing.assert_close(ga.cpu(), wa, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(ge.cpu(), we, rtol=1e-9, atol=1e-11)


def test_neg_inf_arcs_and_infeasible(lattice_backend):
    dev = device_for(lattice_backend)
    bd, ed = (1,), (0,)
    ab, ae = _arcs(3, 4, 2, bd, ed, device=dev)
    ab[0, :, 1] = NEG_INF  # sequence 0: every blank in row 1 masked, some paths remain
    ae[1] = NEG_INF  # sequence 1 needs an emission: no path at all
    il, tl = torch.tensor([4, 4, 3]), torch.tensor([2, 1, 0])
    ll, ga, ge = _run(ab, ae, il, tl, bd, ed, False, lattice_backend)
    want, wa, we = _oracle(ab, ae, il, tl, bd, ed, False)
    torch.testing.assert_close(ll.cpu(), want, rtol=1e-10, atol=1e-10)
    assert ll[1].item() == NEG_INF
    assert (ga[1] == 0).all() and (ge[1] == 0).all()
    torch.testing.assert_close(ga.cpu(), wa, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(ge.cpu(), we, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(("bd", "ed", "can"), DURATIONS[:3] + DURATIONS[4:5])
def test_nan_in_unread_entries_gets_zero_gradient(lattice_backend, bd, ed, can):
    dev = device_for(lattice_backend)
    ab, ae = _arcs(2, 4, 2, bd, ed, device=dev, pad_t=2, pad_u=2)
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    clean_ll, clean_a, clean_e = _run(ab, ae, il, tl, bd, ed, can, lattice_backend)
    T, U1 = ab.shape[1], ab.shape[2]
    tt = torch.arange(T)[None, :, None]
    uu = torch.arange(U1)[None, None, :]
    unread_b = (tt >= il[:, None, None]) | (uu > tl[:, None, None])
    unread_e = unread_b | (uu == tl[:, None, None])
    ab2 = ab.masked_fill(unread_b[..., None].to(dev), NAN)
    ae2 = ae.masked_fill(unread_e[..., None].to(dev), NAN)
    ll, ga, ge = _run(ab2, ae2, il, tl, bd, ed, can, lattice_backend)
    torch.testing.assert_close(ll, clean_ll, rtol=0, atol=0)
    assert torch.equal(ga, clean_a) and torch.equal(ge, clean_e)
    assert (ga[unread_b.to(dev)] == 0).all() and (ge[unread_e.to(dev)] == 0).all()


@pytest.mark.parametrize(("bd", "ed", "can"), DURATIONS)
@pytest.mark.parametrize("bad", [NAN, float("inf")], ids=["nan", "inf"])
def test_nan_or_inf_in_a_read_arc_poisons_that_sequence_only(lattice_backend, bd, ed, can, bad):
    """NaN or +inf on a read arc: that sequence's log-likelihood and the occupations of
    every arc a path may take are NaN (the reference's pattern: arcs leaving frames
    ``t < T_b`` and landing within the lattice); the other sequences are unchanged."""
    dev = device_for(lattice_backend)
    ab, ae = _arcs(3, 4, 2, bd, ed, device=dev)
    il, tl = torch.tensor([4, 4, 3]), torch.tensor([2, 1, 2])
    clean = _run(ab, ae, il, tl, bd, ed, can, lattice_backend)
    ab2 = ab.clone()
    ab2[0, 0, 0, 0] = bad  # the first blank-like arc: on a path of sequence 0
    got = _run(ab2, ae, il, tl, bd, ed, can, lattice_backend)
    ref = _run(ab2.cpu(), ae.cpu(), il, tl, bd, ed, can, other_backend(lattice_backend))
    assert torch.isnan(got[0][0])
    for g, r, c in zip(got, ref, clean, strict=True):
        assert torch.equal(torch.isnan(g[0]).cpu(), torch.isnan(r[0]))
        assert torch.isnan(g[0]).any()
        assert (g[0][~torch.isnan(g[0])] == 0).all()
        torch.testing.assert_close(g[1:], c[1:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_low_precision_against_float64(lattice_backend, dtype):
    dev = device_for(lattice_backend)
    bd, ed = (1, 2), (0, 1)
    ab, ae = _arcs(3, 6, 3, bd, ed, device=dev)
    ab, ae = ab.to(dtype), ae.to(dtype)
    il, tl = torch.tensor([6, 5, 4]), torch.tensor([3, 2, 0])
    ll, ga, ge = _run(ab, ae, il, tl, bd, ed, False, lattice_backend)
    assert ll.dtype == torch.float32 and ga.dtype == dtype and ge.dtype == dtype
    want, wa, we = _oracle(ab, ae, il, tl, bd, ed, False)  # on the rounded inputs
    torch.testing.assert_close(ll.double().cpu(), want, rtol=1e-5, atol=1e-5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ga.double().cpu(), wa, rtol=tol, atol=tol)
    torch.testing.assert_close(ge.double().cpu(), we, rtol=tol, atol=tol)


@pytest.mark.parametrize(("bd", "ed", "can"), [DURATIONS[2], DURATIONS[4]])
def test_gradcheck(lattice_backend, bd, ed, can):
    dev = device_for(lattice_backend)
    ab, ae = _arcs(2, 3, 2, bd, ed, device=dev, pad_t=0, pad_u=0)
    il, tl = torch.tensor([3, 2]), torch.tensor([2, 1])
    f = lambda a, e: seqloss.transducer_lattice(a, e, il, tl, bd, ed, emit_can_end=can,
                                               backend=lattice_backend)
    # The interpreter takes ~1.5 s a call here: Triton checks one random direction
    # (fast_mode, a few calls instead of two per element); test_brute_force checks its
    # gradient element by element.
    assert torch.autograd.gradcheck(f, (ab.requires_grad_(), ae.requires_grad_()),
                                    fast_mode=lattice_backend == "triton")


def test_rnnt_arcs_give_the_rnnt_loss(lattice_backend):
    dev = device_for(lattice_backend)
    g = torch.Generator().manual_seed(3)
    B, T, U, V = 2, 4, 2, 5
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).to(dev)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    lp = x.log_softmax(-1)
    ab = lp[..., V - 1 :]
    ae = lp[:, :, :U].gather(3, tg[:, None, :, None].expand(B, T, U, 1).to(dev))
    ae = torch.cat([ae, torch.zeros_like(ae[:, :, :1])], dim=2)
    ll = seqloss.transducer_lattice(ab, ae, il, tl, backend=lattice_backend)
    loss = seqloss.rnnt_loss(x, tg, il, tl, reduction="none",
                             backend=other_backend(lattice_backend))
    torch.testing.assert_close(-ll, loss, rtol=1e-10, atol=1e-10)


def test_arc_logprobs_compose_with_the_lattice(lattice_backend):
    """transducer_arc_logprobs' (B, T, U+1) outputs are the lattice's RNN-T arcs as they are:
    minus the log-likelihood is rnnt_loss, in value and in the gradient on the logits."""
    dev = device_for(lattice_backend)
    g = torch.Generator().manual_seed(5)
    B, T, U, V = 3, 5, 3, 6
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).to(dev)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([5, 4, 2]), torch.tensor([3, 1, 0])
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    arcs = seqloss.transducer_arc_logprobs(x1, tg, il, tl)
    assert [a.shape for a in arcs] == [(B, T, U + 1)] * 2
    ll = seqloss.transducer_lattice(*arcs, il, tl, backend=lattice_backend)
    want = seqloss.rnnt_loss(x2, tg, il, tl, reduction="none",
                             backend=other_backend(lattice_backend))
    torch.testing.assert_close(-ll, want, rtol=1e-10, atol=1e-10)
    up = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64, device=dev)
    (gx,) = torch.autograd.grad(-(ll * up).sum(), x1)
    (gw,) = torch.autograd.grad((want * up).sum(), x2)
    torch.testing.assert_close(gx, gw, rtol=1e-9, atol=1e-12)


def test_three_dim_arcs_are_one_duration():
    ab, ae = _arcs(2, 3, 2, (1,), (0,), pad_t=0, pad_u=0)
    il, tl = [3, 2], [2, 1]
    ll = seqloss.transducer_lattice(ab[..., 0], ae, il, tl)
    torch.testing.assert_close(ll, seqloss.transducer_lattice(ab, ae, il, tl), rtol=0, atol=0)
    with pytest.raises(seqloss.InputError, match="blank_durations must hold one duration"):
        seqloss.transducer_lattice(ab[..., 0], ae, il, tl, (1, 2))
    with pytest.raises(seqloss.InputError, match="emit_durations must hold one duration"):
        seqloss.transducer_lattice(ab, ae[..., 0], il, tl, (1,), (0, 1))
    with pytest.raises(seqloss.InputError, match=r"arc_blank must be \(B, T, U\+1, Db\)"):
        seqloss.transducer_lattice(ab[..., 0, 0], ae, il, tl)


def test_opcheck_and_compile(lattice_backend):
    dev = device_for(lattice_backend)
    bd, ed = (1, 2), (0, 1)
    ab, ae = _arcs(2, 3, 2, bd, ed, device=dev)
    il, tl = torch.tensor([3, 2]), torch.tensor([2, 1])
    args = (ab.clone().requires_grad_(), ae.clone().requires_grad_(), il, tl, list(bd), list(ed),
            False, lattice_backend, True, True)
    torch.library.opcheck(torch.ops.seqloss.transducer_lattice.default, args)
    torch._dynamo.reset()

    def f(a, e):
        return seqloss.transducer_lattice(a, e, il, tl, bd, ed, backend=lattice_backend).sum()

    a1, e1 = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    a2, e2 = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    y1 = torch.compile(f, fullgraph=True)(a1, e1)
    y1.backward()
    y2 = f(a2, e2)
    y2.backward()
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(e1.grad, e2.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(bd=(1, 0)), r"blank_durations\[1\] = 0"),
        (dict(ed=(0, -1)), r"emit_durations\[1\] = -1"),
        (dict(bd=(1, 2, 3)), r"arc_blank.size\(3\) = 2 must equal len\(blank_durations\) = 3"),
        (dict(ed=(0,)), r"arc_emit.size\(3\) = 2 must equal len\(emit_durations\) = 1"),
        (dict(il=[3, 9]), r"logit_lengths\[1\] = 9 exceeds"),
        (dict(il=[-1, 2]), r"logit_lengths\[0\] = -1 is negative"),
        (dict(tl=[2, 5]), r"target_lengths\[1\] = 5 exceeds"),
        (dict(il=[3, 2, 1]), r"logit_lengths must have shape \(2,\)"),
    ],
)
def test_bad_arguments(change, match):
    bd, ed = change.get("bd", (1, 2)), change.get("ed", (0, 1))
    ab, ae = _arcs(2, 3, 2, (1, 2), (0, 1), pad_t=0, pad_u=0)
    il, tl = change.get("il", [3, 2]), change.get("tl", [2, 1])
    with pytest.raises(seqloss.InputError, match=match):
        seqloss.transducer_lattice(ab, ae, il, tl, bd, ed)


def test_bad_types():
    ab, ae = _arcs(1, 2, 1, (1,), (0,), pad_t=0, pad_u=0)
    with pytest.raises(TypeError, match="arc_blank"):
        seqloss.transducer_lattice(ab.long(), ae, [2], [1])
    with pytest.raises(TypeError, match=r"blank_durations\[0\]"):
        seqloss.transducer_lattice(ab, ae, [2], [1], (1.5,))
    with pytest.raises(seqloss.InputError, match="arc_emit must have shape"):
        seqloss.transducer_lattice(ab, ae[:, :1], [2], [1])


# ------------------------------------------------------------------ dead arcs
# An arc is *live* when some complete path of nonzero probability (every score on it
# above ``-inf``) takes it. A dead arc (out of an unreachable state, into a dead end,
# or beside a masked ``-inf`` arc on every path through it) has occupation 0, so its
# gradient is exactly 0 and the log-likelihood does not depend on it, whatever it holds:
# NaN and ``+inf`` included. The oracle lists every path (no recursion shared with the
# kernels).
DEAD_DURATIONS = [((1,), (0,), False), ((1, 2), (0, 1), False), ((1,), (1,), True),
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


def _dead_run(ab, ae, il, tl, bd, ed, can, backend):
    dev = device_for(backend)
    a = ab.detach().clone().to(dev).requires_grad_()
    e = ae.detach().clone().to(dev).requires_grad_()
    ll = seqloss.transducer_lattice(a, e, il, tl, bd, ed, emit_can_end=can, backend=backend)
    ga, gb = torch.autograd.grad(ll.sum(), (a, e))
    return ll.cpu(), ga.cpu(), gb.cpu()


def _dead_oracle(ab, ae, T, U, bd, ed, can):
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
    """T = U = 1: the blank out of (0, 0) lands on (1, 0), from which
    the end (1, 1) is unreachable (no emission lands on the last frame)."""
    ab = torch.tensor([[[[NAN], [-0.7]]]], dtype=torch.float64)
    ae = torch.tensor([[[[-0.3], [-0.2]]]], dtype=torch.float64)
    for dt in (torch.float64, torch.float32):
        ll, ga, ge = _dead_run(ab.to(dt), ae.to(dt), [1], [1], (1,), (0,), False, backend)
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
    ll, ga, ge = _dead_run(ab, ae, [2], [1], (1,), (0,), False, backend)
    assert ll.item() == pytest.approx(-0.5 - 1.0 - 0.125, abs=1e-12)
    assert torch.equal(ga, torch.tensor([[[[1.0], [0.0]], [[0.0], [1.0]]]], dtype=torch.float64))
    assert torch.equal(ge, torch.tensor([[[[0.0], [0.0]], [[1.0], [0.0]]]], dtype=torch.float64))


@st.composite
def _dead_arc_case(draw):
    bd, ed, can = draw(st.sampled_from(DEAD_DURATIONS))
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
    ll, ga, ge = _dead_run(ab, ae, il, tl, bd, ed, can, backend)
    for b in range(B):
        want, wa, we = _dead_oracle(clean_b[b], clean_e[b], il[b], tl[b], bd, ed, can)
        if want == NEG_INF:
            assert ll[b] == NEG_INF
        else:
            torch.testing.assert_close(ll[b], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ga[b], wa, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ge[b], we, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("bd", "ed", "can"), DURATIONS)
def test_band_with_nan_outside_against_reference(bd, ed, can):
    """A pruned lattice with each duration set: the states of a band of 4 rows climbing
    with t; the arcs that leave the band -inf, the arcs out of the states off it NaN
    (never reached). The Numba sweep computes only the band's states, and must give
    the float64 reference's values, and exactly 0 off the band."""
    B, T, U = 3, 14, 9
    ab, ae = _arcs(B, T, U, bd, ed, seed=7)
    il, tl = [T, T - 1, T], [U, U, U - 3]
    off = torch.zeros(B, T + 1, U + 2, dtype=torch.bool)
    for b in range(B):
        for t in range(T + 1):
            lo = (t * tl[b]) // il[b] - 1 if t <= il[b] else U + 2
            off[b, t] = True
            off[b, t, max(lo, 0):lo + 4] = False
    for b, t, u in itertools.product(range(B), range(T), range(U + 1)):
        if off[b, t, u]:
            ab[b, t, u] = NAN
            ae[b, t, u] = NAN
            continue
        for i, d in enumerate(bd):
            if t + d > T or off[b, t + d, u]:
                ab[b, t, u, i] = NEG_INF
        for j, d in enumerate(ed):
            if t + d > T or off[b, t + d, u + 1]:
                ae[b, t, u, j] = NEG_INF
    il, tl = torch.tensor(il), torch.tensor(tl)
    ll, ga, ge = _run(ab, ae, il, tl, bd, ed, can, "numba")
    want, wa, we = _run(ab, ae, il, tl, bd, ed, can, "reference")
    assert torch.isfinite(want).sum() >= 2  # the band holds paths
    torch.testing.assert_close(ll, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ga, wa, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(ge, we, rtol=1e-9, atol=1e-11)
    m = off[:, :T, :U + 1]
    assert (ga[:, :T, :U + 1][m] == 0).all() and (ge[:, :T, :U + 1][m] == 0).all()
