"""``_core.opdecl.OpDecl``: one declaration gives the registered op, autograd, the eager and
``torch.func`` paths and the call ladder. Oracle: torch's own autograd of the same
function written in plain torch ops."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from seqloss._core.opdecl import OpDecl


def _sq_impl(x: Tensor, y: Tensor, w: float, compute_grad: bool,
             validate: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per batch item ``w * sum(x**2) + sum(x * y)``; its gradients merged in."""
    v = (w * x.detach() ** 2).sum(-1) + (x.detach() * y.detach()).sum(-1)
    if not compute_grad:
        return v, x.new_empty(0), y.new_empty(0)
    return v, 2 * w * x.detach() + y.detach(), x.detach().clone()


def _sq_fake(x, y, w, compute_grad, validate):
    g = (torch.empty_like(x), torch.empty_like(y)) if compute_grad else (x.new_empty(0),) * 2
    return (x.new_empty(x.shape[:1]), *g)


FAST_CALLS: list[bool] = []


def _fast(x, y, w, compute_grad, validate):
    FAST_CALLS.append(True)
    return None  # never takes the call: the general path runs, the spy records the try


SQ = OpDecl("seqloss_test::sq", _sq_impl, _sq_fake, n_diff=2, fast=_fast)


def _mm_impl(x: Tensor, k: float, compute_grad: bool) -> list[Tensor]:
    """``k * sum(exp(x))`` per row; saves ``exp(x)`` for the backward."""
    e = x.detach().exp()
    return [k * e.sum(-1), e] if compute_grad else [k * e.sum(-1)]


def _mm_fake(x, k, compute_grad):
    v = x.new_empty(x.shape[:1])
    return [v, torch.empty_like(x)] if compute_grad else [v]


def _mm_vjp(g, xs, outs, rest, needs, traced):
    return (g[:, None] * rest[0] * outs[1] if needs[0] else None,)


EXP = OpDecl("seqloss_test::expsum", _mm_impl, _mm_fake, vjp=_mm_vjp)


def _oracle_sq(x, y, w):
    return (w * x**2).sum(-1) + (x * y).sum(-1)


def _leaves(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    return x, y


def _sq(x, y, w=0.5):
    want = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)
    return SQ.value(x, y, w, want, True)


@pytest.mark.parametrize("weights", [None, torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)])
def test_eager_matches_autograd(weights):
    x, y = _leaves()
    v = _sq(x, y)
    ref = _oracle_sq(x, y, 0.5)
    torch.testing.assert_close(v, ref)
    w = torch.ones(3, dtype=torch.float64) if weights is None else weights
    got = torch.autograd.grad((v * w).sum() if weights is not None else v.sum(), (x, y))
    exp = torch.autograd.grad((ref * w).sum(), (x, y))
    for a, b in zip(got, exp, strict=True):
        torch.testing.assert_close(a, b)


def test_torch_func_and_compile_match_autograd():
    x, y = _leaves()
    ref = torch.autograd.grad(_oracle_sq(x, y, 0.5).sum(), (x, y))
    got = torch.func.grad(lambda a, b: _sq(a, b).sum(), argnums=(0, 1))(x.detach(), y.detach())
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    compiled = torch.compile(lambda a, b: _sq(a, b).sum(), fullgraph=True, backend="aot_eager")
    cx, cy = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    compiled(cx, cy).backward()
    torch.testing.assert_close(cx.grad, ref[0])
    torch.testing.assert_close(cy.grad, ref[1])


def test_fast_hook_is_tried_eagerly_only():
    x, y = _leaves()
    FAST_CALLS.clear()
    _sq(x, y)
    assert FAST_CALLS == [True]
    FAST_CALLS.clear()
    torch.func.grad(lambda a: _sq(a, y.detach()).sum())(x.detach())
    assert FAST_CALLS == []


