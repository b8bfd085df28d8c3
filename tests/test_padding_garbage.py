"""Garbage where no sequence reads never reaches a result: property tests.

HAT (``hat_loss``, ``hat_loss_from_joint``), RNN-T's delay penalty and
``transducer_arc_logprobs`` on random shapes, lengths, dtypes and blank indices (negative
ones included), with garbage (NaN, ``±inf``, huge values, out-of-range ids) everywhere a
sequence does not read: values and gradients match, padding gets a zero gradient. Every
oracle is written here, in float64, from the definitions in the API contract: an O(T*U)
forward recursion over the RNN-T lattice, differentiated by autograd for the gradients.
"""

from __future__ import annotations

import importlib.util

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import seqloss
from seqloss.transducer.arc_logprobs import transducer_arc_logprobs
from seqloss.transducer.hat import hat_loss, hat_loss_from_joint

BACKENDS = ["reference"] + (["numba"] if importlib.util.find_spec("numba") else [])
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
GARBAGE = [float("nan"), float("inf"), float("-inf"), 1e30]
PROPS = settings(max_examples=25, deadline=None)


def _tol(dtype):
    """(value rtol/atol, gradient rtol/atol): the kernels accumulate in float32 at best
    for half inputs, and a half gradient is rounded to 8 or 11 bits."""
    if dtype == torch.float64:
        return 1e-9, 1e-9
    if dtype == torch.float32:
        return 1e-5, 1e-5
    return 1e-4, 2e-2


@st.composite
def batches(draw, min_v=2):
    """Logits ``(B, T, U+1, V)`` with garbage padding, targets with garbage padding, lengths."""
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 5))
    U = draw(st.integers(0, 3))
    V = draw(st.integers(max(min_v, 2), 6))
    blank = draw(st.integers(-V, V - 1))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    il = [draw(st.integers(1, T)) for _ in range(B)]
    tl = [draw(st.integers(0, U)) for _ in range(B)]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64) * 3
    labels = [c for c in range(V) if c != blank % V]
    tg = torch.tensor(labels)[torch.randint(len(labels), (B, max(U, 1)), generator=g)][:, :U]
    tg = tg.reshape(B, U)
    junk = draw(st.sampled_from(GARBAGE))
    read = torch.zeros(B, T, U + 1, dtype=torch.bool)
    for b in range(B):
        read[b, : il[b], : tl[b] + 1] = True
        tg[b, tl[b]:] = draw(st.sampled_from([-1, blank % V, V + 3]))
    x = x.masked_fill(~read[..., None], junk).to(dtype)  # 1e30: inf in float16
    return x, tg, torch.tensor(il), torch.tensor(tl), blank % V, read


def _lattice_loglik(blank_lp, emit_lp, Tb, Ub):
    """log of the sum over RNN-T paths (0, 0) -> (Tb, Ub): a forward recursion, float64."""
    ninf = blank_lp.new_tensor(float("-inf"))
    alpha = [[ninf] * (Ub + 1) for _ in range(Tb)]
    for t in range(Tb):
        for u in range(Ub + 1):
            if t == 0 and u == 0:
                alpha[t][u] = blank_lp.new_zeros(())
                continue
            terms = []
            if t > 0:
                terms.append(alpha[t - 1][u] + blank_lp[t - 1, u])
            if u > 0:
                terms.append(alpha[t][u - 1] + emit_lp[t, u - 1])
            alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
    return alpha[Tb - 1][Ub] + blank_lp[Tb - 1, Ub]


def _offset(dp, Tb, T):
    return dp * ((Tb - 1) / 2 - torch.arange(T, dtype=torch.float64))


def _hat_oracle(x, tg, il, tl, blank, dp):
    """HAT's per-sequence losses from its arc definition (float64, differentiable)."""
    out = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        z = x[b, :Tb, : Ub + 1].double()
        zb = z[..., blank]
        keep = torch.ones(z.shape[-1], dtype=torch.bool)
        keep[blank] = False
        lse = torch.logsumexp(z[..., keep], -1)
        emit = torch.full_like(zb, float("-inf"))
        if Ub:
            y = tg[b, :Ub]
            zy = z[:, :Ub].gather(-1, y.expand(Tb, Ub)[..., None])[..., 0]
            emit = torch.cat([torch.nn.functional.logsigmoid(-zb[:, :Ub]) + zy - lse[:, :Ub]
                              + _offset(dp, Tb, Tb)[:, None], emit[:, Ub:]], 1)
        out.append(-_lattice_loglik(torch.nn.functional.logsigmoid(zb), emit, Tb, Ub))
    return torch.stack(out)


