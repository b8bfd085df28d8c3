"""k2's delay penalty on the transducer losses: every backend against path enumeration.

Every emission arc leaving frame ``t`` of sequence ``b`` gains ``delay_penalty * ((T_b - 1)
/ 2 - t)``. The oracle scores the arcs from a float64 ``log_softmax`` written here (NeMo's
conventions for multi-blank and TDT) and sums every path with
``seqloss.testing.brute_force_lattice(..., delay_penalty=)``; autograd through it gives
the gradient. FastEmit enters as ``(1 + λ) a - λ a.detach()`` on each emission arc (its
value unchanged, its occupation scaled), the clamp per element of each sequence's (and
each TDT branch's) gradient.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for

from seqloss._core.errors import InputError, InputTypeError
from seqloss.testing import assert_close_budget, brute_force_lattice
from seqloss.transducer.from_joint import (
    multiblank_rnnt_loss_from_joint,
    rnnt_loss_from_joint,
    tdt_loss_from_joint,
)
from seqloss.transducer.multiblank import MultiBlankRNNTLoss, multiblank_rnnt_loss
from seqloss.transducer.rnnt import RNNTLoss, rnnt_loss, rnnt_loss_packed
from seqloss.transducer.tdt import TDTLoss, tdt_loss

NAN = float("nan")
INF = float("inf")
BB = (2, 3)  # multi-blank's big blanks: classes V-2, V-3
DURS = (0, 1, 2)  # TDT's durations


def _spec(kind):
    """(V token classes, D duration logits, labels allowed) of each loss's tiny cases."""
    if kind == "multiblank":
        return 5, 0, [0, 1]
    if kind == "tdt":
        return 4, len(DURS), [0, 1, 2]
    return 4, 0, [0, 1, 2]


def _batch(kind, *, B=3, T=4, U=2, seed=0, dtype=torch.float64, lengths=None):
    """Padded logits (NaN in the padding: never read) with sequences of different T_b."""
    V, D, labels = _spec(kind)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + 1, U + 2, V + D, generator=g, dtype=torch.float64) * 1.5
    tg = torch.tensor(labels)[torch.randint(0, len(labels), (B, U), generator=g)]
    il, tl = lengths if lengths is not None else ([T, 3, 2][:B], [U, 1, 2][:B])
    il, tl = torch.tensor(il), torch.tensor(tl)
    for i in range(B):
        x[i, il[i]:] = NAN
        x[i, :, tl[i] + 1:] = NAN
    return x.to(dtype), tg, il, tl


def _weights(reduction, tl):
    B = tl.shape[0]
    if reduction == "mean_target":
        return 1.0 / (tl.double().clamp(min=1) * B)
    if reduction == "mean_batch":
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    if reduction == "mean_volume":
        return torch.full((B,), 1.0 / max(int(tl.sum()), 1), dtype=torch.float64)
    return torch.ones(B, dtype=torch.float64)


def _branch_ll(kind, z, y, Tb, Ub, *, V, fused, sigma, lam, dp):
    """log p of one sequence under one table, by listing every path (float64)."""
    lpt = z[..., :V].log_softmax(-1) if fused else z[..., :V]
    T, U1 = z.shape[:2]
    lpy = lpt.gather(2, y[None, :, None].expand(T, U1, 1))[..., 0]
    blank = V - 1
    if kind == "multiblank":
        ab = torch.stack([lpt[..., blank - i] - sigma for i in range(len(BB) + 1)], -1)
        ae = (lpy - sigma)[..., None]
        bd, ed = (1, *BB), (0,)
    elif kind == "tdt":
        lpd = z[..., V:].log_softmax(-1) if fused else z[..., V:]
        ab = torch.stack([lpt[..., blank] - sigma + lpd[..., k]
                          for k, d in enumerate(DURS) if d > 0], -1)
        ae = torch.stack([lpy - sigma + lpd[..., k] for k in range(len(DURS))], -1)
        bd, ed = tuple(d for d in DURS if d > 0), DURS
    else:  # RNN-T (also TDT's omega branch, on the token logits)
        ab, ae = lpt[..., blank : blank + 1] - sigma, lpy[..., None] - sigma
        bd, ed = (1,), (0,)
    ae = (1 + lam) * ae - lam * ae.detach()
    return brute_force_lattice(ab, ae, Tb, Ub, bd, ed, delay_penalty=dp)


