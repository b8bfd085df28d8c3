"""CTC's ``delay_penalty`` (k2's latency penalty) on every backend, against brute force.

Every frame ``t`` a path spends on a non-blank label gains ``dp * ((T_b - 1) / 2 - t)``
in log space. The oracles: every alignment path of tiny cases enumerated in float64
(gradients by autograd through the enumeration), and for long inputs torch's own
``ctc_loss`` on the penalized log-probabilities, renormalized per frame.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import device_for
from hypothesis import given, settings
from hypothesis import strategies as st

from seqloss._core.errors import InputError
from seqloss.ctc.api import CTCLoss, ctc_loss
from seqloss.testing import assert_close_budget

INF = float("inf")
F64 = torch.float64


# ------------------------------------------------------------------ oracles
def _collapse(path, blank):
    out, prev = [], None
    for c in path:
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return tuple(out)


@functools.cache
def _paths(T, C, target, blank):
    return [p for p in itertools.product(range(C), repeat=T) if _collapse(p, blank) == target]


def brute(lp, target, Tb, blank, dp):
    """``-log sum_paths exp(sum_t lp[t, path_t] + sum_{t: path_t != blank} dp ((Tb-1)/2 - t))``
    over the first ``Tb`` frames of ``lp (T, C)``; differentiable by autograd."""
    target = tuple(int(v) for v in target)
    if Tb == 0:
        return lp.sum() * 0 + (0.0 if not target else INF)
    paths = _paths(Tb, lp.shape[1], target, blank)
    if not paths:
        return lp.sum() * 0 + INF
    P = torch.tensor(paths)
    t = torch.arange(Tb)
    pen = torch.tensor([dp * ((Tb - 1) / 2 - k) for k in range(Tb)], dtype=F64)
    score = lp[t, P].sum(1) + (pen * (P != blank)).sum(1)
    return -torch.logsumexp(score, 0)


def brute_batch(x, tg, il, tl, blank, dp, fused):
    """Per-sequence losses ``(B,)`` of ``x (T, B, C)`` (logits when ``fused``)."""
    lp = x.log_softmax(-1) if fused else x
    return torch.stack([brute(lp[:, b], tg[b, :tl[b]].tolist(), int(il[b]), blank, dp)
                        for b in range(x.shape[1])])


def torch_oracle(x, tg, il, tl, blank, dp, fused):
    """Loss ``(B,)`` and gradient through torch's ``ctc_loss`` (float64): the penalty
    added to the label columns, each frame renormalized (every path takes one class per
    frame, so the loss shifts by the normalizers' sum), the penalized occupation read
    back from torch's gradient ``exp(lp) - occupation``."""
    T, B, C = x.shape
    lp = x.log_softmax(-1) if fused else x
    t = torch.arange(T, dtype=F64)[:, None]
    pen = dp * ((il.to(F64)[None, :] - 1) * 0.5 - t)  # (T, B)
    label = torch.ones(C, dtype=F64)
    label[blank] = 0.0
    shifted = lp + pen[:, :, None] * label
    lse = torch.logsumexp(shifted, -1)
    valid = t < il[None, :]
    norm = (shifted - lse[:, :, None]).detach().requires_grad_()
    loss_n = F.ctc_loss(norm, tg, il, tl, blank, "none")
    (g,) = torch.autograd.grad(loss_n.sum(), norm)
    occ = torch.where(valid[:, :, None], norm.exp() - g, 0.0)
    loss = loss_n - torch.where(valid, lse, 0.0).sum(0)
    grad = -occ
    if fused:
        grad = torch.where(valid[:, :, None], x.softmax(-1), 0.0) + grad
    return loss.detach(), grad.detach()


def _batch(T, B, C, S, *, seed, blank=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=F64) * scale
    labels = torch.tensor([c for c in range(C) if c != blank])
    tg = labels[torch.randint(0, len(labels), (B, S), generator=g)]
    return x, tg


# A batch with different T_b (the penalty is centred on each sequence's own length),
# a repeat, an empty target and a zero-frame sequence.
IL = torch.tensor([6, 4, 5, 3, 0])
TL = torch.tensor([2, 1, 3, 0, 0])
TG = torch.tensor([[1, 2, 0], [3, 0, 0], [2, 2, 1], [0, 0, 0], [0, 0, 0]])


def _ours(x, backend, dp, fused, reduction="none", zero_infinity=False, tg=TG, il=IL, tl=TL):
    device = device_for(backend)
    xin = x.detach().to(device).requires_grad_()
    loss = ctc_loss(xin, tg.to(device), il.to(device), tl.to(device), 0, reduction,
                    zero_infinity, fused_log_softmax=fused, delay_penalty=dp, backend=backend)
    return xin, loss


# ------------------------------------------------------------------ brute force
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("dp", [0.7, -0.9, 0.0], ids=["pos", "neg", "zero"])
def test_brute_force(ctc_backend, dp, fused):
    x, _ = _batch(6, 5, 4, 3, seed=1)
    if not fused:
        x = x.log_softmax(-1)
    xin, loss = _ours(x, ctc_backend, dp, fused)
    w = torch.linspace(0.5, 1.5, 5, dtype=loss.dtype, device=loss.device)
    (grad,) = torch.autograd.grad((loss * w).sum(), xin)
    xo = x.clone().requires_grad_()
    want = brute_batch(xo, TG, IL, TL, 0, dp, fused)
    (want_g,) = torch.autograd.grad((want * w.cpu()).sum(), xo)
    assert_close_budget(loss, want, rtol=1e-11, atol=1e-12, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=1e-11, what="grad")


@pytest.mark.parametrize("lane", ["lane", "general"])
def test_numba_fast_lane_and_general_path(lane):
    # int64 tensors take the eager fast lane (fast.py); int32 targets the general path.
    pytest.importorskip("numba")
    x, _ = _batch(6, 5, 4, 3, seed=2)
    x = x.log_softmax(-1)
    tg = TG if lane == "lane" else TG.int()
    xin, loss = _ours(x, "numba", 0.45, False, tg=tg)
    (grad,) = torch.autograd.grad(loss.sum(), xin)
    xo = x.clone().requires_grad_()
    want = brute_batch(xo, TG, IL, TL, 0, 0.45, False)
    (want_g,) = torch.autograd.grad(want.sum(), xo)
    assert_close_budget(loss, want, rtol=1e-11, atol=1e-12, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=1e-11, what="grad")


@pytest.mark.parametrize("path", ["auto", "extended", "logspace"])
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_numba_each_path(path, fused):
    """Each of the Numba kernel's three paths carries the penalty exactly."""
    nk = pytest.importorskip("seqloss.ctc.numba_cpu")
    x, _ = _batch(6, 5, 4, 3, seed=3)
    if not fused:
        x = x.log_softmax(-1)
    for dp in (1.3, -0.6):
        status: list[str] = []
        loss, grad = nk.ctc_loss_forward(x, TG, IL, TL, 0, fused, True, delay_penalty=dp,
                                         _status=status, _path=path)
        assert (path == "auto" and "fast" in status) or path in status
        xo = x.clone().requires_grad_()
        want = brute_batch(xo, TG, IL, TL, 0, dp, fused)
        (want_g,) = torch.autograd.grad(want.sum(), xo)
        assert_close_budget(loss, want, rtol=1e-11, atol=1e-12, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-11, what="grad")


# ------------------------------------------------------------------ dtypes, reductions
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_dtypes_against_float64_brute_force(ctc_backend, dtype, fused):
    x, _ = _batch(6, 5, 4, 3, seed=4)
    if not fused:
        x = x.log_softmax(-1)
    xr = x.to(dtype)  # the oracle sees the rounded input: only the kernel's error is measured
    xin, loss = _ours(xr, ctc_backend, 0.6, fused)
    assert loss.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss.sum(), xin)
    assert grad.dtype == dtype
    xo = xr.to(F64).requires_grad_()
    want = brute_batch(xo, TG, IL, TL, 0, 0.6, fused)
    (want_g,) = torch.autograd.grad(want.sum(), xo)
    # float32 accumulation (Triton) or float64 rounded once (reference, Numba); the
    # gradient is rounded once to its dtype (|grad| <= 1).
    assert_close_budget(loss, want, rtol=2e-6, atol=2e-6, what="loss")
    eps = torch.finfo(dtype).eps
    assert_close_budget(grad.float(), want_g, rtol=0.0, atol=eps if eps > 1e-6 else 2e-6,
                        what="grad")