def _rnnt_oracle(x, tg, il, tl, blank, dp):
    """RNN-T per-sequence losses with k2's delay penalty on every emission (float64)."""
    out = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        lp = torch.log_softmax(x[b, :Tb, : Ub + 1].double(), -1)
        emit = torch.full_like(lp[..., 0], float("-inf"))
        if Ub:
            y = tg[b, :Ub]
            ey = lp[:, :Ub].gather(-1, y.expand(Tb, Ub)[..., None])[..., 0]
            emit = torch.cat([ey + _offset(dp, Tb, Tb)[:, None], emit[:, Ub:]], 1)
        out.append(-_lattice_loglik(lp[..., blank], emit, Tb, Ub))
    return torch.stack(out)


def _grad_of_oracle(oracle, x, *args):
    """The oracle's gradient on the rows read (padding's is 0 by definition)."""
    xr = x.detach().double().nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    loss = oracle(xr, *args)
    (g,) = torch.autograd.grad(loss.sum(), xr)
    return loss.detach(), g


def _check_loss_and_grad(got, gx, want, gw, read, dtype):
    vt, gt = _tol(dtype)
    assert got.dtype == (dtype if dtype == torch.float64 else torch.float32)
    assert torch.isfinite(got).all(), got
    torch.testing.assert_close(got.double(), want, rtol=vt, atol=vt)
    assert gx.dtype == dtype
    assert torch.all(gx[~read] == 0), "padding got a gradient"
    assert torch.isfinite(gx).all()
    torch.testing.assert_close(gx.double()[read], gw[read], rtol=gt, atol=gt)


@PROPS
@given(batch=batches(), dp=st.sampled_from([0.0, 0.5, -1.5]), clamp=st.sampled_from([-1, 0.05]),
       backend=st.sampled_from(BACKENDS), layout=st.sampled_from(["contiguous", "strided"]))
def test_hat_loss_against_path_sum_oracle(batch, dp, clamp, backend, layout):
    x, tg, il, tl, blank, read = batch
    if layout == "strided":  # a (B, T, V, U+1) buffer seen as (B, T, U+1, V)
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    # A negative blank index names the same class counted from the end.
    blank_arg = blank - x.shape[-1] if int(il[0]) % 2 else blank
    x = x.detach().requires_grad_()
    got = hat_loss(x, tg, il, tl, blank=blank_arg, clamp=clamp, reduction="none",
                   delay_penalty=dp, backend=backend)
    (gx,) = torch.autograd.grad(got.sum(), x)
    want, gw = _grad_of_oracle(_hat_oracle, x, tg, il, tl, blank, dp)
    if clamp > 0:  # elementwise on each sequence's gradient (its incoming gradient is 1)
        gw = gw.clamp(-clamp, clamp)
    _check_loss_and_grad(got.detach(), gx, want, gw, read, x.dtype)


def _joint(e, p):
    return torch.tanh(e[:, :, None] + p[:, None]) * 4


