"""CTC kernel specifics, at each backend's kernel interface, against the float64 reference
kernel or torch's float64 CTC.

Numba: which path runs (fast / extended / log space), each exact; the checkpointed
(segmented) sweeps on long utterances and their peak memory; the thread pool. Triton
(on CPU under ``TRITON_INTERPRET=1``, set by conftest, which is slow: shapes cover what
the family's tests do not, more than 64 states, long and very uneven lengths, many
repeated labels, in few calls). The family's tests on every backend are in test_ctc.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import device_for

from seqloss._core import numba_pool
from seqloss.ctc import reference as rk
from seqloss.testing import assert_close_budget

nk = (importlib.import_module("seqloss.ctc.numba_cpu")
      if importlib.util.find_spec("numba") is not None else None)
triton_ctc = (importlib.import_module("seqloss.ctc.triton_cuda")
              if importlib.util.find_spec("triton") is not None else None)
numba_only = pytest.mark.skipif(nk is None, reason="numba is not installed")
triton_only = pytest.mark.skipif(triton_ctc is None, reason="triton is not installed")
INF = float("inf")


# ------------------------------------------------------------------ Numba's paths
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


@numba_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("path", ["extended", "logspace"])
def test_forced_paths_exact(path, fused):
    x, tg, il, tl = _inputs(30, 5, 7, 8, seed=1)
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, path=path)
    assert set(status) <= {path, "infeasible"} and path in status


@numba_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_underflow_leaves_fast_path_and_stays_exact(fused):
    # Log-probabilities spread over hundreds of nats: the scaled probability
    # domain would lose states below float64's range, so the kernel must switch.
    x, tg, il, tl = _inputs(40, 4, 6, 6, seed=2, scale=150.0)
    lp = x if fused else x.log_softmax(-1)
    status = _check(lp, tg, il, tl, fused, rtol=1e-12, gatol=1e-9)
    assert "extended" in status


@numba_only
def test_peaked_logits_1e4():
    x, tg, il, tl = _inputs(20, 3, 6, 5, seed=4)
    lp = (torch.sign(x) * 1e4).log_softmax(-1)
    status = _check(lp, tg, il, tl, False, rtol=1e-12, gatol=1e-9)
    assert "fast" not in status
    loss, grad = nk.ctc_loss_forward(lp.float(), tg, il, tl, 0, False, True)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()


@numba_only
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


@numba_only
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


@numba_only
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


@numba_only
def test_lengths_vary_widely():
    T, B = 120, 8
    x, tg, _, _ = _inputs(T, B, 9, 50, seed=7, scale=1.5)
    il = torch.tensor([1, 2, 5, 17, 60, 119, 120, 0])
    tl = torch.tensor([0, 1, 2, 8, 29, 50, 0, 0])
    lp = x.log_softmax(-1)
    lp[120 - 1, 0] = float("nan")  # padding of sequence 0: never read
    status = _check(lp, tg, il, tl, False)
    assert status[7] == "infeasible"


@numba_only
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


@numba_only
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


@numba_only
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
                # The caller and the workers: torch's OpenMP team (threads Python did not
                # start: "Dummy-N") where torch runs on libgomp, else seqloss's pool.
                team = numba_pool._team() is not None
                assert all(x == main or x.startswith("Dummy" if team else "seqloss")
                           for x, _ in seen), seen
        for o in outs[1:]:
            assert torch.equal(outs[0][0], o[0]) and torch.equal(outs[0][1], o[1])
    finally:
        nk._ctc_chunk = real
        torch.set_num_threads(old)


@numba_only
def test_threads_keep_subnormals_after_the_fast_path(monkeypatch):
    """The fast path runs with x86's flush-to-zero flags set (a subnormal is never a value
    it keeps, only a slow one to form); every thread that ran it, the caller's and the
    pool's, gets its float state back: subnormals survive arithmetic afterwards."""
    import threading

    import numpy as np

    from seqloss._core.numba_pool import run_jobs

    def subnormals_survive() -> bool:
        tiny = np.float64(5e-324)  # the least subnormal
        return bool(tiny * 1.0 == tiny and np.float32(1e-45) * np.float32(1.0) > 0
                    and torch.tensor(1e-320, dtype=torch.float64).mul(1.0).item() > 0)

    old = torch.get_num_threads()
    x, tg, il, tl = _inputs(40, 6, 5, 6, seed=11)
    lp = x.log_softmax(-1)
    try:
        for n, min_cells in ((1, nk.POOL_MIN_CELLS), (2, 0)):
            torch.set_num_threads(n)
            monkeypatch.setattr(nk, "POOL_MIN_CELLS", min_cells)
            status: list[str] = []
            nk.ctc_loss_forward(lp, tg, il, tl, 0, False, True, _status=status)
            assert "fast" in status
            assert subnormals_survive()
        seen: dict[str, bool] = {}
        run_jobs(lambda job: seen.__setitem__(threading.current_thread().name,
                                              subnormals_survive()), (), range(64))
        assert seen and all(seen.values()), seen
    finally:
        torch.set_num_threads(old)


