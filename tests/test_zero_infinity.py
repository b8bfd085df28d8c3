"""``zero_infinity`` on every loss, on a sequence whose loss overflows to ``+inf``.

``zero_infinity``: a feasible path whose score lies past the float range (every arc at
``finfo.min``) gives a ``+inf`` loss with finite occupations. torch's ``ctc_loss`` then
returns 0 and a zero gradient for that sequence; every loss here must do the same and
leave the other sequences' losses and gradients as they are. The oracles: torch's
``ctc_loss`` for CTC; for every loss, the definition, checked against the same call
with ``zero_infinity=False`` (the overflowing sequences: loss 0 and gradient exactly
0; the others: unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from conftest import backend_params, device_for
from hypothesis import given
from hypothesis import strategies as st

import seqloss

INF = float("inf")
SINK = 0  # a class no arc reads (never a target, never blank-like) for the fused losses
LABELS = (1, 2)  # target ids of every family below
BACKENDS = backend_params("zero_infinity")


# --------------------------------------------------------------------------- the batch
@dataclass(frozen=True)
class Spec:
    """Per sequence: frames, targets, whether every arc it reads sits at ``finfo.min``."""

    Tb: tuple[int, ...]
    Ub: tuple[int, ...]
    hot: tuple[bool, ...]
    seed: int

    @property
    def B(self) -> int:
        return len(self.Tb)

    @property
    def T(self) -> int:
        return max(self.Tb) + 1  # a padding frame

    @property
    def U(self) -> int:
        return max(self.Ub)

    def targets(self) -> torch.Tensor:
        """``(B, U)`` ids from ``LABELS``, no two neighbours equal (CTC needs no extra frames)."""
        g = torch.Generator().manual_seed(self.seed + 1)
        tg = torch.full((self.B, self.U), LABELS[0], dtype=torch.int64)
        for b in range(self.B):
            for u in range(1, self.U):
                tg[b, u] = LABELS[1] if tg[b, u - 1] == LABELS[0] else LABELS[0]
            if self.U and torch.rand((), generator=g) < 0.5:
                tg[b] = LABELS[0] + LABELS[1] - tg[b]
        return tg

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.Tb), torch.tensor(self.Ub)


def _randn(spec: Spec, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec.seed * 7 + salt)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _heat(x: torch.Tensor, region, dtype: torch.dtype, classes: slice = slice(None)) -> None:
    """Every class of ``x[region]`` (within ``classes``) at ``finfo.min`` but ``SINK`` at 0:
    a log-softmax keeps them at ``finfo.min``, so every arc a path takes costs that."""
    sub = x[region]  # a view
    sub[..., classes] = torch.finfo(dtype).min
    sub[..., SINK] = 0.0


def _joint(spec: Spec, width: int, dtype: torch.dtype,
           token_width: int | None = None) -> torch.Tensor:
    """Padded ``(B, T, U+1, width)`` logits; the hot sequences' read region heated (its
    first ``token_width`` classes: TDT's duration logits stay as they are)."""
    x = _randn(spec, (spec.B, spec.T, spec.U + 1, width), dtype)
    for b in range(spec.B):
        if spec.hot[b]:
            _heat(x, (b, slice(0, spec.Tb[b]), slice(0, spec.Ub[b] + 1)), dtype,
                  slice(0, token_width))
    return x


# --------------------------------------------------------------------------- the losses
# Each runs one public loss on ``spec`` and returns (loss, its inputs, split): split maps
# the inputs' gradients to sequence b's part of each, flattened and concatenated.
def _per_seq(grads: list[torch.Tensor], B: int) -> list[torch.Tensor]:
    return [torch.cat([g[b].reshape(-1) for g in grads]) for b in range(B)]


def run_ctc(spec, backend, dtype, zi, reduction, fused=False):
    # (T, B, C), blank 0; the sink is class 3 (0 is the blank)
    C = 4
    x = _randn(spec, (spec.T, spec.B, C), dtype)
    for b in range(spec.B):
        if spec.hot[b]:
            x[: spec.Tb[b], b] = torch.finfo(dtype).min
            x[: spec.Tb[b], b, 3] = 0.0
    x = x.to(device_for(backend)).requires_grad_()
    il, tl = spec.lengths()
    loss = seqloss.ctc_loss(x, spec.targets(), il, tl, blank=0, reduction=reduction,
                            zero_infinity=zi, fused_log_softmax=fused, backend=backend)
    return loss, [x], lambda gs: _per_seq([gs[0].transpose(0, 1)], spec.B)


