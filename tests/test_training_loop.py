"""Every public loss inside a real training loop: inductor, autocast, retain_graph, torch.func.

Each case is a function of one float32 leaf ``x`` (the output of a model) returning a
scalar loss, on the CPU backend. ``torch.compile`` with inductor (``fullgraph=True``
except for the eager-only functions in ``GRAPH_BREAKS``) must give eager's values and
gradients; under ``torch.autocast("cpu", bfloat16)`` the model's output arrives in
bfloat16 and the loss must be float32, finite, and close to float32's on the same rounded
values; ``retain_graph`` must allow a second backward that adds the same gradient.
CTC and RNN-T are also checked on every backend: the gradient ``autograd.grad`` and
``torch.func`` return is a plain tensor equal to brute force's, a double backward raises,
TorchScript says it is unsupported; ``grad_clamp`` clamps the gradient it passes on.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from conftest import ctc_batch, device_for, rnnt_batch

import seqloss
from seqloss import InputError
from seqloss._core.distributed import distributed_mean
from seqloss.testing import brute_force_ctc, brute_force_rnnt
from seqloss.transducer.arc_logprobs import transducer_arc_logprobs
from seqloss.transducer.hat import hat_loss, hat_loss_from_joint

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")

B, T, U, V = 3, 6, 3, 9
TG = torch.tensor([[1, 2, 3], [2, 3, 1], [3, 1, 2]])  # no repeats: CTC feasible in 4 frames
IL, TL = torch.tensor([6, 5, 4]), torch.tensor([3, 2, 3])


def _ctc(x):  # x (B, T, V): a transposed (T, B, V) view, as models give
    return seqloss.ctc_loss(x.log_softmax(-1).transpose(0, 1), TG, IL, TL)


def _ctc_fused(x):
    return seqloss.ctc_loss(x.transpose(0, 1), TG, IL, TL, fused_log_softmax=True)


def _joint(x):  # (B, T, V) -> (B, T, U+1, V) logits
    return x[:, :, None, :] + x[:, : U + 1, None, :].transpose(1, 2) * 0.5


def _rnnt(x):
    return seqloss.rnnt_loss(_joint(x), TG, IL, TL, clamp=0.5)


# The packed rows' positions in the padded joint (the model packs; not the loss's part).
ROWS = torch.cat([((b * T + torch.arange(int(IL[b]))[:, None]) * (U + 1)
                   + torch.arange(int(TL[b]) + 1)).reshape(-1) for b in range(B)])


def _packed(x):
    rows = _joint(x).reshape(-1, V)[ROWS]
    return seqloss.rnnt_loss_packed(rows, TG, IL, TL, reduction="sum")


def _multiblank(x):
    return seqloss.multiblank_rnnt_loss(_joint(x), TG, IL, TL, [2, 3], reduction="mean_volume")


def _tdt(x):
    return seqloss.tdt_loss(_joint(x), TG, IL, TL, [0, 1, 2], blank=5, omega=0.2)


def _tdt_pair(x):
    j = _joint(x)
    return seqloss.tdt_loss((j[..., :6], j[..., 6:]), TG, IL, TL, [0, 1, 2], blank=5)


def _lattice(x):
    j = _joint(x).log_softmax(-1)
    return -seqloss.transducer_lattice(j[..., :2], j[..., 2:4], IL, TL, (1, 2), (0, 1)).sum()


def _logmmexp(x):
    # Not a loss: the result has the input's dtype (bfloat16 under autocast).
    return seqloss.logmmexp(x, x.transpose(1, 2)).float().logsumexp((-1, -2)).sum()


def _simple(x):
    return seqloss.rnnt_loss_simple(x[:, : U + 1] * 0.5, x, TG, 0)


def _smoothed(x):
    return seqloss.rnnt_loss_smoothed(x[:, : U + 1] * 0.5, x, TG, 0, rnnt_type="modified")


RANGES = (torch.stack([torch.clamp(torch.arange(T) // 2, max=U - 1)] * B)[..., None]
          + torch.arange(2))


def _pruned(x):
    am, lm = seqloss.do_rnnt_pruning(x, x[:, : U + 1] * 0.5, RANGES)
    return seqloss.rnnt_loss_pruned(am + lm, TG, RANGES, 0)


def _from_joint(x):
    return seqloss.rnnt_loss_from_joint(x, x[:, : U + 1] * 0.5,
                                        lambda e, p: e[:, :, None] + p[:, None], TG, IL, TL)


def _ctc_dp(x):
    return seqloss.ctc_loss(x.log_softmax(-1).transpose(0, 1), TG, IL, TL, delay_penalty=0.3)


def _rnnt_dp(x):
    return seqloss.rnnt_loss(_joint(x), TG, IL, TL, blank=0, delay_penalty=0.3)


def _multiblank_dp(x):
    return seqloss.multiblank_rnnt_loss(_joint(x), TG, IL, TL, [2, 3], delay_penalty=-0.2)


def _tdt_dp(x):
    return seqloss.tdt_loss(_joint(x), TG, IL, TL, [0, 1, 2], blank=5, delay_penalty=0.3)


def _pruned_hat(x):
    am, lm = seqloss.do_rnnt_pruning(x, x[:, : U + 1] * 0.5, RANGES)
    return seqloss.rnnt_loss_pruned(am + lm, TG, RANGES, 0, use_hat_loss=True)


def _hat(x):
    return hat_loss(_joint(x), TG, IL, TL, clamp=0.5, delay_penalty=0.3)


def _hat_from_joint(x):
    return hat_loss_from_joint(x, x[:, : U + 1] * 0.5, lambda e, p: e[:, :, None] + p[:, None],
                               TG, IL, TL, blank=0, delay_penalty=-0.2)


def _finite_sum(*outs):
    """A scalar from arc log-probabilities: undefined arcs are ``-inf`` (never a NaN gradient:
    the masked branch gets exactly zero)."""
    return sum(o.masked_fill(o == float("-inf"), 0.0).float().sum() for o in outs)


def _arc_logprobs(x):
    return _finite_sum(*transducer_arc_logprobs(_joint(x), TG, IL, TL, blank=-4))


def _distributed_mean(x):
    losses = seqloss.rnnt_loss(_joint(x), TG, IL, TL, reduction="none")
    return distributed_mean(losses, TL)


CASES = {f.__name__[1:]: f for f in (_ctc, _ctc_fused, _rnnt, _packed, _multiblank, _tdt,
                                     _tdt_pair, _lattice, _logmmexp, _simple, _smoothed,
                                     _pruned, _from_joint, _ctc_dp, _rnnt_dp, _multiblank_dp,
                                     _tdt_dp, _pruned_hat, _hat, _hat_from_joint,
                                     _arc_logprobs, _distributed_mean)}
# Eager by design: the joint is re-run in the backward (the from-joint losses), the rows
# are recomputed by tiles (HAT, arc log-probabilities), or a collective runs (distributed_mean).
GRAPH_BREAKS = {"from_joint", "hat_from_joint", "arc_logprobs", "distributed_mean"}


def _x(dtype=torch.float32):
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(1), dtype=dtype)


def _value_and_grad(f, x):
    x = x.detach().clone().requires_grad_()
    loss = f(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("ctc", "rnnt")])
def test_inductor_matches_eager(name):
    """(CTC and RNN-T on inductor: ``test_inductor_compile_*`` below.)"""
    f = CASES[name]
    torch._dynamo.reset()
    cf = torch.compile(f, backend="inductor", fullgraph=name not in GRAPH_BREAKS)
    want = _value_and_grad(f, _x())
    got = _value_and_grad(cf, _x())
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_bfloat16_autocast(name):
    """A model's output under autocast (a Linear: bfloat16) into the loss."""
    f = CASES[name]
    lin = torch.nn.Linear(V, V)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(V))
        lin.bias.zero_()
    x = _x().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
        assert y.dtype == torch.bfloat16
        loss = f(y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(lin.weight.grad).all()
    want, gw = _value_and_grad(f, x.detach().bfloat16().float())
    torch.testing.assert_close(loss.detach(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(x.grad, gw, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("name", list(CASES))
def test_retain_graph_second_backward(name):
    f = CASES[name]
    x = _x().requires_grad_()
    loss = f(x)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first, rtol=1e-6, atol=1e-7)


# The same losses with their differentiable inputs as leaves (what torch's own CTC tests
# do): the gradient a backward hands on becomes the leaf's ``.grad`` itself, so it must be
# a plain tensor that a user may zero, and never the op's saved one while the graph is kept.
def _leaf(*shape):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g).requires_grad_()


def _joint_leaf(v=V):
    return _joint(_leaf(B, T, v)).detach().requires_grad_()


LEAF_CASES = {
    "ctc": lambda: ((_leaf(T, B, V).log_softmax(-1).detach().requires_grad_(),),
                    lambda lp: seqloss.ctc_loss(lp, TG, IL, TL)),
    "ctc_fused": lambda: ((_leaf(T, B, V),),
                          lambda x: seqloss.ctc_loss(x, TG, IL, TL, fused_log_softmax=True)),
    "rnnt": lambda: ((_joint_leaf(),), lambda j: seqloss.rnnt_loss(j, TG, IL, TL)),
    "packed": lambda: ((_joint_leaf().reshape(-1, V)[ROWS].detach().requires_grad_(),),
                       lambda r: seqloss.rnnt_loss_packed(r, TG, IL, TL, reduction="sum")),
    "multiblank": lambda: ((_joint_leaf(),),
                           lambda j: seqloss.multiblank_rnnt_loss(j, TG, IL, TL, [2, 3])),
    "tdt": lambda: ((_joint_leaf(),), lambda j: seqloss.tdt_loss(j, TG, IL, TL, [0, 1, 2],
                                                                  blank=5)),
    "tdt_pair": lambda: ((_joint_leaf(6), _joint_leaf(3)),
                         lambda a, d: seqloss.tdt_loss((a, d), TG, IL, TL, [0, 1, 2], blank=5)),
    "lattice": lambda: ((_joint_leaf(2).log_softmax(-1).detach().requires_grad_(),
                         _joint_leaf(2).log_softmax(-1).detach().requires_grad_()),
                        lambda a, e: -seqloss.transducer_lattice(a, e, IL, TL, (1, 2),
                                                                 (0, 1)).sum()),
    "logmmexp": lambda: ((_leaf(B, T, V), _leaf(B, V, 5)),
                         lambda a, b: seqloss.logmmexp(a, b).logsumexp((-1, -2)).sum()),
    "simple": lambda: ((_leaf(B, U + 1, V), _leaf(B, T, V)),
                       lambda lm, am: seqloss.rnnt_loss_simple(lm, am, TG, 0)),
    "smoothed": lambda: ((_leaf(B, U + 1, V), _leaf(B, T, V)),
                         lambda lm, am: seqloss.rnnt_loss_smoothed(lm, am, TG, 0,
                                                                   rnnt_type="modified")),
    "pruned": lambda: ((_leaf(B, T, 2, V),),
                       lambda lg: seqloss.rnnt_loss_pruned(lg, TG, RANGES, 0)),
    "from_joint": lambda: ((_leaf(B, T, V), _leaf(B, U + 1, V)),
                           lambda e, p: seqloss.rnnt_loss_from_joint(
                               e, p, lambda a, b: a[:, :, None] + b[:, None], TG, IL, TL)),
    "ctc_dp": lambda: ((_leaf(T, B, V).log_softmax(-1).detach().requires_grad_(),),
                       lambda lp: seqloss.ctc_loss(lp, TG, IL, TL, delay_penalty=0.3)),
    "rnnt_dp": lambda: ((_joint_leaf(),),
                        lambda j: seqloss.rnnt_loss(j, TG, IL, TL, blank=0, delay_penalty=0.3)),
    "multiblank_dp": lambda: ((_joint_leaf(),),
                              lambda j: seqloss.multiblank_rnnt_loss(j, TG, IL, TL, [2, 3],
                                                                     delay_penalty=-0.2)),
    "tdt_dp": lambda: ((_joint_leaf(),),
                       lambda j: seqloss.tdt_loss(j, TG, IL, TL, [0, 1, 2], blank=5,
                                                  delay_penalty=0.3)),
    "pruned_hat": lambda: ((_leaf(B, T, 2, V),),
                           lambda lg: seqloss.rnnt_loss_pruned(lg, TG, RANGES, 0,
                                                               use_hat_loss=True)),
    "hat": lambda: ((_joint_leaf(),),
                    lambda j: hat_loss(j, TG, IL, TL, clamp=0.5, delay_penalty=0.3)),
    "hat_from_joint": lambda: ((_leaf(B, T, V), _leaf(B, U + 1, V)),
                               lambda e, p: hat_loss_from_joint(
                                   e, p, lambda a, b: a[:, :, None] + b[:, None], TG, IL, TL,
                                   blank=0, delay_penalty=-0.2)),
    "arc_logprobs": lambda: ((_joint_leaf(),),
                             lambda j: _finite_sum(*transducer_arc_logprobs(j, TG, IL, TL,
                                                                            blank=-4))),
    "distributed_mean": lambda: ((_leaf(B),), lambda v: distributed_mean(v * v, TL)),
}
# torch.func cannot trace a backward that re-runs the joint: these raise a clear error.
FUNC_UNSUPPORTED = ("from_joint", "hat_from_joint")
@pytest.mark.parametrize("name", list(LEAF_CASES))
def test_leaf_grads_are_plain_and_survive_zeroing(name):
    leaves, f = LEAF_CASES[name]()
    want = torch.autograd.grad(f(*leaves), leaves)
    for g in want:
        assert not g.requires_grad and g.grad_fn is None
        g.numpy()  # a plain CPU tensor
    loss = f(*leaves)
    loss.backward(retain_graph=True)
    first = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad.zero_()
    loss.backward()
    for x, g1, g in zip(leaves, first, want, strict=True):
        assert torch.equal(x.grad, g1), name
        torch.testing.assert_close(g1, g, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", [n for n in LEAF_CASES if n not in FUNC_UNSUPPORTED])
def test_torch_func_grad_matches_autograd(name):
    leaves, f = LEAF_CASES[name]()
    rest = [x.detach() for x in leaves[1:]]
    (want,) = torch.autograd.grad(f(leaves[0], *rest), leaves[0])
    try:
        got = torch.func.grad(lambda x: f(x, *rest))(leaves[0].detach())
    except NotImplementedError as e:  # unsupported is allowed if it says so
        assert "torch.func" in str(e), str(e)
        return
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", FUNC_UNSUPPORTED)
def test_torch_func_on_a_loss_from_the_joint_says_unsupported(name):
    leaves, f = LEAF_CASES[name]()
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.grad(lambda x: f(x, leaves[1].detach()))(leaves[0].detach())


def test_hat_loss_compiles_without_graph_break():
    torch._dynamo.reset()
    cf = torch.compile(CASES["hat"], backend="inductor", fullgraph=True)
    got = _value_and_grad(cf, _x())
    want = _value_and_grad(CASES["hat"], _x())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# CTC and RNN-T across backends: compiled, differentiated by autograd.grad and torch.func,
# backward twice, double backward; the oracles are eager, brute force and torch's CTC.
def _brute_ctc_grad(lp, tg, il, tl, reduction):
    """The gradient of the reduced CTC loss w.r.t. log-probs ``(T, B, C)``, by brute force."""
    w = 1.0 / tl.clamp(min=1).double() / len(tl) if reduction == "mean" else torch.ones(len(tl))
    out = torch.zeros_like(lp)
    for b in range(len(tl)):
        xb = lp[: il[b], b].clone().requires_grad_()
        (gb,) = torch.autograd.grad(brute_force_ctc(xb, tg[b, : tl[b]].tolist()) * w[b], xb)
        out[: il[b], b] = gb
    return out


def _ctc_inputs(T, B=2, C=5, S=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g)
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.tensor([T, T - 1])
    tl = torch.tensor([S, S - 1])
    return x, tg, il, tl


@pytest.mark.parametrize("fused", [False, True], ids=["log_softmax", "fused"])
def test_inductor_compile_transposed_ctc_matches_eager(fused):
    torch._dynamo.reset()
    x0, tg, il, tl = ctc_batch(T=9, B=3, C=6, layout="btc")
    x0 = x0.float()

    def f(x):
        y = x if fused else x.log_softmax(-1)
        return seqloss.ctc_loss(y.transpose(0, 1), tg, il, tl, fused_log_softmax=fused)

    x1, x2 = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    a = torch.compile(f, backend="inductor")(x1)
    a.backward()
    b = f(x2)
    b.backward()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-7)


def test_inductor_compile_noncontiguous_rnnt_matches_eager():
    torch._dynamo.reset()
    x0, tg, il, tl = rnnt_batch(B=2, T=4, U=2, V=5)
    x0 = x0.float()

    def f(x):  # a (B, U+1, T, V) model output, transposed to the loss's layout
        return seqloss.rnnt_loss(x.transpose(1, 2), tg, il, tl)

    base = x0.transpose(1, 2).contiguous()
    x1, x2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    a = torch.compile(f, backend="inductor")(x1)
    a.backward()
    b = f(x2)
    b.backward()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-7)


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


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_autograd_grad_is_plain_tensor_ctc(ctc_backend, reduction):
    x, tg, il, tl = ctc_batch()
    x = x.log_softmax(-1).to(device_for(ctc_backend)).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction=reduction, backend=ctc_backend)
    (g,) = torch.autograd.grad(loss, x)
    assert not g.requires_grad and g.grad_fn is None
    g.cpu().numpy()  # fails on a tensor attached to the graph
    torch.testing.assert_close(g.cpu(), _brute_ctc_grad(x.detach().cpu(), tg, il, tl, reduction),
                               rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_autograd_grad_is_plain_tensor_rnnt(rnnt_backend, reduction):
    x, tg, il, tl = rnnt_batch()
    x = x.to(device_for(rnnt_backend)).requires_grad_()
    loss = seqloss.rnnt_loss(x, tg, il, tl, reduction=reduction, backend=rnnt_backend)
    (g,) = torch.autograd.grad(loss, x)
    assert not g.requires_grad and g.grad_fn is None
    g.cpu().numpy()
    w = 1.0 / len(tl) if reduction == "mean" else 1.0
    for b in range(len(tl)):
        xb = x.detach()[b, : il[b], : tl[b] + 1].cpu().clone().requires_grad_()
        ref = brute_force_rnnt(xb.log_softmax(-1), tg[b, : tl[b]].tolist(), blank=x.shape[-1] - 1)
        (gb,) = torch.autograd.grad(ref * w, xb)
        torch.testing.assert_close(g[b, : il[b], : tl[b] + 1].cpu(), gb, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_retain_graph_zero_grad_backward_again_ctc(ctc_backend, reduction):
    x, tg, il, tl = ctc_batch()
    x = x.log_softmax(-1).to(device_for(ctc_backend)).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction=reduction, backend=ctc_backend)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    x.grad.zero_()
    loss.backward()
    torch.testing.assert_close(x.grad, first, rtol=0, atol=0)
    torch.testing.assert_close(first.cpu(),
                               _brute_ctc_grad(x.detach().cpu(), tg, il, tl, reduction),
                               rtol=1e-9, atol=1e-10)


def test_retain_graph_zero_grad_backward_again_rnnt(rnnt_backend):
    x, tg, il, tl = rnnt_batch()
    x = x.to(device_for(rnnt_backend)).requires_grad_()
    loss = seqloss.rnnt_loss(x, tg, il, tl, backend=rnnt_backend)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    x.grad.zero_()
    loss.backward()
    torch.testing.assert_close(x.grad, first, rtol=0, atol=0)
    b = 0
    xb = x.detach()[b, : il[b], : tl[b] + 1].cpu().clone().requires_grad_()
    ref = brute_force_rnnt(xb.log_softmax(-1), tg[b, : tl[b]].tolist(), blank=x.shape[-1] - 1)
    (gb,) = torch.autograd.grad(ref / len(tl), xb)
    torch.testing.assert_close(first[b, : il[b], : tl[b] + 1].cpu(), gb, rtol=1e-9, atol=1e-10)


def test_leaf_grad_without_retain_graph_is_usable():
    # The hand-off path (no retained graph): .grad is an ordinary tensor the user owns.
    x, tg, il, tl = ctc_batch()
    x = x.log_softmax(-1).requires_grad_()
    seqloss.ctc_loss(x, tg, il, tl).backward()
    g = x.grad.clone()
    x.grad.zero_()
    seqloss.ctc_loss(x, tg, il, tl).backward()
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)


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


