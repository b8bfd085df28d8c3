"""RNN-T: each backend against brute force, golden values, gradcheck, the contract's edge cases."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import device_for
from hypothesis import example, given
from hypothesis import strategies as st

import seqloss
from seqloss.testing import assert_close_budget, brute_force_rnnt
from seqloss.transducer import op as _ops

INF = float("inf")
NAN = float("nan")


def _batch(B, T, U, V, *, blank=0, seed=0, dtype=torch.float32, device="cpu", scale=2.0,
           full=False, pad_t=0, pad_u=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T + pad_t, U + 1 + pad_u, V, generator=g, dtype=torch.float64) * scale
    if full:
        il = torch.full((B,), T)
        tl = torch.full((B,), U)
    else:
        il = torch.randint(1, T + 1, (B,), generator=g)
        tl = torch.randint(0, U + 1, (B,), generator=g)
        il[0], tl[0] = T, U  # the longest sequence fills the tensor
    labels = torch.tensor([c for c in range(V) if c != blank % V])
    tg = labels[torch.randint(0, len(labels), (B, U), generator=g)]
    return logits.to(device=device, dtype=dtype), tg.to(device), il, tl


def _loss_grad(x, tg, il, tl, backend, reduction="none", **kw):
    kw.setdefault("blank", 0)
    x = x.detach().clone().requires_grad_()
    loss = seqloss.rnnt_loss(x, tg, il, tl, reduction=reduction, backend=backend, **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss, g


def _pack(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1]) for b in range(len(il))])


def _brute_batch(x, tg, il, tl, blank=0, fused=True):
    """Per-sequence losses and the gradient of their sum, by path enumeration (float64)."""
    x = x.detach().double().cpu().requires_grad_()
    losses = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        xb = x[b, :Tb, : Ub + 1]
        losses.append(brute_force_rnnt(xb.log_softmax(-1) if fused else xb, tg[b, :Ub].tolist(),
                                       blank))
    loss = torch.stack(losses)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), g


# ------------------------------------------------------------------ brute force
TINY = [
    # (T, U, V, blank)
    (1, 0, 3, 0),
    (1, 2, 3, 0),
    (3, 0, 4, 2),
    (2, 1, 3, 2),
    (3, 2, 4, 0),
    (4, 2, 3, 1),
    (3, 3, 5, 4),
]
TINY_IDS = [f"T{c[0]}U{c[1]}V{c[2]}b{c[3]}" for c in TINY]


def _tiny(case, seed):
    T, U, V, blank = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, U + 1, V, generator=g, dtype=torch.float64) * 1.5
    labels = [c for c in range(V) if c != blank]
    target = [labels[int(i)] for i in torch.randint(0, len(labels), (U,), generator=g)]
    return x, target


def _oracle_grad(x, target, blank, fused, *, clamp=-1.0, lam=0.0):
    """Brute-force loss and gradient. FastEmit (Yu et al., 2021, as NeMo applies it):
    d loss / d lp = -(occ_blank at blank + (1 + λ) occ_emit at the target), then the
    log-softmax's chain rule g_x = g_lp - softmax * sum(g_lp); the loss is (1 + λ) * nll."""
    lp = x.log_softmax(-1) if fused else x
    loss, ob, oe = brute_force_rnnt(lp, target, blank, return_occupations=True)
    T, U1, V = x.shape
    g_lp = torch.zeros_like(x)
    g_lp[:, :, blank] -= ob
    for u, y in enumerate(target):
        g_lp[:, u, y] -= (1 + lam) * oe[:, u]
    g = g_lp - torch.softmax(x, -1) * g_lp.sum(-1, keepdim=True) if fused else g_lp
    if clamp > 0:
        g = g.clamp(-clamp, clamp)
    return loss.detach() * (1 + lam), g


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("case", TINY, ids=TINY_IDS)
def test_brute_force(rnnt_backend, case, fused):
    device = device_for(rnnt_backend)
    x, target = _tiny(case, seed=sum(case))
    blank = case[3]
    if not fused:
        x = x.log_softmax(-1)
    loss, g = _loss_grad(x[None].to(device),
                         torch.tensor([target], dtype=torch.long).reshape(1, -1),
                         [case[0]], [case[1]], rnnt_backend, blank=blank, fused_log_softmax=fused)
    # Autograd through the enumeration and the occupation formula agree.
    xo = x.clone().requires_grad_()
    want = brute_force_rnnt(xo.log_softmax(-1) if fused else xo, target, blank)
    (want_g,) = torch.autograd.grad(want, xo)
    want2, want_g2 = _oracle_grad(x, target, blank, fused)
    assert (want_g - want_g2).abs().max().item() <= 1e-12
    assert abs(loss.item() - want.item()) <= 1e-10 * max(1.0, abs(want.item()))
    assert (g[0].cpu() - want_g).abs().max().item() <= 1e-10


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("lam", [0.0, 0.5], ids=["lam0", "lam0.5"])
@pytest.mark.parametrize("clamp", [-1.0, 0.15], ids=["noclamp", "clamp"])
@pytest.mark.parametrize("case", [TINY[4], TINY[6]], ids=[TINY_IDS[4], TINY_IDS[6]])
def test_brute_force_clamp_fastemit(rnnt_backend, case, fused, lam, clamp):
    device = device_for(rnnt_backend)
    x, target = _tiny(case, seed=7 + sum(case))
    blank = case[3]
    if not fused:
        x = x.log_softmax(-1)
    loss, g = _loss_grad(x[None].to(device), torch.tensor([target]), [case[0]], [case[1]],
                         rnnt_backend, blank=blank, fused_log_softmax=fused, clamp=clamp,
                         fastemit_lambda=lam)
    want, want_g = _oracle_grad(x, target, blank, fused, clamp=clamp, lam=lam)
    if clamp > 0:
        assert (want_g.abs() >= clamp).any()  # the clamp bites
    assert abs(loss.item() - want.item()) <= 1e-10 * max(1.0, abs(want.item()))
    assert (g[0].cpu() - want_g).abs().max().item() <= 1e-10