def run_rnnt(spec, backend, dtype, zi, reduction, fused=True, inplace=False):
    x = _joint(spec, 4, dtype).to(device_for(backend)).requires_grad_()
    y = x.clone() if inplace else x  # in place: the gradient overwrites a non-leaf
    il, tl = spec.lengths()
    loss = seqloss.rnnt_loss(y, spec.targets(), il, tl, blank=3, reduction=reduction,
                             fused_log_softmax=fused, zero_infinity=zi, backend=backend,
                             inplace_grad=inplace)
    return loss, [x], lambda gs: _per_seq(gs, spec.B)


def run_rnnt_packed(spec, backend, dtype, zi, reduction, fused=True):
    full = _joint(spec, 4, dtype)
    rows = [full[b, : spec.Tb[b], : spec.Ub[b] + 1].reshape(-1, 4) for b in range(spec.B)]
    x = torch.cat(rows).to(device_for(backend)).requires_grad_()
    il, tl = spec.lengths()
    tg = torch.cat([spec.targets()[b, : spec.Ub[b]] for b in range(spec.B)])
    loss = seqloss.rnnt_loss_packed(x, tg, il, tl, blank=3, reduction=reduction,
                                    fused_log_softmax=fused, zero_infinity=zi, backend=backend)
    return loss, [x], lambda gs: list(torch.split(gs[0], [r.shape[0] for r in rows]))


def run_multiblank(spec, backend, dtype, zi, reduction):
    x = _joint(spec, 5, dtype).to(device_for(backend)).requires_grad_()  # big blank 3, blank 4
    il, tl = spec.lengths()
    loss = seqloss.multiblank_rnnt_loss(x, spec.targets(), il, tl, [2], blank=4,
                                        reduction=reduction, zero_infinity=zi, backend=backend)
    return loss, [x], lambda gs: _per_seq(gs, spec.B)


def run_tdt(spec, backend, dtype, zi, reduction, omega=0.0, pair=False):
    x = _joint(spec, 4 + 3, dtype, token_width=4).to(device_for(backend))  # blank 3, D = 3
    il, tl = spec.lengths()
    kw = dict(blank=3, omega=omega, reduction=reduction, zero_infinity=zi, backend=backend)
    if pair:
        leaves = [x[..., :4].clone().requires_grad_(), x[..., 4:].clone().requires_grad_()]
        loss = seqloss.tdt_loss(tuple(leaves), spec.targets(), il, tl, [0, 1, 2], **kw)
    else:
        leaves = [x.requires_grad_()]
        loss = seqloss.tdt_loss(x, spec.targets(), il, tl, [0, 1, 2], **kw)
    return loss, leaves, lambda gs: _per_seq(gs, spec.B)


def _factored(spec, dtype, backend):
    """k2's inputs: ``lm (B, S+1, C)``, ``am (B, T, C)``, termination 3, per-sequence
    lengths through the boundary; a hot sequence's frames heated in ``am``."""
    am = _randn(spec, (spec.B, spec.T, 4), dtype)
    lm = _randn(spec, (spec.B, spec.U + 1, 4), dtype, salt=1)
    for b in range(spec.B):
        if spec.hot[b]:
            _heat(am, (b, slice(0, spec.Tb[b])), dtype)
    bnd = torch.tensor([[0, 0, u, t] for t, u in zip(spec.Tb, spec.Ub, strict=True)])
    dev = device_for(backend)
    return lm.to(dev).requires_grad_(), am.to(dev).requires_grad_(), bnd.to(dev)


def run_simple(spec, backend, dtype, zi, reduction, smoothed=False):
    lm, am, bnd = _factored(spec, dtype, backend)
    sym = spec.targets().to(am.device)
    if smoothed:
        loss = seqloss.rnnt_loss_smoothed(lm, am, sym, 3, 0.1, 0.1, boundary=bnd,
                                          reduction=reduction, zero_infinity=zi, backend=backend)
    else:
        loss = seqloss.rnnt_loss_simple(lm, am, sym, 3, boundary=bnd, reduction=reduction,
                                        zero_infinity=zi, backend=backend)
    return loss, [lm, am], lambda gs: _per_seq(gs, spec.B)


