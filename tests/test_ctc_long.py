"""Numba CTC on long utterances: the checkpointed (segmented) sweeps and their peak memory."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("numba")
from seqloss.ctc import numba_cpu as nk
from seqloss.ctc import reference as rk
from seqloss.testing import assert_close_budget


def _inputs(T, B, C, S, *, seed=0, scale=1.0, min_frac=0.8):
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


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("path", ["auto", "extended", "logspace"])
def test_segmented_sweeps_match_torch_and_reference(path, fused, monkeypatch):
    x, tg, il, tl = _inputs(300, 3, 12, 40, seed=1)
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


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_segmented_extended_range_on_its_own(fused, monkeypatch):
    # Log-probabilities spread over hundreds of nats leave the fast path by themselves.
    x, tg, il, tl = _inputs(120, 3, 6, 12, seed=2, scale=150.0)
    lp = x if fused else x.log_softmax(-1)
    want_l, want_g = rk.ctc_loss_forward(lp, tg, il, tl, 0, fused, True)
    for seg in (3, 0):
        loss, grad, status = _run(lp, tg, il, tl, fused, seg=seg, monkeypatch=monkeypatch)
        assert "extended" in status
        assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-9, what="grad")


@pytest.mark.parametrize("path", ["auto", "extended", "logspace"])
def test_forward_only_matches_forward_backward(path, monkeypatch):
    x, tg, il, tl = _inputs(200, 4, 9, 30, seed=3)
    lp = x.log_softmax(-1)
    want, _, _ = _run(lp, tg, il, tl, False, seg=5, path=path, monkeypatch=monkeypatch)
    loss, grad, _ = _run(lp, tg, il, tl, False, seg=0, path=path, compute_grad=False,
                         monkeypatch=monkeypatch)
    assert grad.numel() == 0 and torch.equal(loss, want)


@pytest.mark.parametrize(("fused", "where"), [(False, "label"), (True, "label"),
                                             (True, "other class")])
def test_nan_in_a_segmented_sequence_poisons_it_alone(fused, where, monkeypatch):
    # A NaN log-probability of one of the sequence's labels (or, fused, any logit
    # of a frame) makes its loss and read gradient rows NaN, as in the reference;
    # the others stay fast.
    x, tg, il, tl = _inputs(150, 3, 8, 20, seed=4)
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


def test_automatic_segments_on_a_long_sequence(monkeypatch):
    # Override -1: the automatic checkpointed choice (ceil(sqrt(T_b)) frames per
    # segment) whatever the size, so that a quick size takes that branch.
    x, tg, il, tl = _inputs(400, 2, 10, 60, seed=5)
    il[0] = 400
    want_l, want_g = rk.ctc_loss_forward(x, tg, il, tl, 0, True, True)
    for path in ("auto", "extended", "logspace"):
        loss, grad, status = _run(x, tg, il, tl, True, seg=-1, path=path, monkeypatch=monkeypatch)
        assert status == ["fast" if path == "auto" else path] * 2
        assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-10, what="grad")


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_long_sequence_narrow_blocks_stay_fast(fused, monkeypatch):
    # Beyond LONG_T frames the fast path takes blocks of 4 labels: with 16, alpha's
    # spread within a block leaves float64's range here (about frame 5000; checked with
    # LONG_T raised past T: both cases leave the fast path). At L = 1500 they did not:
    # the spread is widest with many frames per label.
    T, L = 6000, 100
    assert T > nk.LONG_T
    x, tg, il, tl = _inputs(T, 1, 30, L, seed=7, min_frac=1.0)
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