def _oracle(kind, x, tg, il, tl, *, dp, sigma=0.0, lam=0.0, clamp=-1.0, omega=0.0,
            fused=True, reduction="none", zero_infinity=False):
    """(reduced loss, d loss.sum() / d x) of ``kind`` on the padded joint, in float64."""
    x = x.detach().cpu().double()
    B, T, U1, W = x.shape
    V = _spec(kind)[0]
    w = _weights(reduction, tl)
    losses, grad = [], torch.zeros_like(x)
    branches = [(kind, 1.0)] if kind != "tdt" else [("tdt", 1.0 - omega), ("rnnt", omega)]
    for b in range(B):
        Tb, Ub = int(il[b]), int(tl[b])
        valid = (torch.arange(T)[:, None] < Tb) & (torch.arange(U1)[None, :] <= Ub)
        xb = torch.where(valid[..., None], x[b], 0.0)
        y = torch.cat([tg[b, :Ub].cpu(), torch.zeros(U1 - Ub, dtype=torch.int64)])
        loss_b, g_b = 0.0, torch.zeros_like(xb)
        for k, weight in branches:
            if weight == 0.0:
                continue
            z = xb.clone().requires_grad_()
            ll = _branch_ll(k, z, y, Tb, Ub, V=V, fused=fused, sigma=0.0 if k != kind else sigma,
                            lam=lam, dp=dp)
            g = torch.zeros_like(z)
            if torch.isfinite(ll):
                (g,) = torch.autograd.grad(-ll, z)
                if clamp > 0:
                    g = g.clamp(-clamp, clamp)
            loss_b = loss_b + weight * -(1 + lam) * ll.detach()
            g_b = g_b + weight * g
        if torch.isfinite(loss_b):
            grad[b] = g_b * w[b]
        else:
            loss_b = torch.tensor(0.0 if zero_infinity else INF, dtype=torch.float64)
        losses.append(loss_b)
    loss = torch.stack(losses)
    if reduction != "none":
        loss = (loss * w).sum()
    return loss, grad


def _packed(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1])
                      for b in range(x.shape[0])])


def _run(loss, x, tg, il, tl, backend, **kw):
    """The loss (``rnnt``, ``rnnt_packed``, ``multiblank``, ``tdt``, ``tdt_pair``) and
    its gradient on the padded joint."""
    dev = device_for(backend)
    tg = tg.to(dev)
    kw = dict(kw, backend=backend)
    if loss == "rnnt_packed":
        xp = _packed(x, il, tl).to(dev).requires_grad_()
        out = rnnt_loss_packed(xp, tg, il, tl, **kw)
        (gp,) = torch.autograd.grad(out.sum(), xp)
        g = torch.zeros_like(x)
        off = 0
        for b in range(x.shape[0]):
            n = int(il[b]) * (int(tl[b]) + 1)
            g[b, : il[b], : tl[b] + 1] = gp[off : off + n].reshape(il[b], tl[b] + 1, -1).cpu()
            off += n
        return out.detach().cpu(), g
    if loss == "tdt_pair":
        D = len(DURS)
        a = x[..., :-D].contiguous().to(dev).requires_grad_()
        b = x[..., -D:].contiguous().to(dev).requires_grad_()
        out = tdt_loss((a, b), tg, il, tl, list(DURS), **kw)
        ga, gb = torch.autograd.grad(out.sum(), (a, b))
        return out.detach().cpu(), torch.cat([ga, gb], -1).cpu()
    z = x.to(dev).requires_grad_()
    if loss == "rnnt":
        out = rnnt_loss(z, tg, il, tl, **kw)
    elif loss == "multiblank":
        out = multiblank_rnnt_loss(z, tg, il, tl, list(BB), **kw)
    else:
        out = tdt_loss(z, tg, il, tl, list(DURS), **kw)
    (g,) = torch.autograd.grad(out.sum(), z)
    return out.detach().cpu(), g.cpu()


