"""HAT as a joint table: the ``"hat"`` normalizer against brute-force path enumeration.

``hat_table`` fed to ``joint_loss`` (the table op every variant shares) on every backend
and dtype, value and gradient, with ``clamp`` and ``delay_penalty``. The oracle forms
HAT's probabilities from their definition (``p(blank) = sigmoid(z_blank)``,
``p(y) = (1 - sigmoid(z_blank)) softmax(z_labels)[y]``) in float64, lists every path,
and differentiates by autograd.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for

from seqloss.testing import brute_force_lattice
from seqloss.transducer.joint.api import joint_loss
from seqloss.transducer.joint.table import JointTable, hat_table

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _oracle(x, tg, il, tl, blank, clamp, delay_penalty):
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


def _case(dtype, seed=21):
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
    x, tg, il, tl = _case(dtype)
    V = x.shape[-1]
    clamp, dp = opts.get("clamp", -1.0), opts.get("delay_penalty", 0.0)
    want_l, want_g = _oracle(x, tg, il, tl, V - 1, clamp, dp)
    if clamp > 0:  # the clamp binds, or the test proves nothing
        assert (_oracle(x, tg, il, tl, V - 1, -1.0, dp)[1] - want_g).abs().max() > 1e-3
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
    x, tg, il, tl = _case(torch.float64, seed=22)
    x = x.flip(-1).contiguous()  # the dominant/vanishing blank column now at class 0
    tg = tg + 1  # labels 1..V-1
    V = x.shape[-1]
    want_l, want_g = _oracle(x, tg, il, tl, 0, 0.1, 0.25)
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
