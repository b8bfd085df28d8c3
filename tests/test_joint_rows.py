"""The joint's row passes on CPU (``seqloss.transducer.joint.numba_rows``): the written-out
``exp``, rows of ``-inf``, wide rows, and results independent of the thread count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import seqloss

pytest.importorskip("numba")

from numba import njit

from seqloss._core.numba_exp import vexp, vlog1pexp
from seqloss.transducer.joint import numba_cpu, numba_rows


@njit(cache=False)
def _exp_array(x, out):
    for i in range(x.shape[0]):
        out[i] = vexp(x[i])


@pytest.mark.parametrize("dtype, lo, ulps", [(np.float32, -87.0, 4), (np.float64, -707.0, 2)],
                         ids=["fp32", "fp64"])
def test_exp_against_libm(dtype, lo, ulps):
    x = np.concatenate([np.linspace(lo, 1.0, 200001), [0.0, -0.0, 1e-30, -1e-30]]).astype(dtype)
    out = np.empty_like(x)
    _exp_array(x, out)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(dtype)).astype(np.float64)
    err = np.abs(out.astype(np.float64) - want) / ulp
    assert err.max() <= ulps, (float(err.max()), float(x[np.argmax(err)]))


@njit(cache=False)
def _log1pexp_array(x, out):
    for i in range(x.shape[0]):
        out[i] = vlog1pexp(x[i])


def test_log1pexp_against_libm():
    # The lattice's logaddexp correction: log1p(exp(d)) for d <= 0, within 3 ulp of libm's
    # (itself within 1) over float64's normal range, exactly 0 below it and at -inf.
    x = np.concatenate([-np.geomspace(1e-300, 708.0, 200001), [0.0, -0.0]])
    out = np.empty_like(x)
    _log1pexp_array(x, out)
    want = np.log1p(np.exp(x))
    err = np.abs(out - want) / np.spacing(want)
    assert err.max() <= 3, (float(err.max()), float(x[np.argmax(err)]))
    special = np.array([-np.inf, np.nan, -1e4, -746.0])
    out = np.empty_like(special)
    _log1pexp_array(special, out)
    assert out[0] == 0.0 and np.isnan(out[1]) and (out[2:] == 0.0).all()


@pytest.mark.parametrize("dtype, below", [(np.float32, [-1e4, -104.0, -88.0]),
                                          (np.float64, [-1e4, -750.0, -709.0])],
                         ids=["fp32", "fp64"])
def test_exp_special_values(dtype, below):
    x = np.array([-np.inf, np.nan, *below], dtype=dtype)
    out = np.empty_like(x)
    _exp_array(x, out)
    assert out[0] == 0.0  # exp(-inf): an exact zero (a masked class)
    assert np.isnan(out[1])  # NaN survives: the caller's NaN check is the row's sum
    # Below the normal range: exactly 0 (no subnormal results, no microcode assists).
    assert (out[2:] == 0).all()
    assert (np.exp(x[2:].astype(np.float64)) < np.finfo(dtype).tiny).all()


@pytest.fixture(autouse=True)
def rows_everywhere(monkeypatch):
    """The row passes for every width here (by default only rows of >= 512 classes for
    RNN-T, >= 128 for the many-arc tables)."""
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 1)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 1)


def _batch(B, T, U, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype) * 3
    tg = torch.randint(1, V, (B, U), generator=g)
    il = torch.full((B,), T)
    tl = torch.full((B,), U)
    il[-1], tl[-1] = T - 2, U - 1
    return x, tg, il, tl


def _loss_grad(x, *args, **kw):
    x = x.detach().clone().requires_grad_()
    loss = seqloss.rnnt_loss(x, *args, blank=0, reduction="none", **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), g


def test_rows_of_neg_inf_have_no_arc_out():
    x, tg, il, tl = _batch(2, 6, 3, 9, seed=1, dtype=torch.float64)
    x[0, 2, 1] = -math.inf  # state (t=2, u=1) of sequence 0: no arc leaves it
    x[1, 0, 0, 1:] = -math.inf  # only the blank leaves the start
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x, tg, il, tl, backend="reference")
    assert torch.isfinite(a).all() and torch.isfinite(ga).all()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-15)
    assert torch.count_nonzero(ga[0, 2, 1]) == 0


@pytest.mark.parametrize("V", [1, 17, 4099], ids=["V1", "V17", "V4099"])
def test_row_widths_against_float64(V):
    # Widths around the 16 lanes of the row max (a tail, none, one class only); a wide
    # row of float32 summed in float32 stays within float32's rounding of the float64 loss.
    x, tg, il, tl = _batch(2, 5, 2, max(V, 2), seed=2)
    x = x[..., :V].contiguous()
    tg = tg.clamp(max=V - 1) if V > 1 else tg
    if V == 1:  # blank only: an empty target
        tl[:] = 0
        tg = tg[:, :0]
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x.double(), tg, il, tl, backend="reference")
    torch.testing.assert_close(a.double(), b, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(ga.double(), gb, rtol=1e-4, atol=2e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_same_bits_for_any_thread_count(dtype):
    x, tg, il, tl = _batch(3, 40, 12, 64, seed=3, dtype=dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a, ga = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.2)
        torch.set_num_threads(2)
        b, gb = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(a, b) and torch.equal(ga, gb)


def test_huge_logits_keep_their_digits():
    # Log-probs as (x - m) - log(s): with logits of 1e4 nothing of float32's precision
    # is lost to the shift (x - (m + log s) would round away the small part).
    x, tg, il, tl = _batch(2, 6, 3, 11, seed=4)
    x = x + 1e4
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x.double(), tg, il, tl, backend="reference")
    torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ga.double(), gb, rtol=1e-4, atol=1e-6)


def _grads(fn, x, *args, **kw):
    xs = tuple(t.detach().clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,)))
    loss = fn(xs if isinstance(x, tuple) else xs[0], *args, reduction="none", **kw)
    gs = torch.autograd.grad(loss.sum(), xs)
    return loss.detach(), torch.cat(gs, -1)


def _pack(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1]) for b in range(len(il))])


CASES = {
    "rnnt": lambda x, tg, il, tl, V, **kw: (seqloss.rnnt_loss, x[..., :V], (tg, il, tl),
                                            dict(blank=0, **kw)),
    "rnnt-packed": lambda x, tg, il, tl, V, **kw: (seqloss.rnnt_loss_packed,
                                                   _pack(x[..., :V], il, tl), (tg, il, tl),
                                                   dict(blank=0, **kw)),
    "multiblank": lambda x, tg, il, tl, V, **kw: (seqloss.multiblank_rnnt_loss, x[..., :V],
                                                  (tg, il, tl),
                                                  dict(blank=V - 1, big_blank_durations=[2, 3],
                                                       **kw)),
    "tdt": lambda x, tg, il, tl, V, **kw: (seqloss.tdt_loss, x, (tg, il, tl),
                                           dict(blank=V - 1, durations=[0, 1, 2], **kw)),
    "tdt-pair": lambda x, tg, il, tl, V, **kw: (seqloss.tdt_loss, (x[..., :V], x[..., V:]),
                                                (tg, il, tl),
                                                dict(blank=V - 1, durations=[0, 1, 2], **kw)),
}


@pytest.mark.parametrize("kw", [{}, {"clamp": 0.05}, {"fastemit_lambda": 0.01}],
                         ids=["plain", "clamp", "fastemit"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_table_against_the_reference(case, dtype, kw):
    if "fastemit_lambda" in kw and case.startswith("tdt"):
        pytest.skip("FastEmit is a multi-blank/RNN-T option")
    V = 13
    x, tg, il, tl = _batch(3, 7, 4, V + 3, seed=5, dtype=dtype)
    tg = tg % (V - 4) + 1  # never a blank-like class of any table here
    fn, xin, args, opts = CASES[case](x, tg, il, tl, V, **kw)
    a, ga = _grads(fn, xin, *args, backend="numba", **opts)
    xref = tuple(t.double() for t in xin) if isinstance(xin, tuple) else xin.double()
    b, gb = _grads(fn, xref, *args, backend="reference", **opts)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(a.double(), b, **tol)
    torch.testing.assert_close(ga.double(), gb, **tol)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "posinf"])
def test_nonfinite_poisons_one_sequence(case, bad):
    V = 13
    x, tg, il, tl = _batch(3, 7, 4, V + 3, seed=6)
    tg = tg % (V - 4) + 1
    clean = _grads(*CASES[case](x, tg, il, tl, V)[:2], tg, il, tl, backend="numba",
                   **CASES[case](x, tg, il, tl, V)[3])
    x = x.clone()
    x[1, 2, 1, 3] = bad  # a token logit of sequence 1
    fn, xin, args, opts = CASES[case](x, tg, il, tl, V)
    loss, g = _grads(fn, xin, *args, backend="numba", **opts)
    assert torch.isnan(loss[1]) and not torch.isnan(loss[[0, 2]]).any()
    torch.testing.assert_close(loss[[0, 2]], clean[0][[0, 2]], rtol=0, atol=0)


def test_inplace_gradient_is_bit_identical():
    x, tg, il, tl = _batch(3, 9, 4, 33, seed=7)
    a, ga = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.3)
    xi = x.clone().requires_grad_()
    h = xi * 1.0  # a non-leaf: the gradient may overwrite it
    loss = seqloss.rnnt_loss(h, tg, il, tl, blank=0, reduction="none", backend="numba",
                             clamp=0.3, inplace_grad=True)
    (gi,) = torch.autograd.grad(loss.sum(), xi)
    assert torch.equal(loss.detach(), a) and torch.equal(gi, ga)


@pytest.mark.parametrize("case", sorted(CASES))
def test_row_passes_against_chunked_torch_ops(monkeypatch, case):
    V = 700
    x, tg, il, tl = _batch(3, 12, 5, V + 3, seed=8)
    tg = tg % (V - 4) + 1
    fn, xin, args, opts = CASES[case](x, tg, il, tl, V, clamp=0.2)
    a, ga = _grads(fn, xin, *args, backend="numba", **opts)
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 10**9)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 10**9)
    b, gb = _grads(fn, xin, *args, backend="numba", **opts)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    # The two exps (vectorized in Numba, torch's) differ by an ulp or two; an entry
    # ``softmax * total - occupation`` of terms up to 1 then differs by a few float32
    # ulps of 1 after the cancellation (seen: 4.6e-8 on an AMD EPYC, duration column).
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=3e-7)


def test_wide_rows_take_the_row_passes_by_default(monkeypatch):
    # RNN-T from 512 classes (below, torch's chunked ops measured faster); the many-arc
    # tables (multi-blank, TDT) from their own width (16 by default; 128 here).
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 512)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 128)
    calls = []
    orig = numba_rows.RowPasses.prologue

    def spy(self, g=None, arcs=None):
        calls.append(self.V)
        return orig(self, g, arcs)

    monkeypatch.setattr(numba_rows.RowPasses, "prologue", spy)
    for V in (127, 128, 511, 512):
        x, tg, il, tl = _batch(2, 4, 2, V, seed=9)
        _loss_grad(x, tg, il, tl, backend="numba")
        seqloss.multiblank_rnnt_loss(x.requires_grad_(), tg % (V - 3) + 1, il, tl, blank=V - 1,
                                     big_blank_durations=[2], backend="numba").backward()
    assert calls == [128, 511, 512, 512]
