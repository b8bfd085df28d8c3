"""Each backend's tile epilogue (``joint_tile_grad``), which the losses from the joint call
per tile of recomputed logits: against its formula in float64 numpy row by row, and
end to end against the materialized loss of another backend in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import backend_params, device_for, other_backend
from torch import nn

import seqloss
from seqloss._core.dispatch import kernel_module


def _tile_grad_fn(backend: str):
    if backend == "numba":
        from seqloss.transducer.joint import numba_rows

        return numba_rows.joint_tile_grad
    return kernel_module("joint", backend).joint_tile_grad


def _brute(x, lz, lzd, occ, cls, tg, hb, clamp, gscale, V):
    """``joint_tile_grad``'s formula, one row and one part at a time, float64 numpy."""
    x = x.astype(np.float64)
    nb, nt, nu, W = x.shape
    D = W - V
    out = np.zeros_like(x)
    for b, t, u in np.ndindex(nb, nt, nu):
        row = x[b, t, u]
        z = lz[b, t, u]
        p = np.exp(row[:V] - (math.inf if z == -math.inf else z))
        for k in range(occ.shape[0]):
            o = occ[k, b, t, u]
            w, wd, oe = o[0], o[1], o[2]
            g = np.zeros(W)
            if hb >= 0:
                g[:V] = p * oe
                g[hb] = 0.5 * (1.0 + math.tanh(row[hb] / 2)) * w - o[3]  # sigmoid
            else:
                g[:V] = p * w
                for i, c in enumerate(cls):
                    g[c] -= o[3 + i]
            g[tg[b, u]] -= oe
            if D:
                g[V:] = np.exp(row[V:] - lzd[b, t, u]) * wd - o[3 + len(cls):]
            if clamp[k] > 0:
                g = np.clip(g, -clamp[k], clamp[k])
            out[b, t, u] += g * gscale[k, b]
    return out


CASES = {
    # name: (V, D, blank classes, HAT's blank or -1, clamps)
    "rnnt": (7, 0, (6,), -1, (0.0,)),
    "rnnt_clamp": (7, 0, (6,), -1, (0.02,)),
    "multiblank": (9, 0, (8, 7, 6), -1, (0.0,)),
    "tdt": (7, 4, (6,), -1, (0.0,)),
    "tdt_two_clamped_parts": (7, 4, (6,), -1, (0.03, 0.03)),
    "hat": (7, 0, (6,), 6, (0.0,)),
    "hat_clamp": (7, 0, (6,), 6, (0.02,)),
    "wide": (600, 0, (599,), -1, (0.0,)),
}