# ------------------------------------------------------------------ golden values
# The small warp-transducer example (HawkAaron/warp-transducer; torchaudio's
# rnnt test utils, NeMo's test_case_small): blank 0, labels [1, 2].
_ACTS = [
    [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.2, 0.8, 0.1]],
    [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.1, 0.1], [0.7, 0.1, 0.2, 0.1, 0.1]],
]
_COST = 4.495666
_GRAD_LOGITS = [
    [[-0.13116688, -0.3999269, 0.17703125, 0.17703125, 0.17703125],
     [-0.18572757, 0.12247056, -0.18168412, 0.12247056, 0.12247056],
     [-0.32091254, 0.06269141, 0.06928472, 0.12624499, 0.06269141]],
    [[0.05456069, -0.21824276, 0.05456069, 0.05456069, 0.05456069],
     [0.12073959, 0.12073959, -0.48295835, 0.12073959, 0.12073959],
     [-0.6925882, 0.16871116, 0.18645467, 0.16871116, 0.16871116]],
]
_GRAD_LOGPROBS = [
    [[-0.308198071906, -0.6918019280939998, 0.0, 0.0, 0.0],
     [-0.308198071906, 0.0, -0.3836038561880001, 0.0, 0.0],
     [-0.3836038561880001, 0.0, 0.0, 0.0, 0.0]],
    [[0.0, -0.308198071906, 0.0, 0.0, 0.0],
     [0.0, 0.0, -0.6163961438119995, 0.0, 0.0],
     [-0.9999999999999991, 0.0, 0.0, 0.0, 0.0]],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_golden_small(rnnt_backend, fused, dtype):
    device = device_for(rnnt_backend)
    x = torch.tensor([_ACTS], dtype=torch.float64)
    if not fused:
        x = x.log_softmax(-1)
    loss, g = _loss_grad(x.to(device=device, dtype=dtype),
                         torch.tensor([[1, 2]], dtype=torch.int32),
                         torch.tensor([2], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
                         rnnt_backend, reduction="sum", blank=0, fused_log_softmax=fused)
    want_g = torch.tensor([_GRAD_LOGITS if fused else _GRAD_LOGPROBS], dtype=torch.float64)
    assert loss.dtype == dtype
    assert abs(loss.item() - _COST) <= 1e-6
    assert_close_budget(g, want_g, rtol=0, atol=2e-7 if dtype == torch.float64 else 5e-7,
                        what="grad")


# ------------------------------------------------------------------ gradcheck
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_gradcheck(rnnt_backend, fused):
    device = device_for(rnnt_backend)
    # The Triton interpreter costs ~0.15 s per call and gradcheck makes two calls per
    # input element: a smaller input (still padded in T) keeps it affordable.
    shape, pad_u = ((1, 2, 1, 3), 0) if rnnt_backend == "triton" else ((2, 3, 2, 4), 1)
    x, tg, il, tl = _batch(*shape, seed=3, dtype=torch.float64, device=device, pad_t=1, pad_u=pad_u)
    lp = (x if fused else x.log_softmax(-1)).detach().requires_grad_()
    f = lambda z: seqloss.rnnt_loss(z, tg, il, tl, blank=0, reduction="none",
                                    fused_log_softmax=fused, backend=rnnt_backend)
    # Interpreted Triton and the reference (a Python loop over diagonals: ~0.02 s a call,
    # two calls per element) check one random direction (fast_mode); test_brute_force
    # checks their gradient element by element, Numba's here.
    assert torch.autograd.gradcheck(f, (lp,), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    fast_mode=rnnt_backend != "numba")


# ------------------------------------------------------------------ layouts and batching
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_packed_equals_padded(rnnt_backend, fused):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(4, 9, 5, 7, seed=4, dtype=torch.float64, device=device, pad_t=2, pad_u=1,
                           blank=3)
    il[2], tl[3] = 1, 0
    kw = dict(blank=3, fused_log_softmax=fused, clamp=0.2, fastemit_lambda=0.1)
    loss, g = _loss_grad(x, tg, il, tl, rnnt_backend, **kw)
    xp = _pack(x, il, tl).requires_grad_()
    for targets in (tg, torch.cat([tg[b, : tl[b]] for b in range(4)])):
        lp = seqloss.rnnt_loss_packed(xp, targets, il, tl, reduction="none", backend=rnnt_backend,
                                      **kw)
        (gp,) = torch.autograd.grad(lp.sum(), xp)
        assert torch.equal(lp, loss) if rnnt_backend != "reference" else True
        assert_close_budget(lp, loss, rtol=1e-12, what="loss")
        assert_close_budget(gp, _pack(g, il, tl), rtol=1e-12, atol=1e-15, what="grad")
    # Reductions over packed input scale per sequence.
    ls = seqloss.rnnt_loss_packed(xp, tg, il, tl, reduction="mean", backend=rnnt_backend, **kw)
    (gs,) = torch.autograd.grad(ls, xp)
    assert_close_budget(gs, _pack(g, il, tl) / 4, rtol=1e-12, atol=1e-15, what="mean grad")


def test_batched_equals_per_sequence(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(4, 12, 6, 9, seed=5, device=device, pad_t=3, pad_u=2, blank=-1)
    il[:], tl[:] = torch.tensor([12, 1, 7, 3]), torch.tensor([6, 0, 2, 6])
    loss, g = _loss_grad(x, tg, il, tl, rnnt_backend, blank=-1)
    for b in range(4):
        lb, gb = _loss_grad(x[b : b + 1, : il[b], : tl[b] + 1], tg[b : b + 1, : tl[b]],
                            il[b : b + 1], tl[b : b + 1], rnnt_backend, blank=-1)
        assert_close_budget(loss[b : b + 1], lb, rtol=1e-6, what=f"loss {b}")
        assert_close_budget(g[b, : il[b], : tl[b] + 1], gb[0], rtol=1e-5, atol=1e-7,
                            what=f"grad {b}")
        assert (torch.count_nonzero(g[b, il[b]:]) == 0
                and torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0)


@pytest.mark.reference_oracle
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_matches_reference_float64(rnnt_backend, reduction):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(5, 20, 8, 11, seed=6, dtype=torch.float64, device=device, pad_t=2)
    il[:] = torch.tensor([20, 1, 13, 20, 4])
    tl[:] = torch.tensor([8, 0, 8, 1, 3])
    kw = dict(blank=0, reduction=reduction, clamp=0.05, fastemit_lambda=0.01)
    a = seqloss.rnnt_loss(x.requires_grad_(), tg.int(), il.int(), tl.int(), backend=rnnt_backend,
                          **kw)
    (ga,) = torch.autograd.grad(a.sum(), x)
    b = seqloss.rnnt_loss(x, tg, il.tolist(), tl.tolist(), backend="reference", **kw)
    (gb,) = torch.autograd.grad(b.sum(), x)
    assert a.dtype == torch.float64 and a.shape == b.shape
    assert_close_budget(a, b, rtol=1e-12, what="loss")
    assert_close_budget(ga, gb, rtol=1e-12, atol=1e-15, what="grad")


def test_against_torchaudio(rnnt_backend):
    F = pytest.importorskip("torchaudio.functional")
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 15, 6, 10, seed=7, device=device)
    il[:], tl[:] = 15, 6  # torchaudio wants the tensor filled by the longest
    il[1], tl[2] = 9, 3
    for fused in (True, False):
        xi = x if fused else x.log_softmax(-1)
        ours, go = _loss_grad(xi, tg, il, tl, rnnt_backend, reduction="sum",
                              fused_log_softmax=fused)
        xt = xi.detach().clone().requires_grad_()
        ref = F.rnnt_loss(xt, tg.int(), il.int(), tl.int(), blank=0, reduction="sum",
                          fused_log_softmax=fused)
        ref.backward()
        assert_close_budget(ours.sum(), ref, rtol=1e-5, what="loss")
        if fused:  # torchaudio's unfused gradient is not the true derivative
            assert_close_budget(go, xt.grad, rtol=1e-4, atol=1e-6, what="grad")


# ------------------------------------------------------------------ extremes and dtypes
@functools.cache
def _extreme_oracle():
    x, tg, il, tl = _batch(3, 10, 4, 6, seed=8, dtype=torch.float64)
    return _brute_batch(torch.sign(x) * 1e4, tg, il, tl)


def test_extreme_logits_finite(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 10, 4, 6, seed=8, dtype=torch.float64)
    x = torch.sign(x) * 1e4
    want, want_g = _extreme_oracle()
    got, g = _loss_grad(x.float().to(device), tg, il, tl, rnnt_backend, blank=0)
    assert torch.isfinite(got).all() and torch.isfinite(g).all()
    assert_close_budget(got, want, rtol=1e-6, what="loss")
    assert_close_budget(g, want_g, rtol=0, atol=1e-5, what="grad")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_half_equals_float32_on_rounded(rnnt_backend, dtype, fused):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 12, 5, 8, seed=9, pad_t=1)
    lp = x if fused else x.log_softmax(-1)
    half = lp.to(dtype).to(device)
    a, ga = _loss_grad(half, tg, il, tl, rnnt_backend, reduction="sum", fused_log_softmax=fused)
    b, gb = _loss_grad(half.float(), tg, il, tl, rnnt_backend, reduction="sum",
                       fused_log_softmax=fused)
    assert a.dtype == torch.float32 and ga.dtype == dtype
    assert_close_budget(a, b, rtol=1e-6, what="loss")
    eps = torch.finfo(dtype).eps
    assert_close_budget(ga.float(), gb.to(dtype).float(), rtol=eps, atol=eps * 1e-2, what="grad")


def test_noncontiguous(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 7, 4, 6, seed=10, dtype=torch.float64, device=device)
    xt = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # (B, T, U+1, V), strides swapped
    assert not xt.is_contiguous()
    a, ga = _loss_grad(xt, tg, il, tl, rnnt_backend, blank=0)
    b, gb = _brute_batch(x, tg, il, tl)
    assert_close_budget(a, b, rtol=1e-10, what="loss")
    assert_close_budget(ga, gb, rtol=1e-10, atol=1e-12, what="grad")


def test_determinism(rnnt_backend):
    device = device_for(rnnt_backend)
    # The interpreter runs a grid's programs one after another: a small size is enough.
    interpreted = rnnt_backend == "triton" and device.type == "cpu"
    x, tg, il, tl = _batch(4, *((10, 4) if interpreted else (30, 10)), 16, seed=11,
                           device=device)
    a = _loss_grad(x, tg, il, tl, rnnt_backend, clamp=0.3)
    b = _loss_grad(x, tg, il, tl, rnnt_backend, clamp=0.3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------ non-finite input, padding
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_nan_padding_is_never_read(rnnt_backend, fused):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 8, 4, 6, seed=12, pad_t=2, pad_u=2)
    il[:], tl[:] = torch.tensor([8, 5, 2]), torch.tensor([4, 2, 0])
    if not fused:
        x = x.log_softmax(-1)
    clean, gc = _loss_grad(x, tg, il, tl, rnnt_backend, fused_log_softmax=fused)
    tg = tg.clone()
    tg[1, 2:] = -7  # padding targets: never read, never validated
    for b in range(3):
        x[b, il[b]:] = NAN
        x[b, :, tl[b] + 1:] = INF
    loss, g = _loss_grad(x.to(device), tg, il, tl, rnnt_backend, fused_log_softmax=fused)
    assert torch.equal(loss, clean)
    assert torch.equal(g, gc)
    for b in range(3):
        assert (torch.count_nonzero(g[b, il[b]:]) == 0
                and torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0)


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("bad", [NAN, INF], ids=["nan", "posinf"])
def test_nonfinite_poisons_one_sequence(rnnt_backend, fused, bad):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 8, 4, 6, seed=13, pad_t=1)
    il[:], tl[:] = torch.tensor([8, 6, 5]), torch.tensor([4, 2, 3])
    if not fused:
        x = x.log_softmax(-1)
    clean, gc = _loss_grad(x, tg, il, tl, rnnt_backend, fused_log_softmax=fused)
    x[1, 3, 1, 0] = bad  # read by sequence 1 (class 0 is blank there, maybe not a target)
    loss, g = _loss_grad(x.to(device), tg, il, tl, rnnt_backend, fused_log_softmax=fused)
    assert torch.isnan(loss[1])
    assert torch.isnan(g[1, :6, :3]).all()
    assert torch.count_nonzero(g[1, 6:]) == 0 and torch.count_nonzero(g[1, :, 3:]) == 0
    assert torch.equal(loss[[0, 2]], clean[[0, 2]]) and torch.equal(g[[0, 2]], gc[[0, 2]])


