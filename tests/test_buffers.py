"""The reused host memory of large gradients (``seqloss._core.buffers``).

The danger of reuse is handing out memory someone still reads: every test here that
keeps a gradient checks it is unchanged after later calls.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

import seqloss
from seqloss._core import buffers


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch):
    """Reuse from 4 KiB here, so that small test tensors take the reuse path."""
    monkeypatch.setattr(buffers, "MIN_BYTES", 4096)
    monkeypatch.delenv("SEQLOSS_REUSE_BUFFERS", raising=False)
    buffers._KEPT.clear()
    yield
    buffers._KEPT.clear()


def _inputs(seed: int, B: int = 3, T: int = 9, U: int = 4, V: int = 40, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype)
    tg = torch.randint(0, V - 1, (B, U), generator=g)  # the blank is the last class
    return x, tg, torch.full((B,), T), torch.full((B,), U)


def _grad(x, tg, il, tl, backend="numba"):
    x = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(seqloss.rnnt_loss(x, tg, il, tl, backend=backend), x)
    return g


def test_a_dropped_gradient_is_reused():
    x, tg, il, tl = _inputs(0)
    p = _grad(x, tg, il, tl).data_ptr()  # the gradient is dropped at once
    assert buffers.kept_bytes() >= x.numel() * 4
    assert _grad(x, tg, il, tl).data_ptr() == p


@pytest.mark.parametrize("keep", ["tensor", "view", "numpy", "storage"])
def test_memory_still_referenced_is_never_reused(keep):
    x1, tg, il, tl = _inputs(1)
    g1 = _grad(x1, tg, il, tl)
    want = g1.clone()
    if keep == "tensor":
        held = g1
    elif keep == "view":
        held = g1[1, 2:5]
    elif keep == "numpy":
        held = g1.numpy()
    else:
        held = g1.untyped_storage()
    del g1
    for seed in (2, 3):
        x, tg2, il2, tl2 = _inputs(seed)
        g = _grad(x, tg2, il2, tl2)
        torch.testing.assert_close(g.double(), _grad(x.double(), tg2, il2, tl2, "reference"),
                                   rtol=1e-5, atol=1e-7)
    if keep == "tensor":
        assert torch.equal(held, want)
    elif keep == "view":
        assert torch.equal(held, want[1, 2:5])
    elif keep == "numpy":
        assert torch.equal(torch.from_numpy(held).view_as(want), want)
    else:
        assert torch.equal(torch.empty(0).set_(held).view_as(want), want)


def test_leaf_grad_accumulates_across_calls():
    x, tg, il, tl = _inputs(4)
    xl = x.clone().requires_grad_()
    seqloss.rnnt_loss(xl, tg, il, tl).backward()
    seqloss.rnnt_loss(xl, tg, il, tl).backward()  # .grad holds the first buffer
    ref = _grad(x.double(), tg, il, tl, "reference")
    torch.testing.assert_close(xl.grad.double(), 2 * ref, rtol=1e-5, atol=1e-7)


def _tdt_call(scale: float):
    g = torch.Generator().manual_seed(5)
    V = 30
    x = torch.randn(2, 8, 4, V + 3, generator=g).mul_(scale).requires_grad_()
    tg = torch.randint(0, V - 1, (2, 3), generator=g)
    loss = seqloss.tdt_loss(x, tg, torch.tensor([8, 7]), torch.tensor([3, 2]), blank=V - 1,
                            durations=[0, 1, 2])
    return torch.autograd.grad(loss, x)[0]


def _ctc_call(scale: float):
    g = torch.Generator().manual_seed(6)
    lp = torch.randn(400, 2, 20, generator=g).mul_(scale).log_softmax(-1).requires_grad_()
    loss = seqloss.ctc_loss(lp, torch.randint(1, 20, (2, 30), generator=g),
                            torch.tensor([400, 390]), torch.tensor([30, 25]))
    return torch.autograd.grad(loss, lp)[0]


@pytest.mark.parametrize("call", [_tdt_call, _ctc_call], ids=["tdt", "ctc"])
def test_other_families_keep_a_held_gradient(call):
    g1 = call(1.0)
    want = g1.clone()
    assert buffers.kept_bytes() >= g1.numel() * 4  # it went through the reuse
    for scale in (2.0, 3.0):
        call(scale)
    assert torch.equal(g1, want)
    p = call(4.0).data_ptr()
    assert call(5.0).data_ptr() == p  # a dropped one is reused


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_empty_dtypes_and_layouts(dtype):
    like = torch.empty(4, 50, 30, dtype=dtype).permute(1, 0, 2)
    t = buffers.empty(like.shape, dtype, like=like)
    assert t.dtype == dtype and t.shape == like.shape
    assert t.stride() == torch.empty_like(like).stride()
    t.fill_(1.5)
    assert (t == 1.5).all()
    assert t.data_ptr() % 64 == 0
    c = buffers.empty((50, 4, 30), dtype)
    assert c.is_contiguous()


def test_far_larger_buffers_are_released_not_lent():
    big = buffers.empty((1 << 20,), torch.float32)
    p = big.data_ptr()
    del big
    small = buffers.empty((1 << 16,), torch.float32)  # 16x smaller than the free buffer
    assert small.data_ptr() != p
    assert buffers.kept_bytes() == small.numel() * 4


def test_at_most_two_buffers_are_kept():
    held = [buffers.empty((5000 + i,), torch.float32) for i in range(5)]
    assert buffers.kept_bytes() <= 2 * 5004 * 4
    del held


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("SEQLOSS_REUSE_BUFFERS", "0")
    x, tg, il, tl = _inputs(6)
    _grad(x, tg, il, tl)
    assert buffers.kept_bytes() == 0


def test_concurrent_calls_from_threads():
    inputs = [_inputs(10 + i) for i in range(4)]
    refs = [_grad(x.double(), *rest, backend="reference") for x, *rest in inputs]
    out: dict[int, list] = {i: [] for i in range(4)}

    def work(i: int) -> None:
        for _ in range(5):
            out[i].append(_grad(*inputs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for g in out[i]:  # all kept: none was lent twice
            torch.testing.assert_close(g.double(), refs[i], rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_without_buffers():
    x, tg, il, tl = _inputs(7)
    _grad(x, tg, il, tl)
    assert buffers.kept_bytes() > 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it holds, then leave at once
        os.close(r)
        os.write(w, str(buffers.kept_bytes()).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"0"