def _kind(loss):
    return loss.removesuffix("_packed").removesuffix("_pair")


def _oracle_kw(kw):
    out = dict(dp=kw.get("delay_penalty", 0.0), sigma=kw.get("sigma", 0.0),
               lam=kw.get("fastemit_lambda", 0.0), clamp=kw.get("clamp", -1.0),
               omega=kw.get("omega", 0.0), fused=kw.get("fused_log_softmax", True),
               reduction=kw["reduction"], zero_infinity=kw.get("zero_infinity", False))
    return out


# --------------------------------------------------------------------------- the oracle
def test_oracle_by_hand():
    """The oracle's penalty on a lattice small enough to list by hand: T = 2, U = 1, RNN-T.

    Two paths: emit at frame 0 (``+dp/2``) then two blanks, or a blank, emit at frame 1
    (``-dp/2``), a blank."""
    g = torch.Generator().manual_seed(0)
    ab = torch.randn(2, 2, 1, generator=g, dtype=torch.float64)
    ae = torch.randn(2, 2, 1, generator=g, dtype=torch.float64)
    dp = 0.7
    p0 = ae[0, 0, 0] + dp / 2 + ab[0, 1, 0] + ab[1, 1, 0]
    p1 = ab[0, 0, 0] + ae[1, 0, 0] - dp / 2 + ab[1, 1, 0]
    want = torch.logaddexp(p0, p1)
    got = brute_force_lattice(ab, ae, 2, 1, (1,), (0,), delay_penalty=dp)
    assert abs(float(got - want)) < 1e-14


# --------------------------------------------------------------------------- every loss
CASES = [
    pytest.param(dict(delay_penalty=0.7, reduction="none"), id="pos"),
    pytest.param(dict(delay_penalty=-1.3, reduction="sum"), id="neg"),
    pytest.param(dict(delay_penalty=0.0, reduction="none"), id="zero"),
    pytest.param(dict(delay_penalty=40.0, reduction="mean_batch"), id="large"),
    pytest.param(dict(delay_penalty=0.5, clamp=0.05, reduction="mean_volume"), id="clamp"),
]
LOSSES = ["rnnt", "rnnt_packed", "multiblank", "tdt", "tdt_pair"]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("loss", LOSSES)
def test_against_brute_force(rnnt_backend, loss, kw):
    if rnnt_backend == "triton" and (kw["delay_penalty"] in (0.0, 40.0) or (
            loss in ("rnnt_packed", "tdt_pair") and kw["delay_penalty"] != -1.3)):
        pytest.skip("interpreted Triton: the other cases cover its prologue")
    x, tg, il, tl = _batch(_kind(loss), seed=hash(loss) % 1000)
    got, g = _run(loss, x, tg, il, tl, rnnt_backend, **kw)
    want, want_g = _oracle(_kind(loss), x, tg, il, tl, **_oracle_kw(kw))
    assert got.dtype == torch.float64
    assert_close_budget(got, want, rtol=1e-10, atol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


COMBOS = [
    pytest.param("rnnt", dict(delay_penalty=0.6, fastemit_lambda=0.3, clamp=0.1,
                              reduction="none"), id="rnnt-fastemit-clamp"),
    pytest.param("rnnt", dict(delay_penalty=-0.8, fused_log_softmax=False, reduction="sum"),
                 id="rnnt-unfused"),
    pytest.param("rnnt", dict(delay_penalty=0.4, zero_infinity=True, reduction="none"),
                 id="rnnt-zero-infinity"),
    pytest.param("multiblank", dict(delay_penalty=-0.9, sigma=0.2, fastemit_lambda=0.25,
                                    clamp=0.2, reduction="mean_target"), id="mb-all"),
    pytest.param("tdt", dict(delay_penalty=0.8, sigma=0.1, omega=0.3, clamp=0.15,
                             reduction="mean_target"), id="tdt-omega"),
    pytest.param("tdt", dict(delay_penalty=-0.5, omega=1.0, reduction="none"),
                 id="tdt-omega1"),
]


@pytest.mark.parametrize("loss,kw", COMBOS)
def test_combined_against_brute_force(rnnt_backend, loss, kw):
    """With sigma, FastEmit, clamp, omega, log-prob inputs, zero_infinity (a sequence
    without frames and one with no path)."""
    x, tg, il, tl = _batch(loss, seed=7)
    if kw.get("zero_infinity"):
        il[1] = 0
        x[2, :, :, -1] = -INF  # no blank anywhere: no path
    if not kw.get("fused_log_softmax", True):
        x = torch.where(x.isnan(), x, torch.log_softmax(x.nan_to_num(), -1))
    got, g = _run(loss, x, tg, il, tl, rnnt_backend, **kw)
    want, want_g = _oracle(loss, x, tg, il, tl, **_oracle_kw(kw))
    assert_close_budget(got, want, rtol=1e-10, atol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


@pytest.mark.parametrize("loss", ["rnnt", "rnnt_packed", "multiblank", "tdt"])
def test_numba_row_passes(monkeypatch, loss):
    """Numba's row prologue (taken for wide rows) forced at these widths."""
    from seqloss.transducer.joint import numba_cpu, numba_rows

    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 1)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 1)
    x, tg, il, tl = _batch(_kind(loss), seed=21)
    kw = dict(delay_penalty=-0.45, fastemit_lambda=0.1, reduction="none")
    if loss == "tdt":
        kw = dict(delay_penalty=-0.45, reduction="none")
    got, g = _run(loss, x, tg, il, tl, "numba", **kw)
    want, want_g = _oracle(_kind(loss), x, tg, il, tl, **_oracle_kw(kw))
    assert_close_budget(got, want, rtol=1e-10, atol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-12, what="grad")