@pytest.mark.parametrize("module", [seqloss.CTCLoss, seqloss.RNNTLoss])
def test_torchscript_says_unsupported(module):
    with pytest.raises(NotImplementedError, match="TorchScript"):
        torch.jit.script(module())


def test_torch_func_grad_ctc_and_rnnt():
    x, tg, il, tl = ctc_batch()
    g = torch.func.grad(lambda z: seqloss.ctc_loss(z.log_softmax(-1), tg, il, tl))(x)
    y = x.clone().requires_grad_()
    F.ctc_loss(y.log_softmax(-1), tg, il, tl).backward()
    torch.testing.assert_close(g, y.grad, rtol=1e-9, atol=1e-12)

    x, tg, il, tl = rnnt_batch()
    g = torch.func.grad(lambda z: seqloss.rnnt_loss(z, tg, il, tl, reduction="sum"))(x)
    xs = x.clone().requires_grad_()
    w = sum(brute_force_rnnt(xs[b, : il[b], : tl[b] + 1].log_softmax(-1), tg[b, : tl[b]].tolist(),
                             blank=3) for b in range(2))
    (gw,) = torch.autograd.grad(w, xs)
    torch.testing.assert_close(g, gw, rtol=1e-9, atol=1e-12)

    # grad_clamp is an identity whose backward clamps: d/dx sum(grad_clamp(3x)^2 / 2)
    # = 3 * clamp(9x, -1, 1).
    z = torch.linspace(-1, 1, 7, dtype=torch.float64)
    gz = torch.func.grad(lambda t: (seqloss.grad_clamp(3 * t, 1.0) ** 2).sum() / 2)(z)
    torch.testing.assert_close(gz, 3 * (9 * z).clamp(-1, 1))


