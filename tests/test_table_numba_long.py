"""The Numba joint's many-arc path (multi-blank, TDT) on lattices too long to enumerate.

The oracle is a float64 forward recursion written here with ``torch.logsumexp`` over
each state's incoming arcs (NeMo's conventions, as in test_tdt.py / test_multiblank.py),
differentiated by autograd: no code shared with the kernels. The lattices are long and
the logits spread, so that occupations span hundreds of orders of magnitude: the path
skips states whose gradient row rounds to zero, stores values at or below half the
least float32 subnormal as 0 and runs beta on a ring of frames (durations up to 8).
"""

from __future__ import annotations

import pytest
import torch

import seqloss
from seqloss.testing import assert_close_budget


def _batch(B, T, U, W, *, seed, scale=3.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + 1, U + 2, W, generator=g, dtype=torch.float64) * scale
    il = torch.tensor([T, T - 3, T - 7][:B])
    tl = torch.tensor([U, U - 1, U - 3][:B])
    for b in range(B):  # padding never read
        x[b, il[b]:] = float("nan")
        x[b, :, tl[b] + 1:] = float("nan")
    return x.to(dtype), il, tl


def _dp(blank_arcs, emit_arcs, Tb, Ub, z):
    """``-log p`` by the forward recursion; arcs: lists of ``(duration, score(t, u))``.

    ``z[t, u]`` (zeros) is added to every arc leaving ``(t, u)``: the gradient with
    respect to it is the state's occupation (of the arcs leaving it).
    """
    alpha = {(0, 0): torch.zeros((), dtype=torch.float64)}
    for t in range(Tb + 1):
        for u in range(Ub + 1):
            if (t, u) == (0, 0):
                continue
            terms = []
            for d, score in blank_arcs:
                if t - d >= 0 and (t - d, u) in alpha:
                    terms.append(alpha[(t - d, u)] + score(t - d, u) + z[t - d, u])
            if u > 0 and t < Tb:  # an emission lands on a frame < T_b
                for d, score in emit_arcs:
                    if 0 <= t - d < Tb and (t - d, u - 1) in alpha:
                        terms.append(alpha[(t - d, u - 1)] + score(t - d, u - 1) + z[t - d, u - 1])
            if terms:
                alpha[(t, u)] = torch.logsumexp(torch.stack(terms), 0)
    return -alpha[(Tb, Ub)]


def _oracle_multiblank(x, tg, il, tl, big, sigma):
    x = x.detach().double().requires_grad_()
    z = torch.zeros(x.shape[:3], dtype=torch.float64, requires_grad=True)
    V = x.shape[-1]
    losses = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        lp = torch.log_softmax(x[b, :Tb, : Ub + 1], -1) - sigma
        blanks = [(1, lambda t, u, lp=lp: lp[t, u, V - 1])]
        blanks += [(d, lambda t, u, lp=lp, c=V - 2 - i: lp[t, u, c]) for i, d in enumerate(big)]
        emits = [(0, lambda t, u, lp=lp, y=tg[b]: lp[t, u, y[u]])]
        losses.append(_dp(blanks, emits, Tb, Ub, z[b]))
    loss = torch.stack(losses)
    g, occ = torch.autograd.grad(loss.sum(), (x, z))
    return loss.detach(), g, -occ


def _oracle_tdt(x, tg, il, tl, durs, sigma):
    x = x.detach().double().requires_grad_()
    z = torch.zeros(x.shape[:3], dtype=torch.float64, requires_grad=True)
    D = len(durs)
    V = x.shape[-1] - D
    losses = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        lp = torch.log_softmax(x[b, :Tb, : Ub + 1, :V], -1) - sigma
        ld = torch.log_softmax(x[b, :Tb, : Ub + 1, V:], -1)
        blanks = [(d, lambda t, u, lp=lp, ld=ld, k=k: lp[t, u, V - 1] + ld[t, u, k])
                  for k, d in enumerate(durs) if d > 0]
        emits = [(d, lambda t, u, lp=lp, ld=ld, k=k, y=tg[b]: lp[t, u, y[u]] + ld[t, u, k])
                 for k, d in enumerate(durs)]
        losses.append(_dp(blanks, emits, Tb, Ub, z[b]))
    loss = torch.stack(losses)
    g, occ = torch.autograd.grad(loss.sum(), (x, z))
    return loss.detach(), g, -occ