REDUCTIONS = ["none", "sum", "mean", "mean_batch", "mean_volume"]


def _reduce(losses, tl, reduction):
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return (losses / tl.clamp(min=1).to(losses.dtype)).mean()
    if reduction == "mean_batch":
        return losses.mean()
    return losses.sum() / max(int(tl.sum()), 1)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reductions_and_zero_infinity(ctc_backend, reduction):
    # Sequence 1 is impossible (a repeat needs 3 frames, it has 2).
    tg = torch.tensor([[1, 2, 0], [3, 3, 0], [2, 2, 1]])
    il = torch.tensor([6, 2, 5])
    tl = torch.tensor([2, 2, 3])
    x, _ = _batch(6, 3, 4, 3, seed=5)
    x = x.log_softmax(-1)
    xin, loss = _ours(x, ctc_backend, -0.8, False, reduction, True, tg=tg, il=il, tl=tl)
    w = torch.tensor([0.5, 1.0, 2.0], dtype=loss.dtype, device=loss.device)
    (grad,) = torch.autograd.grad((loss * w).sum() if loss.dim() else loss, xin)
    xo = x.clone().requires_grad_()
    per = brute_batch(xo, tg, il, tl, 0, -0.8, False)
    assert per[1].item() == INF
    per = torch.where(torch.isinf(per), 0.0, per)  # zero_infinity
    want = _reduce(per, tl, reduction)
    (want_g,) = torch.autograd.grad((want * w).sum() if want.dim() else want, xo)
    assert_close_budget(loss, want, rtol=1e-11, atol=1e-12, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=1e-11, what="grad")
    assert torch.count_nonzero(grad[:, 1]) == 0


