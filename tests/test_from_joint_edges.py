"""Losses from the joint at the edges: padding never reaches a gradient, float32 precision.

The oracle is the materialized pipeline run one sequence at a time on its real rows only
(``joint(enc[b, :T_b], pred[b, :U_b + 1])``), so it never sees padding; the losses from
the joint run on the whole padded batch, with tiles that span several sequences.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from conftest import backend_params, device_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import seqloss

DURS = [0, 1, 2]
BIG = [2, 3]


class Joint(nn.Module):
    """``Linear(tanh(enc_proj + pred_proj))``; ``divide``: the logits divided by the sum
    of the encoder frame's and the predictor row's absolute values, so a zero row (or
    one that sums to inf) gives NaN logits and NaN local derivatives from finite input."""

    def __init__(self, He: int, Hp: int, H: int, W: int, divide: bool = False,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.enc = nn.Linear(He, H, dtype=dtype)
        self.pred = nn.Linear(Hp, H, dtype=dtype)
        self.out = nn.Linear(H, W, dtype=dtype)
        self.divide = divide

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        x = self.out(torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None]))
        if self.divide:
            x = x / (e.abs().sum(-1)[:, :, None, None] * p.abs().sum(-1)[:, None, :, None])
        return x


def _loss(kind: str, x, tg, Tl, tl, **kw):
    """The loss of ``kind`` on logits ``x``, or from the joint when ``x`` is a tuple."""
    if isinstance(x, tuple):
        if kind == "rnnt":
            return seqloss.rnnt_loss_from_joint(*x, tg, Tl, tl, **kw)
        if kind == "mb":
            return seqloss.multiblank_rnnt_loss_from_joint(*x, tg, Tl, tl, BIG, **kw)
        return seqloss.tdt_loss_from_joint(*x, tg, Tl, tl, DURS, omega=0.3, **kw)
    kw.pop("chunk_elements", None)
    if kind == "rnnt":
        return seqloss.rnnt_loss(x, tg, Tl, tl, **kw)
    if kind == "mb":
        return seqloss.multiblank_rnnt_loss(x, tg, Tl, tl, BIG, **kw)
    return seqloss.tdt_loss(x, tg, Tl, tl, DURS, omega=0.3, **kw)


def _case(kind, Tl, tl, T, U, V=6, He=3, Hp=4, H=5, seed=0, divide=False, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    W = V + (len(DURS) if kind == "tdt" else 0)
    joint = Joint(He, Hp, H, W, divide, dtype)
    with torch.no_grad():
        joint.out.weight.mul_(3.0)
    B = len(Tl)
    enc = torch.randn(B, T, He, generator=g, dtype=dtype)
    pred = torch.randn(B, U + 1, Hp, generator=g, dtype=dtype)
    top = V - 1 - (len(BIG) if kind == "mb" else 0)  # labels below every blank
    tg = torch.randint(0, top, (B, U), generator=g)
    return joint, enc, pred, tg, torch.tensor(Tl), torch.tensor(tl)


def _pad(enc, pred, Tl, tl, fill_e, fill_p):
    """Copies with every padded frame set to ``fill_e``, every padded row to ``fill_p``."""
    enc, pred = enc.clone(), pred.clone()
    for b in range(len(Tl)):
        enc[b, int(Tl[b]):] = fill_e
        pred[b, int(tl[b]) + 1:] = fill_p
    return enc, pred


def _oracle(kind, joint, enc, pred, tg, Tl, tl):
    """Per-sequence materialized losses (zero-frame sequences: 0, no gradient), their
    gradients w.r.t. encoder, predictor (zero on padding) and the joint's parameters."""
    e = enc.detach().clone().requires_grad_()
    p = pred.detach().clone().requires_grad_()
    params = list(joint.parameters())
    total, losses = 0.0, []
    for b in range(len(Tl)):
        T_b, U_b = int(Tl[b]), int(tl[b])
        if T_b == 0:
            losses.append(torch.zeros((), dtype=enc.dtype))
            continue
        x = joint(e[b:b + 1, :T_b], p[b:b + 1, :U_b + 1])
        lo = _loss(kind, x, tg[b:b + 1, :U_b], Tl[b:b + 1], tl[b:b + 1], reduction="sum")
        losses.append(lo.detach())
        total = total + (b + 1) * lo  # distinct weights per sequence
    if not isinstance(total, torch.Tensor):  # no sequence has a frame
        return torch.stack(losses), [torch.zeros_like(t) for t in (e, p, *params)]
    grads = torch.autograd.grad(total, [e, p, *params], allow_unused=True)
    grads = [torch.zeros_like(t) if gr is None else gr
             for gr, t in zip(grads, [e, p, *params], strict=True)]
    return torch.stack(losses), grads