@numba_only
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


@numba_only
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


# ------------------------------------------------------------------ Numba, long utterances
def _long_inputs(T, B, C, S, *, seed=0, scale=1.0, min_frac=0.8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * scale
    il = torch.randint(max(1, int(T * min_frac)), T + 1, (B,), generator=g)
    tl = torch.minimum(torch.randint(S // 2, S + 1, (B,), generator=g), il // 2)
    tg = torch.randint(1, C, (B, S), generator=g)
    return x, tg, il, tl


def _run(lp, tg, il, tl, fused, *, seg, path="auto", compute_grad=True, monkeypatch):
    monkeypatch.setattr(nk, "_SEGMENT_OVERRIDE", seg)
    status: list[str] = []
    loss, grad = nk.ctc_loss_forward(lp, tg, il, tl, 0, fused, compute_grad, _status=status,
                                     _path=path)
    return loss, grad, status


def _torch_logits_grad(lp, tg, il, tl, fused):
    """torch's float64 CTC losses and the gradient with respect to the logits."""
    z = lp.detach().clone().requires_grad_()
    loss = torch.nn.functional.ctc_loss(z.log_softmax(-1) if fused else z, tg, il, tl,
                                        reduction="none", zero_infinity=False)
    (gz,) = torch.autograd.grad(loss.sum(), z)
    return loss.detach(), gz


def _to_logits_grad(grad, lp, fused):
    """Our gradient, carried to the logits of ``log_softmax`` when it is w.r.t. log-probs."""
    if fused:
        return grad
    return grad - lp.exp() * grad.sum(-1, keepdim=True)


# Segment lengths: forced small (many recomputed segments, a ragged last one), and
# automatic (the whole sequence fits the buffers: nothing recomputed).
SEGS = [2, 7, 0]


@numba_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("path", ["auto", "extended", "logspace"])
def test_segmented_sweeps_match_torch_and_reference(path, fused, monkeypatch):
    x, tg, il, tl = _long_inputs(300, 3, 12, 40, seed=1)
    il[0] = 300
    lp = x if fused else x.log_softmax(-1)
    want_l, want_g = rk.ctc_loss_forward(lp, tg, il, tl, 0, fused, True)
    t_loss, t_gz = _torch_logits_grad(lp, tg, il, tl, fused)
    outs = []
    for seg in SEGS:
        loss, grad, status = _run(lp, tg, il, tl, fused, seg=seg, path=path,
                                  monkeypatch=monkeypatch)
        assert status == ["fast" if path == "auto" else path] * 3
        assert_close_budget(loss, want_l, rtol=1e-12, what="loss vs reference")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-10, what="grad vs reference")
        assert_close_budget(loss, t_loss, rtol=1e-10, what="loss vs torch")
        assert_close_budget(_to_logits_grad(grad, lp, fused), t_gz, rtol=0.0, atol=1e-9,
                            what="grad vs torch")
        outs.append((loss, grad))
    # The recomputed segments reproduce the first sweep bit for bit.
    for loss, grad in outs[1:]:
        assert torch.equal(loss, outs[0][0]) and torch.equal(grad, outs[0][1])


@numba_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_segmented_extended_range_on_its_own(fused, monkeypatch):
    # Log-probabilities spread over hundreds of nats leave the fast path by themselves.
    x, tg, il, tl = _long_inputs(120, 3, 6, 12, seed=2, scale=150.0)
    lp = x if fused else x.log_softmax(-1)
    want_l, want_g = rk.ctc_loss_forward(lp, tg, il, tl, 0, fused, True)
    for seg in (3, 0):
        loss, grad, status = _run(lp, tg, il, tl, fused, seg=seg, monkeypatch=monkeypatch)
        assert "extended" in status
        assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-9, what="grad")


@numba_only
@pytest.mark.parametrize("path", ["auto", "extended", "logspace"])
def test_forward_only_matches_forward_backward(path, monkeypatch):
    x, tg, il, tl = _long_inputs(200, 4, 9, 30, seed=3)
    lp = x.log_softmax(-1)
    want, _, _ = _run(lp, tg, il, tl, False, seg=5, path=path, monkeypatch=monkeypatch)
    loss, grad, _ = _run(lp, tg, il, tl, False, seg=0, path=path, compute_grad=False,
                         monkeypatch=monkeypatch)
    assert grad.numel() == 0 and torch.equal(loss, want)


@numba_only
@pytest.mark.parametrize(("fused", "where"), [(False, "label"), (True, "label"),
                                             (True, "other class")])
def test_nan_in_a_segmented_sequence_poisons_it_alone(fused, where, monkeypatch):
    # A NaN log-probability of one of the sequence's labels (or, fused, any logit
    # of a frame) makes its loss and read gradient rows NaN, as in the reference;
    # the others stay fast.
    x, tg, il, tl = _long_inputs(150, 3, 8, 20, seed=4)
    il[1] = 150
    tg[1] = torch.arange(20) % 3 + 1  # classes 4..7 are not labels of sequence 1
    lp = x if fused else x.log_softmax(-1)
    lp[100, 1, tg[1, 0] if where == "label" else 6] = float("nan")
    loss, grad, status = _run(lp, tg, il, tl, fused, seg=6, monkeypatch=monkeypatch)
    assert status[1] == "nonfinite" and status[0] == status[2] == "fast"
    want_l, want_g = rk.ctc_loss_forward(lp, tg, il, tl, 0, fused, True)
    assert torch.isnan(want_l[1]) and torch.isnan(loss[1])
    assert torch.isnan(grad[: il[1], 1]).all()
    ok = [0, 2]
    assert_close_budget(loss[ok], want_l[ok], rtol=1e-12, what="loss")
    assert_close_budget(grad[:, ok], want_g[:, ok], rtol=0.0, atol=1e-10, what="grad")


@numba_only
def test_automatic_segments_on_a_long_sequence(monkeypatch):
    # Override -1: the automatic checkpointed choice (ceil(sqrt(T_b)) frames per
    # segment) whatever the size, so that a quick size takes that branch.
    x, tg, il, tl = _long_inputs(400, 2, 10, 60, seed=5)
    il[0] = 400
    want_l, want_g = rk.ctc_loss_forward(x, tg, il, tl, 0, True, True)
    for path in ("auto", "extended", "logspace"):
        loss, grad, status = _run(x, tg, il, tl, True, seg=-1, path=path, monkeypatch=monkeypatch)
        assert status == ["fast" if path == "auto" else path] * 2
        assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-10, what="grad")