def test_neg_inf_is_a_valid_log_prob(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(2, 6, 3, 5, seed=14, dtype=torch.float64)
    tg[:] = torch.tensor([1, 2, 3])
    for fused in (True, False):
        xi = x.clone() if fused else x.log_softmax(-1)
        xi[..., 4] = -INF  # class 4 masked out, never a target
        loss, g = _loss_grad(xi.to(device), tg, il, tl, rnnt_backend, blank=0,
                             fused_log_softmax=fused)
        want, wg = _brute_batch(xi[..., :4], tg, il, tl, fused=fused)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all()
        assert torch.count_nonzero(g[..., 4]) == 0
        assert_close_budget(loss, want, rtol=1e-10, what="loss")
        assert_close_budget(g[..., :4], wg, rtol=1e-10, atol=1e-12, what="grad")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible_and_zero_frames(rnnt_backend, zero_infinity):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(4, 6, 3, 5, seed=15, dtype=torch.float64)
    il[:], tl[:] = torch.tensor([6, 0, 0, 6]), torch.tensor([3, 0, 2, 2])
    x[3, :, :, 0] = -INF  # sequence 3: blank impossible everywhere -> no path ends
    loss, g = _loss_grad(x.to(device), tg, il, tl, rnnt_backend, blank=0,
                         zero_infinity=zero_infinity)
    z = 0.0 if zero_infinity else INF
    assert loss[1].item() == z and loss[2].item() == z and loss[3].item() == z
    assert torch.isfinite(loss[0])
    assert torch.count_nonzero(g[1:]) == 0 and torch.isfinite(g).all()
    mean = seqloss.rnnt_loss(x, tg, il, tl, blank=0, backend=rnnt_backend,
                             zero_infinity=zero_infinity)
    assert mean.item() == (loss.sum() / 4).item()


def test_fastemit_against_reference(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 10, 4, 6, seed=16, dtype=torch.float64, device=device)
    l0, g0 = _loss_grad(x, tg, il, tl, rnnt_backend, fastemit_lambda=0.0)
    l1, g1 = _loss_grad(x, tg, il, tl, rnnt_backend, fastemit_lambda=0.25)
    assert_close_budget(l1, 1.25 * l0, rtol=1e-13, what="loss scaled by 1 + λ")
    assert not torch.allclose(g0, g1)


# ------------------------------------------------------------------ in-place mode
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_inplace_grad(rnnt_backend, packed, dtype):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(3, 9, 4, 7, seed=17, device=device, pad_t=1)
    x = x.to(dtype)
    if packed:
        x = _pack(x, il, tl)
    fn = seqloss.rnnt_loss_packed if packed else seqloss.rnnt_loss
    x1 = x.clone().requires_grad_()
    l1 = fn(x1, tg, il, tl, blank=0, reduction="mean", backend=rnnt_backend, clamp=0.4)
    l1.backward()
    # A joiner's Linear saves its input, not its output: fine with the in-place mode.
    w = torch.eye(x.shape[-1], dtype=dtype, device=device).requires_grad_()
    x2 = x.clone().requires_grad_()
    h = x2 @ w
    l2 = fn(h, tg, il, tl, blank=0, reduction="mean", backend=rnnt_backend, clamp=0.4,
            inplace_grad=True)
    l2.backward()
    assert torch.equal(l1, l2)
    assert torch.equal(x1.grad, x2.grad)


def test_inplace_refused_when_logits_saved(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(2, 5, 3, 6, seed=18, device=device)
    x = x.requires_grad_()
    h = x.exp()  # exp saves its output: the version check must catch the overwrite
    loss = seqloss.rnnt_loss(h, tg, il, tl, blank=0, backend=rnnt_backend, inplace_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _max_alloc(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as p:
        fn()
    return max((e.cpu_memory_usage for e in p.events()), default=0)


def test_inplace_adds_no_logits_sized_allocation():
    x, tg, il, tl = _batch(2, 40, 10, 512, seed=19, full=True)
    nbytes = x.numel() * x.element_size()

    def run(inplace):
        def f():
            y = x.clone().requires_grad_() if not inplace else x_in
            seqloss.rnnt_loss(y, tg, il, tl, blank=0, reduction="sum", backend="numba",
                              inplace_grad=inplace).backward()
        return f

    pytest.importorskip("numba")
    x_in = x.clone().requires_grad_()
    assert _max_alloc(run(False)) >= nbytes  # the gradient (and the clone) are visible
    x_in = x.clone().requires_grad_()
    assert _max_alloc(run(True)) < nbytes // 8


# ------------------------------------------------------------------ errors
def test_errors():
    x, tg, il, tl = _batch(3, 5, 3, 6, seed=20, full=True)
    f = seqloss.rnnt_loss
    with pytest.raises(TypeError, match="logits"):
        f(x.long(), tg, il, tl)
    with pytest.raises(TypeError, match="targets"):
        f(x, tg.float(), il, tl)
    with pytest.raises(TypeError, match="logit_lengths"):
        f(x, tg, il.float(), tl)
    with pytest.raises(seqloss.InputError, match="logits must be"):
        f(x[0], tg, il, tl)
    with pytest.raises(seqloss.InputError, match=r"logit_lengths must have shape \(3,\)"):
        f(x, tg, il[:2], tl)
    with pytest.raises(seqloss.InputError, match="targets must have shape"):
        f(x, tg[:2], il, tl)
    with pytest.raises(seqloss.InputError, match="blank = 6"):
        f(x, tg, il, tl, blank=6)
    with pytest.raises(seqloss.InputError, match="reduction"):
        f(x, tg, il, tl, reduction="avg")
    bad = il.clone()
    bad[1] = 6
    with pytest.raises(seqloss.InputError, match=r"logit_lengths\[1\] = 6 exceeds"):
        f(x, tg, bad, tl)
    bad = il.clone()
    bad[2] = -1
    with pytest.raises(seqloss.InputError, match=r"logit_lengths\[2\] = -1 is negative"):
        f(x, tg, bad, tl)
    bad = tl.clone()
    bad[1] = 4
    with pytest.raises(seqloss.InputError,
                       match=r"target_lengths\[1\] = 4 exceeds targets.size\(1\)"):
        f(x, tg, il, bad)
    with pytest.raises(seqloss.InputError,
                       match=r"target_lengths\[0\] = 3 exceeds logits.size\(2\) - 1"):
        f(x[:, :, :3], tg, il, tl)
    bad = tg.clone()
    bad[2, 1] = 0
    with pytest.raises(seqloss.InputError, match=r"targets\[2, 1\] = 0 equals blank"):
        f(x, bad, il, tl, blank=0)
    bad = tg.clone()
    bad[1, 0] = 6
    with pytest.raises(seqloss.InputError, match=r"targets\[1, 0\] = 6 is out of range"):
        f(x, bad, il, tl, blank=0)
    with pytest.raises(seqloss.InputError, match="fastemit_lambda"):
        f(x, tg, il, tl, fastemit_lambda=-0.5)
    xp = _pack(x, il, tl)
    with pytest.raises(seqloss.InputError, match=rf"logits.size\(0\) = {xp.shape[0] - 1} but"):
        seqloss.rnnt_loss_packed(xp[:-1], tg, il, tl)
    with pytest.raises(seqloss.InputError, match="logits must be packed"):
        seqloss.rnnt_loss_packed(x, tg, il, tl)
    with pytest.raises(seqloss.InputError, match=r"target_lengths sum to 9"):
        seqloss.rnnt_loss_packed(xp, tg.reshape(-1)[:8], il, tl)
    # validate=False skips the value checks (at the caller's risk), not the shape checks.
    seqloss.rnnt_loss(x, tg, il, tl, validate=False)


# ------------------------------------------------------------------ API, compile, opcheck
def test_module_and_defaults():
    x, tg, il, tl = _batch(2, 6, 3, 5, seed=21, full=True, blank=4)
    m = seqloss.RNNTLoss(reduction="sum", fastemit_lambda=0.1, backend="reference")
    a = m(x, tg, il, tl)
    b = seqloss.rnnt_loss(x, tg, il.tolist(), tl.tolist(), 4, -1, "sum", True,
                          fastemit_lambda=0.1, backend="reference")
    assert torch.equal(a, b) and a.dim() == 0
    assert seqloss.rnnt_loss(x, tg, il, tl, backend="reference").shape == ()


def test_torch_compile_fullgraph(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(2, 6, 3, 5, seed=22, device=device)

    def f(z):
        return seqloss.rnnt_loss(z, tg, il, tl, blank=0, clamp=0.5, backend=rnnt_backend)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    a = f(x1)
    b = cf(x2)
    a.backward()
    b.backward()
    assert torch.equal(a, b) and torch.equal(x1.grad, x2.grad)


def test_opcheck(rnnt_backend):
    device = device_for(rnnt_backend)
    x, tg, il, tl = _batch(2, 5, 3, 6, seed=23, device=device)
    x = x.requires_grad_()
    args = (x, tg, il, tl, 0, -1.0, True, 0.0, "none", False, rnnt_backend, True, True)
    torch.library.opcheck(_ops.rnnt_loss_op, args)
    xp = _pack(x.detach(), il, tl).requires_grad_()
    torch.library.opcheck(_ops.rnnt_loss_op, (xp, tg, il, tl, 0, 0.2, False, 0.1, "mean_target",
                                              True, rnnt_backend, True, True))


# ------------------------------------------------------------------ hypothesis
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 7),
    U=st.integers(0, 4),
    V=st.integers(2, 6),
    blank_last=st.booleans(),
    fused=st.booleans(),
    seed=st.integers(0, 2**16),
)
# A loss of 7e-5 from cancelling terms of magnitude ~5: |diff| 2.9e-16 is rounding.
@example(B=1, T=1, U=0, V=2, blank_last=False, fused=True, seed=128)
def test_hypothesis_numba_vs_reference(B, T, U, V, blank_last, fused, seed):
    pytest.importorskip("numba")
    blank = V - 1 if blank_last else 0
    x, tg, il, tl = _batch(B, T, U, V, blank=blank, seed=seed, dtype=torch.float64, scale=3.0,
                           pad_t=1)
    if not fused:
        x = x.log_softmax(-1)
    a, ga = _loss_grad(x, tg, il, tl, "numba", blank=blank, fused_log_softmax=fused)
    b, gb = _loss_grad(x, tg, il, tl, "reference", blank=blank, fused_log_softmax=fused)
    # A loss is a difference of log-sums of inputs of magnitude max|x|, summed over
    # T + U + 1 steps: its rounding is absolute, about eps * max|x| per step, so a tiny
    # loss (1e-4 from cancelling terms) needs an absolute floor beside rtol.
    floor = 8 * torch.finfo(torch.float64).eps * float(x.detach().abs().amax()) * (T + U + 1)
    assert_close_budget(a, b, rtol=1e-12, atol=floor, what="loss")
    assert_close_budget(ga, gb, rtol=1e-11, atol=1e-14, what="grad")


def test_inplace_grad_under_compile_is_a_graph_break():
    # README: "under torch.compile it is a graph break (fullgraph=True raises)".
    pytest.importorskip("numba")
    x, tg, il, tl = _batch(2, 6, 3, 5, seed=20)
    w = torch.eye(x.shape[-1]).requires_grad_()

    def f(x, w):
        return seqloss.rnnt_loss(x @ w, tg, il, tl, blank=0, backend="numba", inplace_grad=True)

    want = f(x, w)
    (gw_want,) = torch.autograd.grad(want, w)
    torch._dynamo.reset()
    got = torch.compile(f, backend="inductor")(x, w)
    (gw,) = torch.autograd.grad(got, w)
    assert torch.equal(got, want)
    torch.testing.assert_close(gw, gw_want, rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="disable"):
        torch.compile(f, backend="inductor", fullgraph=True)(x, w)
