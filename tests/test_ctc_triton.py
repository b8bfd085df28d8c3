"""Triton CTC kernel against the reference kernel, at the kernel interface.

On CPU these run under ``TRITON_INTERPRET=1`` (set by conftest), which is slow:
shapes are chosen to cover the cases the generic suite does not (more than 64
states, long and very uneven lengths, many repeated labels) in few calls.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for

pytest.importorskip("triton")
triton_ctc = pytest.importorskip("seqloss.ctc.triton_cuda")
from seqloss.ctc import reference as reference_ctc  # noqa: E402 -- after the importorskip

INF = float("inf")


def _uneven_batch(dtype, *, seed, fused, blank_last=True):
    """Lengths from 0 to T, targets up to S = 40 (K = 81 states, a 128-lane block)."""
    T, C, S = 64, 9, 40
    blank = C - 1 if blank_last else 0
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 6, C, generator=g, dtype=torch.float64) * 2
    lp = x if fused else x.log_softmax(-1)
    labels = torch.tensor([c for c in range(C) if c != blank])
    # Few distinct labels: every target has long groups of the same label, and
    # adjacent repeats (which need an extra blank frame each).
    tg = labels[torch.randint(0, 3, (6, S), generator=g)]
    tg[0, :6] = labels[torch.tensor([1, 1, 1, 2, 1, 1])]
    il = torch.tensor([64, 45, 20, 40, 0, 6])
    tl = torch.tensor([40, 25, 9, 40, 0, 0])
    # Sequence 3 (40 labels in 40 frames) is impossible if its target has a repeat.
    tg[3, 5] = tg[3, 4]
    # Padding frames hold NaN: the kernel must never read them.
    for b in range(6):
        lp[il[b]:, b] = float("nan")
    return lp.to(dtype), tg, il, tl, blank


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_uneven_lengths_float64_exact(fused):
    lp, tg, il, tl, blank = _uneven_batch(torch.float64, seed=0, fused=fused)
    device = device_for("triton")
    loss, grad = triton_ctc.ctc_loss_forward(lp.to(device), tg.to(device), il.to(device),
                                             tl.to(device), blank, fused, True)
    want_loss, want_grad = reference_ctc.ctc_loss_forward(lp, tg, il, tl, blank, fused, True)
    loss, grad = loss.cpu(), grad.cpu()
    assert loss.dtype == torch.float64 and grad.dtype == torch.float64
    assert (loss[3].item() == INF and loss[4].item() == 0.0
            and torch.isfinite(loss[[0, 1, 2, 5]]).all())
    finite = torch.isfinite(want_loss)
    assert torch.equal(finite, torch.isfinite(loss))
    err = (loss[finite] - want_loss[finite]).abs() / want_loss[finite].abs().clamp(min=1)
    assert err.max().item() <= 1e-10
    assert torch.isfinite(grad).all()
    assert (grad - want_grad).abs().max().item() <= 1e-10
    for b in range(6):
        assert torch.count_nonzero(grad[il[b]:, b]) == 0
    assert torch.count_nonzero(grad[:, 3]) == 0


def test_uneven_lengths_float32_and_loss_only():
    lp, tg, il, tl, blank = _uneven_batch(torch.float32, seed=1, fused=True)
    device = device_for("triton")
    args = (lp.to(device), tg.to(device), il.to(device), tl.to(device), blank, True)
    loss, grad = triton_ctc.ctc_loss_forward(*args, True)
    loss_only, empty = triton_ctc.ctc_loss_forward(*args, False)
    assert empty.numel() == 0
    # The loss-only pass keeps two alpha rows instead of T: same arithmetic.
    assert torch.equal(loss_only, loss)
    want_loss, want_grad = reference_ctc.ctc_loss_forward(lp.double(), tg, il, tl, blank, True,
                                                          True)
    finite = torch.isfinite(want_loss)
    assert torch.equal(finite, torch.isfinite(loss.cpu()))
    assert ((loss.cpu() - want_loss).abs()[finite] <= 1e-5 * want_loss[finite]).all()
    # Occupations are per-frame softmaxes of rescaled alpha + beta': float32
    # rounding does not grow with the length (64 frames here).
    assert (grad.cpu().double() - want_grad).abs().max().item() <= 1e-5


def test_strided_input_and_blank_zero():
    g = torch.Generator().manual_seed(3)
    T, B, C = 14, 3, 5
    base = torch.randn(B, T, 2 * C, generator=g, dtype=torch.float64)
    x = base.transpose(0, 1)[:, :, ::2]  # (T, B, C) with strides (2C, 2CT, 2)
    assert not x.is_contiguous()
    tg = torch.tensor([[1, 2, 2, 3], [4, 4, 4, 4], [1, 3, 1, 0]])
    il = torch.tensor([14, 11, 9])
    tl = torch.tensor([4, 3, 3])
    device = device_for("triton")
    for fused in (False, True):
        lp = x if fused else x.log_softmax(-1)
        loss, grad = triton_ctc.ctc_loss_forward(lp.to(device), tg.to(device), il.to(device),
                                                 tl.to(device), 0, fused, True)
        want_loss, want_grad = reference_ctc.ctc_loss_forward(lp.contiguous(), tg, il, tl, 0, fused,
                                                              True)
        assert (loss.cpu() - want_loss).abs().max().item() <= 1e-10
        assert (grad.cpu() - want_grad).abs().max().item() <= 1e-10


def test_label_groups():
    tg = torch.tensor([[3, 1, 3, 3, 2, 1, 0], [5, 5, 5, 5, 5, 5, 5], [2, 4, 6, 1, 1, 1, 1]])
    tl = torch.tensor([6, 7, 3])
    perm, pos, count, mult = triton_ctc._label_groups(tg, tl, blank=0)
    for b in range(3):
        L = int(tl[b])
        groups = {}
        for i in range(L):
            groups.setdefault(int(tg[b, i]), []).append(i)
        want_count = [0] * tg.shape[1]
        for members in groups.values():
            want_count[members[0]] = len(members)
            # The group, in position order, follows its first member in perm.
            start = int(pos[b, members[0]])
            assert perm[b, start:start + len(members)].tolist() == members
        assert count[b].tolist() == want_count
        assert int(mult[b]) == max(want_count)
