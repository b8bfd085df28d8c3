"""TDT: every backend against path enumeration, gradcheck, structure, the pair layout, errors.

The oracle scores every arc from float64 log-softmaxes written here (NeMo's
conventions: token logits then duration logits; a blank takes durations >= 1, a label
any duration; ``sigma`` on every arc's token log-probability; the path ends on a blank
landing on ``T_b``) and sums the paths with ``seqloss.testing.brute_force_lattice``.
``omega`` mixes it with the RNN-T loss of the token logits (standard blank, no sigma),
each branch's per-sequence gradient clamped on its own.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for, other_backend

import seqloss
from seqloss.testing import assert_close_budget, brute_force_lattice
from seqloss.transducer import tdt as _tdt

NAN = float("nan")
INF = float("inf")


def _batch(B=3, T=5, U=2, V=6, D=3, *, seed=0, pad_t=1, pad_u=1, blank=-1, dtype=torch.float64):
    """Joint logits ``(B, T', U'+1, V + D)`` with NaN in the padding, targets never the blank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + pad_t, U + 1 + pad_u, V + D, generator=g, dtype=dtype) * 1.5
    labels = [c for c in range(V) if c != blank % V]
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


def _oracle(x, tg, il, tl, durs, *, blank=-1, sigma=0.0, omega=0.0, clamp=-1.0, reduction="none",
            zero_infinity=False):
    """(reduced loss, d loss.sum() / d x) on the joint ``x (B, T, U+1, V + D)``, float64."""
    x = x.detach().cpu().double()
    B, T, U1, W = x.shape
    D = len(durs)
    V = W - D
    blank %= V
    bdurs = tuple(d for d in durs if d > 0)
    w = _weights(reduction, B, tl)
    losses, grad = [], torch.zeros_like(x)
    for b in range(B):
        Tb, Ub = int(il[b]), int(tl[b])
        valid = (torch.arange(T)[:, None] < Tb) & (torch.arange(U1)[None, :] <= Ub)
        xb = torch.where(valid[..., None], x[b], 0.0)
        y = torch.cat([tg[b, :Ub].cpu(), torch.zeros(U1 - Ub, dtype=torch.int64)])
        parts = []  # (weight, -log-likelihood, gradient)
        for weight, kind in ((1.0 - omega, "tdt"), (omega, "rnnt")):
            if weight == 0.0:
                continue
            z = xb.clone().requires_grad_()
            lpt, lpd = z[..., :V].log_softmax(-1), z[..., V:].log_softmax(-1)
            lpy = lpt.gather(2, y[None, :, None].expand(T, U1, 1))[..., 0]
            if kind == "tdt":
                ab = torch.stack([lpt[..., blank] - sigma + lpd[..., k]
                                  for k, d in enumerate(durs) if d > 0], -1)
                ae = torch.stack([lpy - sigma + lpd[..., k] for k in range(D)], -1)
                ll = brute_force_lattice(ab, ae, Tb, Ub, bdurs, tuple(durs))
            else:
                ll = brute_force_lattice(lpt[..., blank : blank + 1], lpy[..., None], Tb, Ub, (1,),
                                         (0,))
            g = torch.zeros_like(z)
            if torch.isfinite(ll):
                (g,) = torch.autograd.grad(-ll, z)
                if clamp > 0:
                    g = g.clamp(-clamp, clamp)
            parts.append((weight, -ll.detach(), g))
        loss = sum(wt * lv for wt, lv, _ in parts)
        if torch.isfinite(loss):
            grad[b] = sum(wt * g for wt, _, g in parts) * w[b]
        else:
            loss = torch.tensor(0.0 if zero_infinity else INF, dtype=torch.float64)
        losses.append(loss)
    loss = torch.stack(losses)
    if reduction != "none":
        loss = (loss * w).sum()
    return loss, grad