def test_torch_func_vjp_per_sequence_weights():
    # README: torch.func.grad/vjp work. A weighted cotangent of the per-sequence losses.
    x, tg, il, tl = ctc_batch()
    w = torch.tensor([0.5, -2.0, 3.0], dtype=x.dtype)
    loss, vjp = torch.func.vjp(
        lambda z: seqloss.ctc_loss(z.log_softmax(-1), tg, il, tl, reduction="none"), x)
    (g,) = vjp(w)
    y = x.clone().requires_grad_()
    want = F.ctc_loss(y.log_softmax(-1), tg, il, tl, reduction="none")
    want.backward(w)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g, y.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("form", ["sum", "sum_x2", "vector_ones", "vector_mixed", "scalar_half"])
def test_incoming_gradient_forms_scale_the_saved_one(form):
    """The backward hands the saved gradient on only for an incoming gradient of ones
    (a 0-stride expand from ``sum``, a vector, a scalar), and scales it otherwise."""
    x, tg, il, tl = rnnt_batch(B=3)
    x = x.requires_grad_()
    per_seq = torch.stack([
        brute_force_rnnt(x[b, : il[b], : tl[b] + 1].log_softmax(-1), tg[b, : tl[b]].tolist(),
                         blank=x.shape[-1] - 1) for b in range(3)])
    ab = torch.randn(3, 4, 3, 1, dtype=torch.float64).requires_grad_()
    ae = torch.randn(3, 4, 3, 1, dtype=torch.float64).requires_grad_()
    lil, ltl = torch.tensor([4, 3, 2]), torch.tensor([2, 1, 2])
    for loss_fn, ref_fn, leaves in (
        (lambda: seqloss.rnnt_loss(x, tg, il, tl, reduction="none", backend="numba"),
         lambda: per_seq, (x,)),
        (lambda: seqloss.transducer_lattice(ab, ae, lil, ltl, backend="numba"),
         lambda: seqloss.transducer_lattice(ab, ae, lil, ltl, backend="reference"), (ab, ae)),
    ):
        def reduce(v):
            if form == "sum":
                return v.sum()
            if form == "sum_x2":
                return v.sum() * 2
            if form == "vector_ones":
                return (v * torch.ones(3, dtype=v.dtype)).sum()
            if form == "vector_mixed":
                return (v * torch.tensor([1.0, 3.0, 1.0], dtype=v.dtype)).sum()
            return v[1] * 0.5
        got = torch.autograd.grad(reduce(loss_fn()), leaves)
        want = torch.autograd.grad(reduce(ref_fn()), leaves)
        for g, w in zip(got, want, strict=True):
            assert g.grad_fn is None
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


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