@PROPS
@given(batch=batches(), dp=st.sampled_from([0.0, 0.7]), chunk=st.sampled_from([None, 5]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_hat_loss_from_joint_against_path_sum_oracle(batch, dp, chunk, dtype):
    _, tg, il, tl, blank, _ = batch
    B, U1, V = tg.shape[0], tg.shape[1] + 1, batch[0].shape[-1]
    T = batch[0].shape[1]
    g = torch.Generator().manual_seed(int(il.sum() * 7 + tl.sum()))
    e = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    p = torch.randn(B, U1, V, generator=g, dtype=torch.float64)
    t_pad = torch.arange(T)[None, :] >= il[:, None]
    u_pad = torch.arange(U1)[None, :] > tl[:, None]
    # The joint never sees padding: NaN there must reach neither the loss nor a gradient.
    e = e.masked_fill(t_pad[..., None], float("nan")).to(dtype).requires_grad_()
    p = p.masked_fill(u_pad[..., None], float("nan")).to(dtype).requires_grad_()
    got = hat_loss_from_joint(e, p, _joint, tg, il, tl, blank=blank, reduction="none",
                              delay_penalty=dp, chunk_elements=chunk)
    ge, gp = torch.autograd.grad(got.sum(), (e, p))
    er = e.detach().double().nan_to_num(0.0).requires_grad_()
    pr = p.detach().double().nan_to_num(0.0).requires_grad_()
    want = _hat_oracle(_joint(er, pr), tg, il, tl, blank, dp)
    we, wp = torch.autograd.grad(want.sum(), (er, pr))
    vt = _tol(dtype)[0]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.detach().double(), want.detach(), rtol=vt, atol=vt)
    assert torch.all(ge[t_pad] == 0) and torch.all(gp[u_pad] == 0), "padding got a gradient"
    torch.testing.assert_close(ge.double(), we, rtol=vt * 10, atol=vt * 10)
    torch.testing.assert_close(gp.double(), wp, rtol=vt * 10, atol=vt * 10)


@PROPS
@given(batch=batches(), dp=st.floats(-2.0, 2.0), backend=st.sampled_from(BACKENDS))
def test_rnnt_delay_penalty_against_recursion_oracle(batch, dp, backend):
    x, tg, il, tl, blank, read = batch
    x = x.detach().requires_grad_()
    got = seqloss.rnnt_loss(x, tg, il, tl, blank=blank, reduction="none", delay_penalty=dp,
                            backend=backend)
    (gx,) = torch.autograd.grad(got.sum(), x)
    want, gw = _grad_of_oracle(_rnnt_oracle, x, tg, il, tl, blank, dp)
    _check_loss_and_grad(got.detach(), gx, want, gw, read, x.dtype)


@PROPS
@given(batch=batches(), chunk=st.sampled_from([None, 1, 7]))
def test_arc_logprobs_against_float64_log_softmax(batch, chunk):
    x, tg, il, tl, blank, read = batch
    B, T, U1, V = x.shape
    x = x.detach().requires_grad_()
    ab, ae = transducer_arc_logprobs(x, tg, il, tl, blank=blank - V, chunk_elements=chunk)
    acc = x.dtype if x.dtype == torch.float64 else torch.float32
    assert ab.dtype == acc and ae.dtype == acc and ab.shape == ae.shape == (B, T, U1)
    xr = x.detach().double().nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    lp = torch.log_softmax(xr, -1)
    wb = lp[..., blank]
    lab = torch.zeros(B, U1, dtype=torch.int64)
    lab[:, : U1 - 1] = tg.clamp(0, V - 1)
    we = lp.gather(-1, lab[:, None, :, None].expand(B, T, U1, 1))[..., 0]
    emits = read & (torch.arange(U1)[None, None, :] < tl[:, None, None])
    ninf = float("-inf")
    wb, we = wb.masked_fill(~read, ninf), we.masked_fill(~emits, ninf)
    vt, gt = _tol(x.dtype)
    torch.testing.assert_close(ab.double(), wb.detach(), rtol=vt, atol=vt)
    torch.testing.assert_close(ae.double(), we.detach(), rtol=vt, atol=vt)
    # Gradient of a random weighting of the defined arcs (the undefined ones masked out).
    g = torch.Generator().manual_seed(int(il.sum()))
    cb, ce = torch.randn(B, T, U1, generator=g), torch.randn(B, T, U1, generator=g)
    got = ((ab.masked_fill(~read, 0) * cb).sum() + (ae.masked_fill(~emits, 0) * ce).sum())
    (gx,) = torch.autograd.grad(got, x)
    want = (wb.masked_fill(~read, 0) * cb).sum() + (we.masked_fill(~emits, 0) * ce).sum()
    (gw,) = torch.autograd.grad(want, xr)
    assert gx.dtype == x.dtype and torch.isfinite(gx).all()
    assert torch.all(gx[~read] == 0), "padding got a gradient"
    torch.testing.assert_close(gx.double()[read], gw[read], rtol=gt, atol=gt)