@pytest.mark.parametrize("in_place", [False, True], ids=["buffer", "in_place"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", backend_params("joint"))
def test_tile_grad_matches_its_formula(backend, case, dtype, in_place):
    V, D, cls, hb, clamp = CASES[case]
    K = len(clamp)
    nb, nt, nu = 2, 3, 4
    g = torch.Generator().manual_seed(list(CASES).index(case))
    x = torch.randn(nb, nt, nu, V + D, generator=g, dtype=torch.float64) * 3
    x[0, 0, 0, :V] = -math.inf  # a row without a finite logit: probabilities 0
    # exp(x - lz) subnormal (float32; float64), products flushed to 0
    x[1, 2, 1, 1:V] = -95.0
    x[1, 2, 2, 1:V] = -720.0
    # normal products that the factor (0.01 for sequence 1) takes below (after a clamp)
    x[1, 2, 3, 1:V] = -85.0
    x[1, 1, 3, 1:V] = -705.0
    xt = x[..., :V] if hb < 0 else x[..., :V].index_fill(-1, torch.tensor([hb]), -math.inf)
    lz = torch.logsumexp(xt, -1)
    lzd = torch.logsumexp(x[..., V:], -1) if D else None
    occ = torch.rand(K, nb, nt, nu, 3 + len(cls) + D, generator=g, dtype=torch.float64)
    occ[..., 3:] *= 0.3
    tg = torch.randint(0, V - len(cls), (nb, nu), generator=g)
    gscale = torch.rand(K, nb, generator=g, dtype=torch.float64) + 0.5
    gscale[:, 1] *= 0.01
    want = _brute(x.to(dtype).numpy(), lz.numpy(), None if lzd is None else lzd.numpy(),
                  occ.numpy(), cls, tg.numpy(), hb, clamp, gscale.numpy(), V)
    tiny = torch.finfo(dtype).tiny
    want = np.where(np.abs(want) < tiny, 0.0, want)

    dev = device_for(backend)
    xd = x.to(dtype).to(dev)
    out = xd if in_place else torch.empty_like(xd)
    got = _tile_grad_fn(backend)(xd, lz.to(dev), None if lzd is None else lzd.to(dev),
                                 occ.to(dev), cls, tg.to(dev), hb, clamp, gscale.to(dev), out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    got = got.cpu().double().numpy()
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert (np.abs(got[got != 0]) >= tiny).all()  # no subnormal


# --------------------------------------------------------------------------- end to end
class Joint(nn.Module):
    """``Linear(tanh(enc_proj + pred_proj))`` (the gradient written over the logits), or
    with ``log_softmax`` after it (its backward reads its output: a buffer of its own)."""

    def __init__(self, W: int, last: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.enc = nn.Linear(5, 8, dtype=dtype)
        self.pred = nn.Linear(4, 8, dtype=dtype)
        self.out = nn.Linear(8, W, dtype=dtype)
        self.last = last

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        z = self.out(torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None]))
        return torch.log_softmax(z, -1) if self.last == "log_softmax" else z


DURS = [0, 1, 2, 3]
LOSSES = {
    # name: (V, D, keywords)
    "rnnt_fastemit": (7, 0, {"fastemit_lambda": 0.2}),
    "rnnt_clamp": (7, 0, {"clamp": 0.05}),
    "rnnt_wide": (530, 0, {}),
    "multiblank_clamp": (9, 0, {"big_blank_durations": [2, 3], "sigma": 0.05, "clamp": 0.05}),
    "tdt": (7, 4, {"durations": DURS, "sigma": 0.05}),
    "tdt_omega": (7, 4, {"durations": DURS, "omega": 0.3}),
    "tdt_omega_clamp": (7, 4, {"durations": DURS, "omega": 0.3, "clamp": 0.05}),
    "hat": (7, 0, {"fastemit_lambda": 0.1}),
    "hat_clamp": (7, 0, {"clamp": 0.05}),
}


def _loss(name: str, x, tg, Tl, tl, backend: str, chunk=None):
    """The loss ``name`` on logits ``x``, or from the joint when ``x`` is a tuple."""
    kw = dict(LOSSES[name][2], reduction="none", backend=backend)
    kind = name.split("_")[0]
    fj = isinstance(x, tuple)
    if fj:
        kw["chunk_elements"] = chunk
        x = tuple(x)
    args = (*x, tg, Tl, tl) if fj else (x, tg, Tl, tl)
    if kind == "rnnt":
        return (seqloss.rnnt_loss_from_joint if fj else seqloss.rnnt_loss)(*args, **kw)
    if kind == "multiblank":
        d = kw.pop("big_blank_durations")
        fn = seqloss.multiblank_rnnt_loss_from_joint if fj else seqloss.multiblank_rnnt_loss
        return fn(*args, d, **kw)
    if kind == "tdt":
        d = kw.pop("durations")
        return (seqloss.tdt_loss_from_joint if fj else seqloss.tdt_loss)(*args, d, **kw)
    return (seqloss.hat_loss_from_joint if fj else seqloss.hat_loss)(*args, **kw)


@pytest.mark.parametrize("last", ["linear", "log_softmax"])
@pytest.mark.parametrize("chunk", [None, 15], ids=["shared", "split"])
@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("backend", backend_params("joint"))
def test_loss_from_joint_matches_another_backend_materialized(backend, name, chunk, last):
    """Every backend's tiles (several sequences of different lengths in one, or rows
    split within a frame) against the materialized loss of another backend, float64:
    TDT's duration columns, its two branches (``omega``) folded or clamped apart,
    multi-blank's blank classes, HAT's sigmoid, narrow and wide rows."""
    V, D, _ = LOSSES[name]
    B, T, U = 3, 5, 3
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    dt = torch.float64
    joint = Joint(V + D, last, dt)
    with torch.no_grad():
        joint.out.weight.mul_(3.0)
    enc = torch.randn(B, T, 5, generator=g, dtype=dt)
    pred = torch.randn(B, U + 1, 4, generator=g, dtype=dt)
    tg = torch.randint(0, V - 3, (B, U), generator=g)
    Tl, tl = torch.tensor([5, 3, 4]), torch.tensor([3, 1, 2])
    w = torch.tensor([1.0, 2.0, 3.0], dtype=dt)

    e, p = enc.clone().requires_grad_(), pred.clone().requires_grad_()
    ref = _loss(name, joint(e, p), tg, Tl, tl, other_backend(backend))
    want = torch.autograd.grad((ref * w).sum(), [e, p, *joint.parameters()])

    dev = device_for(backend)
    jd = joint.to(dev)
    e, p = enc.to(dev).requires_grad_(), pred.to(dev).requires_grad_()
    got = _loss(name, (e, p, jd), tg.to(dev), Tl, tl, backend, chunk=chunk)
    grads = torch.autograd.grad((got * w.to(dev)).sum(), [e, p, *jd.parameters()])
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-9, atol=1e-9)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-9)
    joint.to("cpu")


@pytest.mark.parametrize("name", ["rnnt_clamp", "tdt_omega", "hat"])
@pytest.mark.parametrize("backend", backend_params("joint"))
def test_float32_tiles_within_float32_rounding_of_float64(backend, name):
    """float32 logits: the tile epilogue in float32 (float64 normalizers) against the
    float64 materialized loss of another backend."""
    V, D, _ = LOSSES[name]
    B, T, U = 2, 6, 3
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    joint = Joint(V + D, "linear", torch.float64)
    with torch.no_grad():
        joint.out.weight.mul_(3.0)
    enc = torch.randn(B, T, 5, generator=g, dtype=torch.float64)
    pred = torch.randn(B, U + 1, 4, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 3, (B, U), generator=g)
    Tl, tl = torch.tensor([6, 4]), torch.tensor([3, 2])
    e, p = enc.clone().requires_grad_(), pred.clone().requires_grad_()
    ref = _loss(name, joint(e, p), tg, Tl, tl, other_backend(backend))
    want = torch.autograd.grad(ref.sum(), [e, p])

    dev = device_for(backend)
    j32 = Joint(V + D, "linear", torch.float32).to(dev)
    j32.load_state_dict({k: v.float() for k, v in joint.state_dict().items()})
    e = enc.float().to(dev).requires_grad_()
    p = pred.float().to(dev).requires_grad_()
    got = _loss(name, (e, p, j32), tg.to(dev), Tl, tl, backend, chunk=60)
    grads = torch.autograd.grad(got.sum(), [e, p])
    torch.testing.assert_close(got.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a.cpu().double(), b, rtol=1e-4, atol=1e-5)