def run_pruned(spec, backend, dtype, zi, reduction):
    # s_range = S + 1 (every position): the windows keep every path
    R = spec.U + 1
    x = _randn(spec, (spec.B, spec.T, R, 4), dtype)
    for b in range(spec.B):
        if spec.hot[b]:
            _heat(x, (b, slice(0, spec.Tb[b])), dtype)
    dev = device_for(backend)
    x = x.to(dev).requires_grad_()
    ranges = torch.arange(R, device=dev).expand(spec.B, spec.T, R).contiguous()
    bnd = torch.tensor([[0, 0, u, t] for t, u in zip(spec.Tb, spec.Ub, strict=True)], device=dev)
    loss = seqloss.rnnt_loss_pruned(x, spec.targets().to(dev), ranges, 3, boundary=bnd,
                                    reduction=reduction, zero_infinity=zi, backend=backend)
    return loss, [x], lambda gs: _per_seq(gs, spec.B)


def _add_joint(e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return e[:, :, None, :] + p[:, None, :, :]


def run_from_joint(spec, backend, dtype, zi, reduction, which="rnnt"):
    width = {"rnnt": 4, "multiblank": 5, "tdt": 7}[which]
    enc = _randn(spec, (spec.B, spec.T, width), dtype)
    pred = _randn(spec, (spec.B, spec.U + 1, width), dtype, salt=1)
    for b in range(spec.B):
        if spec.hot[b]:  # every joint logit of its frames ~ finfo.min but the sink's
            _heat(enc, (b, slice(0, spec.Tb[b])), dtype, slice(0, 4 if which == "tdt" else None))
    dev = device_for(backend)
    enc, pred = enc.to(dev).requires_grad_(), pred.to(dev).requires_grad_()
    il, tl = spec.lengths()
    kw = dict(reduction=reduction, zero_infinity=zi, backend=backend)
    if which == "rnnt":
        loss = seqloss.rnnt_loss_from_joint(enc, pred, _add_joint, spec.targets(), il, tl,
                                            blank=3, **kw)
    elif which == "multiblank":
        loss = seqloss.multiblank_rnnt_loss_from_joint(enc, pred, _add_joint, spec.targets(), il,
                                                       tl, [2], blank=4, **kw)
    else:
        loss = seqloss.tdt_loss_from_joint(enc, pred, _add_joint, spec.targets(), il, tl,
                                           [0, 1, 2], blank=3, **kw)
    return loss, [enc, pred], lambda gs: _per_seq(gs, spec.B)


LOSSES = {
    "ctc": run_ctc,
    "ctc_fused": lambda *a: run_ctc(*a, fused=True),
    "rnnt": run_rnnt,
    "rnnt_logprobs": lambda *a: run_rnnt(*a, fused=False),
    "rnnt_inplace": lambda *a: run_rnnt(*a, inplace=True),
    "rnnt_packed": run_rnnt_packed,
    "multiblank": run_multiblank,
    "tdt": run_tdt,
    "tdt_omega": lambda *a: run_tdt(*a, omega=0.5),
    "tdt_pair": lambda *a: run_tdt(*a, pair=True),
    "tdt_pair_omega": lambda *a: run_tdt(*a, omega=0.5, pair=True),
    "simple": run_simple,
    "smoothed": lambda *a: run_simple(*a, smoothed=True),
    "pruned": run_pruned,
    "rnnt_from_joint": run_from_joint,
    "multiblank_from_joint": lambda *a: run_from_joint(*a, which="multiblank"),
    "tdt_from_joint": lambda *a: run_from_joint(*a, which="tdt"),
}
F32, F64 = torch.float32, torch.float64
CASES = [pytest.param(k, dt, id=f"{k}-{i}") for k in LOSSES
         for dt, i in ((F32, "f32"), (F64, "f64"))]


def _weights(name: str, reduction: str, spec: Spec) -> list[float]:
    """The reduction's factor on sequence b's loss (and gradient)."""
    B = spec.B
    if reduction in ("none", "sum"):
        return [1.0] * B
    if reduction == "mean_volume":
        return [1.0 / max(sum(spec.Ub), 1)] * B
    # "mean": torch's (CTC), NeMo's (multi-blank, TDT): each loss over max(U_b, 1)
    if reduction == "mean_target" or (
            reduction == "mean" and name.startswith(("ctc", "multiblank", "tdt"))):
        return [1.0 / (B * max(u, 1)) for u in spec.Ub]
    return [1.0 / B] * B


def check_zero_infinity(name: str, spec: Spec, backend: str, dtype: torch.dtype,
                        reduction: str) -> None:
    """The definition: the hot sequences' losses are 0 and contribute no gradient, the
    rest is the same call without the flag (its ``"none"`` losses, weighted as the
    reduction weights them, the hot ones by 0). Each sequence's gradient is its own but
    for the smoothed loss, whose unigram couples the batch: there the hot sequences'
    inputs keep the gradient the other losses send them."""
    run = LOSSES[name]
    ref, leaves, split = run(spec, backend, dtype, False, "none")
    for b in range(spec.B):
        if spec.hot[b]:  # the premise: a feasible path, a score past the float range
            assert ref[b].item() == INF, f"sequence {b} did not overflow: {ref[b].item()}"
        else:
            assert math.isfinite(ref[b].item())
    w = _weights(name, reduction, spec)
    keep = [0.0 if spec.hot[b] else w[b] for b in range(spec.B)]
    gref = split(torch.autograd.grad(ref, leaves, ref.new_tensor(keep)))
    loss, leaves, split = run(spec, backend, dtype, True, reduction)
    grads = split(torch.autograd.grad(loss, leaves, torch.ones_like(loss)))
    want = [0.0 if spec.hot[b] else ref[b].item() * w[b] for b in range(spec.B)]
    if reduction == "none":
        assert loss.tolist() == want
    else:
        assert math.isclose(loss.item(), math.fsum(want), rel_tol=1e-6, abs_tol=1e-6), \
            (loss.item(), want)
    for b in range(spec.B):
        if spec.hot[b] and name != "smoothed":
            assert not grads[b].any(), f"sequence {b}: gradient {grads[b]}"
        if reduction in ("none", "sum"):
            assert torch.equal(grads[b], gref[b]), f"sequence {b}: {grads[b]} != {gref[b]}"
        else:
            torch.testing.assert_close(grads[b], gref[b], rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- the tests
def test_ctc_empty_target_overflow_matches_torch(ctc_backend):
    # lp = zeros(3, 1, 3) with lp[:, 0, 0] = finfo.min, empty target: the one path overflows.
    device = device_for(ctc_backend)
    for dtype in (torch.float32, torch.float64):
        lp = torch.zeros(3, 1, 3, dtype=dtype, device=device)
        lp[:, 0, 0] = torch.finfo(dtype).min
        args = (torch.zeros(1, 0, dtype=torch.int64), torch.tensor([3]), torch.tensor([0]))
        a = lp.clone().requires_grad_()
        t = lp.clone().requires_grad_()
        la = seqloss.ctc_loss(a, *args, reduction="sum", zero_infinity=True, backend=ctc_backend)
        lt = F.ctc_loss(t, *(x.to(device) for x in args), reduction="sum", zero_infinity=True)
        la.backward()
        lt.backward()
        assert la.item() == lt.item() == 0.0
        assert torch.equal(a.grad, t.grad) and not a.grad.any()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_ctc_overflow_matches_torch(ctc_backend, reduction, dtype, fused):
    """Against torch's ctc_loss through a log-softmax (both gradients then agree): the
    overflowing sequences (an empty target and a label sequence) 0 with zero gradient."""
    device = device_for(ctc_backend)
    T, C = 5, 5
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(T, 4, C, generator=g, dtype=torch.float64).to(dtype)
    for b in (0, 2):  # hot: every class but the sink (4) at finfo.min
        x0[:, b, :4] = torch.finfo(dtype).min
    tg = torch.tensor([[0, 0], [1, 2], [1, 3], [2, 2]])
    il, tl = torch.tensor([3, 5, 4, 5]), torch.tensor([0, 2, 2, 2])
    x0 = x0.to(device)
    xs = x0.clone().requires_grad_()
    xt = x0.clone().requires_grad_()
    lp = xs if fused else xs.log_softmax(-1)
    ls = seqloss.ctc_loss(lp, tg, il, tl, reduction=reduction, zero_infinity=True,
                          fused_log_softmax=fused, backend=ctc_backend)
    lt = F.ctc_loss(xt.log_softmax(-1), tg.to(device), il.to(device), tl.to(device),
                    reduction=reduction, zero_infinity=True)
    (ls.sum()).backward()
    (lt.sum()).backward()
    torch.testing.assert_close(ls.to(lt.dtype), lt, rtol=1e-5, atol=1e-6)
    assert not xs.grad[:, 0].any() and not xs.grad[:, 2].any()
    torch.testing.assert_close(xs.grad, xt.grad, rtol=1e-5, atol=1e-6)
    plain = seqloss.ctc_loss(x0 if fused else x0.log_softmax(-1), tg, il, tl, reduction="none",
                             fused_log_softmax=fused, backend=ctc_backend)
    assert plain[0].item() == plain[2].item() == INF  # the premise: overflow, not zero frames


def test_ctc_numba_pool_path_zeroes_the_gradient(monkeypatch):
    # A batch the Numba kernel runs on the pool (not inline) applies zero_infinity after it.
    pytest.importorskip("numba")
    from seqloss.ctc import numba_cpu

    monkeypatch.setattr(numba_cpu, "runs_inline", lambda il, tl: False)
    spec = Spec(Tb=(3, 4, 3), Ub=(0, 2, 1), hot=(True, False, True), seed=5)
    for dtype in (torch.float32, torch.float64):
        for reduction in ("none", "sum", "mean"):
            check_zero_infinity("ctc", spec, "numba", dtype, reduction)


def test_ctc_fast_lane_zeroes_the_gradient():
    # The eager CPU lane (float32 (T, B, C), int64 tensors, backend "auto").
    pytest.importorskip("numba")
    T = 3
    lp = torch.zeros(T, 2, 3)
    lp[:, 0, 0] = torch.finfo(torch.float32).min
    lp = lp.requires_grad_()
    loss = seqloss.ctc_loss(lp, torch.tensor([[0], [1]]), torch.tensor([T, T]),
                            torch.tensor([0, 1]), reduction="sum", zero_infinity=True)
    loss.backward()
    assert not lp.grad[:, 0].any()
    assert lp.grad[:, 1].any()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_volume"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_zero_infinity_on_overflow(name, dtype, backend, reduction):
    slow = backend == "triton" and not torch.cuda.is_available()
    if slow and reduction in ("sum", "mean_volume"):
        pytest.skip("the interpreter is slow; the reductions share one finish with the others")
    spec = Spec(Tb=(3, 4, 4), Ub=(1, 2, 0), hot=(True, False, True), seed=11)
    check_zero_infinity(name, spec, backend, dtype, reduction)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_volume", "mean_target",
                                       "mean_batch"])