def _targets(B, U, n_classes, seed):
    g = torch.Generator().manual_seed(seed + 100)
    return torch.randint(0, n_classes, (B, U), generator=g)


def _check(loss, g, want, want_g, occ, il, tl, dtype):
    valid = torch.zeros_like(want_g, dtype=torch.bool)
    for b in range(want_g.shape[0]):
        valid[b, : il[b], : tl[b] + 1] = True
    assert torch.isfinite(g).all()
    assert (g[~valid] == 0).all()
    assert g.dtype == dtype
    # Each row (state) against its own scale, the state's occupation: an entry is
    # softmax * occupation minus an arc's occupation, which may cancel.
    row = occ[..., None].expand_as(want_g)
    err = (g.double() - want_g).abs()
    if dtype == torch.float64:
        assert_close_budget(loss, want, rtol=1e-11, what="loss")
        assert bool((err <= 1e-9 * want_g.abs() + 1e-12 * row).all()), float(
            (err / row).nan_to_num().max())
        return
    assert_close_budget(loss.double(), want, rtol=1e-5, what="loss")
    # The wide dynamic range the test is for: rows far below float32's range come out
    # as exactly 0, and rows of small but representable states keep their accuracy.
    tiny_rows = valid & (row < 2.0**-151)
    assert bool(tiny_rows.any())
    assert (g[tiny_rows] == 0).all()
    ok = valid & (row > 1e-30)
    assert bool((valid & (row > 1e-30) & (row < 1e-10)).any())
    assert bool((err[ok] <= 1e-3 * want_g.abs()[ok] + 1e-5 * row[ok]).all()), \
        float((err[ok] / row[ok]).max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("kw", [{}, {"sigma": 0.05}], ids=["plain", "sigma"])
def test_multiblank_long(dtype, kw):
    big = [2, 4, 8]
    x, il, tl = _batch(3, 40, 14, 12, seed=1, scale=10.0, dtype=dtype)
    tg = _targets(3, 14, 12 - 1 - len(big), 1)
    xr = x.clone().requires_grad_()
    loss = seqloss.multiblank_rnnt_loss(xr, tg, il, tl, big, blank=-1, reduction="none",
                                        backend="numba", **kw)
    (g,) = torch.autograd.grad(loss.sum(), xr)
    want, want_g, occ = _oracle_multiblank(x, tg, il, tl, big, kw.get("sigma", 0.0))
    _check(loss.double(), g, want, want_g, occ, il, tl, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_tdt_long(dtype, pair):
    durs = [0, 1, 2, 3, 4]
    D = len(durs)
    x, il, tl = _batch(3, 40, 6, 9 + D, seed=2, scale=5.0, dtype=dtype)
    tg = _targets(3, 6, 9 - 1, 2)
    if pair:
        a = x[..., :-D].contiguous().requires_grad_()
        b = x[..., -D:].contiguous().requires_grad_()
        loss = seqloss.tdt_loss((a, b), tg, il, tl, durs, blank=-1, sigma=0.02,
                                reduction="none", backend="numba")
        g = torch.cat(torch.autograd.grad(loss.sum(), (a, b)), -1)
    else:
        xr = x.clone().requires_grad_()
        loss = seqloss.tdt_loss(xr, tg, il, tl, durs, blank=-1, sigma=0.02, reduction="none",
                                backend="numba")
        (g,) = torch.autograd.grad(loss.sum(), xr)
    want, want_g, occ = _oracle_tdt(x, tg, il, tl, durs, 0.02)
    _check(loss.double(), g, want, want_g, occ, il, tl, dtype)


def test_tdt_long_clamp_and_mean():
    durs = [0, 1, 2, 3, 4]
    x, il, tl = _batch(3, 30, 5, 8 + 5, seed=3)
    tg = _targets(3, 5, 7, 3)
    xr = x.clone().requires_grad_()
    loss = seqloss.tdt_loss(xr, tg, il, tl, durs, blank=-1, clamp=0.05, reduction="mean_batch",
                            backend="numba")
    (g,) = torch.autograd.grad(loss, xr)
    want, want_g, _ = _oracle_tdt(x, tg, il, tl, durs, 0.0)
    assert_close_budget(loss, want.mean(), rtol=1e-11, what="loss")
    want_g = torch.nan_to_num(want_g.clamp(-0.05, 0.05)) / 3
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-300, what="grad")