def _ours(kind, joint, enc, pred, tg, Tl, tl, backend, chunk):
    dev = device_for(backend)
    joint = joint.to(dev)
    e = enc.detach().to(dev).requires_grad_()
    p = pred.detach().to(dev).requires_grad_()
    lo = _loss(kind, (e, p, joint), tg.to(dev), Tl, tl, reduction="none", zero_infinity=True,
               chunk_elements=chunk, backend=backend)
    w = torch.arange(1, len(Tl) + 1, dtype=lo.dtype, device=dev)
    grads = torch.autograd.grad((lo * w).sum(), [e, p, *joint.parameters()])
    return lo.detach().cpu(), [gr.cpu() for gr in grads]


def _check(ours, oracle, Tl, tl):
    (lo, grads), (lr, gref) = ours, oracle
    torch.testing.assert_close(lo, lr, rtol=1e-9, atol=1e-9)
    for gr, want in zip(grads, gref, strict=True):
        assert torch.isfinite(gr).all()
        torch.testing.assert_close(gr, want, rtol=1e-9, atol=1e-9)
    ge, gp = grads[:2]
    for b in range(len(Tl)):
        assert (ge[b, int(Tl[b]):] == 0).all() and (gp[b, int(tl[b]) + 1:] == 0).all()


def _skip_other_backends(backend, tile_ops):
    if tile_ops == "row_passes" and backend != "numba":
        pytest.skip("the row passes are the Numba backend's")


# Sequence 1 is short in both directions and shares a tile with sequence 0 (whole batch,
# or two sequences' rows); sequence 2 has no frame at all.
TL, UL, T, U = [6, 3, 0, 5], [4, 1, 2, 3], 6, 4
KINDS = ["rnnt", "mb", "tdt"]


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf"), 1e300],
                         ids=["nan", "inf", "-inf", "huge"])
