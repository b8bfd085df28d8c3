"""Harness: torch.compile, opcheck, imports without optional kernels, grad_clamp."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import seqloss
from seqloss import InputError


def _ctc_inputs(T, B=2, C=5, S=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g)
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.tensor([T, T - 1])
    tl = torch.tensor([S, S - 1])
    return x, tg, il, tl


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_compile_fullgraph_dynamic_no_recompile(backend):
    pytest.importorskip("numba") if backend == "numba" else None
    torch._dynamo.reset()

    def f(x, tg, il, tl):
        return seqloss.ctc_loss(x.log_softmax(-1), tg, il, tl, backend=backend)

    cf = torch.compile(f, fullgraph=True, dynamic=True)
    for i, T in enumerate((9, 11, 13)):
        x, tg, il, tl = _ctc_inputs(T, seed=i)
        x1 = x.clone().requires_grad_()
        x2 = x.clone().requires_grad_()
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            a = cf(x1, tg, il, tl)
        a.backward()
        b = f(x2, tg, il, tl)
        b.backward()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-7)


def test_opcheck_ctc():
    x, tg, il, tl = _ctc_inputs(6)
    x = x.double().requires_grad_()
    for fused, reduction, zinf, dp in ((False, "none", False, 0.0),
                                       (True, "mean_target", True, 0.3),
                                       (False, "sum", False, -0.2)):
        args = (x, tg, il, tl, 0, fused, reduction, zinf, dp, "reference", True, True)
        torch.library.opcheck(torch.ops.seqloss.ctc_loss.default, args)


def test_import_without_numba_and_triton():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numba"] = None
        sys.modules["triton"] = None
        import torch, seqloss
        x = torch.randn(6, 2, 4).log_softmax(-1)
        loss = seqloss.ctc_loss(x, torch.tensor([[1, 2], [3, 3]]), [6, 5], [2, 2])
        assert torch.isfinite(loss), loss
        for name in ("numba", "triton"):
            try:
                seqloss.ctc_loss(x, torch.tensor([[1, 2], [3, 3]]), [6, 5], [2, 2], backend=name)
            except ImportError as e:
                assert name in str(e)
            else:
                raise AssertionError(name + " should have raised ImportError")
        print("ok")
        """
    )
    env = dict(os.environ)
    env.pop("SEQLOSS_BACKEND", None)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_triton_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pytest.importorskip("triton")
    x, tg, il, tl = _ctc_inputs(6)
    with pytest.raises(InputError, match="Triton kernels run on CUDA"):
        seqloss.ctc_loss(x, tg, il, tl, backend="triton")


def test_grad_clamp():
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = seqloss.grad_clamp(x, 0.5)
    assert torch.equal(y, x)
    (y * torch.tensor([2.0, -3.0, 0.1])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.5, -0.5, 0.1]))
    x.grad = None
    (seqloss.grad_clamp(x, 0) * 5).sum().backward()
    assert torch.count_nonzero(x.grad) == 0
    x.grad = None
    (seqloss.grad_clamp(x, 1.0) * torch.tensor([float("nan"), 1.0, 1.0])).sum().backward()
    assert torch.isnan(x.grad[0]) and x.grad[1] == 1.0
    with pytest.raises(InputError, match="clamp must be >= 0"):
        seqloss.grad_clamp(x, -1.0)
    with pytest.raises(TypeError, match="clamp must be a real number"):
        seqloss.grad_clamp(x, "1")


def test_grad_clamp_composes_with_ctc():
    x, tg, il, tl = _ctc_inputs(8)
    x = x.requires_grad_()
    loss = seqloss.ctc_loss(seqloss.grad_clamp(x.log_softmax(-1), 0.05), tg, il, tl,
                            reduction="sum", backend="reference")
    loss.backward()
    lp = x.detach().log_softmax(-1).requires_grad_()
    seqloss.ctc_loss(lp, tg, il, tl, reduction="sum", backend="reference").backward()
    g = lp.grad.clamp(-0.05, 0.05)
    want = g - lp.detach().exp() * g.sum(-1, keepdim=True)
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-7)


def test_rnnt_double_backward_raises():
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    loss = seqloss.rnnt_loss(x, torch.tensor([[1, 2], [1, 1]]), torch.tensor([5, 4]),
                             torch.tensor([2, 1]), backend="reference")
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        g.sum().backward()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_retain_graph_backward_twice_is_exact(reduction):
    x, tg, il, tl = _ctc_inputs(8)
    x = x.double().requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction=reduction, fused_log_softmax=True,
                            backend="reference")
    w = torch.tensor([0.5, 2.0], dtype=torch.float64) if reduction == "none" else None
    (g1,) = torch.autograd.grad(loss, x, grad_outputs=w, retain_graph=True)
    (g2,) = torch.autograd.grad(loss, x, grad_outputs=w)
    assert torch.equal(g1, g2)