@pytest.mark.parametrize("name", ["ctc", "rnnt", "rnnt_packed", "tdt_pair_omega", "multiblank"])
def test_zero_infinity_without_host_reads(monkeypatch, name, reduction):
    # As on a device: no host read decides, the zeroing always runs (a masked pass, or
    # folded into the reduction's weights where those multiply the gradient anyway).
    from seqloss._core import checks

    monkeypatch.setattr(checks, "host_side", lambda t: False)
    spec = Spec(Tb=(3, 4, 4), Ub=(1, 2, 0), hot=(True, False, True), seed=11)
    check_zero_infinity(name, spec, "reference", torch.float32, reduction)


@st.composite
def specs(draw):
    B = draw(st.integers(1, 3))
    # >= 3 frames: every path takes >= 2 arcs (a big blank or a TDT blank spans 2)
    Tb = tuple(draw(st.integers(3, 4)) for _ in range(B))
    Ub = tuple(draw(st.integers(0, 2)) for _ in range(B))
    hot = (True, *(draw(st.booleans()) for _ in range(B - 1)))
    perm = draw(st.permutations(range(B)))
    return Spec(Tb=tuple(Tb[i] for i in perm), Ub=tuple(Ub[i] for i in perm),
                hot=tuple(hot[i] for i in perm), seed=draw(st.integers(0, 2**16)))


