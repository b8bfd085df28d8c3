"""transducer_arc_logprobs(_from_joint) against gathering from the full float64 log-softmax."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seqloss import InputError
from seqloss.transducer.arc_logprobs import (
    transducer_arc_logprobs,
    transducer_arc_logprobs_from_joint,
)

NEG = float("-inf")


def _case(B=3, T=6, U=4, V=7, D=0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, U + 1, V + D, generator=g, dtype=torch.float64) * 2).to(dtype)
    y = torch.randint(0, V - 1, (B, U), generator=g)  # blank = V - 1 never a target
    il = torch.tensor([T, T - 2, 0][:B])
    tl = torch.tensor([U, 1, 2][:B])
    return x, y, il, tl


def _read(il, tl, T, U1):
    """(B, T, U+1) masks of the states read, and of the emissions defined."""
    tt = torch.arange(T)[None, :, None]
    uu = torch.arange(U1)[None, None, :]
    rows = (tt < il[:, None, None]) & (uu <= tl[:, None, None])
    return rows, rows & (uu < tl[:, None, None])


def _oracle(x, y, il, tl, blank, V):
    """Gathers from torch's float64 log_softmax of the token block; -inf where undefined."""
    B, T, U1 = x.shape[:3]
    rows, emits = _read(il, tl, T, U1)
    clean = torch.where(rows[..., None], x.double(), 0.0)  # no NaN reaches the gradient
    lp = clean[..., :V].log_softmax(-1)
    lab = torch.zeros(B, U1, dtype=torch.long)
    lab[:, : min(y.shape[1], U1 - 1)] = y[:, : U1 - 1]
    lb = torch.where(rows, lp[..., blank], NEG)
    le = torch.where(emits, lp.gather(-1, lab[:, None, :, None].expand(B, T, U1, 1))[..., 0], NEG)
    out = [lb, le]
    if x.shape[-1] > V:
        out.append(torch.where(rows[..., None], clean[..., V:].log_softmax(-1), NEG))
    return out


def _poison_padding(x, il, tl):
    rows, _ = _read(il, tl, x.shape[1], x.shape[2])
    with torch.no_grad():
        x.masked_fill_(~rows[..., None], float("nan"))


def _compare(ours, ref, x_ours, x_ref, atol, seed=1):
    g = torch.Generator().manual_seed(seed)
    ups = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    for o, r in zip(ours, ref, strict=True):
        assert o.shape == r.shape
        assert torch.equal(torch.isinf(o), torch.isinf(r))
        torch.testing.assert_close(o.double().nan_to_num(neginf=0), r.nan_to_num(neginf=0),
                                   atol=atol, rtol=0)
    (go,) = torch.autograd.grad([(o.double() * u).nan_to_num(0.0).sum() for o, u in
                                 zip(ours, ups, strict=True)], x_ours)
    # the oracle's -inf entries get zero upstream gradient by construction (torch.where)
    (gr,) = torch.autograd.grad(sum(torch.where(torch.isinf(r), 0.0, r * u).sum()
                                    for r, u in zip(ref, ups, strict=True)), x_ref)
    assert go.dtype == x_ours.dtype
    assert torch.isfinite(go).all()
    torch.testing.assert_close(go.double(), gr, atol=atol, rtol=0)
    return go