@pytest.mark.parametrize("chunk", ["batch", "two"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", backend_params("lattice"))
def test_garbage_padding_reaches_no_gradient(backend, kind, chunk, fill, tile_ops):
    _skip_other_backends(backend, tile_ops)
    if backend == "triton" and not math.isnan(fill):
        # The fill is replaced before the joint (torch's ops, the same on every backend):
        # the lattice kernel sees the same input whatever the fill; NaN is enough for it.
        pytest.skip("interpreted Triton: the kernel's input does not depend on the fill")
    joint, enc, pred, tg, Tl, tl = _case(kind, TL, UL, T, U)
    W = joint.out.out_features
    rows = 10**9 if chunk == "batch" else 2 * T * (U + 1)
    want = _oracle(kind, joint, enc, pred, tg, Tl, tl)
    enc, pred = _pad(enc, pred, Tl, tl, fill, -fill)
    _check(_ours(kind, joint, enc, pred, tg, Tl, tl, backend, rows * W), want, Tl, tl)
    # and equal to the same loss with the padding zeroed
    e0, p0 = _pad(enc, pred, Tl, tl, 0.0, 0.0)
    _check(_ours(kind, joint, e0, p0, tg, Tl, tl, backend, rows * W), want, Tl, tl)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", backend_params("lattice"))
def test_joint_nan_on_finite_padding_reaches_no_gradient(backend, kind, tile_ops):
    """Zero padding, finite, but the joint divides by the rows' sums: its logits there are
    infinite and its local derivatives NaN (the materialized pipeline gets NaN weights)."""
    _skip_other_backends(backend, tile_ops)
    joint, enc, pred, tg, Tl, tl = _case(kind, TL, UL, T, U, divide=True)
    enc, pred = _pad(enc, pred, Tl, tl, 0.0, 0.0)
    x = joint(enc, pred)
    assert not torch.isfinite(x[1, 3:]).any() and not torch.isfinite(x[1, :, 2:]).any()
    want = _oracle(kind, joint, enc, pred, tg, Tl, tl)
    _check(_ours(kind, joint, enc, pred, tg, Tl, tl, backend, 10**9), want, Tl, tl)


@pytest.mark.parametrize("kind", KINDS)
def test_nan_sequence_keeps_to_itself_in_a_shared_tile(kind, tile_ops):
    """NaN in a sequence's real frames: its loss and its rows' gradients are NaN, its
    padding and the other sequences' rows (same tile) get their own gradients."""
    joint, enc, pred, tg, Tl, tl = _case(kind, TL, UL, T, U)
    want_l, want_g = _oracle(kind, joint, enc, pred, tg, Tl, tl)
    enc, pred = _pad(enc, pred, Tl, tl, float("nan"), float("nan"))
    enc[1, 1] = float("nan")
    e = enc.detach().requires_grad_()
    p = pred.detach().requires_grad_()
    lo = _loss(kind, (e, p, joint), tg, Tl, tl, reduction="none", zero_infinity=True,
               chunk_elements=10**9)
    assert torch.isnan(lo[1]) and torch.isfinite(lo[[0, 2, 3]]).all()
    torch.testing.assert_close(lo[[0, 2, 3]], want_l[[0, 2, 3]], rtol=1e-9, atol=1e-9)
    w = torch.arange(1, len(Tl) + 1, dtype=lo.dtype)
    ge, gp = torch.autograd.grad((lo * w).sum(), [e, p])
    assert torch.isnan(ge[1, :3]).all() and (ge[1, 3:] == 0).all() and (gp[1, 2:] == 0).all()
    for b in (0, 2, 3):
        torch.testing.assert_close(ge[b], want_g[0][b], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(gp[b], want_g[1][b], rtol=1e-9, atol=1e-9)


GARBAGE = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 0.0, 7.0])


@pytest.mark.parametrize("backend", backend_params("lattice"))
def test_property_padding_garbage_never_reaches_a_gradient(backend):
    # Interpreted Triton (~1 s an example): fewer examples.
    slow = backend == "triton" and not torch.cuda.is_available()
    _padding_property(8 if slow else 25)(backend)


def _padding_property(max_examples):
    @settings(max_examples=max_examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data(), kind=st.sampled_from(KINDS), B=st.integers(1, 4),
           T=st.integers(1, 5), U=st.integers(0, 3), fe=GARBAGE, fp=GARBAGE,
           chunk=st.sampled_from([1, 7, 30, 10**9]), divide=st.booleans(), rows=st.booleans())
    def check(backend, data, kind, B, T, U, fe, fp, chunk, divide, rows):
        Tl = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B), label="Tl")
        tl = data.draw(st.lists(st.integers(0, U), min_size=B, max_size=B), label="tl")
        seed = data.draw(st.integers(0, 2**16), label="seed")
        joint, enc, pred, tg, Tl, tl = _case(kind, Tl, tl, T, U, seed=seed, divide=divide)
        want = _oracle(kind, joint, enc, pred, tg, Tl, tl)
        enc, pred = _pad(enc, pred, Tl, tl, fe, fp)
        W = joint.out.out_features
        width = 1 if rows else 10**9  # the Numba row passes forced, or torch's ops
        with mock.patch("seqloss.transducer.joint.numba_rows.MIN_ROW_WIDTH", width):
            _check(_ours(kind, joint, enc, pred, tg, Tl, tl, backend, chunk * W), want, Tl, tl)

    return check