@pytest.mark.parametrize("backend", [p for p in BACKENDS if p.id != "triton"])
@pytest.mark.parametrize(("name", "dtype"), CASES)
@given(spec=specs(), reduction=st.sampled_from(["none", "sum", "mean", "mean_volume"]))
def test_hypothesis_zero_infinity_on_overflow(name, dtype, backend, spec, reduction):
    check_zero_infinity(name, spec, backend, dtype, reduction)


@given(spec=specs(), f64=st.booleans(), fused=st.booleans(),
       reduction=st.sampled_from(["none", "sum", "mean"]))
def test_hypothesis_ctc_zero_infinity_matches_torch(spec, f64, fused, reduction):
    dtype = torch.float64 if f64 else torch.float32
    x0 = _randn(spec, (spec.T, spec.B, 4), dtype)
    for b in range(spec.B):
        if spec.hot[b]:
            x0[:, b, :3] = torch.finfo(dtype).min  # class 3: the sink
    il, tl = spec.lengths()
    xs, xt = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    ls = seqloss.ctc_loss(xs if fused else xs.log_softmax(-1), spec.targets(), il, tl,
                          reduction=reduction, zero_infinity=True, fused_log_softmax=fused)
    lt = F.ctc_loss(xt.log_softmax(-1), spec.targets(), il, tl, reduction=reduction,
                    zero_infinity=True)
    ls.sum().backward()
    lt.sum().backward()
    torch.testing.assert_close(ls, lt, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xs.grad, xt.grad, rtol=1e-5, atol=1e-6)
