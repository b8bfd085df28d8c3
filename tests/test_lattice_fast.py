"""``transducer_lattice``'s eager CPU fast lane (``seqloss.transducer.lattice.fast``).

The lane, the op declaration's ``fast`` hook, takes the common call (float32/float64 CPU
arcs with a gradient wanted, the Numba backend as dispatch resolved it); anything else
takes the general path. Both must
give the same bits, the same errors and the same autograd semantics; the general path is
checked against brute force in ``test_lattice.py``.
"""

from __future__ import annotations

import pytest
import torch

import seqloss
from seqloss.transducer.lattice import fast, op

pytest.importorskip("numba")

NAN = float("nan")


def _inputs(B=3, T=6, U=3, bd=(1, 2), ed=(0, 1), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(B, T + 1, U + 2, len(bd), generator=g, dtype=dtype)
    ae = torch.randn(B, T + 1, U + 2, len(ed), generator=g, dtype=dtype)
    il = torch.tensor([T, T - 1, 0][:B])
    tl = torch.tensor([U, 0, 2][:B])
    return ab, ae, il, tl


def _both(ab, ae, il, tl, bd, ed, can, weights=None):
    """(ll, grads) through the lane (the public function) and through the declaration's
    general path (its call ladder, which never tries the hook)."""
    out = []
    for lane in (True, False):
        a = ab.detach().clone().requires_grad_()
        e = ae.detach().clone().requires_grad_()
        if lane:
            assert fast.lattice_fast(a, e, il, tl, bd, ed, can, "numba", True, True) is not None
            ll = seqloss.transducer_lattice(a, e, il, tl, bd, ed, emit_can_end=can)
        else:
            ll = op.lattice_decl(a, e, il, tl, list(bd), list(ed), can, "numba", True, True)[0]
        w = torch.ones_like(ll) if weights is None else weights
        out.append((ll, torch.autograd.grad(ll, (a, e), w)))
    return out


@pytest.mark.parametrize(("bd", "ed", "can"), [((1,), (0,), False), ((1, 2), (0, 1), False),
                                               ((1, 3), (0, 1), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lane_matches_general_path_bit_for_bit(bd, ed, can, dtype):
    ab, ae, il, tl = _inputs(bd=bd, ed=ed, dtype=dtype)
    for w in (None, torch.tensor([0.5, -2.0, 3.0], dtype=dtype)):
        (l1, (a1, e1)), (l2, (a2, e2)) = _both(ab, ae, il, tl, bd, ed, can, w)
        assert l1.dtype == dtype and a1.dtype == dtype
        assert torch.equal(l1, l2) and torch.equal(a1, a2) and torch.equal(e1, e2)


def test_lane_poisons_like_the_general_path():
    ab, ae, il, tl = _inputs()
    ab[0, 1, 1, 0] = NAN  # read by sequence 0 only
    ae[1, 0, 0, 1] = float("inf")  # sequence 1: u = 0 = U_1, an emission no path reads
    (l1, g1), (l2, g2) = _both(ab, ae, il, tl, (1, 2), (0, 1), False)
    assert torch.isnan(l1[0]) and torch.isfinite(l1[1])
    assert torch.equal(l1.isnan(), l2.isnan()) and torch.equal(l1.nan_to_num(), l2.nan_to_num())
    for x, y in zip(g1, g2, strict=True):
        assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())


def test_lane_is_taken_only_for_the_common_call():
    ab, ae, il, tl = _inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    args = (il, tl, (1, 2), (0, 1), False)
    assert fast.lattice_fast(a, e, *args, "numba", True, True) is not None
    assert fast.lattice_fast(a, e, *args, "numba", False, True) is None  # no gradient wanted
    assert fast.lattice_fast(a.float(), e, *args, "numba", True, True) is None  # mixed dtypes
    assert fast.lattice_fast(a, e, *args, "reference", True, True) is None
    bad = torch.tensor([7, 9, 0])  # out of range: the general path raises the error
    assert fast.lattice_fast(a, e, bad, tl, *args[2:], "numba", True, True) is None
    # a large batch (the lengths read through numpy): in range, then one out of range
    ab, ae, _, _ = _inputs(B=3)
    a, e = ab.repeat(30, 1, 1, 1).requires_grad_(), ae.repeat(30, 1, 1, 1).requires_grad_()
    il, tl = torch.full((90,), 6), torch.full((90,), 3)
    assert fast.lattice_fast(a, e, il, tl, *args[2:], "numba", True, True) is not None
    tl[77] = 5  # the arcs hold U + 1 = 5 rows: U_b <= 4
    assert fast.lattice_fast(a, e, il, tl, *args[2:], "numba", True, True) is None


def test_lane_is_taken_through_dispatch(monkeypatch):
    ab, ae, il, tl = _inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    taken = []

    def spy(*args):
        out = fast.lattice_fast(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(op.lattice_decl, "fast", spy)
    for env, want in (("reference", False), ("numba", True), ("auto", True), ("", True)):
        monkeypatch.setenv("SEQLOSS_BACKEND", env)
        taken.clear()
        seqloss.transducer_lattice(a, e, il, tl, (1, 2), (0, 1))
        assert taken == [want], env
    taken.clear()
    g = torch.func.grad(lambda x: seqloss.transducer_lattice(x, ae, il, tl, (1, 2), (0, 1)).sum())
    g(ab)
    assert taken == []  # a functorch transform: the declaration's general path


def test_lane_errors_name_the_argument():
    ab, ae, il, tl = _inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    with pytest.raises(seqloss.InputError, match=r"logit_lengths\[1\] = 9 exceeds"):
        seqloss.transducer_lattice(a, e, torch.tensor([6, 9, 0]), tl, (1, 2), (0, 1))
    with pytest.raises(seqloss.InputError, match=r"target_lengths\[2\] = -1 is negative"):
        seqloss.transducer_lattice(a, e, il, torch.tensor([3, 0, -1]), (1, 2), (0, 1))
    with pytest.raises(seqloss.InputError, match=r"blank_durations\[1\] = 0"):
        seqloss.transducer_lattice(a, e, il, tl, (1, 0), (0, 1))


def test_lane_autograd_semantics():
    ab, ae, il, tl = _inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    args = (il, tl, (1, 2), (0, 1))
    ga, ge = torch.autograd.grad(seqloss.transducer_lattice(a, e, *args).sum(), (a, e))
    assert not ga.requires_grad and ga.grad_fn is None and not ge.requires_grad
    # retain_graph, zeroing the leaves' .grad, a second backward: the same gradients
    ll = seqloss.transducer_lattice(a, e, *args)
    ll.sum().backward(retain_graph=True)
    first = a.grad.clone(), e.grad.clone()
    a.grad.zero_()
    e.grad.zero_()
    ll.sum().backward()
    assert torch.equal(a.grad, first[0]) and torch.equal(e.grad, first[1])
    assert torch.equal(first[0], ga) and torch.equal(first[1], ge)
    with pytest.raises(RuntimeError, match="second time"):
        ll.sum().backward()
    # double backward: the clear error, not a silent zero
    g2 = torch.autograd.grad(seqloss.transducer_lattice(a, e, *args).sum(), (a, e),
                             create_graph=True)
    assert torch.equal(g2[0].detach(), ga) and g2[0].requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        (g2[0] ** 2).sum().backward()
    # only one input wants a gradient
    (gb,) = torch.autograd.grad(seqloss.transducer_lattice(a, ae, *args).sum(), (a,))
    assert torch.equal(gb, ga)


def test_lane_under_compile_and_functorch():
    ab, ae, il, tl = _inputs()
    args = (il, tl, (1, 2), (0, 1))
    a = ab.clone().requires_grad_()
    eager = seqloss.transducer_lattice(a, ae, *args)
    compiled = torch.compile(lambda x: seqloss.transducer_lattice(x, ae, *args), fullgraph=True)
    torch.testing.assert_close(compiled(a), eager)
    g = torch.func.grad(lambda x: seqloss.transducer_lattice(x, ae, *args).sum())(ab)
    ref = torch.autograd.grad(eager.sum(), a)[0]
    torch.testing.assert_close(g, ref)


def test_common_call_and_general_conversion_agree():
    """Exact-type arguments skip the generic conversion; anything else converts: the same
    bits, and the same errors for what the short path does not accept."""
    ab, ae, il, tl = _inputs()
    outs = []
    for lens in ((il, tl), (il.tolist(), tl.tolist()), (il.int(), tl.int())):
        a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
        ll = seqloss.transducer_lattice(a, e, *lens, (1, 2), (0, 1))
        outs.append((ll, *torch.autograd.grad(ll.sum(), (a, e))))
    for other in outs[1:]:
        for x, y in zip(outs[0], other, strict=True):
            assert torch.equal(x, y)
    with pytest.raises(TypeError, match=r"blank_durations\[1\] must be an int"):
        seqloss.transducer_lattice(ab, ae, il, tl, (1, True), (0, 1))
    with pytest.raises(seqloss.InputError, match="target_lengths"):
        seqloss.transducer_lattice(ab, ae, il, tl[:2], (1, 2), (0, 1))