def test_impossible_without_zero_infinity(ctc_backend):
    tg = torch.tensor([[3, 3]])
    xin, loss = _ours(torch.randn(2, 1, 4, dtype=F64).log_softmax(-1), ctc_backend, 0.5, False,
                      tg=tg, il=torch.tensor([2]), tl=torch.tensor([2]))
    (grad,) = torch.autograd.grad(loss.sum(), xin)
    assert loss.item() == INF and torch.count_nonzero(grad) == 0


def test_gradcheck(ctc_backend):
    device = device_for(ctc_backend)
    x, _ = _batch(5, 2, 3, 2, seed=6)
    x = x.to(device).requires_grad_()
    tg = torch.tensor([[1, 2], [2, 0]], device=device)
    il = torch.tensor([5, 4], device=device)
    tl = torch.tensor([2, 1], device=device)
    for dp, fused in ((0.9, True), (-1.1, False)):
        def f(v, dp=dp, fused=fused):
            return ctc_loss(v if fused else v.log_softmax(-1), tg, il, tl, reduction="none",
                            fused_log_softmax=fused, delay_penalty=dp, backend=ctc_backend)

        assert torch.autograd.gradcheck(f, (x,), fast_mode=ctc_backend == "triton")


# ------------------------------------------------------------------ long inputs, big penalties
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["pos", "neg"])
def test_large_penalty_long_input(ctc_backend, sign, dtype):
    """|dp| (T - 1) / 2 ~ 1000 nats at the ends (Numba: dp = 1, T = 2000; the reference's
    Python loop over frames and the interpreted Triton kernels, ~60 ms a frame, get
    shorter inputs and larger penalties): far past float64's exp range, no overflow, exact
    against torch's float64 CTC."""
    T, dp, S = {"triton": (40, 50.0, 6), "reference": (500, 4.0, 12)}.get(
        ctc_backend, (2000, 1.0, 12))
    dp *= sign
    x, tg = _batch(T, 2, 5, S, seed=7)
    il = torch.tensor([T, T - T // 7])
    tl = torch.tensor([S, S - 3])
    fused = dp < 0
    if not fused:
        x = x.log_softmax(-1)
    want, want_g = torch_oracle(x, tg, il, tl, 0, dp, fused)
    xin, loss = _ours(x.to(dtype), ctc_backend, dp, fused, tg=tg, il=il, tl=tl)
    (grad,) = torch.autograd.grad(loss.sum(), xin)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    # A float32 loss of ~5e5 is rounded to float32 (ulp 0.03). Triton accumulates
    # float32 input in float32: emissions of ~1000 nats carry an absolute rounding of
    # ~1e-4 each (ulp(1000) = 6e-5). In float64 the oracle's own unscaled log-space alpha
    # and beta reach ~1e6 nats (ulp 1.2e-10), hence 1e-8.
    f32 = dtype == torch.float32
    f32_acc = f32 and ctc_backend == "triton"
    assert_close_budget(loss, want, rtol=1e-6 if f32_acc else (1.2e-7 if f32 else 1e-10),
                        what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=2e-3 if f32_acc else (2e-6 if f32 else 1e-8),
                        what="grad")


@pytest.mark.parametrize("logits", ["randn", "uniform", "peaky"])
def test_large_penalty_numba_paths(logits):
    """A penalty spreads a frame's states apart: by up to |dp| T^2 / 8 nats between state 0
    and the rest (uniform logits), |dp| (T - 1) / 2 between neighbouring labels. The fast
    path keeps the sequence while a label's spread fits a block (narrower blocks; states
    that fall out of float64's range below their block's maximum are dropped, and the
    check on every frame's sum proves that exact); past that, the extended path. Either
    way the result is torch's float64 CTC on the penalized log-probabilities."""
    nk = pytest.importorskip("seqloss.ctc.numba_cpu")
    T, S = 600, 10
    x, tg = _batch(T, 2, 5, S, seed=8)
    if logits == "uniform":
        x = torch.zeros_like(x)
    elif logits == "peaky":
        x = 2 * x
        x[..., 0] += 8.0
    x = x.log_softmax(-1)
    il, tl = torch.tensor([T, T - 50]), torch.tensor([S, S - 2])
    # 0.5 T^2 / 8 = 22500 nats of spread, 150 nats between neighbouring labels
    for dp, path in ((0.003, "fast"), (0.5, "fast"), (-0.5, "fast"), (5.0, "extended")):
        status: list[str] = []
        loss, grad = nk.ctc_loss_forward(x, tg, il, tl, 0, False, True, delay_penalty=dp,
                                         _status=status)
        assert status == [path, path], dp
        want, want_g = torch_oracle(x, tg, il, tl, 0, dp, False)
        assert_close_budget(loss, want, rtol=1e-11, what="loss")
        assert_close_budget(grad, want_g, rtol=0.0, atol=1e-10, what="grad")


@pytest.mark.parametrize("T, S, logits, dp", [
    (1000, 100, "randn", -1.0), (1000, 100, "uniform", -1.0), (2000, 150, "randn", -0.5),
    (600, 10, "uniform", -1.5)])
def test_checked_drops_keep_the_fast_path(T, S, logits, dp):
    """Cases the fast path used to hand to the extended one (an underflow in a block whose
    maximum was small, refused at once): each drop's bound is now checked at the frame's
    occupation against what it meets, so all three sequences stay fast, and exact."""
    nk = pytest.importorskip("seqloss.ctc.numba_cpu")
    g = torch.Generator().manual_seed(T + S)
    x = torch.randn(T, 3, 30, generator=g, dtype=torch.float64)
    if logits == "uniform":
        x = torch.zeros_like(x)
    x = x.log_softmax(-1)
    tg = torch.randint(1, 30, (3, S), generator=g)
    il, tl = torch.tensor([T, T - 7, T - 50]), torch.tensor([S, S - 1, S - 3])
    status: list[str] = []
    loss, grad = nk.ctc_loss_forward(x, tg, il, tl, 0, False, True, delay_penalty=dp,
                                     _status=status)
    assert status == ["fast"] * 3
    want, want_g = torch_oracle(x, tg, il, tl, 0, dp, False)
    assert_close_budget(loss, want, rtol=1e-11, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=1e-10, what="grad")


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("bad", [float("nan"), INF, -INF])
def test_non_finite_is_an_input_error(bad):
    x = torch.randn(4, 1, 3).log_softmax(-1)
    with pytest.raises(InputError, match="delay_penalty"):
        ctc_loss(x, torch.tensor([[1]]), torch.tensor([4]), torch.tensor([1]), delay_penalty=bad)
    with pytest.raises(InputError, match="delay_penalty"):
        CTCLoss(delay_penalty=bad)


@pytest.mark.parametrize("bad", [True, "0.5", None, [0.5]])
def test_non_number_is_a_type_error(bad):
    x = torch.randn(4, 1, 3).log_softmax(-1)
    with pytest.raises(TypeError, match="delay_penalty"):
        ctc_loss(x, torch.tensor([[1]]), torch.tensor([4]), torch.tensor([1]), delay_penalty=bad)
    with pytest.raises(TypeError, match="delay_penalty"):
        CTCLoss(delay_penalty=bad)


def test_module_and_int_penalty():
    x, _ = _batch(6, 5, 4, 3, seed=9)
    x = x.log_softmax(-1)
    mod = CTCLoss(reduction="none", delay_penalty=2)
    assert "delay_penalty=2.0" in repr(mod)
    got = mod(x, TG, IL, TL)
    want = brute_batch(x, TG, IL, TL, 0, 2.0, False)
    assert_close_budget(got, want, rtol=1e-11, atol=1e-12, what="loss")


# ------------------------------------------------------------------ property
@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 6), C=st.integers(2, 4), S=st.integers(0, 3),
       dp=st.floats(-3.0, 3.0, allow_nan=False), blank_last=st.booleans(),
       seed=st.integers(0, 2**16))