def _run(x, tg, il, tl, durs, backend, *, pair=False, **kw):
    """Loss and gradient on the joint (or on its two blocks as a pair of tensors)."""
    dev = device_for(backend)
    D = len(durs)
    tg = tg.to(dev) if isinstance(tg, torch.Tensor) else tg
    if pair:
        a = x[..., :-D].contiguous().to(dev).requires_grad_()
        b = x[..., -D:].contiguous().to(dev).requires_grad_()
        loss = seqloss.tdt_loss((a, b), tg, il, tl, durs, backend=backend, **kw)
        ga, gb = torch.autograd.grad(loss.sum(), (a, b))
        return loss.detach().cpu(), torch.cat([ga, gb], -1).cpu()
    x = x.to(dev).requires_grad_()
    loss = seqloss.tdt_loss(x, tg, il, tl, durs, backend=backend, **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach().cpu(), g.cpu()


CASES = [
    pytest.param(dict(), dict(durs=[0, 1, 2], reduction="none"), id="default-none"),
    pytest.param(dict(D=4, seed=1), dict(durs=[0, 1, 2, 3], sigma=0.1, reduction="sum"),
                 id="sigma-sum"),
    pytest.param(dict(seed=2), dict(durs=[0, 1, 3], omega=0.3, clamp=0.05, reduction="mean"),
                 id="omega-clamp-mean"),
    pytest.param(dict(seed=3, D=2), dict(durs=[0, 1], omega=0.5, sigma=0.05,
                                         reduction="mean_volume"), id="omega-sigma-mean-volume"),
    pytest.param(dict(seed=4, blank=2), dict(durs=[0, 1, 2], blank=2, reduction="none"),
                 id="explicit-blank"),
]


@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
@pytest.mark.parametrize("shape_kw,kw", CASES)
def test_against_brute_force(rnnt_backend, shape_kw, kw, pair):
    if rnnt_backend == "triton" and pair and kw["reduction"] not in ("mean", "none"):
        pytest.skip("the interpreter is slow: a few pair cases are enough")
    kw = dict(kw)
    durs = kw.pop("durs")
    x, tg, il, tl = _batch(**shape_kw)
    loss, g = _run(x, tg, il, tl, durs, rnnt_backend, pair=pair, **kw)
    want, want_g = _oracle(x, tg, il, tl, durs, **kw)
    assert loss.dtype == torch.float64 and loss.shape == want.shape
    assert_close_budget(loss, want, rtol=1e-10, atol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")
    assert not torch.isnan(g).any()  # padding held NaN: never read, zero gradient


def test_no_emission_lands_on_the_last_frame():
    """NeMo's final state: one frame, one label: label (duration 0) then blank (duration 1)."""
    x = torch.randn(1, 1, 2, 4 + 2, dtype=torch.float64)
    loss = seqloss.tdt_loss(x, torch.tensor([[1]]), [1], [1], [0, 1], reduction="none",
                            backend="reference")
    lpt, lpd = x[0, 0, :, :4].log_softmax(-1), x[0, 0, :, 4:].log_softmax(-1)
    want = -(lpt[0, 1] + lpd[0, 0] + lpt[1, 3] + lpd[1, 1])
    assert_close_budget(loss, want[None], rtol=1e-12, what="loss")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible(rnnt_backend, zero_infinity):
    """No frame, or the blank at -inf everywhere: +inf (0 with zero_infinity), zero grad."""
    x, tg, il, tl = _batch(seed=5)
    il[1] = 0
    x[2, :, :, 5] = -INF  # the blank (token 5): no path can end
    loss, g = _run(x, tg, il, tl, [0, 1, 2], rnnt_backend, reduction="none", omega=0.25,
                   zero_infinity=zero_infinity)
    want, want_g = _oracle(x, tg, il, tl, [0, 1, 2], omega=0.25, zero_infinity=zero_infinity)
    assert loss[1] == loss[2] == (0.0 if zero_infinity else INF)
    assert_close_budget(loss, want, rtol=1e-10, what="loss")
    assert torch.count_nonzero(g[1:]) == 0 and not torch.isnan(g).any()
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_nonfinite_duration_logit_poisons_one_sequence(rnnt_backend, pair):
    x, tg, il, tl = _batch(seed=6)
    x[0, 0, 0, -1] = NAN  # a duration logit that sequence 0 reads
    loss, g = _run(x, tg, il, tl, [0, 1, 2], rnnt_backend, pair=pair, reduction="none")
    want, want_g = _oracle(x[1:], tg[1:], il[1:], tl[1:], [0, 1, 2])
    assert torch.isnan(loss[0]) and torch.isnan(g[0, : il[0], : tl[0] + 1]).all()
    assert_close_budget(loss[1:], want, rtol=1e-10, what="loss")
    assert_close_budget(g[1:], want_g, rtol=1e-9, atol=1e-12, what="grad")


@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_gradcheck(rnnt_backend, pair):
    x, tg, il, tl = _batch(seed=7, B=2, T=3, U=2, V=4, pad_u=0)
    durs = [0, 1, 2]
    x = torch.nan_to_num(x, nan=0.3).to(device_for(rnnt_backend))
    tg = tg.to(x.device)
    kw = dict(sigma=0.1, omega=0.25, reduction="none", backend=rnnt_backend)
    # The reference and interpreted Triton (~0.1 s a launch; gradcheck makes two calls per
    # element) check one random direction (fast_mode); test_against_brute_force checks
    # every element's gradient.
    opts = dict(eps=1e-6, atol=1e-8, rtol=1e-6, fast_mode=rnnt_backend != "numba")
    if pair:
        D = len(durs)
        a, b = x[..., :-D].clone().requires_grad_(), x[..., -D:].clone().requires_grad_()
        assert torch.autograd.gradcheck(
            lambda p, q: seqloss.tdt_loss((p, q), tg, il, tl, durs, **kw), (a, b), **opts)
    else:
        x = x.requires_grad_()
        assert torch.autograd.gradcheck(lambda z: seqloss.tdt_loss(z, tg, il, tl, durs, **kw),
                                        (x,), **opts)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_equals_float32_on_rounded(rnnt_backend, dtype):
    if rnnt_backend == "triton" and dtype == torch.float16:
        pytest.skip("one half dtype under the interpreter is enough")
    x, tg, il, tl = _batch(seed=8, dtype=torch.float32)
    half = x.to(dtype)
    for pair in (False, True):
        a, ga = _run(half, tg, il, tl, [0, 1, 2], rnnt_backend, pair=pair, reduction="sum",
                     sigma=0.05)
        b, gb = _run(half.float(), tg, il, tl, [0, 1, 2], rnnt_backend, pair=pair,
                     reduction="sum", sigma=0.05)
        assert a.dtype == torch.float32 and ga.dtype == dtype
        assert_close_budget(a, b, rtol=1e-6, what="loss")
        eps = torch.finfo(dtype).eps
        assert_close_budget(ga.float(), gb.to(dtype).float(), rtol=eps, atol=eps * 1e-2,
                            what="grad")


def test_determinism(rnnt_backend):
    tiny = rnnt_backend == "triton"  # the interpreter is slow
    shape = dict(B=2, T=5, U=2, V=6, D=4) if tiny else dict(B=4, T=8, U=4, V=8, D=4)
    x, tg, il, tl = _batch(seed=9, dtype=torch.float32, **shape)
    for pair in (True,) if tiny else (False, True):
        kw = dict(pair=pair, clamp=0.3, sigma=0.1, omega=0.2)
        a = _run(x, tg, il, tl, [0, 1, 2, 3], rnnt_backend, **kw)
        b = _run(x, tg, il, tl, [0, 1, 2, 3], rnnt_backend, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------ structure
@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_omega_one_is_rnnt_on_the_token_logits(rnnt_backend, pair):
    x, tg, il, tl = _batch(B=3, T=6, U=3, V=7, D=3, seed=10)
    loss, g = _run(x, tg, il, tl, [0, 1, 2], rnnt_backend, pair=pair, omega=1.0, clamp=0.2,
                   sigma=0.3, reduction="sum")
    xr = x[..., :7].clone().requires_grad_()
    want = seqloss.rnnt_loss(xr, tg, il, tl, blank=-1, clamp=0.2, reduction="sum",
                             backend=other_backend(rnnt_backend))
    (gw,) = torch.autograd.grad(want, xr)
    assert_close_budget(loss, want.detach(), rtol=1e-12, what="loss")
    assert_close_budget(g[..., :7], gw, rtol=1e-10, atol=1e-14, what="grad")
    assert torch.count_nonzero(g[..., 7:]) == 0


def test_pair_equals_joint(rnnt_backend):
    x, tg, il, tl = _batch(B=3, T=6, U=3, V=7, D=4, seed=11, dtype=torch.float32)
    kw = dict(sigma=0.05, omega=0.1, clamp=0.5, reduction="mean")
    a, ga = _run(x, tg, il, tl, [0, 1, 2, 4], rnnt_backend, **kw)
    b, gb = _run(x, tg, il, tl, [0, 1, 2, 4], rnnt_backend, pair=True, **kw)
    assert_close_budget(b, a, rtol=1e-6, what="loss")
    assert_close_budget(gb, ga, rtol=1e-6, atol=1e-8, what="grad")


def test_pair_of_views_is_read_in_place():
    """The pair may be views (here: the blocks of one joint, strided); nothing is copied."""
    x, tg, il, tl = _batch(seed=12)
    x = x.requires_grad_()
    loss = seqloss.tdt_loss((x[..., :6], x[..., 6:]), tg, il, tl, [0, 1, 2], backend="numba")
    (g,) = torch.autograd.grad(loss, x)
    want, want_g = _oracle(x, tg, il, tl, [0, 1, 2], reduction="mean")
    assert_close_budget(loss.detach(), want, rtol=1e-10, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


def test_batched_equals_per_sequence(rnnt_backend):
    x, tg, il, tl = _batch(B=3, T=6, U=3, V=7, D=3, seed=13, pad_t=2)
    kw = dict(reduction="none", sigma=0.1, omega=0.2)
    loss, g = _run(x, tg, il, tl, [0, 1, 2], rnnt_backend, **kw)
    for b in range(3):
        xb = x[b : b + 1, : il[b], : tl[b] + 1]
        lb, gb = _run(xb, tg[b : b + 1, : tl[b]], il[b : b + 1], tl[b : b + 1], [0, 1, 2],
                      rnnt_backend, **kw)
        assert_close_budget(loss[b : b + 1], lb, rtol=1e-12, what=f"loss {b}")
        assert_close_budget(g[b, : il[b], : tl[b] + 1], gb[0], rtol=1e-10, atol=1e-14,
                            what=f"grad {b}")


def test_inputs_int32_lists_and_noncontiguous():
    x, tg, il, tl = _batch(seed=14, pad_t=0, pad_u=0)
    x = torch.nan_to_num(x)
    a, ga = _run(x, tg, il, tl, [0, 1, 2], "numba")
    xt = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    b, gb = _run(xt, tg.int(), il.tolist(), tl.int(), (0, 1, 2), "numba")
    c, gc = _run(x, tg.tolist(), il.int(), tl.tolist(), torch.tensor([0, 1, 2]), "numba")
    assert torch.equal(a, b) and torch.equal(a, c)
    assert_close_budget(gb, ga, rtol=1e-14, what="grad")
    assert_close_budget(gc, ga, rtol=1e-14, what="grad")


def test_empty_batch():
    x = torch.zeros(0, 3, 2, 6 + 2, requires_grad=True)
    a, b = torch.zeros(0, 3, 2, 6, requires_grad=True), torch.zeros(0, 3, 2, 2, requires_grad=True)
    tg = torch.zeros(0, 1, dtype=torch.int64)
    for logits, leaves in ((x, (x,)), ((a, b), (a, b))):
        loss = seqloss.tdt_loss(logits, tg, [], [], [0, 1], omega=0.5, backend="numba")
        grads = torch.autograd.grad(loss, leaves)
        assert loss.item() == 0.0 and all(g.shape == t.shape
                                          for g, t in zip(grads, leaves, strict=True))


@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_torch_compile_fullgraph(rnnt_backend, pair):
    if rnnt_backend == "triton" and not pair:
        pytest.skip("the interpreter is slow: the pair is enough")
    x, tg, il, tl = _batch(B=2, T=4, U=2, V=5, D=3, seed=15, dtype=torch.float32)
    x = torch.nan_to_num(x).to(device_for(rnnt_backend))
    tg = tg.to(x.device)
    kw = dict(sigma=0.1, omega=0.3, clamp=0.5, reduction="mean_volume", backend=rnnt_backend)

    def f(*z):
        return seqloss.tdt_loss(z if pair else z[0], tg, il, tl, [0, 1, 2], **kw)

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = lambda: (x[..., :5].clone().requires_grad_(), x[..., 5:].clone().requires_grad_()) \
        if pair else (x.clone().requires_grad_(),)
    l1, l2 = leaves(), leaves()
    a, b = f(*l1), cf(*l2)
    g1, g2 = torch.autograd.grad(a, l1), torch.autograd.grad(b, l2)
    assert torch.equal(a, b) and all(torch.equal(p, q) for p, q in zip(g1, g2, strict=True))


def test_opcheck():
    x, tg, il, tl = _batch(B=2, T=4, U=2, V=5, D=2, seed=16, pad_t=0, pad_u=0)
    x = torch.nan_to_num(x).requires_grad_()
    table = seqloss.transducer.joint.table.tdt_table(5, 4, (0, 1), 0.1, 0.5)
    ints, floats = table.encode()
    rest = (tg, il, tl, ints, floats, 0.25, "mean_target", False, "reference", True, True)
    torch.library.opcheck(_tdt.tdt_loss_op, (x, *rest))
    a, b = (x[..., :5].detach().clone().requires_grad_(),
            x[..., 5:].detach().clone().requires_grad_())
    torch.library.opcheck(_tdt.tdt_pair_loss_op, (a, b, *rest))


def test_module():
    x, tg, il, tl = _batch(seed=17, dtype=torch.float32)
    m = seqloss.TDTLoss([0, 1, 2], sigma=0.1, omega=0.2, reduction="sum", backend="numba")
    assert "omega=0.2" in repr(m) and "durations=[0, 1, 2]" in repr(m)
    a = m(x, tg, il, tl)
    b = seqloss.tdt_loss(x, tg, il, tl, [0, 1, 2], sigma=0.1, omega=0.2, reduction="sum",
                         backend="numba")
    assert torch.equal(a, b)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("durs,match", [
    ([1, 2], "must contain 0 and 1"),
    ([0, 2], "must contain 0 and 1"),
    ([0, 2, 1], "must be ascending"),
    ([0, 1, 1], r"durations\[2\] = 1 repeats"),
    ([-1, 0, 1], r"durations\[0\] = -1 is negative"),
])
def test_duration_errors(durs, match):
    x, tg, il, tl = _batch(seed=18, D=len(durs))
    with pytest.raises(seqloss.InputError, match=match):
        seqloss.tdt_loss(x, tg, il, tl, durs)


def test_errors():
    x, tg, il, tl = _batch(seed=19)  # V = 6, D = 3
    f = seqloss.tdt_loss
    durs = [0, 1, 2]
    with pytest.raises(TypeError, match=r"durations\[1\] must be an int") as e:
        f(x, tg, il, tl, [0, 1.0, 2])
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(TypeError):
        f(x.long(), tg, il, tl, durs)
    with pytest.raises(seqloss.InputError, match=r"logits.size\(-1\) = 3 must be V \+ D"):
        f(x[..., :3], tg, il, tl, durs)
    # The blank is named once, not once per duration arc (it was "blanks: (5, 5, 5)").
    with pytest.raises(seqloss.InputError,
                       match=r"targets\[0, 1\] = 5 equals blank = 5; targets may not"):
        bad = tg.clone()
        bad[0, 1] = 5
        f(x, bad, il, tl, durs)
    # A duration class is no token; the message says how V was derived from the joint.
    with pytest.raises(seqloss.InputError, match=r"out of range: expected 0 <= id < 6 "
                       r"\(V = logits.size\(-1\) - len\(durations\) = 9 - 3\)"):
        bad = tg.clone()
        bad[0, 0] = 6
        f(x, bad, il, tl, durs)
    # Too many durations for this joint: V shrinks, and the same message shows why.
    with pytest.raises(seqloss.InputError, match=r"expected 0 <= id < 5 "
                       r"\(V = logits.size\(-1\) - len\(durations\) = 9 - 4\)"):
        bad = tg.clone()
        bad[0, 0] = 5
        f(x, bad, il, tl, [0, 1, 2, 3])
    with pytest.raises(seqloss.InputError, match="blank = 6 is out of range"):
        f(x, tg, il, tl, durs, blank=6)
    with pytest.raises(seqloss.InputError, match="omega"):
        f(x, tg, il, tl, durs, omega=1.5)
    with pytest.raises(seqloss.InputError, match="omega"):
        f(x, tg, il, tl, durs, omega=-0.1)
    with pytest.raises(seqloss.InputError, match=r"target_lengths\[1\] = 5 exceeds"):
        f(x, tg, il, [2, 5, 0], durs)
    tok, dur = x[..., :6], x[..., 6:]
    with pytest.raises(seqloss.InputError,
                       match=r"duration_logits.size\(-1\) = 3 must equal len\(durations\) = 4"):
        f((tok, dur), tg, il, tl, [0, 1, 2, 3])
    with pytest.raises(seqloss.InputError, match="duration_logits must have shape"):
        f((tok, dur[:, :-1]), tg, il, tl, durs)
    with pytest.raises(TypeError, match="dtypes differ"):
        f((tok, dur.float()), tg, il, tl, durs)
    with pytest.raises(seqloss.InputError, match="pair"):
        f((tok, dur, dur), tg, il, tl, durs)
    with pytest.raises(TypeError, match="duration_logits"):
        f((tok, dur.long()), tg, il, tl, durs)