def test_double_backward_raises_and_retain_graph_keeps_gradients():
    x, y = _leaves()
    (g,) = torch.autograd.grad(_sq(x, y).sum(), (x,), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()
    v = _sq(x, y)
    v.sum().backward(retain_graph=True)
    first = x.grad.clone()
    x.grad.zero_()  # must not change what the second backward hands on
    v.sum().backward()
    torch.testing.assert_close(x.grad, first)


def test_registered_op_checks_with_opcheck():
    x, y = _leaves()
    torch.library.opcheck(SQ.op, (x, y, 0.5, True, True))
    torch.library.opcheck(EXP.op, (x, 0.5, True))


def test_vjp_op_eager_func_and_compile():
    x, _ = _leaves()
    k = 0.5
    ref = torch.autograd.grad((k * x.exp().sum(-1) * torch.arange(1.0, 4.0)).sum(), x)[0]

    def f(a):
        want = torch.is_grad_enabled() and a.requires_grad
        return (EXP.value(a, k, want) * torch.arange(1.0, 4.0)).sum()

    torch.testing.assert_close(torch.autograd.grad(f(x), x)[0], ref)
    torch.testing.assert_close(torch.func.grad(f)(x.detach()), ref)
    cx = x.detach().clone().requires_grad_()
    torch.compile(f, fullgraph=True, backend="aot_eager")(cx).backward()
    torch.testing.assert_close(cx.grad, ref)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward of expsum"):
        g.sum().backward()


def _cumsum_impl(x: Tensor, k: int) -> Tensor:
    return x.cumsum(0) * k


PLAIN = OpDecl("seqloss_test::cumsum", _cumsum_impl, lambda x, k: torch.empty_like(x), n_diff=0)


def test_plain_op_runs_eagerly_and_compiles():
    x = torch.arange(5.0)
    ref = torch.tensor([0.0, 1.0, 3.0, 6.0, 10.0]) * 2
    torch.testing.assert_close(PLAIN(x, 2), ref)
    torch.testing.assert_close(torch.compile(lambda t: PLAIN(t, 2), fullgraph=True)(x), ref)
    torch.library.opcheck(PLAIN.op, (x, 2))


# An op with an implementation per backend: "doubled" computes 2 * sum(x**2) per row itself,
# the others get the plain implementation times 2 through a different code path.
RAN: list[str] = []


def _bk_impl(x: Tensor, backend: str, compute_grad: bool,
             validate: bool) -> tuple[Tensor, Tensor]:
    RAN.append("default")
    v = 2 * (x.detach() ** 2).sum(-1)
    return v, (4 * x.detach()) if compute_grad else x.new_empty(0)


def _bk_doubled(x, backend, compute_grad, validate):
    RAN.append("doubled")
    xd = x.detach()
    return (xd * xd).sum(-1) * 2, (xd * 4) if compute_grad else x.new_empty(0)


def _bk_fake(x, backend, compute_grad, validate):
    return x.new_empty(x.shape[:1]), torch.empty_like(x) if compute_grad else x.new_empty(0)


BK = OpDecl("seqloss_test::per_backend", _bk_impl, _bk_fake, per_backend={"doubled": _bk_doubled})


@pytest.mark.parametrize("backend", ["doubled", "plain"])
def test_per_backend_implementation_on_every_path(backend):
    x, _ = _leaves()
    want = "doubled" if backend == "doubled" else "default"
    ref_v = 2 * (x.detach() ** 2).sum(-1)
    ref_g = torch.autograd.grad((2 * (x**2).sum(-1)).sum(), x)[0]
    paths = {
        "eager": lambda a: torch.autograd.grad(BK.value(a, backend, True, True).sum(), a)[0],
        "no grad": lambda a: BK.value(a.detach(), backend, False, True),
        "torch.func": lambda a: torch.func.grad(
            lambda b: BK.value(b, backend, True, True).sum())(a.detach()),
    }
    for name, fn in paths.items():
        RAN.clear()
        out = fn(x)
        assert RAN == [want], (name, RAN)
        torch.testing.assert_close(out, ref_v if name == "no grad" else ref_g)
    torch._dynamo.reset()
    RAN.clear()
    compiled = torch.compile(lambda a: BK.value(a, backend, True, True).sum(), fullgraph=True,
                             backend="aot_eager")
    cx = x.detach().clone().requires_grad_()
    compiled(cx).backward()
    assert want in RAN and set(RAN) == {want}, RAN  # the registered op chose it too
    torch.testing.assert_close(cx.grad, ref_g)
    torch.library.opcheck(BK.op, (x, backend, True, True))


def test_per_backend_needs_a_loss_like_op():
    with pytest.raises(ValueError, match="per_backend"):
        OpDecl("seqloss_test::per_backend_vjp", _mm_impl, _mm_fake, vjp=_mm_vjp,
               per_backend={"x": _mm_impl})