def test_property_against_brute_force(T, C, S, dp, blank_last, seed):
    blank = C - 1 if blank_last else 0
    x, tg = _batch(T, 2, C, S, seed=seed, blank=blank)
    g = torch.Generator().manual_seed(seed + 1)
    il = torch.randint(0, T + 1, (2,), generator=g)
    tl = torch.randint(0, S + 1, (2,), generator=g)
    lp = x.log_softmax(-1)
    want = brute_batch(lp, tg, il, tl, blank, dp, False)
    for backend in ("reference", "numba"):
        got = ctc_loss(lp, tg, il, tl, blank, "none", delay_penalty=dp, backend=backend)
        assert_close_budget(got, want, rtol=1e-10, atol=1e-10, what=backend)


@settings(max_examples=10, deadline=None)
@given(T=st.integers(40, 400), S=st.integers(1, 12), dp=st.floats(-2.0, 2.0, allow_nan=False),
       scale=st.sampled_from([0.0, 1.0, 4.0]), seed=st.integers(0, 2**16))
def test_property_numba_any_penalty_against_torch(T, S, dp, scale, seed):
    """Whatever path the penalty sends a sequence down (blocks narrowed, states dropped,
    the extended path), the result is torch's float64 CTC on penalized log-probabilities."""
    x, tg = _batch(T, 2, 6, S, seed=seed, scale=scale)
    lp = x.log_softmax(-1)
    il, tl = torch.tensor([T, max(T - 7, S)]), torch.tensor([S, max(S - 1, 0)])
    want, want_g = torch_oracle(lp, tg, il, tl, 0, dp, False)
    xin = lp.clone().requires_grad_()
    got = ctc_loss(xin, tg, il, tl, 0, "none", delay_penalty=dp, backend="numba")
    (grad,) = torch.autograd.grad(got.sum(), xin)
    assert_close_budget(got, want, rtol=1e-10, atol=1e-10, what="loss")
    assert_close_budget(grad, want_g, rtol=0.0, atol=1e-9, what="grad")


