"""Multi-blank RNN-T: every backend against path enumeration, gradcheck, structure, errors.

The oracle scores every arc from a float64 ``log_softmax`` written here (NeMo's
conventions: big blank ``i`` at class ``blank - 1 - i``, ``sigma`` subtracted from
every arc) and sums the paths with ``seqloss.testing.brute_force_lattice``; autograd
through it gives the gradient. FastEmit scales the emission arcs' occupations (the
arc enters as ``(1 + λ) a - λ a.detach()``: its value is unchanged), the clamp is
applied per element to each sequence's oracle gradient.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for, other_backend

import seqloss
from seqloss.testing import assert_close_budget, brute_force_lattice

NAN = float("nan")
INF = float("inf")


def _batch(B=3, T=5, U=2, V=7, *, seed=0, pad_t=1, pad_u=1, n_big=2, blank=-1, dtype=torch.float64):
    """Logits with NaN in the padding (never read), targets avoiding every blank-like class."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + pad_t, U + 1 + pad_u, V, generator=g, dtype=dtype) * 1.5
    b = blank % V
    labels = [c for c in range(V) if not (b - n_big <= c <= b)]
    tg = torch.tensor(labels)[torch.randint(0, len(labels), (B, U), generator=g)]
    il = torch.randint(1, T + 1, (B,), generator=g)
    tl = torch.randint(0, U + 1, (B,), generator=g)
    il[0], tl[0] = T, U
    for i in range(B):
        x[i, il[i]:] = NAN
        x[i, :, tl[i] + 1:] = NAN
    return x, tg, il, tl


def _weights(reduction, B, tl):
    """Per-sequence factors; ``"mean"`` is NeMo's: each loss over its target length."""
    if reduction in ("mean", "mean_target"):
        return 1.0 / (tl.double().clamp(min=1) * B)
    if reduction == "mean_batch":
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    if reduction == "mean_volume":
        return torch.full((B,), 1.0 / max(int(tl.sum()), 1), dtype=torch.float64)
    return torch.ones(B, dtype=torch.float64)


def _oracle(x, tg, il, tl, bb, *, blank=-1, sigma=0.0, lam=0.0, clamp=-1.0, reduction="none",
            zero_infinity=False):
    """(reduced loss, d loss.sum() / d x) by listing every path, in float64."""
    x = x.detach().cpu().double()
    B, T, U1, V = x.shape
    blank %= V
    losses, grad = [], torch.zeros_like(x)
    w = _weights(reduction, B, tl)
    for b in range(B):
        Tb, Ub = int(il[b]), int(tl[b])
        valid = (torch.arange(T)[:, None] < Tb) & (torch.arange(U1)[None, :] <= Ub)
        xb = torch.where(valid[..., None], x[b], 0.0).requires_grad_()
        lp = xb.log_softmax(-1) - sigma
        ab = torch.stack([lp[..., blank]] + [lp[..., blank - 1 - i] for i in range(len(bb))], -1)
        y = torch.cat([tg[b, :Ub].cpu(), torch.zeros(U1 - Ub, dtype=torch.int64)])
        ae = lp.gather(2, y[None, :, None].expand(T, U1, 1))
        ae = (1 + lam) * ae - lam * ae.detach()
        ll = brute_force_lattice(ab, ae, Tb, Ub, (1, *bb), (0,))
        if torch.isfinite(ll):
            (gb,) = torch.autograd.grad(-ll, xb)
            if clamp > 0:
                gb = gb.clamp(-clamp, clamp)
            grad[b] = gb * w[b]
            losses.append(-(1 + lam) * ll.detach())
        else:
            losses.append(torch.tensor(0.0 if zero_infinity else INF, dtype=torch.float64))
    loss = torch.stack(losses)
    if reduction != "none":
        loss = (loss * w).sum()
    return loss, grad