@pytest.mark.parametrize("chunk", [None, 15, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_float64_log_softmax(dtype, chunk):
    x, y, il, tl = _case(dtype=dtype)
    _poison_padding(x, il, tl)
    x.requires_grad_()
    xr = x.detach().double().requires_grad_()
    ours = transducer_arc_logprobs(x, y, il, tl, chunk_elements=chunk)
    assert all(o.dtype == dtype for o in ours)
    go = _compare(ours, _oracle(xr, y, il, tl, x.shape[-1] - 1, x.shape[-1]), x, xr,
                  1e-12 if dtype == torch.float64 else 2e-5)
    rows, _ = _read(il, tl, x.shape[1], x.shape[2])
    assert (go[~rows] == 0).all()  # padding: exactly zero


@pytest.mark.parametrize("blank", [0, 2, -3])
def test_blank_anywhere(blank):
    x, y, il, tl = _case(V=6, seed=3)
    V = 6
    b = blank % V
    y = torch.where(y >= b, y + 1, y) % V  # every id but the blank
    assert not (y == b).any()
    x.requires_grad_()
    xr = x.detach().clone().requires_grad_()
    ours = transducer_arc_logprobs(x, y, il, tl, blank)
    _compare(ours, _oracle(xr, y, il, tl, b, V), x, xr, 1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype):
    x, y, il, tl = _case(dtype=dtype, seed=4)
    x.requires_grad_()
    xr = x.detach().double().requires_grad_()  # the half values, exactly
    ours = transducer_arc_logprobs(x, y, il, tl, chunk_elements=40)
    assert all(o.dtype == torch.float32 for o in ours)
    ref = _oracle(xr, y, il, tl, x.shape[-1] - 1, x.shape[-1])
    for o, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(o.double().nan_to_num(neginf=0), r.nan_to_num(neginf=0),
                                   atol=2e-5, rtol=0)
    up = torch.randn(ours[0].shape, dtype=torch.float64)
    (go,) = torch.autograd.grad((ours[0].double() * up).nan_to_num(0.0).sum(), x)
    (gr,) = torch.autograd.grad(torch.where(torch.isinf(ref[0]), 0.0, ref[0] * up).sum(), xr)
    assert go.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(go.double(), gr, atol=4 * eps * gr.abs().max().item(), rtol=0)


@pytest.mark.parametrize("pair", [False, True])
def test_tdt_durations(pair):
    V, D = 6, 3
    x, y, il, tl = _case(V=V, D=D, seed=5)
    _poison_padding(x, il, tl)
    xr = x.detach().clone().requires_grad_()
    if pair:
        tok = x[..., :V].detach().clone().requires_grad_()
        dur = x[..., V:].detach().clone().requires_grad_()
        ours = transducer_arc_logprobs((tok, dur), y, il, tl, durations=[0, 1, 2],
                                       chunk_elements=30)
    else:
        x.requires_grad_()
        ours = transducer_arc_logprobs(x, y, il, tl, durations=[0, 1, 2], chunk_elements=30)
    assert len(ours) == 3 and ours[2].shape == (*x.shape[:3], D)
    ref = _oracle(xr, y, il, tl, V - 1, V)
    if not pair:
        _compare(ours, ref, x, xr, 1e-12)
        return
    ups = [torch.randn(r.shape, dtype=torch.float64) for r in ref]
    terms = [(o * u).nan_to_num(0.0).sum() for o, u in zip(ours, ups, strict=True)]
    gt, gd = torch.autograd.grad(terms, (tok, dur))
    (gr,) = torch.autograd.grad(sum(torch.where(torch.isinf(r), 0.0, r * u).sum()
                                    for r, u in zip(ref, ups, strict=True)), xr)
    torch.testing.assert_close(torch.cat((gt, gd), -1), gr, atol=1e-12, rtol=0)


def test_gradcheck_float64():
    x, y, il, tl = _case(B=2, T=3, U=2, V=4, seed=6)
    x.requires_grad_()
    rows, emits = _read(il, tl, 3, 3)

    def fn(x):
        b, e = transducer_arc_logprobs(x, y, il, tl, chunk_elements=9)
        return b.masked_fill(~rows, 0.0), e.masked_fill(~emits, 0.0)

    assert torch.autograd.gradcheck(fn, (x,))


class _Joint(torch.nn.Module):
    def __init__(self, H=5, V=7, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.enc = torch.nn.Linear(H, 8, dtype=torch.float64)
        self.pred = torch.nn.Linear(H, 8, dtype=torch.float64)
        self.out = torch.nn.Linear(8, V, dtype=torch.float64)

    def forward(self, e, p):
        return self.out(torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None]))


@pytest.mark.parametrize("chunk", [None, 20])
def test_from_joint_matches_materialized(chunk):
    B, T, U, H, V = 3, 6, 4, 5, 7
    torch.manual_seed(1)
    enc = torch.randn(B, T, H, dtype=torch.float64)
    pred = torch.randn(B, U + 1, H, dtype=torch.float64)
    _, y, il, tl = _case(B, T, U, V)
    enc[1, int(il[1]):] = float("nan")  # padding, never shown to the joint
    pred[1, int(tl[1]) + 1:] = float("nan")
    enc.requires_grad_()
    pred.requires_grad_()
    joint = _Joint(H, V)
    ours = transducer_arc_logprobs_from_joint(enc, pred, joint, y, il, tl, chunk_elements=chunk)
    ups = [torch.randn(o.shape, dtype=torch.float64) for o in ours]
    loss = sum((o * u).nan_to_num(0.0).sum() for o, u in zip(ours, ups, strict=True))
    params = list(joint.parameters())
    g_ours = torch.autograd.grad(loss, [enc, pred, *params])
    # oracle: the materialized joint on clean streams, float64 log_softmax
    rows, _ = _read(il, tl, T, U + 1)
    tt = torch.arange(T)[None, :, None] < il[:, None, None]
    uu = torch.arange(U + 1)[None, :, None] <= tl[:, None, None]
    ec, pc = torch.where(tt, enc, 0.0), torch.where(uu, pred, 0.0)
    ref = _oracle(joint(ec, pc), y, il, tl, V - 1, V)
    for o, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(o.nan_to_num(neginf=0), r.nan_to_num(neginf=0), atol=1e-12,
                                   rtol=0)
    lr = sum(torch.where(torch.isinf(r), 0.0, r * u).sum() for r, u in zip(ref, ups, strict=True))
    g_ref = torch.autograd.grad(lr, [enc, pred, *params])
    for a, b in zip(g_ours, g_ref, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_from_joint_tdt_and_closure_joint():
    B, T, U, H, V, D = 2, 5, 3, 4, 5, 2
    torch.manual_seed(2)
    enc = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    pred = torch.randn(B, U + 1, H, dtype=torch.float64, requires_grad=True)
    w = torch.randn(H, V + D, dtype=torch.float64, requires_grad=True)

    def joint(e, p):  # a plain callable: w gets .grad by accumulation
        return torch.tanh(e[:, :, None] + p[:, None]) @ w

    y = torch.randint(0, V - 1, (B, U))
    il, tl = torch.tensor([5, 3]), torch.tensor([3, 2])
    ours = transducer_arc_logprobs_from_joint(enc, pred, joint, y, il, tl, durations=[0, 1],
                                              chunk_elements=14)
    ups = [torch.randn(o.shape, dtype=torch.float64) for o in ours]
    sum((o * u).nan_to_num(0.0).sum() for o, u in zip(ours, ups, strict=True)).backward()
    g_ours = [enc.grad.clone(), pred.grad.clone(), w.grad.clone()]
    for t in (enc, pred, w):
        t.grad = None
    ref = _oracle(joint(enc, pred), y, il, tl, V - 1, V)
    for o, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(o.nan_to_num(neginf=0), r.nan_to_num(neginf=0), atol=1e-12,
                                   rtol=0)
    sum(torch.where(torch.isinf(r), 0.0, r * u).sum()
        for r, u in zip(ref, ups, strict=True)).backward()
    for a, b in zip(g_ours, [enc.grad, pred.grad, w.grad], strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


class _BigAllocations(TorchDispatchMode):
    """Counts op outputs of at least ``n`` elements that do not alias an input's storage."""

    def __init__(self, n):
        super().__init__()
        self.n, self.count = n, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = {a.untyped_storage().data_ptr() for a in
               torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for o in torch.utils._pytree.tree_leaves(out):
            if (isinstance(o, torch.Tensor) and o.numel() >= self.n
                    and o.untyped_storage().data_ptr() not in ins):
                self.count += 1
        return out


def test_no_logits_sized_intermediate():
    B, T, U, V = 2, 40, 10, 256
    x, y, il, tl = _case(B, T, U, V, dtype=torch.float32)
    il = torch.tensor([T, T - 3])
    x.requires_grad_()
    n = x.numel() // 4  # anything a quarter of the logits' size counts
    mode = _BigAllocations(n)
    with mode:
        b, e = transducer_arc_logprobs(x, y, il, tl, chunk_elements=4096)
    assert mode.count == 0
    up = (b.nan_to_num(0.0) + e.nan_to_num(0.0)).sum()
    with mode:
        up.backward()
    assert mode.count == 1  # the gradient itself


def test_bad_inputs():
    x, y, il, tl = _case()
    y_bad = y.clone()
    y_bad[1, 0] = x.shape[-1] - 1  # the blank, read (U_1 = 1)
    with pytest.raises(InputError, match=r"targets.*\b1\b"):
        transducer_arc_logprobs(x, y_bad, il, tl)
    with pytest.raises(InputError, match="logit_lengths"):
        transducer_arc_logprobs(x, y, il + 1, tl)
    with pytest.raises(TypeError, match="targets"):
        transducer_arc_logprobs(x, y.double(), il, tl)
    with pytest.raises(InputError, match="durations"):
        transducer_arc_logprobs(x, y, il, tl, durations=[1, 2])
    with pytest.raises(InputError, match="chunk_elements"):
        transducer_arc_logprobs(x, y, il, tl, chunk_elements=0)