# --------------------------------------------------------------------------- float32
class Lookup(nn.Module):
    """The logits themselves as the joint's parameter, looked up by (frame, row) index:
    its gradient is the loss's gradient w.r.t. the logits, and the joint rounds nothing."""

    def __init__(self, X: torch.Tensor) -> None:
        super().__init__()
        self.X = nn.Parameter(X)

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        t, u = e[..., 0].long(), p[..., 0].long()
        return self.X[0][t[:, :, None], u[:, None, :]]


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("kind", KINDS)
def test_float32_logit_gradient_within_a_few_roundings_of_float64(kind, scale, tile_ops):
    """float32 logits at T=1000, U=100: the gradient is within 2.5e-7 (relative
    Frobenius) of the float64 full-joint loss's on the same logits. It was 3e-7 to 2.3e-6
    with the normalizers and arcs rounded to float32 (summed over T + U lattice steps) and
    ``log Z`` rounded to float32 in ``exp(x - log Z)`` (off by ``eps |log Z|`` everywhere)."""
    T, U, V = 1000, 100, 16
    W = V + (len(DURS) if kind == "tdt" else 0)
    g = torch.Generator().manual_seed(7)
    X = (torch.randn(1, T, U + 1, W, generator=g, dtype=torch.float64) * scale).float()
    tg = torch.randint(1, V - 3, (1, U), generator=g)
    e = torch.arange(T, dtype=torch.float32).reshape(1, T, 1)
    p = torch.arange(U + 1, dtype=torch.float32).reshape(1, U + 1, 1)
    joint = Lookup(X.clone())
    got = torch.autograd.grad(_loss(kind, (e, p, joint), tg, [T], [U], reduction="sum"),
                              joint.X)[0]
    x64 = X.double().requires_grad_()
    want = torch.autograd.grad(_loss(kind, x64, tg, [T], [U], reduction="sum"), x64)[0]
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err <= 2.5e-7, err


class AddJoint(nn.Module):
    """``enc + pred + bias``: the hot sequence's blank-like logits stay at finfo.min."""

    def __init__(self, W: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(W))

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return e[:, :, None] + p[:, None] + self.bias


