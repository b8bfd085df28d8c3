"""Every public loss inside a real training loop: inductor, autocast, retain_graph.

Each case is a function of one float32 leaf ``x`` (the output of a model) returning a
scalar loss, on the CPU backend. ``torch.compile`` with inductor (``fullgraph=True``
except for the eager-only functions in ``GRAPH_BREAKS``) must give eager's values and
gradients; under ``torch.autocast("cpu", bfloat16)`` the model's output arrives in
bfloat16 and the loss must be float32, finite, and close to float32's on the same rounded
values; ``retain_graph`` must allow a second backward that adds the same gradient.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import seqloss
from seqloss._core.distributed import distributed_mean
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
    """(CTC and RNN-T on inductor: ``test_fidelity.py``.)"""
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
