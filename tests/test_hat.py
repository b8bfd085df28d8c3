"""HAT: hat_loss(_from_joint) and HAT's joint table against brute-force path enumeration.

The oracles form HAT's probabilities from their definition (``p(blank) = sigmoid(z_blank)``,
``p(y) = (1 - sigmoid(z_blank)) softmax(z_labels)[y]``) in float64, enumerate every RNN-T
path, and differentiate by autograd. ``hat_table`` is also fed to ``joint_loss`` (the
table op every variant shares) directly, on every backend and dtype, with ``clamp`` and
``delay_penalty``.
"""

from __future__ import annotations

from itertools import combinations

import pytest
import torch
from conftest import backend_params, device_for

from seqloss import InputError
from seqloss.testing import brute_force_lattice
from seqloss.transducer.hat import HATLoss, hat_loss, hat_loss_from_joint, hat_table
from seqloss.transducer.joint.api import joint_loss
from seqloss.transducer.joint.table import JointTable

INF = float("inf")
REDUCTIONS = ["none", "sum", "mean", "mean_batch", "mean_target", "mean_volume"]


def _case(B=3, T=4, U=3, V=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64) * 2).to(dtype)
    y = torch.randint(0, V - 1, (B, U), generator=g)
    il = torch.tensor([T, T - 1, 2, 0][:B])
    tl = torch.tensor([U, 1, 0, 2][:B])
    return x, y, il, tl


def _read(il, tl, T, U1):
    tt = torch.arange(T)[None, :, None]
    uu = torch.arange(U1)[None, None, :]
    return (tt < il[:, None, None]) & (uu <= tl[:, None, None])


def _arcs(x, y, blank, il, delay_penalty):
    """HAT's arc log-probabilities from the probabilities themselves (float64)."""
    B, T, U1, V = x.shape
    keep = [c for c in range(V) if c != blank]
    p_blank = torch.sigmoid(x[..., blank])
    p_labels = torch.zeros_like(x)
    # 1 - sigmoid(z) written as sigmoid(-z): 1 - sigmoid(120) is 0 in float64
    p_labels[..., keep] = torch.softmax(x[..., keep], -1) * torch.sigmoid(-x[..., blank])[..., None]
    lab = torch.zeros(B, U1, dtype=torch.long)
    lab[:, : U1 - 1] = y[:, : U1 - 1]
    ae = p_labels.gather(-1, lab[:, None, :, None].expand(B, T, U1, 1))[..., 0].log()
    t = torch.arange(T, dtype=torch.float64)
    ae = ae + delay_penalty * ((il[:, None, None] - 1) / 2 - t[None, :, None])
    return p_blank.log(), ae


def _brute_ll(ab, ae, Tb, Ub):
    """log-sum over every path (0, 0) -> (T_b, U_b) of its arcs' scores."""
    if Tb == 0:
        return None
    n = Tb - 1 + Ub
    scores = []
    for emits in combinations(range(n), Ub):
        t = u = 0
        s = ab.new_zeros(())
        for k in range(n):
            if k in emits:
                s = s + ae[t, u]
                u += 1
            else:
                s = s + ab[t, u]
                t += 1
        scores.append(s + ab[Tb - 1, Ub])
    return torch.logsumexp(torch.stack(scores), 0)


def _weights(reduction, tl, B):
    if reduction in ("mean", "mean_batch"):
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    if reduction == "mean_target":
        return 1.0 / (tl.double().clamp(min=1) * B)
    if reduction == "mean_volume":
        return torch.full((B,), 1.0 / max(int(tl.sum()), 1), dtype=torch.float64)
    return torch.ones(B, dtype=torch.float64)


