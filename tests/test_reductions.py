"""Every reduction name on every public loss, against its formula.

The formulas are written here from API.md, applied to the same loss's ``"none"``
output (value, and the gradient through autograd of the formula), so the reduction
paths (weights folded into a kernel, applied to the saved gradient, or summed in a
Numba kernel) are checked against autograd's product rule:

- ``"sum"``: ``sum_b loss_b``; ``"mean_batch"``: ``sum_b loss_b / B``;
- ``"mean_target"``: ``sum_b (loss_b / max(U_b, 1)) / B``;
- ``"mean_volume"``: ``sum_b loss_b / max(sum_b U_b, 1)``;
- ``"mean"``: the replaced library's (torch's CTC: ``"mean_target"``; torchaudio's RNN-T
  and fast_rnnt's factored losses: ``"mean_batch"``; NeMo's and transformers'
  multi-blank and TDT: ``"mean_target"``).

The batches hold sequences with ``U_b = 0``; with ``zero_infinity`` one sequence is
infeasible (no frame; CTC: a label and no frame) and still counts in ``B``.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import backend_params, device_for, other_backend
from torch import nn

import seqloss

F64 = torch.float64
EXPLICIT = ("sum", "mean_batch", "mean_target", "mean_volume")
MEAN_IS = {
    "ctc": "mean_target",
    "rnnt": "mean_batch",
    "rnnt_packed": "mean_batch",
    "multiblank": "mean_target",
    "tdt": "mean_target",
    "simple": "mean_batch",
    "smoothed": "mean_batch",
    "pruned": "mean_batch",
    "rnnt_from_joint": "mean_batch",
    "multiblank_from_joint": "mean_target",
    "tdt_from_joint": "mean_target",
}
FUNCTIONS = {
    "ctc": seqloss.ctc_loss,
    "rnnt": seqloss.rnnt_loss,
    "rnnt_packed": seqloss.rnnt_loss_packed,
    "multiblank": seqloss.multiblank_rnnt_loss,
    "tdt": seqloss.tdt_loss,
    "simple": seqloss.rnnt_loss_simple,
    "smoothed": seqloss.rnnt_loss_smoothed,
    "pruned": seqloss.rnnt_loss_pruned,
    "rnnt_from_joint": seqloss.rnnt_loss_from_joint,
    "multiblank_from_joint": seqloss.multiblank_rnnt_loss_from_joint,
    "tdt_from_joint": seqloss.tdt_loss_from_joint,
}
# Variants of a loss whose reductions take another code path.
VARIANTS = {
    "ctc-lists": "ctc",  # lengths as lists: the op, not the CPU fast lane
    "ctc-pool": "ctc",  # the Numba kernel's thread-pool path (chunks of sequences)
    "rnnt-inplace": "rnnt",
    "tdt-pair": "tdt",
    "tdt-omega": "tdt",  # the RNN-T/TDT mixture
}
LOSSES = [*FUNCTIONS, *VARIANTS]
NUMBA_ONLY = ("ctc-lists", "ctc-pool")
# Losses whose Triton kernel takes part in the reduction (the weights folded into its
# gradient); the others reduce after the lattice, as on the other backends.
TRITON = ("ctc", "rnnt", "rnnt_packed", "rnnt-inplace", "multiblank", "tdt", "tdt-pair")

U_ALL = [2, 0, 3, 1, 0]
T_FEASIBLE = [5, 4, 6, 3, 2]
T_INFEASIBLE = [5, 4, 6, 0, 2]  # sequence 3: no frame, one label
T, S, V, DURS, BIG = 6, 3, 6, [0, 1, 2], [2]


def formula(reduction: str, none: torch.Tensor, U: list[int]) -> torch.Tensor:
    B = none.shape[0]
    u = torch.tensor(U, dtype=none.dtype)
    if reduction == "sum":
        return none.sum()
    if reduction == "mean_batch":
        return none.sum() / max(B, 1)
    if reduction == "mean_target":
        return (none / u.clamp(min=1)).sum() / max(B, 1)
    if reduction == "mean_volume":
        return none.sum() / max(int(u.sum()), 1)
    raise AssertionError(reduction)


class Joint(nn.Module):
    def __init__(self, W: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.w = nn.Parameter(torch.randn(4, W, generator=g, dtype=F64))

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.tanh(e[:, :, None] + p[:, None]) @ self.w


def build(loss: str, backend: str, B: int, lengths: list[int]):
    """``(make, call)``: ``make()`` gives fresh leaf inputs, ``call(inputs, **kw)`` the loss."""
    dev = device_for(backend)
    g = torch.Generator().manual_seed(sum(map(ord, loss)))
    U = U_ALL[:B]
    Tl = torch.tensor(lengths[:B], dtype=torch.long)
    tl = torch.tensor(U, dtype=torch.long)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=F64) * 1.5

    def labels(hi):  # (B, S) in [1, hi): never 0 (factored termination), never blank
        return torch.randint(1, hi, (B, S), generator=g)

    kw = dict(backend=backend)
    if loss.startswith("ctc"):
        x0 = rand(T, B, V)
        tg = labels(V)
        il, tl_ = (Tl.tolist(), tl.tolist()) if loss == "ctc-lists" else (Tl, tl)

        def make():
            return (x0.clone().to(dev).requires_grad_(),)

        def call(inp, **k):
            lp = inp[0].log_softmax(-1)
            return seqloss.ctc_loss(lp, tg.to(dev), il, tl_, **kw, **k)

        return make, call
    if loss in ("rnnt", "rnnt-inplace", "multiblank", "tdt", "tdt-pair", "tdt-omega"):
        W = V + (len(DURS) if loss.startswith("tdt") else 0)
        x0 = rand(B, T, S + 1, W)
        tg = labels(V - 2)
        extra = {}
        if loss == "rnnt-inplace":
            extra = dict(inplace_grad=True)
        if loss == "tdt-omega":
            extra = dict(omega=0.5)

        def make():
            x = x0.clone().to(dev)
            if loss == "tdt-pair":
                return (x[..., :V].contiguous().requires_grad_(),
                        x[..., V:].contiguous().requires_grad_())
            return (x.requires_grad_(),)

        def call(inp, **k):
            x = tuple(inp) if loss == "tdt-pair" else inp[0]
            if loss.startswith("rnnt"):
                if k.get("reduction") == "none" and extra:
                    # the in-place mode's reference: the ordinary one
                    return seqloss.rnnt_loss(x.clone(), tg.to(dev), Tl, tl, **kw, **k)
                return seqloss.rnnt_loss(x, tg.to(dev), Tl, tl, **kw, **extra, **k)
            if loss == "multiblank":
                return seqloss.multiblank_rnnt_loss(x, tg.to(dev), Tl, tl, BIG, **kw, **k)
            return seqloss.tdt_loss(x, tg.to(dev), Tl, tl, DURS, **kw, **extra, **k)

        return make, call
    if loss == "rnnt_packed":
        rows = [t * (u + 1) for t, u in zip(Tl.tolist(), U, strict=True)]
        x0 = rand(sum(rows), V)
        tg = labels(V - 2)

        def make():
            return (x0.clone().to(dev).requires_grad_(),)

        def call(inp, **k):
            return seqloss.rnnt_loss_packed(inp[0], tg.to(dev), Tl, tl, **kw, **k)

        return make, call
    if loss in ("simple", "smoothed", "pruned"):
        C = V
        sym = labels(C)
        bnd = torch.stack([torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long),
                           tl, Tl], 1).to(dev)
        if loss == "pruned":
            x0 = (rand(B, T, S + 1, C),)
            ranges = torch.arange(S + 1).expand(B, T, S + 1).contiguous().to(dev)
        else:
            x0 = (rand(B, S + 1, C), rand(B, T, C))

        def make():
            return tuple(x.clone().to(dev).requires_grad_() for x in x0)

        def call(inp, **k):
            if loss == "pruned":
                return seqloss.rnnt_loss_pruned(inp[0], sym.to(dev), ranges, 0, bnd, **kw, **k)
            if loss == "simple":
                return seqloss.rnnt_loss_simple(inp[0], inp[1], sym.to(dev), 0, bnd, **kw, **k)
            return seqloss.rnnt_loss_smoothed(inp[0], inp[1], sym.to(dev), 0, 0.1, 0.2, bnd,
                                              **kw, **k)

        return make, call
    # from the joint
    W = V + (len(DURS) if loss == "tdt_from_joint" else 0)
    e0, p0 = rand(B, T, 4), rand(B, S + 1, 4)
    tg = labels(V - 2)
    joint = Joint(W).to(dev)

    def make():
        return (e0.clone().to(dev).requires_grad_(), p0.clone().to(dev).requires_grad_(),
                joint.w)

    def call(inp, **k):
        e, p = inp[0], inp[1]
        if loss == "rnnt_from_joint":
            return seqloss.rnnt_loss_from_joint(e, p, joint, tg.to(dev), Tl, tl, **kw, **k)
        if loss == "multiblank_from_joint":
            return seqloss.multiblank_rnnt_loss_from_joint(e, p, joint, tg.to(dev), Tl, tl, BIG,
                                                           **kw, **k)
        return seqloss.tdt_loss_from_joint(e, p, joint, tg.to(dev), Tl, tl, DURS, **kw, **k)

    return make, call


def _skip(loss: str, backend: str, zero_infinity: bool) -> None:
    if loss in NUMBA_ONLY and backend != "numba":
        pytest.skip("a Numba code path")
    if backend == "triton" and (loss not in TRITON or not zero_infinity):
        pytest.skip("the interpreter is slow: the kernels' own reductions, one batch")


def _grads(out: torch.Tensor, inputs: tuple) -> list[torch.Tensor]:
    return [g.cpu() for g in torch.autograd.grad(out, inputs)]


@pytest.fixture
def pool(request, monkeypatch):
    """The CTC Numba kernel's thread pool for any batch (``ctc-pool``)."""
    if "ctc-pool" in request.node.name:
        from seqloss.ctc import numba_cpu

        monkeypatch.setattr(numba_cpu, "POOL_MIN_CELLS", 0)
        n = torch.get_num_threads()
        torch.set_num_threads(2)
        yield
        torch.set_num_threads(n)
    else:
        yield