@pytest.mark.parametrize("chunk", [None, 1], ids=["shared", "row"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_volume"])
@pytest.mark.parametrize("kind", KINDS)
def test_zero_infinity_on_overflow_zeroes_the_whole_gradient(kind, reduction, chunk, tile_ops):
    """Sequence 0 has a feasible path (blanks only) through
    ``finfo(float32).min`` logits, so its float32 loss is +inf; ``zero_infinity`` makes
    it 0 and takes its whole gradient away (its encoder frames, its predictor rows, its
    share of the joint's bias), whether or not it shares a tile with sequence 1, which
    keeps the materialized float64 loss's value and gradient (its factor: 1, the
    mean's 1/B or 1/(B U_b), or 1/sum U_b). It was +inf with sequence 0's gradient
    kept ([.5, .5, -1] per frame)."""
    V = 6
    W = V + (len(DURS) if kind == "tdt" else 0)
    blanks = [V - 1 - i for i in range(1 + (len(BIG) if kind == "mb" else 0))]
    g = torch.Generator().manual_seed(3)
    enc = torch.randn(2, 5, W, generator=g, dtype=torch.float64)
    pred = torch.randn(2, 3, W, generator=g, dtype=torch.float64)
    enc[0, :, blanks] = torch.finfo(torch.float32).min
    tg = torch.tensor([[0, 0], [1, 2]])
    Tl, tl = torch.tensor([4, 4]), torch.tensor([0, 2])  # 4 frames: >= 2 arcs on any path
    joint = AddJoint(W).float()
    e = enc.float().requires_grad_()
    p = pred.float().requires_grad_()
    kw = dict(chunk_elements=None if chunk is None else W)
    lo = _loss(kind, (e, p, joint), tg, Tl, tl, reduction=reduction, zero_infinity=True, **kw)
    lo.sum().backward()
    # "mean": torchaudio's 1/B for RNN-T, NeMo's 1/(B U_b) for the others (U_1 = 2)
    mean = 0.5 if kind == "rnnt" else 0.25
    factor = {"none": 1.0, "sum": 1.0, "mean": mean, "mean_volume": 0.5}[reduction]

    j64 = AddJoint(W).double()
    e64 = enc[1:2, :4].clone().requires_grad_()
    p64 = pred[1:2, :3].clone().requires_grad_()
    ref = _loss(kind, j64(e64, p64), tg[1:], Tl[1:], tl[1:], reduction="sum")
    ref.backward()
    assert torch.isfinite(ref) and math.isfinite(lo.sum().item())
    want = [0.0, ref.item()] if reduction == "none" else [ref.item() * factor]
    torch.testing.assert_close(lo.double().reshape(-1)[-len(want):], torch.tensor(want,
                               dtype=torch.float64), rtol=1e-6, atol=1e-6)
    if reduction == "none":
        assert lo[0].item() == 0.0
    assert not e.grad[0].any() and not p.grad[0].any()
    torch.testing.assert_close(e.grad[1, :4].double(), e64.grad[0] * factor, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p.grad[1].double(), p64.grad[0] * factor, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(joint.bias.grad.double(), j64.bias.grad * factor, rtol=1e-5,
                               atol=1e-6)


# --------------------------------------------------------------------------- twin checks
# Each loss from the joint shares its argument check with its full-joint twin: the same
# bad argument gives the same error, type and message, from both.
_TWIN_BASE = {"rnnt": {}, "hat": {}, "mb": {"big_blank_durations": [2, 3]},
              "tdt": {"durations": [0, 1, 2]}}
_TWIN_BAD = {
    "any": [{"reduction": "avg"}, {"clamp": "1"}, {"clamp": float("nan")},
            {"zero_infinity": 2}, {"validate": "yes"}, {"delay_penalty": float("inf")},
            {"blank": 9}, {"blank": 1.5}, {"targets": [[1, 6], [2, 0]]},
            {"target_lengths": [3, 1]}, {"logit_lengths": [5, 3]}, {"logit_lengths": [-1, 3]}],
    "rnnt": [{"fastemit_lambda": -1.0}],
    "hat": [{"fastemit_lambda": -1.0}],
    "mb": [{"big_blank_durations": [1]}, {"big_blank_durations": [2, 2]},
           {"big_blank_durations": [2, 3, 4, 5, 6, 7, 8]}, {"big_blank_durations": "2"},
           {"sigma": float("nan")}, {"fastemit_lambda": -0.5}],
    "tdt": [{"durations": [1, 2]}, {"durations": [0, 2, 1]}, {"durations": [0, 1, 1]},
            {"durations": [0.0, 1]}, {"omega": 1.5}, {"omega": -0.1}, {"sigma": "s"}],
}
_TWINS = {
    "rnnt": (seqloss.rnnt_loss, seqloss.rnnt_loss_from_joint),
    "hat": (seqloss.hat_loss, seqloss.hat_loss_from_joint),
    "mb": (seqloss.multiblank_rnnt_loss, seqloss.multiblank_rnnt_loss_from_joint),
    "tdt": (seqloss.tdt_loss, seqloss.tdt_loss_from_joint),
}


@pytest.mark.parametrize("kind,bad", [
    pytest.param(k, bad, id=f"{k}-{'-'.join(f'{a}={v}' for a, v in bad.items())}")
    for k in _TWINS for bad in _TWIN_BAD["any"] + _TWIN_BAD[k]])
def test_twins_share_their_argument_checks(kind, bad):
    g = torch.Generator().manual_seed(0)
    B, T, U, V = 2, 4, 2, 7
    W = V + (3 if kind == "tdt" else 0)  # TDT: 3 duration logits after the tokens
    enc = torch.randn(B, T, W, dtype=torch.float64, generator=g)
    pred = torch.randn(B, U + 1, W, dtype=torch.float64, generator=g)

    def joint(e, p):
        return e[:, :, None] + p[:, None]

    a = {"targets": [[1, 2], [3, 0]], "logit_lengths": [4, 3], "target_lengths": [2, 1],
         **_TWIN_BASE[kind], **bad}
    a["targets"] = torch.tensor(a["targets"])
    full, from_joint = _TWINS[kind]
    with pytest.raises((seqloss.InputError, TypeError)) as e_full:
        full(joint(enc, pred), **a)
    with pytest.raises((seqloss.InputError, TypeError)) as e_joint:
        from_joint(enc, pred, joint, **a)
    assert type(e_full.value) is type(e_joint.value)
    assert str(e_full.value) == str(e_joint.value)