def test_penalty_moves_the_gradient():
    """A penalty changes what the oracle says (so the tests above can tell it apart)."""
    x, tg, il, tl = _batch("rnnt", seed=3)
    a = _oracle("rnnt", x, tg, il, tl, dp=0.0)
    b = _oracle("rnnt", x, tg, il, tl, dp=0.5)
    assert (a[0] - b[0]).abs().max() > 1e-2 and (a[1] - b[1]).abs().max() > 1e-3


def test_zero_is_the_default_bitwise():
    x, tg, il, tl = _batch("tdt", seed=4)
    for be in ("reference", "numba"):
        a = _run("tdt", x, tg, il, tl, be, reduction="none")
        b = _run("tdt", x, tg, il, tl, be, reduction="none", delay_penalty=0.0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("backend", ["numba", "triton"])
@pytest.mark.parametrize("dp", [3.0, -2.5])
def test_long_equals_shifted_log_probs(backend, dp):
    """Past brute force (T = 60: penalties of +-90 nats): on log-probability inputs the
    penalty is a shift of the target entries, so the loss equals the unpenalized loss of
    shifted inputs, and so does its gradient (the true derivative)."""
    g = torch.Generator().manual_seed(5)
    B, T, U, V = 2, 60 if backend == "numba" else 12, 5, 6
    lp = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).log_softmax(-1)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([T, T - 7]), torch.tensor([U, U - 2])
    shifted = lp.clone()
    for b in range(B):
        pen = dp * ((int(il[b]) - 1) / 2 - torch.arange(T, dtype=torch.float64))
        for u in range(int(tl[b])):
            shifted[b, :, u, tg[b, u]] += pen
    kw = dict(fused_log_softmax=False, reduction="none")
    got, gg = _run("rnnt", lp, tg, il, tl, backend, delay_penalty=dp, **kw)
    want, wg = _run("rnnt", shifted, tg, il, tl, "reference", **kw)
    assert_close_budget(got, want, rtol=1e-12, atol=1e-12, what="loss")
    assert_close_budget(gg, wg, rtol=1e-9, atol=1e-13, what="grad")