# ------------------------------------------------------------------ cost
def test_cost_of_a_zero_penalty_is_nil():
    """dp = 0 runs the same kernels as before: the same bits as an omitted penalty."""
    x, tg = _batch(50, 3, 6, 8, seed=10)
    x = x.float().log_softmax(-1).requires_grad_()
    il, tl = torch.tensor([50, 40, 45]), torch.tensor([8, 5, 7])
    a = ctc_loss(x, tg, il, tl, backend="numba")
    (ga,) = torch.autograd.grad(a, x)
    b = ctc_loss(x, tg, il, tl, backend="numba", delay_penalty=0.0)
    (gb,) = torch.autograd.grad(b, x)
    assert torch.equal(a, b) and torch.equal(ga, gb)


def bench(T=500, B=8, C=100, S=60, dps=(0.0, 0.5), reps=15, inner=5):
    """Median forward+backward time (s) on Numba per penalty, interleaved in one process."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, C, generator=g).log_softmax(-1).requires_grad_()
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.full((B,), T)
    tl = torch.full((B,), S)

    def run(dp):
        x.grad = None
        ctc_loss(x, tg, il, tl, delay_penalty=dp, backend="numba").backward()

    times = {dp: [] for dp in dps}
    for dp in dps:
        run(dp)
    for _ in range(reps):
        for dp in dps:
            t0 = time.perf_counter()
            for _ in range(inner):
                run(dp)
            times[dp].append((time.perf_counter() - t0) / inner)
    return {dp: statistics.median(v) for dp, v in times.items()}


if __name__ == "__main__":
    for dps in ((0.0, 0.5), (0.0, 0.01)):
        med = bench(dps=dps)
        base = med[0.0]
        print(", ".join(f"dp={dp}: {t * 1e3:.2f} ms" for dp, t in med.items()),
              f"ratio {med[dps[1]] / base:.3f}", f"(log2 {math.log2(med[dps[1]] / base):.3f})")
