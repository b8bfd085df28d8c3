"""The table-driven joint generalizes: a variant is a table and a few lines, no kernel code.

The variant here exists for this test only: RNN-T plus one extra blank-like class
(index V - 2) that advances two frames. Built from a ``JointTable`` and a call to
``joint_loss``; it must match brute-force path enumeration on every backend.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for, other_backend

from seqloss.testing import brute_force_lattice
from seqloss.transducer.joint.api import joint_loss
from seqloss.transducer.joint.table import Arc, JointTable


def long_blank_rnnt_loss(logits, targets, logit_lengths, target_lengths, *, backend="auto",
                         reduction="none", fused_log_softmax=True):
    """RNN-T with a second blank, class ``V - 2``, that skips two frames (the whole variant)."""
    V = logits.shape[-1]
    table = JointTable(blank_arcs=(Arc(1, token=V - 1), Arc(2, token=V - 2)),
                       emit_arcs=(Arc(0),), num_tokens=V)
    return joint_loss(logits, targets, logit_lengths, target_lengths, table, backend=backend,
                      reduction=reduction, fused_log_softmax=fused_log_softmax)


def _oracle(x, tg, il, tl):
    """Loss per sequence and d(sum of losses)/d logits by enumerating every path."""
    x = x.detach().cpu().double().requires_grad_()
    V = x.shape[-1]
    losses = []
    for b in range(x.shape[0]):
        lp = x[b].log_softmax(-1)
        U = int(tl[b])
        ab = torch.stack([lp[..., V - 1], lp[..., V - 2]], -1)
        y = torch.cat([tg[b, :U], tg.new_zeros(lp.shape[1] - U)])  # past U: never read
        ae = lp.gather(2, y[None, :, None].expand(lp.shape[0], -1, 1))
        losses.append(-brute_force_lattice(ab, ae, int(il[b]), U, (1, 2), (0,)))
    loss = torch.stack(losses)
    (g,) = torch.autograd.grad(loss[torch.isfinite(loss)].sum(), x, allow_unused=True,
                               materialize_grads=True)
    return loss.detach(), g


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_long_blank_variant_against_brute_force(rnnt_backend, packed):
    dev = device_for(rnnt_backend)
    g = torch.Generator().manual_seed(11)
    B, T, U, V = 3, 5, 2, 6
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 2, (B, U), generator=g)  # never a blank-like class
    il, tl = torch.tensor([5, 4, 3]), torch.tensor([2, 1, 2])
    want_l, want_g = _oracle(x, tg, il, tl)
    xin = x
    if packed:
        xin = torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, V) for b in range(B)])
    xin = xin.to(dev).requires_grad_()
    loss = long_blank_rnnt_loss(xin, tg.to(dev), il, tl, backend=rnnt_backend)
    (gx,) = torch.autograd.grad(loss.sum(), xin)
    torch.testing.assert_close(loss.cpu(), want_l, rtol=1e-10, atol=1e-10)
    if packed:
        gx = _unpack(gx.cpu(), il, tl, x.shape)
    torch.testing.assert_close(gx.cpu(), want_g, rtol=1e-9, atol=1e-11)


def _unpack(g, il, tl, shape):
    out = torch.zeros(shape, dtype=g.dtype)
    o = 0
    for b in range(shape[0]):
        n = int(il[b]) * (int(tl[b]) + 1)
        out[b, : il[b], : tl[b] + 1] = g[o : o + n].reshape(int(il[b]), int(tl[b]) + 1, -1)
        o += n
    return out


def test_a_target_equal_to_a_blank_like_class_is_refused():
    x = torch.randn(1, 3, 2, 5)
    with pytest.raises(ValueError, match=r"targets\[0, 0\] = 3 equals the blank-like class 3"):
        long_blank_rnnt_loss(x, torch.tensor([[3]]), [3], [1], backend="reference")


def test_long_blank_with_no_double_step_is_rnnt(rnnt_backend):
    """With the long blank masked out (-inf logit), the variant is plain RNN-T."""
    import seqloss

    dev = device_for(rnnt_backend)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64)
    x[..., 3] = float("-inf")
    tg = torch.randint(0, 3, (2, 2), generator=g)
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    a = long_blank_rnnt_loss(x.to(dev), tg.to(dev), il, tl, backend=rnnt_backend)
    b = seqloss.rnnt_loss(x.to(dev), tg.to(dev), il, tl, reduction="none",
                          backend=other_backend(rnnt_backend))
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-12, atol=1e-12)
