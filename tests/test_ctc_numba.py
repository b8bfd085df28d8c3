"""Numba CTC kernel specifics: which path runs (fast / extended / log space), each exact."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")
from seqloss.ctc import numba_cpu as nk
from seqloss.ctc import reference as rk
from seqloss.testing import assert_close_budget


def _inputs(T, B, C, S, *, seed=0, scale=2.0, min_frac=0.6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * scale
    il = torch.randint(max(1, int(T * min_frac)), T + 1, (B,), generator=g)
    tl = torch.minimum(torch.randint(0, S + 1, (B,), generator=g), il // 2)
    tg = torch.randint(1, C, (B, S), generator=g)
    return x, tg, il, tl


def _check(x, tg, il, tl, fused, *, path="auto", rtol=1e-10, gatol=1e-10):
    status: list[str] = []
    loss, grad = nk.ctc_loss_forward(x, tg, il, tl, 0, fused, True, _status=status, _path=path)
    want, want_g = rk.ctc_loss_forward(x, tg, il, tl, 0, fused, True)
    assert_close_budget(loss, want, rtol=rtol, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=gatol, what="grad")
    return status


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("path", ["extended", "logspace"])
def test_forced_paths_exact(path, fused):
    x, tg, il, tl = _inputs(30, 5, 7, 8, seed=1)
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, path=path)
    assert set(status) <= {path, "infeasible"} and path in status


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_underflow_leaves_fast_path_and_stays_exact(fused):
    # Log-probabilities spread over hundreds of nats: the scaled probability
    # domain would lose states below float64's range, so the kernel must switch.
    x, tg, il, tl = _inputs(40, 4, 6, 6, seed=2, scale=150.0)
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, rtol=1e-12, gatol=1e-9)
    assert "extended" in status


def test_peaked_logits_1e4():
    x, tg, il, tl = _inputs(20, 3, 6, 5, seed=4)
    lp = (torch.sign(x) * 1e4).log_softmax(-1)
    status = _check(lp, tg, il, tl, False, rtol=1e-12, gatol=1e-9)
    assert "fast" not in status
    loss, grad = nk.ctc_loss_forward(lp.float(), tg, il, tl, 0, False, True)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


def test_batch_mixing_fast_and_fallback():
    x, tg, il, tl = _inputs(50, 6, 8, 10, seed=5, scale=1.0)
    tl[2] = 10
    x[:, 2] *= 3000.0  # only sequence 2 leaves the fast path
    x[:, 4] = float("nan")  # sequence 4 reads NaN: poisoned, no leak into the others
    lp = x.log_softmax(-1)
    status: list[str] = []
    loss, grad = nk.ctc_loss_forward(lp, tg, il, tl, 0, False, True, _status=status)
    want, want_g = rk.ctc_loss_forward(lp, tg, il, tl, 0, False, True)
    ok = [0, 1, 2, 3, 5]
    assert status[2] == "extended" and status[4] == "nonfinite"
    assert torch.isnan(loss[4]) and torch.isnan(grad[: il[4], 4]).all()
    assert (grad[il[4] :, 4] == 0).all()
    assert all(status[b] == "fast" for b in (0, 1, 3, 5) if status[b] != "infeasible")
    assert_close_budget(loss[ok], want[ok], rtol=1e-12, what="loss")
    assert_close_budget(grad[:, ok], want_g[:, ok], rtol=0.0, atol=1e-10, what="grad")


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_long_sequences(fused):
    T = 2000
    x, tg, il, tl = _inputs(T, 2, 12, 300, seed=6, scale=1.0, min_frac=0.9)
    tl[:] = torch.tensor([300, 150])
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, rtol=1e-12, gatol=1e-10)
    assert "logspace" not in status
    loss, grad = nk.ctc_loss_forward(lp.float(), tg, il, tl, 0, fused, True)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_wide_band_stays_on_fast_path(fused):
    # Long alignments: alpha's and beta's spread across the band exceeds float64's
    # ~708 nats (the band's edges are forced paths), but not within a block of
    # states, so the per-block exponents keep every sequence on the fast path.
    x, tg, il, tl = _inputs(900, 2, 60, 180, seed=11, scale=1.0, min_frac=0.95)
    tl[:] = torch.tensor([180, 170])
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, rtol=1e-12, gatol=1e-10)
    assert status == ["fast", "fast"]


def test_lengths_vary_widely():
    T, B = 120, 8
    x, tg, _, _ = _inputs(T, B, 9, 50, seed=7, scale=1.5)
    il = torch.tensor([1, 2, 5, 17, 60, 119, 120, 0])
    tl = torch.tensor([0, 1, 2, 8, 29, 50, 0, 0])
    lp = x.log_softmax(-1)
    lp[120 - 1, 0] = float("nan")  # padding of sequence 0: never read
    status = _check(lp, tg, il, tl, False)
    assert status[7] == "infeasible"


def test_masked_label_is_exactly_infeasible():
    x, tg, il, tl = _inputs(12, 2, 5, 3, seed=8)
    tg[:] = torch.tensor([1, 2, 3])
    tl[:] = 3
    lp = x.log_softmax(-1)
    lp[:, 0, 2] = float("-inf")
    lp[:, 1, 4] = float("-inf")  # not a target of sequence 1: stays feasible and fast
    status: list[str] = []
    loss, grad = nk.ctc_loss_forward(lp, tg, il, tl, 0, False, True, _status=status)
    assert status == ["infeasible", "fast"]
    assert loss[0].item() == float("inf") and torch.count_nonzero(grad[:, 0]) == 0
    want, _ = rk.ctc_loss_forward(lp, tg, il, tl, 0, False, True)
    assert_close_budget(loss, want, rtol=1e-12, what="loss")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_noncontiguous_layouts(dtype):
    x, tg, il, tl = _inputs(25, 4, 6, 6, seed=9)
    lp = x.log_softmax(-1).to(dtype)
    btc = lp.transpose(0, 1).contiguous().transpose(0, 1)  # (B, T, C) storage
    big = torch.zeros(lp.shape[0], lp.shape[1], 2 * lp.shape[2], dtype=dtype)
    big[:, :, ::2] = lp
    strided = big[:, :, ::2]  # neither layout: copied
    ref_l, ref_g = nk.ctc_loss_forward(lp, tg, il, tl, 0, False, True)
    for v in (btc, strided):
        loss, grad = nk.ctc_loss_forward(v, tg, il, tl, 0, False, True)
        assert grad.dtype == dtype and grad.shape == lp.shape
        assert torch.equal(loss, ref_l) and torch.equal(grad, ref_g)


def test_threads_follow_torch_and_do_not_change_results(monkeypatch):
    import threading

    old = torch.get_num_threads()
    x, tg, il, tl = _inputs(40, 6, 5, 6, seed=10)
    lp = x.log_softmax(-1)
    seen = []
    real = nk._ctc_chunk
    main = threading.current_thread().name

    def spy(*args):
        seen.append((threading.current_thread().name, args[-2]))
        return real(*args)

    try:
        outs = []
        for n, min_cells in ((1, 0), (2, 0), (2, nk.POOL_MIN_CELLS)):
            torch.set_num_threads(n)
            monkeypatch.setattr(nk, "POOL_MIN_CELLS", min_cells)
            seen.clear()
            nk._ctc_chunk = spy
            outs.append(nk.ctc_loss_forward(lp, tg, il, tl, 0, False, True, reduction="sum"))
            nk._ctc_chunk = real
            if n == 1 or min_cells:
                # One thread, or a batch too small for the pool: one call on the
                # caller's thread doing the whole batch (chunk 0).
                assert seen == [(main, 0)], seen
            else:
                # The pool's workers (how many of them pick up work depends on the
                # schedule; the results must not).
                assert seen and all(c > 0 for _, c in seen), seen
                assert all(x == main or x.startswith("seqloss") for x, _ in seen), seen
        for o in outs[1:]:
            assert torch.equal(outs[0][0], o[0]) and torch.equal(outs[0][1], o[1])
    finally:
        nk._ctc_chunk = real
        torch.set_num_threads(old)


def test_pool_survives_fork():
    import multiprocessing as mp
    import os

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    x, tg, il, tl = _inputs(20, 4, 5, 3, seed=11)
    lp = x.log_softmax(-1)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = nk.ctc_loss_forward(lp, tg, il, tl, 0, False, False)[0]  # pool started here
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply_async(_child_loss, (lp, tg, il, tl)).get(timeout=120)
        assert torch.equal(got, want)
    finally:
        torch.set_num_threads(old)


def _child_loss(lp, tg, il, tl):
    torch.set_num_threads(2)
    return nk.ctc_loss_forward(lp, tg, il, tl, 0, False, False)[0]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean_target", "mean_batch",
                                       "mean_volume"])
@pytest.mark.parametrize("variant", ["padded", "concat", "fused", "btc", "zero_inf", "float32",
                                     "fallback"])
def test_pool_and_inline_paths_agree(monkeypatch, reduction, variant):
    """A small batch runs inline (one call: checks, sequences, reduction), a large one on
    the pool (checks, jobs, then the reduction): both give the same bits, and match the
    reference. ``fallback``: a sequence leaves the fast path, so the fast entry point
    leaves it pending and ``_ctc_fallback`` finishes it and reduces."""
    x, tg, il, tl = _inputs(30, 7, 6, 6, seed=21)
    il[2] = 4  # infeasible: 4 frames for up to 6 labels (+inf, or 0 with zero_infinity)
    tl[2] = 6
    if variant == "fallback":
        tl[3] = 6
        x[:, 3] *= 3000.0
    lp = x if variant == "fused" else x.log_softmax(-1)
    if variant == "float32":
        lp = lp.float()
    if variant == "btc":
        lp = lp.transpose(0, 1).contiguous().transpose(0, 1)  # a (B, T, C) tensor, transposed
    targets = tg
    if variant == "concat":
        targets = torch.cat([tg[b, : tl[b]] for b in range(len(tl))])
    kw = dict(validate=True, reduction=reduction, zero_infinity=variant == "zero_inf")
    fused = variant == "fused"
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        outs = []
        for min_cells in (10**9, 0):  # inline, then the pool
            monkeypatch.setattr(nk, "POOL_MIN_CELLS", min_cells)
            outs.append(nk.ctc_loss_forward(lp, targets, il, tl, 0, fused, True, **kw))
    finally:
        torch.set_num_threads(old)
    (la, ga), (lb, gb) = outs
    assert torch.equal(la, lb) and torch.equal(ga, gb)
    if variant == "fallback":
        status: list[str] = []
        nk.ctc_loss_forward(lp, targets, il, tl, 0, fused, True, _status=status, **kw)
        assert status[3] == "extended", status
    want, want_g = rk.ctc_loss_forward(lp.double(), tg, il, tl, 0, fused, True)
    if variant == "zero_inf":
        want = torch.where(torch.isinf(want), 0.0, want)
    B = len(tl)
    w = {"mean_target": 1.0 / (tl.clamp(min=1).double() * B),
         "mean_batch": torch.full((B,), 1.0 / B, dtype=torch.float64),
         "mean_volume": torch.full((B,), 1.0 / max(int(tl.sum()), 1), dtype=torch.float64),
         }.get(reduction)
    if reduction == "sum":
        want = want.sum()
    elif w is not None:
        want = (want * w).sum()
        want_g = want_g * w[None, :, None]
    tol = 1e-5 if variant == "float32" else 1e-10
    torch.testing.assert_close(la.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(ga.double(), want_g, rtol=0, atol=tol)