@numba_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_long_sequence_narrow_blocks_stay_fast(fused, monkeypatch):
    # Beyond LONG_T frames the fast path takes blocks of 4 labels: with 16, alpha's
    # spread within a block leaves float64's range here (about frame 5000; checked with
    # LONG_T raised past T: both cases leave the fast path). At L = 1500 they did not:
    # the spread is widest with many frames per label.
    T, L = 6000, 100
    assert T > nk.LONG_T
    x, tg, il, tl = _long_inputs(T, 1, 30, L, seed=7, min_frac=1.0)
    tl[:] = L
    lp = x if fused else x.log_softmax(-1)
    # torch's float64 CTC: the reference's 6000 frame steps of small ops take far longer.
    want_l, want_gz = _torch_logits_grad(lp, tg, il, tl, fused)
    outs = []
    # Automatic (the whole sequence stored at this L), checkpointed as at larger L
    # (ceil(sqrt(T)) = 78 frames per segment), forced.
    for seg in (0, -1, 1000):
        loss, grad, status = _run(lp, tg, il, tl, fused, seg=seg, monkeypatch=monkeypatch)
        assert status == ["fast"]
        assert_close_budget(loss, want_l, rtol=1e-10, what="loss")
        assert_close_budget(_to_logits_grad(grad, lp, fused), want_gz, rtol=0.0, atol=1e-9,
                            what="grad")
        outs.append((loss, grad))
    for loss, grad in outs[1:]:
        assert torch.equal(loss, outs[0][0]) and torch.equal(grad, outs[0][1])