def _run(x, tg, il, tl, bb, backend, **kw):
    x = x.to(device_for(backend)).requires_grad_()
    tg = tg.to(x.device) if isinstance(tg, torch.Tensor) else tg
    loss = seqloss.multiblank_rnnt_loss(x, tg, il, tl, bb, backend=backend, **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach().cpu(), g.cpu()


CASES = [
    pytest.param(dict(bb=(2, 3)), dict(reduction="none"), id="default-none"),
    pytest.param(dict(bb=(2, 4), seed=1), dict(sigma=0.1, reduction="sum"), id="sigma-sum"),
    pytest.param(dict(bb=(3,), seed=2), dict(fastemit_lambda=0.25, reduction="mean"),
                 id="fastemit-mean"),
    pytest.param(dict(bb=(2, 3), seed=3), dict(clamp=0.05, sigma=0.05, reduction="mean_volume"),
                 id="clamp-mean-volume"),
    pytest.param(dict(bb=(2,), seed=4, blank=3, n_big=1), dict(blank=3, reduction="none"),
                 id="explicit-blank"),
]


@pytest.mark.parametrize("shape_kw,kw", CASES)
def test_against_brute_force(rnnt_backend, shape_kw, kw):
    shape_kw = dict(shape_kw)
    bb = shape_kw.pop("bb")
    x, tg, il, tl = _batch(**shape_kw)
    loss, g = _run(x, tg, il, tl, list(bb), rnnt_backend, **kw)
    want, want_g = _oracle(x, tg, il, tl, bb, blank=kw.get("blank", -1), sigma=kw.get("sigma", 0.0),
                           lam=kw.get("fastemit_lambda", 0.0), clamp=kw.get("clamp", -1.0),
                           reduction=kw["reduction"])
    assert loss.dtype == torch.float64 and loss.shape == want.shape
    assert_close_budget(loss, want, rtol=1e-10, atol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")
    assert not torch.isnan(g).any()  # padding held NaN: never read, zero gradient


def test_sigma_changes_the_gradient():
    """sigma is on every arc (NeMo): paths with fewer steps gain, so the gradient moves."""
    x, tg, il, tl = _batch(seed=5)
    a = _run(x, tg, il, tl, [2, 3], "reference")
    b = _run(x, tg, il, tl, [2, 3], "reference", sigma=0.3)
    assert (a[1] - b[1]).abs().max() > 1e-3


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible(rnnt_backend, zero_infinity):
    """No frame, or every blank-like class at -inf: +inf (0 with zero_infinity), zero grad."""
    x, tg, il, tl = _batch(seed=6)
    il[1] = 0
    x[2, :, :, 4:] = -INF  # blank 6 and big blanks 5, 4: no blank-like arc anywhere
    loss, g = _run(x, tg, il, tl, [2, 3], rnnt_backend, reduction="none",
                   zero_infinity=zero_infinity)
    want, want_g = _oracle(x, tg, il, tl, (2, 3), zero_infinity=zero_infinity)
    assert loss[1] == loss[2] == (0.0 if zero_infinity else INF)
    assert_close_budget(loss, want, rtol=1e-10, what="loss")
    assert torch.count_nonzero(g[1:]) == 0 and not torch.isnan(g).any()
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


def test_gradcheck(rnnt_backend):
    # The Triton interpreter costs ~0.1 s a call, gradcheck two calls per element: smaller.
    tiny = rnnt_backend == "triton"
    shape = dict(B=1, T=3, U=1, V=4, pad_t=0, pad_u=0, n_big=1) if tiny else dict(B=2, T=4, U=2)
    bb = [2] if tiny else [2, 3]
    x, tg, il, tl = _batch(seed=7, **shape)
    x = torch.nan_to_num(x, nan=0.3).to(device_for(rnnt_backend)).requires_grad_()
    tg = tg.to(x.device)

    def f(z):
        return seqloss.multiblank_rnnt_loss(z, tg, il, tl, bb, sigma=0.1, reduction="none",
                                            backend=rnnt_backend)

    # The reference (~0.03 s a call, ~550 calls) and interpreted Triton check one random
    # direction (fast_mode); test_against_brute_force checks every element's gradient.
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    fast_mode=rnnt_backend != "numba")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_equals_float32_on_rounded(rnnt_backend, dtype):
    if rnnt_backend == "triton" and dtype == torch.float16:
        pytest.skip("one half dtype under the interpreter is enough")
    x, tg, il, tl = _batch(seed=8, dtype=torch.float32)
    half = x.to(dtype)
    a, ga = _run(half, tg, il, tl, [2, 3], rnnt_backend, reduction="sum", sigma=0.05)
    b, gb = _run(half.float(), tg, il, tl, [2, 3], rnnt_backend, reduction="sum", sigma=0.05)
    assert a.dtype == torch.float32 and ga.dtype == dtype
    assert_close_budget(a, b, rtol=1e-6, what="loss")
    eps = torch.finfo(dtype).eps
    assert_close_budget(ga.float(), gb.to(dtype).float(), rtol=eps, atol=eps * 1e-2, what="grad")


def test_determinism(rnnt_backend):
    # The interpreter runs a grid's programs one after another: a small size is enough.
    interpreted = rnnt_backend == "triton" and not torch.cuda.is_available()
    shape = dict(B=2, T=5, U=2) if interpreted else dict(B=4, T=9, U=4)
    x, tg, il, tl = _batch(**shape, V=9, seed=9, dtype=torch.float32)
    a = _run(x, tg, il, tl, [2, 4], rnnt_backend, clamp=0.3, sigma=0.1, fastemit_lambda=0.1)
    b = _run(x, tg, il, tl, [2, 4], rnnt_backend, clamp=0.3, sigma=0.1, fastemit_lambda=0.1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------ structure
def test_masked_big_blanks_are_rnnt(rnnt_backend):
    """Big blanks at -inf: plain RNN-T on the remaining classes (their gradient is 0)."""
    x, tg, il, tl = _batch(B=3, T=6, U=3, V=8, seed=10)
    x[..., 5:7] = -INF  # big blanks 5 and 6 below the blank 7
    x = torch.nan_to_num(x, nan=0.0, neginf=-INF)
    a, ga = _run(x, tg, il, tl, [2, 3], rnnt_backend, reduction="none")
    keep = [0, 1, 2, 3, 4, 7]
    xr = x[..., keep].clone().requires_grad_()
    b = seqloss.rnnt_loss(xr, tg, il, tl, blank=-1, reduction="none",
                          backend=other_backend(rnnt_backend))
    (gb,) = torch.autograd.grad(b.sum(), xr)
    assert_close_budget(a, b.detach(), rtol=1e-12, what="loss")
    assert_close_budget(ga[..., keep], gb, rtol=1e-10, atol=1e-14, what="grad")
    assert torch.count_nonzero(ga[..., 5:7]) == 0


def test_batched_equals_per_sequence(rnnt_backend):
    x, tg, il, tl = _batch(B=3, T=6, U=3, V=8, seed=11, pad_t=2)
    loss, g = _run(x, tg, il, tl, [2, 3], rnnt_backend, reduction="none", sigma=0.1)
    for b in range(3):
        xb = x[b : b + 1, : il[b], : tl[b] + 1]
        lb, gb = _run(xb, tg[b : b + 1, : tl[b]], il[b : b + 1], tl[b : b + 1], [2, 3],
                      rnnt_backend, reduction="none", sigma=0.1)
        assert_close_budget(loss[b : b + 1], lb, rtol=1e-12, what=f"loss {b}")
        assert_close_budget(g[b, : il[b], : tl[b] + 1], gb[0], rtol=1e-10, atol=1e-14,
                            what=f"grad {b}")


def test_inputs_int32_lists_and_noncontiguous():
    x, tg, il, tl = _batch(seed=12, pad_t=0, pad_u=0)
    x = torch.nan_to_num(x)
    a, ga = _run(x, tg, il, tl, [2, 3], "numba")
    xt = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    b, gb = _run(xt, tg.int(), il.tolist(), tl.int(), (2, 3), "numba")
    c, gc = _run(x, tg.tolist(), il.int(), tl.tolist(), torch.tensor([2, 3]), "numba")
    assert torch.equal(a, b) and torch.equal(a, c)
    assert_close_budget(gb, ga, rtol=1e-14, what="grad")
    assert_close_budget(gc, ga, rtol=1e-14, what="grad")


def test_empty_batch():
    x = torch.zeros(0, 3, 2, 6, requires_grad=True)
    tg = torch.zeros(0, 1, dtype=torch.int64)
    loss = seqloss.multiblank_rnnt_loss(x, tg, [], [], [2], backend="numba")
    loss.backward()
    assert loss.item() == 0.0 and x.grad.shape == x.shape


def test_torch_compile_fullgraph(rnnt_backend):
    x, tg, il, tl = _batch(B=2, T=4, U=2, V=6, seed=13, dtype=torch.float32)
    x = torch.nan_to_num(x).to(device_for(rnnt_backend))
    tg = tg.to(x.device)

    def f(z):
        return seqloss.multiblank_rnnt_loss(z, tg, il, tl, [2], sigma=0.1, clamp=0.5,
                                            reduction="mean_volume", backend=rnnt_backend)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = f(x1), cf(x2)
    a.backward()
    b.backward()
    assert torch.equal(a, b) and torch.equal(x1.grad, x2.grad)


def test_module():
    x, tg, il, tl = _batch(seed=14, dtype=torch.float32)
    m = seqloss.MultiBlankRNNTLoss([2, 3], sigma=0.1, reduction="sum", backend="numba")
    assert "sigma=0.1" in repr(m) and "big_blank_durations=[2, 3]" in repr(m)
    a = m(x, tg, il, tl)
    b = seqloss.multiblank_rnnt_loss(x, tg, il, tl, [2, 3], sigma=0.1, reduction="sum",
                                     backend="numba")
    assert torch.equal(a, b)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("bb,match", [
    ([1, 2], r"big_blank_durations\[0\] = 1 is invalid"),
    ([2, 0], r"big_blank_durations\[1\] = 0 is invalid"),
    ([2, 2], r"big_blank_durations\[1\] = 2 repeats"),
    ([2, 3, 4, 5, 6, 7, 8], r"7 big blanks do not fit below blank = 6"),
])
def test_duration_errors(bb, match):
    x, tg, il, tl = _batch(seed=15)
    with pytest.raises(seqloss.InputError, match=match):
        seqloss.multiblank_rnnt_loss(x, tg, il, tl, bb)


def test_errors():
    x, tg, il, tl = _batch(seed=16)
    f = seqloss.multiblank_rnnt_loss
    with pytest.raises(TypeError, match=r"big_blank_durations\[0\] must be an int") as e:
        f(x, tg, il, tl, [2.0])
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(TypeError, match="float"):
        f(x, tg, il, tl, torch.tensor([2.0]))
    with pytest.raises(TypeError):
        f(x.long(), tg, il, tl, [2])
    with pytest.raises(TypeError, match="target_lengths"):
        f(x, tg, il, tl.float(), [2])
    # A label equal to the standard blank or to a big blank: named, with the batch index.
    for c in (6, 5, 4):
        bad = tg.clone()
        bad[0, 1] = c
        with pytest.raises(seqloss.InputError, match=rf"targets\[0, 1\] = {c} equals"):
            f(x, bad, il, tl, [2, 3])
    bad = tg.clone()
    bad[0, 0] = 4  # not a big blank when there is one big blank only: allowed
    f(torch.nan_to_num(x), bad, il, tl, [2])
    with pytest.raises(seqloss.InputError, match=r"logit_lengths\[1\] = 9 exceeds"):
        f(x, tg, [5, 9, 1], tl, [2])
    with pytest.raises(seqloss.InputError, match="blank = 7 is out of range"):
        f(x, tg, il, tl, [2], blank=7)
    with pytest.raises(seqloss.InputError, match="reduction"):
        f(x, tg, il, tl, [2], reduction="batchmean")
    with pytest.raises(seqloss.InputError, match="fastemit_lambda"):
        f(x, tg, il, tl, [2], fastemit_lambda=-0.1)
    with pytest.raises(seqloss.InputError, match="sigma"):
        f(x, tg, il, tl, [2], sigma=float("nan"))