def _oracle(x, y, il, tl, *, blank=-1, clamp=-1.0, reduction="mean", fastemit_lambda=0.0,
            delay_penalty=0.0, zero_infinity=False, upstream=None):
    """``(value, gradient)`` by enumeration: per-sequence gradients by autograd through the
    enumeration, FastEmit on the emission arcs, clamp, then the reduction's weights."""
    B, T, U1, V = x.shape
    blank = blank % V
    rows = _read(il, tl, T, U1)
    x64 = torch.where(rows[..., None], x.detach().double(), 0.0).requires_grad_()
    ab, ae = _arcs(x64, y, blank, il, delay_penalty)
    scale = 1.0 + fastemit_lambda
    losses, grads = [], []
    for b in range(B):
        ll = _brute_ll(ab[b], ae[b], int(il[b]), int(tl[b]))
        if ll is None:
            losses.append(torch.tensor(0.0 if zero_infinity else INF, dtype=torch.float64))
            grads.append(torch.zeros_like(x64))
            continue
        gab, gae = torch.autograd.grad(-ll, (ab, ae), retain_graph=True, allow_unused=True,
                                       materialize_grads=True)
        (g,) = torch.autograd.grad((ab, ae), x64, (gab, gae * scale), retain_graph=True)
        if clamp > 0:
            g = g.clamp(-clamp, clamp)
        losses.append(-ll.detach() * scale)
        grads.append(g)
    losses = torch.stack(losses)
    w = _weights(reduction, tl, B)
    if reduction == "none":
        up = upstream if upstream is not None else torch.ones(B, dtype=torch.float64)
        value = losses
    else:
        up = torch.full((B,), 1.0 if upstream is None else float(upstream), dtype=torch.float64)
        value = (losses * w).sum()
    grad = sum(grads[b] * w[b] * up[b] for b in range(B))
    return value, grad


