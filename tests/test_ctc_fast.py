"""CTC's eager CPU fast lane (``seqloss.ctc.fast``) against the general path.

The lane takes the common small call (CPU float32/float64 tensors, int64 tensor
targets and lengths, the Numba backend, a batch the calling thread runs); anything
else takes the general path. Both must give the same bits, the same errors and the
same autograd semantics; the general path is checked against the float64 reference
and brute force elsewhere (``test_ctc.py``), and here once more directly.
"""

from __future__ import annotations

import pytest
import torch

import seqloss
from seqloss import InputError
from seqloss.ctc import fast

pytest.importorskip("numba")


def _inputs(T=12, B=3, C=6, L=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=dtype)
    tg = torch.randint(1, C, (B, L), generator=g)
    il = torch.randint(max(1, T - 3), T + 1, (B,), generator=g)
    tl = torch.randint(1, L + 1, (B,), generator=g)
    return x, tg, il, tl


def _both(x, tg, il, tl, **kw):
    """(loss, grad) through the lane and through the general path (lengths as lists)."""
    out = []
    for lane in (True, False):
        lp = x.detach().clone().requires_grad_()
        a, b = (il, tl) if lane else (il.tolist(), tl.tolist())
        if lane:
            assert fast.ctc_fast(lp, tg, il, tl, kw.get("blank", 0), kw.get("reduction", "mean"),
                                 kw.get("zero_infinity", False), kw.get("fused_log_softmax", False),
                                 "auto", True) is not None, "the lane was not taken"
        loss = seqloss.ctc_loss(lp, tg, a, b, **kw)
        (g,) = torch.autograd.grad(loss.sum(), lp)
        out.append((loss, g))
    return out


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lane_matches_general_path_bit_for_bit(reduction, fused, dtype):
    x, tg, il, tl = _inputs(dtype=dtype)
    if not fused:
        x = x.log_softmax(-1)
    (l1, g1), (l2, g2) = _both(x, tg, il, tl, reduction=reduction, fused_log_softmax=fused)
    assert l1.dtype == l2.dtype == dtype and g1.dtype == dtype
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    ref = seqloss.ctc_loss(x.double(), tg, il, tl, reduction=reduction, fused_log_softmax=fused,
                           backend="reference")
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(l1.double(), ref, rtol=tol, atol=tol)


def test_lane_layouts_targets_and_zero_infinity():
    x, tg, il, tl = _inputs(T=10, B=4, C=5, L=6, seed=3)
    lp = x.log_softmax(-1)
    # (B, T, C) transposed, the common model layout: the gradient keeps it
    bt = lp.transpose(0, 1).contiguous().transpose(0, 1)
    (l1, g1), (l2, g2) = _both(bt, tg, il, tl, reduction="sum")
    assert torch.equal(l1, l2) and torch.equal(g1, g2) and g1.stride() == bt.stride()
    # concatenated 1-D targets
    cat = torch.cat([tg[b, : tl[b]] for b in range(4)])
    (l1, g1), (l2, g2) = _both(lp, cat, il, tl, reduction="none")
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    # an infeasible sequence (too few frames): inf, or 0 with zero_infinity
    il2 = il.clone()
    il2[1] = 2
    for zi in (False, True):
        (l1, g1), (l2, g2) = _both(lp, tg, il2, tl, reduction="none", zero_infinity=zi)
        assert torch.equal(l1, l2) and torch.equal(g1, g2)
        assert (l1[1] == 0) if zi else torch.isinf(l1[1])
        assert torch.count_nonzero(g1[:, 1]) == 0


