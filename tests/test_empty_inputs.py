"""Empty inputs: empty batches, sequences without frames, logits without frames, empty targets.

An empty batch gives an empty ``"none"`` loss and 0 for every other reduction (never NaN),
and a backward; a sequence with no frame has loss ``+inf`` (0 with ``zero_infinity``)
and leaves the others exact (brute force); all-empty targets are a ``(B, 0)`` batch
(torch's ``ctc_loss``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ctc_batch, device_for

import seqloss
from seqloss.testing import brute_force_rnnt


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_empty_batch_ctc(ctc_backend, reduction):
    dev = device_for(ctc_backend)
    x = torch.randn(5, 0, 4, device=dev).requires_grad_()
    loss = seqloss.ctc_loss(x, torch.zeros(0, 2, dtype=torch.long),
                            torch.zeros(0, dtype=torch.long),
                            torch.zeros(0, dtype=torch.long), reduction=reduction,
                            backend=ctc_backend)
    if reduction == "none":
        assert loss.shape == (0,)
    else:
        assert loss.shape == () and loss.item() == 0.0
    loss.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_volume"])
def test_empty_batch_rnnt(rnnt_backend, reduction):
    dev = device_for(rnnt_backend)
    x = torch.randn(0, 3, 2, 4, device=dev).requires_grad_()
    z = torch.zeros(0, dtype=torch.long)
    loss = seqloss.rnnt_loss(x, torch.zeros(0, 1, dtype=torch.long), z, z, reduction=reduction,
                             backend=rnnt_backend)
    if reduction == "none":
        assert loss.shape == (0,)
    else:
        assert loss.shape == () and loss.item() == 0.0  # never NaN
    loss.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_packed_with_a_zero_frame_sequence(backend):
    """Sequence 0 has no frame (no rows in the packed logits): +inf, the rest exact."""
    V = 5
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3 * 2, V, generator=g, dtype=torch.float64).requires_grad_()
    loss = seqloss.rnnt_loss_packed(x, [[0], [1]], [0, 3], [1, 1], reduction="none",
                                    backend=backend)
    want = brute_force_rnnt(x.detach().reshape(3, 2, V).log_softmax(-1), [1], blank=V - 1)
    assert loss[0].item() == float("inf")
    torch.testing.assert_close(loss[1], want, rtol=1e-12, atol=1e-12)
    loss[1].backward()
    xb = x.detach().reshape(3, 2, V).clone().requires_grad_()
    (gb,) = torch.autograd.grad(brute_force_rnnt(xb.log_softmax(-1), [1], blank=V - 1), xb)
    torch.testing.assert_close(x.grad, gb.reshape(6, V), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("loss_name", ["rnnt", "tdt", "multiblank"])
def test_logits_without_frames(backend, loss_name):
    """T = 0: every sequence has zero frames: +inf each, 0 with zero_infinity, a backward."""
    def call(x, **kw):
        tg, il, tl = [[0, 1], [1, 0]], [0, 0], [2, 1]
        if loss_name == "rnnt":
            return seqloss.rnnt_loss(x, tg, il, tl, backend=backend, **kw)
        if loss_name == "tdt":
            return seqloss.tdt_loss(x, tg, il, tl, [0, 1], backend=backend, **kw)
        return seqloss.multiblank_rnnt_loss(x, tg, il, tl, [2], backend=backend, **kw)
    V = 7 if loss_name == "tdt" else 5
    x = torch.randn(2, 0, 3, V, requires_grad=True)
    assert call(x, reduction="none").tolist() == [float("inf")] * 2
    loss = call(x, reduction="mean", zero_infinity=True)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("loss_name", ["rnnt", "tdt", "multiblank"])
def test_empty_batch_with_list_targets(loss_name):
    x = torch.zeros(0, 3, 2, 7, requires_grad=True)
    if loss_name == "rnnt":
        loss = seqloss.rnnt_loss(x, [], [], [])
    elif loss_name == "tdt":
        loss = seqloss.tdt_loss(x, [], [], [], [0, 1])
    else:
        loss = seqloss.multiblank_rnnt_loss(x, [], [], [], [2])
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("loss_name", ["ctc", "rnnt"])
def test_empty_batch_none_reduction_backward_with_ones_like(loss_name):
    """``ones_like`` of an empty loss may have a 0 stride: the backward must not read it."""
    if loss_name == "ctc":
        x = torch.zeros(5, 0, 4, requires_grad=True)
        loss = seqloss.ctc_loss(x, torch.zeros(0, 2, dtype=torch.long), [], [], reduction="none")
    else:
        x = torch.zeros(0, 3, 2, 5, requires_grad=True)
        loss = seqloss.rnnt_loss(x, torch.zeros(0, 1, dtype=torch.long), [], [], reduction="none")
    (g,) = torch.autograd.grad(loss, x, grad_outputs=torch.ones_like(loss))
    assert g.shape == x.shape


def test_all_empty_nested_targets():
    """``[[], [], []]`` (all-silence utterances) is a padded ``(B, 0)`` batch, not floats."""
    x, _, il, _ = ctc_batch(B=3)
    lp = x.log_softmax(-1)
    zero = torch.zeros(3, dtype=torch.long)
    want = F.ctc_loss(lp, torch.zeros(3, 0, dtype=torch.long), il, zero, reduction="none")
    got = seqloss.ctc_loss(lp, [[], [], []], il, [0, 0, 0], reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