# --------------------------------------------------------------------------- peak memory
@numba_only
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_long_utterance_peak_memory_at_most_torch():
    """T=12000, C=30, S=1200, B=1: extra peak RSS of forward+backward, seqloss <= torch.

    Measured as the benchmarks do (``peak_memory_subprocess``: a fresh process per
    implementation, one warm-up call, then ``VmHWM - VmRSS`` around one call).
    """
    from seqloss.bench import _common

    # Past LONG_T and checkpointed (ceil(sqrt(T)) frames a segment); torch keeps ~160 MiB.
    case = {"name": "long", "T": 12000, "B": 1, "C": 30, "L": 1200, "seed": 0}
    child = [sys.executable, "-m", "seqloss.bench.ctc"]
    impls = ("torch log_softmax+ctc", "seqloss log_softmax+ctc", "seqloss fused")
    # The three children at once: each peak is its own process's (VmHWM), and most of a
    # child's time is its imports, which then overlap (~45% of the sequential time here).
    with ThreadPoolExecutor(len(impls)) as pool:
        peaks = pool.map(lambda impl: _common.peak_memory_subprocess(child, impl, case,
                                                                     timeout=300), impls)
        got = dict(zip(impls, peaks, strict=True))
    assert all(v is not None for v in got.values()), got
    peer = got["torch log_softmax+ctc"]
    assert peer > 100.0, got  # torch keeps alpha and beta: hundreds of MiB
    assert got["seqloss log_softmax+ctc"] <= peer and got["seqloss fused"] <= peer, got


# ------------------------------------------------------------------ Triton
def _uneven_batch(dtype, *, seed, fused, blank_last=True):
    """Lengths from 0 to T, targets up to S = 40 (K = 81 states, a 128-lane block)."""
    T, C, S = 64, 9, 40
    blank = C - 1 if blank_last else 0
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 6, C, generator=g, dtype=torch.float64) * 2
    lp = x if fused else x.log_softmax(-1)
    labels = torch.tensor([c for c in range(C) if c != blank])
    # Few distinct labels: every target has long groups of the same label, and
    # adjacent repeats (which need an extra blank frame each).
    tg = labels[torch.randint(0, 3, (6, S), generator=g)]
    tg[0, :6] = labels[torch.tensor([1, 1, 1, 2, 1, 1])]
    il = torch.tensor([64, 45, 20, 40, 0, 6])
    tl = torch.tensor([40, 25, 9, 40, 0, 0])
    # Sequence 3 (40 labels in 40 frames) is impossible if its target has a repeat.
    tg[3, 5] = tg[3, 4]
    # Padding frames hold NaN: the kernel must never read them.
    for b in range(6):
        lp[il[b]:, b] = float("nan")
    return lp.to(dtype), tg, il, tl, blank