def _run(x, y, il, tl, upstream=None, **kw):
    x = x.detach().clone().requires_grad_()
    loss = hat_loss(x, y, il, tl, **kw)
    if kw.get("reduction") == "none":
        up = torch.ones(loss.shape) if upstream is None else upstream
        loss.backward(up.to(loss.dtype))
    else:
        (loss * (1.0 if upstream is None else upstream)).backward()
    return loss, x.grad


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("backend", backend_params("lattice"))
def test_against_brute_force(backend, reduction):
    x, y, il, tl = _case(B=4)
    up = torch.tensor([0.5, -1.5, 2.0, 1.0], dtype=torch.float64) if reduction == "none" else 0.7
    ref_v, ref_g = _oracle(x, y, il, tl, reduction=reduction, zero_infinity=True, upstream=up)
    v, g = _run(x, y, il, tl, up, reduction=reduction, zero_infinity=True, backend=backend)
    torch.testing.assert_close(v, ref_v, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(g, ref_g, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "opts",
    [
        {"delay_penalty": 0.4},
        {"delay_penalty": -0.7},
        {"clamp": 0.02},
        {"fastemit_lambda": 0.5},
        {"fastemit_lambda": 0.3, "delay_penalty": 0.2, "clamp": 0.05, "reduction": "sum"},
        {"blank": 0},
        {"blank": 2, "reduction": "mean_target"},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("chunk", [None, 7])
def test_options_against_brute_force(opts, chunk):
    x, y, il, tl = _case(B=3, T=5, U=3, V=6, seed=1)
    blank = opts.get("blank", -1) % 6
    y = torch.where(y >= blank, y + 1, y)  # every label but the blank
    ref_v, ref_g = _oracle(x, y, il, tl, **opts)
    rows = _read(il, tl, *x.shape[1:3])
    with torch.no_grad():
        x.masked_fill_(~rows[..., None], float("nan"))  # padding: never read
    v, g = _run(x, y, il, tl, chunk_elements=chunk, **opts)
    torch.testing.assert_close(v, ref_v, atol=1e-10, rtol=1e-10)
    assert (g[~rows] == 0).all()
    torch.testing.assert_close(g, ref_g, atol=1e-10, rtol=1e-10)
    if "clamp" in opts:  # the clamp binds somewhere, or the test proves nothing
        unclamped = _oracle(x, y, il, tl, **{**opts, "clamp": -1})[1]
        assert (unclamped - ref_g).abs().max() > 1e-3


def test_impossible_and_infinite():
    x, y, il, tl = _case(B=4)  # the last sequence has no frame
    v, g = _run(x, y, il, tl, reduction="none")
    assert v[3] == INF and (g[3] == 0).all() and torch.isfinite(v[:3]).all()
    v0, _ = _run(x, y, il, tl, reduction="none", zero_infinity=True)
    assert v0[3] == 0 and torch.equal(v0[:3], v[:3])


def test_nan_in_a_read_row_stays_in_its_sequence():
    x, y, il, tl = _case(B=3)
    x[1, 0, 0, 2] = float("nan")
    v, g = _run(x, y, il, tl, reduction="none")
    assert torch.isnan(v[1]) and torch.isnan(g[1]).any()
    ref_v, ref_g = _oracle(x[[0, 2]], y[[0, 2]], il[[0, 2]], tl[[0, 2]], reduction="none")
    torch.testing.assert_close(v[[0, 2]], ref_v, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(g[[0, 2]], ref_g, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes(dtype):
    x, y, il, tl = _case(B=3, T=5, U=3, V=6, seed=2, dtype=dtype)
    ref_v, ref_g = _oracle(x, y, il, tl, reduction="sum", delay_penalty=0.1)
    v, g = _run(x, y, il, tl, reduction="sum", delay_penalty=0.1)
    assert v.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert g.dtype == dtype
    torch.testing.assert_close(v.double(), ref_v, atol=1e-5, rtol=1e-5)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(g.double(), ref_g, atol=4 * eps * ref_g.abs().max().item(),
                               rtol=0)


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_gradcheck_float64(backend):
    x, y, il, tl = _case(B=2, T=3, U=2, V=4, seed=3)
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: hat_loss(x, y, il, tl, reduction="none", delay_penalty=0.3, backend=backend),
        (x,))


def test_no_subnormal_gradient():
    """A float32 gradient entry below the smallest normal is flushed to 0 (a matmul reading
    subnormals downstream runs many times slower); the rest is untouched."""
    x, y, il, tl = _case(B=2, T=4, U=3, V=6, seed=10, dtype=torch.float32)
    x[..., 1] -= 84.0  # exp(-84) ~ 3e-37, times an occupation below 1e-1: subnormal
    v, g = _run(x, y, il, tl, reduction="sum", backend="numba")
    tiny = torch.finfo(torch.float32).tiny
    assert not ((g != 0) & (g.abs() < tiny)).any()
    ref_v, ref_g = _oracle(x, y, il, tl, reduction="sum")
    assert ((ref_g != 0) & (ref_g.abs() < tiny)).any()  # the case has some to flush
    torch.testing.assert_close(g.double(), ref_g, atol=1e-6, rtol=1e-5)


class _Joint(torch.nn.Module):
    def __init__(self, H=5, V=6):
        super().__init__()
        torch.manual_seed(4)
        self.enc = torch.nn.Linear(H, 8, dtype=torch.float64)
        self.pred = torch.nn.Linear(H, 8, dtype=torch.float64)
        self.out = torch.nn.Linear(8, V, dtype=torch.float64)

    def forward(self, e, p):
        return self.out(torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None]))


@pytest.mark.parametrize("opts", [{}, {"clamp": 0.01, "fastemit_lambda": 0.2,
                                       "delay_penalty": 0.3, "reduction": "mean_volume"}],
                         ids=["plain", "options"])
def test_from_joint_matches_hat_loss(opts):
    B, T, U, H, V = 3, 5, 3, 5, 6
    torch.manual_seed(5)
    enc = torch.randn(B, T, H, dtype=torch.float64)
    pred = torch.randn(B, U + 1, H, dtype=torch.float64)
    _, y, il, tl = _case(B, T, U, V)
    enc[1, int(il[1]):] = float("nan")  # padding never reaches the joint
    joint = _Joint(H, V)
    params = list(joint.parameters())
    e1, p1 = enc.clone().requires_grad_(), pred.clone().requires_grad_()
    loss = hat_loss_from_joint(e1, p1, joint, y, il, tl, chunk_elements=25, **opts)
    g1 = torch.autograd.grad(loss, [e1, p1, *params])
    e2, p2 = enc.clone().requires_grad_(), pred.clone().requires_grad_()
    tt = torch.arange(T)[None, :, None] < il[:, None, None]
    ref = hat_loss(joint(torch.where(tt, e2, 0.0), p2), y, il, tl, **opts)
    g2 = torch.autograd.grad(ref, [e2, p2, *params])
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_module_and_bad_inputs():
    x, y, il, tl = _case()
    m = HATLoss(reduction="sum", delay_penalty=0.1)
    assert "delay_penalty=0.1" in repr(m)
    torch.testing.assert_close(m(x, y, il, tl),
                               hat_loss(x, y, il, tl, reduction="sum", delay_penalty=0.1))
    y_bad = y.clone()
    y_bad[1, 0] = 9
    with pytest.raises(InputError, match=r"targets.*\b1\b"):
        hat_loss(x, y_bad, il, tl)
    with pytest.raises(InputError, match="target_lengths"):
        hat_loss(x, y, il, tl + 5)
    with pytest.raises(InputError, match="reduction"):
        hat_loss(x, y, il, tl, reduction="avg")
    with pytest.raises(InputError, match="fastemit_lambda"):
        hat_loss(x, y, il, tl, fastemit_lambda=-1.0)
    with pytest.raises(TypeError, match="logits"):
        hat_loss(x.long(), y, il, tl)
    with pytest.raises(InputError, match="blank"):
        hat_loss(x, y, il, tl, blank=7)


@pytest.mark.parametrize("layout", ["full_lengths", "permuted", "class_strided"])
def test_layouts_against_brute_force(layout):
    """The Numba row passes (float32/64 CPU, unit class stride) with and without padding,
    on a permuted layout, and the row driver on a class-strided one."""
    x, y, il, tl = _case(B=2, T=4, U=3, V=5, seed=7)
    if layout == "full_lengths":  # no padding: the gradient buffer is never zero-filled
        il, tl = torch.tensor([4, 4]), torch.tensor([3, 3])
    elif layout == "permuted":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    ref_v, ref_g = _oracle(x, y, il, tl, reduction="sum", clamp=0.05)
    if layout == "class_strided":
        base = torch.zeros(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)
        base[..., ::2] = x
        xs = base.requires_grad_()
        loss = hat_loss(xs[..., ::2], y, il, tl, reduction="sum", clamp=0.05, backend="numba")
        loss.backward()
        v, g = loss, xs.grad[..., ::2]
        assert (xs.grad[..., 1::2] == 0).all()
    else:
        xs = x.detach().clone().requires_grad_()
        if layout == "permuted":
            xs = x.detach().transpose(1, 2).clone().transpose(1, 2).requires_grad_()
        loss = hat_loss(xs, y, il, tl, reduction="sum", clamp=0.05, backend="numba")
        loss.backward()
        v, g = loss, xs.grad
    torch.testing.assert_close(v, ref_v, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(g, ref_g, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_retain_graph_and_no_grad(backend):
    x, y, il, tl = _case(seed=8)
    x.requires_grad_()
    loss = hat_loss(x, y, il, tl, backend=backend)
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    (g2,) = torch.autograd.grad(loss, x)
    assert torch.equal(g1, g2)
    with torch.no_grad():
        assert torch.equal(hat_loss(x, y, il, tl, backend=backend), loss.detach())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_dominant_blank_or_label(dtype, backend):
    """Rows where the blank's logit exceeds every label's by far (the labels' sum must not
    underflow) or falls far below (the blank's term is taken out of the row's sum)."""
    x, y, il, tl = _case(B=2, T=4, U=3, V=6, seed=9)
    x[0, :, :, -1] += 120.0
    x[1, :2, :, -1] -= 120.0
    x[1, 2:, :, 0] += 200.0  # a label far above the rest
    x = x.to(dtype)
    ref_v, ref_g = _oracle(x, y, il, tl, reduction="none")
    v, g = _run(x, y, il, tl, reduction="none", backend=backend)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(v.double(), ref_v, atol=tol, rtol=tol)
    torch.testing.assert_close(g.double(), ref_g, atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["numba", "reference"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean_volume"])
def test_empty_batch(backend, reduction):
    x = torch.randn(0, 3, 3, 5, requires_grad=True)
    loss = hat_loss(x, torch.zeros(0, 2, dtype=torch.long), [], [], reduction=reduction,
                    backend=backend)
    assert loss.shape == ((0,) if reduction == "none" else ())
    assert torch.isfinite(loss).all() and (loss == 0).all()
    loss.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("backend,reduction", [("reference", "none"), ("numba", "mean_volume")])
def test_opcheck(backend, reduction):
    """``hat_loss`` is the table op ``seqloss::transducer_joint_loss`` on HAT's table:
    schema, fake kernel, autograd."""
    from seqloss.transducer.hat import hat_table
    from seqloss.transducer.op import table_loss_op

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor([[0, 1], [2, 3]])
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    ints, floats = hat_table(5, 4, 0.5, 0.1, delay_penalty=0.3).encode()
    args = (x, tg, il, tl, ints, floats, True, reduction, False, backend, True, True)
    torch.library.opcheck(table_loss_op, args)


def test_hat_loss_blank_is_the_only_class_but_one():
    """V = 2: the label softmax has one class, so every emission is logsigmoid(-z_blank)."""
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tg, il, tl = torch.tensor([[0], [0]]), torch.tensor([3, 2]), torch.tensor([1, 0])
    got = hat_loss(x, tg, il, tl, blank=1, reduction="none")
    torch.testing.assert_close(got, _oracle(x, tg, il, tl, blank=1, reduction="none")[0])


# ------------------------------------------------------------------ HAT as a joint table
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _table_oracle(x, tg, il, tl, blank, clamp, delay_penalty):
    """Per-sequence losses and d(sum of losses)/d logits (each sequence's gradient
    clamped elementwise), by enumerating every path in float64."""
    x = x.detach().cpu().double().requires_grad_()
    V = x.shape[-1]
    labels = [c for c in range(V) if c != blank]
    losses, grads = [], []
    for b in range(x.shape[0]):
        xb = x[b]
        p_blank = torch.sigmoid(xb[..., blank])
        p_lab = torch.zeros_like(xb)
        # 1 - sigmoid(z) as sigmoid(-z): exact where the blank dominates
        p_rest = torch.sigmoid(-xb[..., blank])[..., None]
        p_lab[..., labels] = torch.softmax(xb[..., labels], -1) * p_rest
        U = int(tl[b])
        y = torch.cat([tg[b, :U], tg.new_full((xb.shape[1] - U,), labels[0])])  # past U: not read
        ae = p_lab.gather(2, y[None, :, None].expand(xb.shape[0], -1, 1)).log()
        ll = brute_force_lattice(p_blank.log()[..., None], ae, int(il[b]), U, (1,), (0,),
                                 delay_penalty=delay_penalty)
        loss = -ll
        if torch.isfinite(loss):
            (g,) = torch.autograd.grad(loss, x)
            if clamp > 0:
                g = g.clamp(-clamp, clamp)
        else:
            g = torch.zeros_like(x)
        losses.append(loss.detach())
        grads.append(g)
    return torch.stack(losses), sum(grads)


def _table_case(dtype, seed=21):
    g = torch.Generator().manual_seed(seed)
    B, T, U, V = 3, 4, 2, 6
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64) * 2
    x[0, 1, :, V - 1] += 30.0  # a dominant blank: the labels' sum must not underflow
    x[2, :, 1, V - 1] -= 30.0  # a vanishing one
    x = x.to(dtype)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([4, 3, 2]), torch.tensor([2, 1, 2])
    return x, tg, il, tl


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("opts", [{}, {"clamp": 0.05, "delay_penalty": 0.4},
                                  {"delay_penalty": -0.7}],
                         ids=["plain", "clamp_delay", "neg_delay"])
def test_hat_table_against_brute_force(rnnt_backend, dtype, opts):
    dev = device_for(rnnt_backend)
    x, tg, il, tl = _table_case(dtype)
    V = x.shape[-1]
    clamp, dp = opts.get("clamp", -1.0), opts.get("delay_penalty", 0.0)
    want_l, want_g = _table_oracle(x, tg, il, tl, V - 1, clamp, dp)
    if clamp > 0:  # the clamp binds, or the test proves nothing
        assert (_table_oracle(x, tg, il, tl, V - 1, -1.0, dp)[1] - want_g).abs().max() > 1e-3
    xin = x.to(dev).requires_grad_()
    table = hat_table(V, -1, clamp, delay_penalty=dp)
    loss = joint_loss(xin, tg.to(dev), il, tl, table, reduction="none", backend=rnnt_backend)
    (gx,) = torch.autograd.grad(loss.sum(), xin)
    assert gx.dtype == dtype
    if dtype == torch.float64:
        torch.testing.assert_close(loss.cpu(), want_l, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gx.cpu(), want_g, rtol=1e-9, atol=1e-11)
    else:
        # float32 sums and exps; a half gradient holds eps of its largest entry
        torch.testing.assert_close(loss.cpu().double(), want_l, rtol=1e-5, atol=1e-5)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(gx.cpu().double(), want_g, rtol=0,
                                   atol=4 * eps * want_g.abs().max().item())


def test_hat_table_packed_and_blank_first(rnnt_backend):
    """Packed rows, and the blank at class 0 (the labels after it)."""
    dev = device_for(rnnt_backend)
    x, tg, il, tl = _table_case(torch.float64, seed=22)
    x = x.flip(-1).contiguous()  # the dominant/vanishing blank column now at class 0
    tg = tg + 1  # labels 1..V-1
    V = x.shape[-1]
    want_l, want_g = _table_oracle(x, tg, il, tl, 0, 0.1, 0.25)
    xp = torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, V) for b in range(3)])
    xin = xp.to(dev).requires_grad_()
    loss = joint_loss(xin, tg.to(dev), il, tl, hat_table(V, 0, 0.1, delay_penalty=0.25),
                      reduction="none", backend=rnnt_backend)
    (gx,) = torch.autograd.grad(loss.sum(), xin)
    want = torch.cat([want_g[b, : il[b], : tl[b] + 1].reshape(-1, V) for b in range(3)])
    torch.testing.assert_close(loss.cpu(), want_l, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gx.cpu(), want, rtol=1e-9, atol=1e-11)


def test_hat_normalizer_round_trips_and_is_checked():
    t = hat_table(7, -1, 0.5, 0.2, delay_penalty=-0.3)
    assert t.hat and t.blank_tokens == (6,)
    assert JointTable.decode(*t.encode()) == t
    with pytest.raises(ValueError, match="normalizer"):
        JointTable(blank_arcs=t.blank_arcs, emit_arcs=t.emit_arcs, num_tokens=7,
                   normalizer="sparsemax")
    x = torch.randn(1, 2, 2, 7)
    with pytest.raises(ValueError, match="fused_log_softmax"):
        joint_loss(x, torch.tensor([[1]]), [2], [1], t, fused_log_softmax=False,
                   backend="reference")