@pytest.mark.parametrize("zero_infinity", [False, True], ids=["feasible", "zero_infinity"])
@pytest.mark.parametrize("reduction", EXPLICIT)
@pytest.mark.parametrize("backend", backend_params("rnnt"))
@pytest.mark.parametrize("loss", LOSSES)
def test_reduction_matches_its_formula(loss, backend, reduction, zero_infinity, pool):
    """Value and gradient of ``reduction`` = the formula on the ``"none"`` losses."""
    _skip(loss, backend, zero_infinity)
    if backend == "triton" and reduction == "mean_volume":
        # Host-side lengths: one factor the kernel applies (reduce.grad_scale), mean_batch's
        # path; its value is backend-independent (the other backends check it).
        pytest.skip("the interpreter is slow: mean_batch's path")
    B = len(U_ALL)
    lengths = T_INFEASIBLE if zero_infinity else T_FEASIBLE
    make, call = build(loss, backend, B, lengths)
    ref_in = make()
    none = call(ref_in, reduction="none", zero_infinity=zero_infinity)
    assert none.shape == (B,) and torch.isfinite(none).all()
    if zero_infinity:
        assert none[3].item() == 0.0
    want = formula(reduction, none, U_ALL)
    want_g = _grads(want, ref_in)
    got_in = make()
    got = call(got_in, reduction=reduction, zero_infinity=zero_infinity)
    got_g = _grads(got, got_in)
    assert got.shape == () and got.dtype == F64
    torch.testing.assert_close(got.cpu(), want.detach().cpu(), rtol=1e-11, atol=1e-12)
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss", list(FUNCTIONS))
def test_mean_is_the_replaced_librarys(loss):
    """``"mean"`` is the documented explicit name, in value and gradient, and the
    docstring names it."""
    make, call = build(loss, "numba", len(U_ALL), T_FEASIBLE)
    a_in, b_in = make(), make()
    a = call(a_in, reduction="mean")
    b = call(b_in, reduction=MEAN_IS[loss])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for ga, gb in zip(_grads(a, a_in), _grads(b, b_in), strict=True):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    assert a.item() != call(make(), reduction=(
        "mean_batch" if MEAN_IS[loss] == "mean_target" else "mean_target")).item()
    doc = " ".join(FUNCTIONS[loss].__doc__.split())
    assert re.search(f'``"mean"``[^.;]{{0,60}}``"{MEAN_IS[loss]}"``', doc), doc