@pytest.mark.parametrize("loss", ["rnnt", "multiblank", "tdt"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half(rnnt_backend, loss, dtype):
    if rnnt_backend == "triton" and (dtype == torch.float16 or loss == "multiblank"):
        pytest.skip("interpreted Triton: one half dtype, two tables")
    x, tg, il, tl = _batch(loss, seed=9, dtype=dtype)
    kw = dict(delay_penalty=0.9, reduction="sum")
    got, g = _run(loss, x, tg, il, tl, rnnt_backend, **kw)
    want, want_g = _oracle(loss, x, tg, il, tl, **_oracle_kw(kw))
    assert got.dtype == torch.float32 and g.dtype == dtype
    # The oracle runs on the same (rounded) logits: the loss is float32-accurate, the
    # gradient off by its rounding to the half dtype.
    assert_close_budget(got, want, rtol=1e-6, what="loss")
    eps = torch.finfo(dtype).eps
    assert_close_budget(g.double(), want_g, rtol=eps, atol=eps * 1e-2, what="grad")


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("loss", ["rnnt", "multiblank", "tdt"])
def test_gradcheck(backend, loss):
    x, tg, il, tl = _batch(loss, B=2, T=3, U=2, seed=11, lengths=([3, 2], [2, 1]))
    x = torch.nan_to_num(x, nan=0.3).requires_grad_()
    fn = {"rnnt": lambda z, **k: rnnt_loss(z, tg, il, tl, **k),
          "multiblank": lambda z, **k: multiblank_rnnt_loss(z, tg, il, tl, list(BB), **k),
          "tdt": lambda z, **k: tdt_loss(z, tg, il, tl, list(DURS), omega=0.2, **k)}[loss]

    def f(z):
        return fn(z, delay_penalty=-0.6, reduction="none", backend=backend)

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    fast_mode=backend == "reference")


# --------------------------------------------------------------------------- from the joint
class _Joint(torch.nn.Module):
    def __init__(self, W, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = torch.nn.Linear(4, W, dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(W, 4, generator=g, dtype=torch.float64))
            self.lin.bias.copy_(torch.randn(W, generator=g, dtype=torch.float64))

    def forward(self, enc, pred):
        return self.lin(torch.tanh(enc[:, :, None, :] + pred[:, None, :, :]))


@pytest.mark.parametrize("kind", ["rnnt", "multiblank", "tdt"])
def test_from_joint_against_brute_force(rnnt_backend, kind):
    V, D, labels = _spec(kind)
    g = torch.Generator().manual_seed(12)
    B, T, U = 3, 4, 2
    enc = torch.randn(B, T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    pred = torch.randn(B, U + 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    joint = _Joint(V + D, 13)
    tg = torch.tensor(labels)[torch.randint(0, len(labels), (B, U), generator=g)]
    il, tl = torch.tensor([4, 3, 2]), torch.tensor([2, 1, 2])
    kw = dict(delay_penalty=-0.7, reduction="sum", backend=rnnt_backend, chunk_elements=40)
    if kind == "rnnt":
        out = rnnt_loss_from_joint(enc, pred, joint, tg, il, tl, fastemit_lambda=0.2, **kw)
        okw = dict(lam=0.2)
    elif kind == "multiblank":
        out = multiblank_rnnt_loss_from_joint(enc, pred, joint, tg, il, tl, list(BB), sigma=0.1,
                                              **kw)
        okw = dict(sigma=0.1)
    else:
        out = tdt_loss_from_joint(enc, pred, joint, tg, il, tl, list(DURS), omega=0.4, **kw)
        okw = dict(omega=0.4)
    ge, gp = torch.autograd.grad(out, (enc, pred))
    x = joint(enc, pred)
    want, want_g = _oracle(kind, x, tg, il, tl, dp=-0.7, reduction="sum", **okw)
    we, wp = torch.autograd.grad(x, (enc, pred), want_g)
    assert_close_budget(out.detach(), want, rtol=1e-10, what="loss")
    assert_close_budget(ge, we, rtol=1e-8, atol=1e-12, what="encoder grad")
    assert_close_budget(gp, wp, rtol=1e-8, atol=1e-12, what="predictor grad")


# --------------------------------------------------------------------------- API
def test_inplace_grad():
    x, tg, il, tl = _batch("rnnt", seed=14, dtype=torch.float32)
    x = x.nan_to_num()
    kw = dict(delay_penalty=0.3, reduction="sum")
    a, ga = _run("rnnt", x, tg, il, tl, "numba", **kw)
    z = x.clone().requires_grad_()
    y = z * 1.0  # the in-place mode overwrites a non-leaf's storage
    loss = rnnt_loss(y, tg, il, tl, inplace_grad=True, backend="numba", **kw)
    (g,) = torch.autograd.grad(loss, z)
    assert torch.equal(loss.detach(), a) and torch.equal(g, ga)


def test_modules():
    x, tg, il, tl = _batch("tdt", seed=15)
    m = TDTLoss(list(DURS), delay_penalty=0.4, reduction="none", backend="numba")
    assert "delay_penalty=0.4" in repr(m)
    want = tdt_loss(x, tg, il, tl, list(DURS), delay_penalty=0.4, reduction="none",
                    backend="numba")
    assert torch.equal(m(x, tg, il, tl), want)
    x, tg, il, tl = _batch("multiblank", seed=16)
    m = MultiBlankRNNTLoss(list(BB), delay_penalty=-0.4, reduction="none")
    want = multiblank_rnnt_loss(x, tg, il, tl, list(BB), delay_penalty=-0.4, reduction="none")
    assert "delay_penalty=-0.4" in repr(m) and torch.equal(m(x, tg, il, tl), want)
    x, tg, il, tl = _batch("rnnt", seed=17)
    m = RNNTLoss(delay_penalty=0.2, reduction="none")
    want = rnnt_loss(x, tg, il, tl, delay_penalty=0.2, reduction="none")
    assert "delay_penalty=0.2" in repr(m) and torch.equal(m(x, tg, il, tl), want)
    assert "delay_penalty" not in repr(RNNTLoss())


def test_keyword_only():
    x, tg, il, tl = _batch("rnnt", seed=18)
    with pytest.raises(TypeError):
        rnnt_loss(x, tg, il, tl, -1, -1, "none", True, 0.5)
    with pytest.raises(TypeError):
        multiblank_rnnt_loss(x, tg, il, tl, [2], -1, 0.0, -1, "none", 0.0, 0.5)


@pytest.mark.parametrize("bad,err", [(NAN, InputError), (INF, InputError),
                                     ("0.5", InputTypeError), (True, InputTypeError)])
def test_bad_values(bad, err):
    x, tg, il, tl = _batch("rnnt", seed=19)
    calls = [lambda: rnnt_loss(x, tg, il, tl, delay_penalty=bad),
             lambda: multiblank_rnnt_loss(x, tg, il, tl, [2], delay_penalty=bad),
             lambda: tdt_loss(torch.cat([x, x[..., :3]], -1), tg, il, tl, list(DURS),
                              delay_penalty=bad)]
    for call in calls:
        with pytest.raises(err, match="delay_penalty"):
            call()


def test_opcheck():
    """``rnnt_loss`` with a penalty runs the table op: its schema carries the penalty."""
    from seqloss.transducer import op
    from seqloss.transducer.joint.table import rnnt_table

    x, tg, il, tl = _batch("rnnt", seed=20, lengths=([4, 4, 4], [2, 2, 2]))
    x = x[:, :4, :3].contiguous().requires_grad_()
    ints, floats = rnnt_table(4, 3, -1.0, 0.1, delay_penalty=0.5).encode()
    args = (x, tg, il, tl, ints, floats, True, "sum", False, "reference", True, True)
    # aot_dispatch (the slow part) does not depend on the floats' values: left out.
    torch.library.opcheck(op.table_loss_op, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor"))