@triton_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_triton_uneven_lengths_float64_exact(fused):
    lp, tg, il, tl, blank = _uneven_batch(torch.float64, seed=0, fused=fused)
    device = device_for("triton")
    loss, grad = triton_ctc.ctc_loss_forward(lp.to(device), tg.to(device), il.to(device),
                                             tl.to(device), blank, fused, True)
    want_loss, want_grad = rk.ctc_loss_forward(lp, tg, il, tl, blank, fused, True)
    loss, grad = loss.cpu(), grad.cpu()
    assert loss.dtype == torch.float64 and grad.dtype == torch.float64
    assert (loss[3].item() == INF and loss[4].item() == 0.0
            and torch.isfinite(loss[[0, 1, 2, 5]]).all())
    finite = torch.isfinite(want_loss)
    assert torch.equal(finite, torch.isfinite(loss))
    err = (loss[finite] - want_loss[finite]).abs() / want_loss[finite].abs().clamp(min=1)
    assert err.max().item() <= 1e-10
    assert torch.isfinite(grad).all()
    assert (grad - want_grad).abs().max().item() <= 1e-10
    for b in range(6):
        assert torch.count_nonzero(grad[il[b]:, b]) == 0
    assert torch.count_nonzero(grad[:, 3]) == 0


@triton_only
def test_triton_uneven_lengths_float32_and_loss_only():
    lp, tg, il, tl, blank = _uneven_batch(torch.float32, seed=1, fused=True)
    device = device_for("triton")
    args = (lp.to(device), tg.to(device), il.to(device), tl.to(device), blank, True)
    loss, grad = triton_ctc.ctc_loss_forward(*args, True)
    loss_only, empty = triton_ctc.ctc_loss_forward(*args, False)
    assert empty.numel() == 0
    # The loss-only pass keeps two alpha rows instead of T: same arithmetic.
    assert torch.equal(loss_only, loss)
    want_loss, want_grad = rk.ctc_loss_forward(lp.double(), tg, il, tl, blank, True,
                                                          True)
    finite = torch.isfinite(want_loss)
    assert torch.equal(finite, torch.isfinite(loss.cpu()))
    assert ((loss.cpu() - want_loss).abs()[finite] <= 1e-5 * want_loss[finite]).all()
    # Occupations are per-frame softmaxes of rescaled alpha + beta': float32
    # rounding does not grow with the length (64 frames here).
    assert (grad.cpu().double() - want_grad).abs().max().item() <= 1e-5


@triton_only
def test_triton_strided_input_and_blank_zero():
    g = torch.Generator().manual_seed(3)
    T, B, C = 14, 3, 5
    base = torch.randn(B, T, 2 * C, generator=g, dtype=torch.float64)
    x = base.transpose(0, 1)[:, :, ::2]  # (T, B, C) with strides (2C, 2CT, 2)
    assert not x.is_contiguous()
    tg = torch.tensor([[1, 2, 2, 3], [4, 4, 4, 4], [1, 3, 1, 0]])
    il = torch.tensor([14, 11, 9])
    tl = torch.tensor([4, 3, 3])
    device = device_for("triton")
    for fused in (False, True):
        lp = x if fused else x.log_softmax(-1)
        loss, grad = triton_ctc.ctc_loss_forward(lp.to(device), tg.to(device), il.to(device),
                                                 tl.to(device), 0, fused, True)
        want_loss, want_grad = rk.ctc_loss_forward(lp.contiguous(), tg, il, tl, 0, fused,
                                                              True)
        assert (loss.cpu() - want_loss).abs().max().item() <= 1e-10
        assert (grad.cpu() - want_grad).abs().max().item() <= 1e-10


@triton_only
def test_triton_label_groups():
    tg = torch.tensor([[3, 1, 3, 3, 2, 1, 0], [5, 5, 5, 5, 5, 5, 5], [2, 4, 6, 1, 1, 1, 1]])
    tl = torch.tensor([6, 7, 3])
    perm, pos, count, mult = triton_ctc._label_groups(tg, tl, blank=0)
    for b in range(3):
        L = int(tl[b])
        groups = {}
        for i in range(L):
            groups.setdefault(int(tg[b, i]), []).append(i)
        want_count = [0] * tg.shape[1]
        for members in groups.values():
            want_count[members[0]] = len(members)
            # The group, in position order, follows its first member in perm.
            start = int(pos[b, members[0]])
            assert perm[b, start:start + len(members)].tolist() == members
        assert count[b].tolist() == want_count
        assert int(mult[b]) == max(want_count)