@pytest.mark.parametrize("reduction", ["none", *EXPLICIT, "mean"])
@pytest.mark.parametrize("loss", LOSSES)
def test_empty_batch_reduces_to_zero(loss, reduction, pool):
    """B = 0: ``"none"`` is empty, every other reduction 0 (never NaN), and the backward
    gives an empty gradient."""
    make, call = build(loss, "numba", 0, T_FEASIBLE)
    inp = make()
    out = call(inp, reduction=reduction)
    if reduction == "none":
        assert out.shape == (0,)
        out = out.sum()
    else:
        assert out.shape == () and out.item() == 0.0
    for x, gx in zip(inp, torch.autograd.grad(out, inp, allow_unused=True), strict=True):
        assert gx is None or (gx.shape == x.shape and not gx.any())


@pytest.mark.parametrize("bad", ["Mean", "mean_volumes", "batch_mean", "", None, 1])
@pytest.mark.parametrize("loss", list(FUNCTIONS))
def test_unknown_reduction_raises_naming_it(loss, bad):
    make, call = build(loss, "numba", 2, T_FEASIBLE)
    with pytest.raises(seqloss.InputError, match="reduction"):
        call(make(), reduction=bad)


def test_ctc_mean_equals_torch():
    """torch's ``ctc_loss(reduction="mean")``, value and gradient through the
    log-softmax, with an empty target and an infeasible sequence zeroed."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(T, len(U_ALL), V, generator=g, dtype=F64)
    tg = torch.randint(1, V, (len(U_ALL), S), generator=g)
    il, tl = torch.tensor(T_INFEASIBLE), torch.tensor(U_ALL)
    out = []
    for fn in (torch.nn.functional.ctc_loss, seqloss.ctc_loss):
        x = x0.clone().requires_grad_()
        loss = fn(x.log_softmax(-1), tg, il, tl, reduction="mean", zero_infinity=True)
        out.append((loss, *torch.autograd.grad(loss, x)))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_rnnt_mean_volume(rnnt_backend):
    """rnnt_loss's ``"mean_volume"`` on every backend against the formula on another
    backend's ``"none"`` losses; with every ``U_b = 0`` the divisor is 1."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 3, 4, generator=g, dtype=F64).to(device_for(rnnt_backend))
    tg = torch.randint(0, 3, (3, 2), generator=g)  # blank is 3
    il, tl = torch.tensor([3, 2, 2]), torch.tensor([2, 1, 1])
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = seqloss.rnnt_loss(x1, tg, il, tl, reduction="mean_volume", backend=rnnt_backend)
    per = seqloss.rnnt_loss(x2, tg, il, tl, reduction="none",
                            backend=other_backend(rnnt_backend))
    want = per.sum() / tl.sum()
    torch.testing.assert_close(a, want, rtol=1e-10, atol=1e-10)
    a.backward()
    want.backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)
    # Every U_b = 0: the divisor is 1 (NeMo's), so the value is the plain sum.
    z = torch.zeros_like(tl)
    a = seqloss.rnnt_loss(x, tg, il, z, reduction="mean_volume", backend=rnnt_backend)
    s = seqloss.rnnt_loss(x, tg, il, z, reduction="sum", backend=rnnt_backend)
    torch.testing.assert_close(a, s, rtol=1e-12, atol=0)