def test_lane_is_skipped_where_it_does_not_apply():
    x, tg, il, tl = _inputs()
    lp = x.log_softmax(-1)
    args = (0, "mean", False, False, "auto", True)
    assert fast.ctc_fast(lp, tg, il, tl, *args) is not None
    skipped = [
        (lp.half(), tg, il, tl),  # half: converted on the general path
        (lp, tg.int(), il, tl),  # int32 ids
        (lp, tg, il.int(), tl),  # int32 lengths
        (lp, tg, il.tolist(), tl),  # lists
        (torch.cat([lp, lp], -1)[:, :, : lp.shape[2]], tg, il, tl),  # neither layout dense
        (lp[0], tg[0], il[0], tl[0]),  # unbatched
    ]
    for case in skipped:
        assert fast.ctc_fast(*case, *args) is None
    assert fast.ctc_fast(lp, tg, il, tl, 0, "mean", False, False, "reference", True) is None
    assert fast.ctc_fast(lp, tg, il, tl, 0, "average", False, False, "auto", True) is None


def test_lane_follows_the_backend_environment(monkeypatch):
    x, tg, il, tl = _inputs()
    lp = x.log_softmax(-1)
    args = (0, "mean", False, False, "auto", True)
    for env, taken in (("reference", False), ("numba", True), ("auto", True), ("", True)):
        monkeypatch.setenv("SEQLOSS_BACKEND", env)
        assert (fast.ctc_fast(lp, tg, il, tl, *args) is not None) == taken, env


def test_lane_autograd_semantics():
    x, tg, il, tl = _inputs()
    lp = x.log_softmax(-1).detach().requires_grad_()
    # autograd.grad: a plain tensor
    (g,) = torch.autograd.grad(seqloss.ctc_loss(lp, tg, il, tl), lp)
    assert not g.requires_grad and g.grad_fn is None
    # retain_graph, then zeroing the leaf's .grad, then a second backward: the same grad
    loss = seqloss.ctc_loss(lp, tg, il, tl)
    loss.backward(retain_graph=True)
    first = lp.grad.clone()
    lp.grad.zero_()
    loss.backward()
    assert torch.equal(lp.grad, first) and torch.equal(first, g)
    # a third backward through the freed graph: torch's error, not a stale gradient
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    # a weighted backward of the per-sequence losses
    lp.grad = None
    w = torch.tensor([0.5, 2.0, -1.0])
    seqloss.ctc_loss(lp, tg, il, tl, reduction="none").backward(w)
    ref = torch.autograd.grad(seqloss.ctc_loss(lp, tg, il.tolist(), tl.tolist(), reduction="none"),
                              lp, w)[0]
    assert torch.equal(lp.grad, ref)
    # double backward: the clear error, not a silent zero
    (g2,) = torch.autograd.grad(seqloss.ctc_loss(lp, tg, il, tl), lp, create_graph=True)
    assert torch.equal(g2.detach(), g) and g2.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        (g2 ** 2).sum().backward()
    # no grad wanted: no graph
    with torch.no_grad():
        assert seqloss.ctc_loss(lp, tg, il, tl).grad_fn is None


def test_lane_value_errors_name_the_argument():
    x, tg, il, tl = _inputs(T=8, B=2, C=5, L=3)
    lp = x.log_softmax(-1)
    bad_il = torch.tensor([8, 9])
    bad_tg = tg.clone()
    bad_tg[1, 0] = 0  # the blank, inside target 1
    bad_tl = torch.tensor([3, 4])
    cases = (((tg, bad_il, tl), "input_lengths"), ((bad_tg, il, torch.tensor([3, 3])), "targets"),
             ((tg, il, bad_tl), "target_lengths"))
    for args, what in cases:
        with pytest.raises(InputError, match=what):
            seqloss.ctc_loss(lp, *args)


def test_lane_under_compile_and_functorch():
    x, tg, il, tl = _inputs()
    lp = x.log_softmax(-1)
    eager = seqloss.ctc_loss(lp, tg, il, tl)
    compiled = torch.compile(lambda a: seqloss.ctc_loss(a, tg, il, tl), fullgraph=True)
    torch.testing.assert_close(compiled(lp), eager)
    g = torch.func.grad(lambda a: seqloss.ctc_loss(a, tg, il, tl))(lp)
    ref = torch.autograd.grad(seqloss.ctc_loss(lp.requires_grad_(), tg, il, tl), lp)[0]
    torch.testing.assert_close(g, ref)
