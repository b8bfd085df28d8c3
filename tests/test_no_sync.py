"""``validate=False`` reads no tensor value on the host: no device-to-host sync on CUDA.

Checked on the CUDA backend's code (Triton; under TRITON_INTERPRET=1 on CPU tensors)
by making every host read of a tensor's value (``.item()``, ``int()``, ``bool()``,
``float()``, ``.tolist()``, ``.cpu()``, ``.numpy()``) raise when seqloss's own code
does it, for the whole call: forward and backward.
"""

from __future__ import annotations

import contextlib
import os
import sys

import pytest
import torch
from conftest import device_for

import seqloss
from seqloss._core import checks

_PKG = os.path.dirname(seqloss.__file__)
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


@contextlib.contextmanager
def no_host_reads():
    """Every tensor counts as a device tensor, and seqloss may read none of their values.

    On a GPU, torch's sync debug mode also turns any synchronizing CUDA call inside
    torch's own C++ (a device-to-host copy, ``nonzero``, a masked index) into an error."""
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    host_side = checks.host_side
    checks.host_side = lambda t: False

    def guard(name):
        orig = originals[name]

        def wrapped(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(_PKG):
                raise AssertionError(f"seqloss read a tensor value on the host: Tensor.{name} "
                                     f"from {caller}:{sys._getframe(1).f_lineno}")
            return orig(self, *args, **kwargs)

        return wrapped

    for name in READS:
        setattr(torch.Tensor, name, guard(name))
    cuda = torch.cuda.is_available()
    mode = torch.cuda.get_sync_debug_mode() if cuda else 0
    try:
        if cuda:
            torch.cuda.set_sync_debug_mode("error")
        yield
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(mode)
        checks.host_side = host_side
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


@pytest.fixture
def dev():
    pytest.importorskip("triton")
    return device_for("triton")


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ctc_padded(dev, fused, reduction):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, 5, generator=g).to(dev).requires_grad_()
    tg = torch.randint(1, 5, (3, 3), generator=g).to(dev)
    il = torch.tensor([8, 7, 6], device=dev)
    tl = torch.tensor([3, 2, 1], device=dev)
    with no_host_reads():
        loss = seqloss.ctc_loss(x if fused else x.log_softmax(-1), tg, il, tl, reduction=reduction,
                                fused_log_softmax=fused, backend="triton", validate=False)
        loss.sum().backward()
    want = seqloss.ctc_loss(x.detach().log_softmax(-1), tg, il, tl, reduction=reduction,
                            backend="reference")
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-5)


def test_ctc_concatenated_targets(dev):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 2, 5, generator=g).log_softmax(-1).to(dev).requires_grad_()
    tg = torch.tensor([1, 2, 3, 4, 1], device=dev)
    il = torch.tensor([8, 6], device=dev)
    tl = torch.tensor([3, 2], device=dev)
    with no_host_reads():
        loss = seqloss.ctc_loss(x, tg, il, tl, backend="triton", validate=False)
        loss.backward()
    want = seqloss.ctc_loss(x.detach(), tg, il, tl, backend="reference")
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_rnnt(dev, packed):
    g = torch.Generator().manual_seed(2)
    B, T, U, V = 2, 4, 2, 5
    x = torch.randn(B, T, U + 1, V, generator=g)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    want = seqloss.rnnt_loss(x, tg, il, tl, backend="reference")
    if packed:
        x = torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, V) for b in range(B)])
    x = x.to(dev).requires_grad_()
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    fn = seqloss.rnnt_loss_packed if packed else seqloss.rnnt_loss
    with no_host_reads():
        loss = fn(x, tg, il, tl, backend="triton", validate=False)
        loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), want, rtol=1e-5, atol=1e-5)


def test_lattice(dev):
    g = torch.Generator().manual_seed(3)
    ab = torch.randn(2, 4, 3, 2, generator=g).to(dev).requires_grad_()
    ae = torch.randn(2, 4, 3, 2, generator=g).to(dev).requires_grad_()
    il, tl = torch.tensor([4, 3], device=dev), torch.tensor([2, 1], device=dev)
    with no_host_reads():
        ll = seqloss.transducer_lattice(ab, ae, il, tl, (1, 2), (0, 1), backend="triton",
                                        validate=False)
        ll.sum().backward()
    want = seqloss.transducer_lattice(ab.detach(), ae.detach(), il, tl, (1, 2), (0, 1),
                                      backend="reference")
    torch.testing.assert_close(ll.detach(), want, rtol=1e-5, atol=1e-5)


def test_the_guard_catches_a_read(dev):
    with pytest.raises(AssertionError, match="Tensor.item"), no_host_reads():
        from seqloss._core import ops

        ops._all_ones(torch.ones((), device=dev))
