"""The eager CPU fast lanes (the op declaration's ``fast`` hook) against the general path.

A lane takes the common call and hands anything else to the general path (the
declaration's call ladder, which never tries the hook). Both must give the same bits,
the same errors and the same autograd semantics; the general path is checked against
the float64 reference and brute force in each family's file, and here once more directly.

- CTC (``seqloss.ctc.fast``): CPU float32/float64 tensors, int64 tensor targets and
  lengths, the Numba backend, a batch the calling thread runs.
- ``transducer_lattice`` (``seqloss.transducer.lattice.fast``): float32/float64 CPU arcs
  with a gradient wanted, the Numba backend as dispatch resolved it.
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

import seqloss
from seqloss import InputError
from seqloss._core.dispatch import resolve_backend
from seqloss._core.lanes import cpu_backend
from seqloss.ctc import fast as ctc_fast_module
from seqloss.ctc.op import ctc_fast, ctc_loss_decl
from seqloss.transducer.lattice import fast, op

pytest.importorskip("numba")
from seqloss.ctc import numba_cpu


# ------------------------------------------------------------------ CTC
def _ctc_inputs(T=12, B=3, C=6, L=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=dtype)
    tg = torch.randint(1, C, (B, L), generator=g)
    il = torch.randint(max(1, T - 3), T + 1, (B,), generator=g)
    tl = torch.randint(1, L + 1, (B,), generator=g)
    return x, tg, il, tl


@pytest.fixture
def lane_calls(monkeypatch):
    """The calls the lane took (``fast.ctc_lane``, the Numba backend's ``ctc_loss_lane``,
    returned a result)."""
    calls = []
    real = numba_cpu.ctc_loss_lane

    def spy(*args):
        out = real(*args)
        if out is not None:
            calls.append(args[0].shape)
        return out

    monkeypatch.setattr(ctc_fast_module, "ctc_lane", spy)
    return calls


def _general(monkeypatch, fn):
    """``fn()`` with the declaration's fast hook removed: the general path alone."""
    with monkeypatch.context() as m:
        m.setattr(ctc_loss_decl, "fast", None)
        return fn()


def _ctc_both(x, tg, il, tl, lane_calls, monkeypatch, **kw):
    """(loss, grad) through the lane and through the general path."""
    out = []
    for lane in (True, False):
        lp = x.detach().clone().requires_grad_()

        def call(lp=lp):
            loss = seqloss.ctc_loss(lp, tg, il, tl, **kw)
            return loss, torch.autograd.grad(loss.sum(), lp)[0]

        n = len(lane_calls)
        out.append(call() if lane else _general(monkeypatch, call))
        assert len(lane_calls) == n + lane, "the lane was not taken" if lane else "it was"
    return out


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ctc_lane_matches_general_path_bit_for_bit(reduction, fused, dtype, lane_calls,
                                               monkeypatch):
    x, tg, il, tl = _ctc_inputs(dtype=dtype)
    if not fused:
        x = x.log_softmax(-1)
    (l1, g1), (l2, g2) = _ctc_both(x, tg, il, tl, lane_calls, monkeypatch, reduction=reduction,
                               fused_log_softmax=fused)
    assert l1.dtype == l2.dtype == dtype and g1.dtype == dtype
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    ref = seqloss.ctc_loss(x.double(), tg, il, tl, reduction=reduction, fused_log_softmax=fused,
                           backend="reference")
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(l1.double(), ref, rtol=tol, atol=tol)


def test_ctc_lane_layouts_targets_and_zero_infinity(lane_calls, monkeypatch):
    x, tg, il, tl = _ctc_inputs(T=10, B=4, C=5, L=6, seed=3)
    lp = x.log_softmax(-1)
    # (B, T, C) transposed, the common model layout: the gradient keeps it
    bt = lp.transpose(0, 1).contiguous().transpose(0, 1)
    (l1, g1), (l2, g2) = _ctc_both(bt, tg, il, tl, lane_calls, monkeypatch, reduction="sum")
    assert torch.equal(l1, l2) and torch.equal(g1, g2) and g1.stride() == bt.stride()
    # concatenated 1-D targets
    cat = torch.cat([tg[b, : tl[b]] for b in range(4)])
    (l1, g1), (l2, g2) = _ctc_both(lp, cat, il, tl, lane_calls, monkeypatch, reduction="none")
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    # an infeasible sequence (too few frames): inf, or 0 with zero_infinity
    il2 = il.clone()
    il2[1] = 2
    for zi in (False, True):
        (l1, g1), (l2, g2) = _ctc_both(lp, tg, il2, tl, lane_calls, monkeypatch, reduction="none",
                                   zero_infinity=zi)
        assert torch.equal(l1, l2) and torch.equal(g1, g2)
        assert (l1[1] == 0) if zi else torch.isinf(l1[1])
        assert torch.count_nonzero(g1[:, 1]) == 0


def test_ctc_lane_is_the_declarations_hook_and_skips_what_it_does_not_take(lane_calls,
                                                                        monkeypatch):
    assert ctc_loss_decl.fast is ctc_fast
    x, tg, il, tl = _ctc_inputs()
    lp = x.log_softmax(-1)
    # Converted by the general checks, then taken by the hook (the op's own arguments)
    converted = [(lp, tg.int(), il, tl), (lp, tg, il.tolist(), tl),
                 (lp[:, 0].contiguous(), tg[0], il[0], tl[0])]  # unbatched
    skipped = [
        (lp.half(), tg, il, tl),  # half: converted to float32 by the kernel wrapper
        (torch.cat([lp, lp], -1)[:, :, : lp.shape[2]], tg, il, tl),  # neither layout dense
    ]
    for case, taken in [(c, True) for c in converted] + [(c, False) for c in skipped]:
        n = len(lane_calls)
        loss = seqloss.ctc_loss(*case)
        assert len(lane_calls) == n + taken
        ref = _general(monkeypatch, lambda case=case: seqloss.ctc_loss(*case))
        assert torch.equal(loss, ref)
    n = len(lane_calls)
    seqloss.ctc_loss(lp, tg, il, tl, backend="reference")
    with torch.inference_mode():
        seqloss.ctc_loss(lp, tg, il, tl, backend="numba")
    assert len(lane_calls) == n + 1  # the reference backend does not take it
    # A batch for the pool (many cells, two threads) takes the general path
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(numba_cpu, "POOL_MIN_CELLS", 0)
        seqloss.ctc_loss(lp, tg, il, tl)
        assert len(lane_calls) == n + 1
    finally:
        torch.set_num_threads(old)


def test_ctc_lane_follows_the_backend_environment(monkeypatch, lane_calls):
    x, tg, il, tl = _ctc_inputs()
    lp = x.log_softmax(-1)
    for env, taken in (("reference", False), ("numba", True), ("auto", True), ("", True),
                       (None, True)):
        if env is None:
            monkeypatch.delenv("SEQLOSS_BACKEND")
        else:
            monkeypatch.setenv("SEQLOSS_BACKEND", env)
        n = len(lane_calls)
        seqloss.ctc_loss(lp, tg, il, tl)
        assert len(lane_calls) == n + taken, env


def test_ctc_cheap_backend_read_agrees_with_dispatch(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("SEQLOSS_BACKEND", raising=False)
    for change in (lambda: os.environ.__setitem__("SEQLOSS_BACKEND", "reference"),
                   lambda: os.environ.update(SEQLOSS_BACKEND="numba"),
                   lambda: os.environ.pop("SEQLOSS_BACKEND"),
                   lambda: os.environ.setdefault("SEQLOSS_BACKEND", "auto"),
                   lambda: monkeypatch.setenv("SEQLOSS_BACKEND", "reference"),
                   lambda: monkeypatch.setenv("SEQLOSS_BACKEND", ""),
                   lambda: monkeypatch.delenv("SEQLOSS_BACKEND")):
        change()
        for backend in ("auto", "numba", "reference"):
            assert cpu_backend(backend) == resolve_backend(backend, cpu), (
                os.environ.get("SEQLOSS_BACKEND"), backend)
    monkeypatch.setenv("SEQLOSS_BACKEND", "bogus")
    with pytest.raises(InputError, match="SEQLOSS_BACKEND='bogus'"):
        cpu_backend("auto")


def test_ctc_lane_autograd_semantics():
    x, tg, il, tl = _ctc_inputs()
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


def test_ctc_lane_value_errors_name_the_argument():
    x, tg, il, tl = _ctc_inputs(T=8, B=2, C=5, L=3)
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


def test_ctc_lane_under_compile_and_functorch():
    x, tg, il, tl = _ctc_inputs()
    lp = x.log_softmax(-1)
    eager = seqloss.ctc_loss(lp, tg, il, tl)
    compiled = torch.compile(lambda a: seqloss.ctc_loss(a, tg, il, tl), fullgraph=True)
    torch.testing.assert_close(compiled(lp), eager)
    g = torch.func.grad(lambda a: seqloss.ctc_loss(a, tg, il, tl))(lp)
    ref = torch.autograd.grad(seqloss.ctc_loss(lp.requires_grad_(), tg, il, tl), lp)[0]
    torch.testing.assert_close(g, ref)


# ------------------------------------------------------------------ transducer_lattice
NAN = float("nan")


def _lattice_inputs(B=3, T=6, U=3, bd=(1, 2), ed=(0, 1), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(B, T + 1, U + 2, len(bd), generator=g, dtype=dtype)
    ae = torch.randn(B, T + 1, U + 2, len(ed), generator=g, dtype=dtype)
    il = torch.tensor([T, T - 1, 0][:B])
    tl = torch.tensor([U, 0, 2][:B])
    return ab, ae, il, tl


def _lattice_both(ab, ae, il, tl, bd, ed, can, weights=None):
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
def test_lattice_lane_matches_general_path_bit_for_bit(bd, ed, can, dtype):
    ab, ae, il, tl = _lattice_inputs(bd=bd, ed=ed, dtype=dtype)
    for w in (None, torch.tensor([0.5, -2.0, 3.0], dtype=dtype)):
        (l1, (a1, e1)), (l2, (a2, e2)) = _lattice_both(ab, ae, il, tl, bd, ed, can, w)
        assert l1.dtype == dtype and a1.dtype == dtype
        assert torch.equal(l1, l2) and torch.equal(a1, a2) and torch.equal(e1, e2)


def test_lattice_lane_poisons_like_the_general_path():
    ab, ae, il, tl = _lattice_inputs()
    ab[0, 1, 1, 0] = NAN  # read by sequence 0 only
    ae[1, 0, 0, 1] = float("inf")  # sequence 1: u = 0 = U_1, an emission no path reads
    (l1, g1), (l2, g2) = _lattice_both(ab, ae, il, tl, (1, 2), (0, 1), False)
    assert torch.isnan(l1[0]) and torch.isfinite(l1[1])
    assert torch.equal(l1.isnan(), l2.isnan()) and torch.equal(l1.nan_to_num(), l2.nan_to_num())
    for x, y in zip(g1, g2, strict=True):
        assert torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())


def test_lattice_lane_is_taken_only_for_the_common_call():
    ab, ae, il, tl = _lattice_inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    args = (il, tl, (1, 2), (0, 1), False)
    assert fast.lattice_fast(a, e, *args, "numba", True, True) is not None
    assert fast.lattice_fast(a, e, *args, "numba", False, True) is None  # no gradient wanted
    assert fast.lattice_fast(a.float(), e, *args, "numba", True, True) is None  # mixed dtypes
    assert fast.lattice_fast(a, e, *args, "reference", True, True) is None
    bad = torch.tensor([7, 9, 0])  # out of range: the general path raises the error
    assert fast.lattice_fast(a, e, bad, tl, *args[2:], "numba", True, True) is None
    # a large batch (the lengths read through numpy): in range, then one out of range
    ab, ae, _, _ = _lattice_inputs(B=3)
    a, e = ab.repeat(30, 1, 1, 1).requires_grad_(), ae.repeat(30, 1, 1, 1).requires_grad_()
    il, tl = torch.full((90,), 6), torch.full((90,), 3)
    assert fast.lattice_fast(a, e, il, tl, *args[2:], "numba", True, True) is not None
    tl[77] = 5  # the arcs hold U + 1 = 5 rows: U_b <= 4
    assert fast.lattice_fast(a, e, il, tl, *args[2:], "numba", True, True) is None


def test_lattice_lane_is_taken_through_dispatch(monkeypatch):
    ab, ae, il, tl = _lattice_inputs()
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


def test_lattice_lane_errors_name_the_argument():
    ab, ae, il, tl = _lattice_inputs()
    a, e = ab.clone().requires_grad_(), ae.clone().requires_grad_()
    with pytest.raises(seqloss.InputError, match=r"logit_lengths\[1\] = 9 exceeds"):
        seqloss.transducer_lattice(a, e, torch.tensor([6, 9, 0]), tl, (1, 2), (0, 1))
    with pytest.raises(seqloss.InputError, match=r"target_lengths\[2\] = -1 is negative"):
        seqloss.transducer_lattice(a, e, il, torch.tensor([3, 0, -1]), (1, 2), (0, 1))
    with pytest.raises(seqloss.InputError, match=r"blank_durations\[1\] = 0"):
        seqloss.transducer_lattice(a, e, il, tl, (1, 0), (0, 1))


def test_lattice_lane_autograd_semantics():
    ab, ae, il, tl = _lattice_inputs()
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


def test_lattice_lane_under_compile_and_functorch():
    ab, ae, il, tl = _lattice_inputs()
    args = (il, tl, (1, 2), (0, 1))
    a = ab.clone().requires_grad_()
    eager = seqloss.transducer_lattice(a, ae, *args)
    compiled = torch.compile(lambda x: seqloss.transducer_lattice(x, ae, *args), fullgraph=True)
    torch.testing.assert_close(compiled(a), eager)
    g = torch.func.grad(lambda x: seqloss.transducer_lattice(x, ae, *args).sum())(ab)
    ref = torch.autograd.grad(eager.sum(), a)[0]
    torch.testing.assert_close(g, ref)


def test_lattice_common_call_and_general_conversion_agree():
    """Exact-type arguments skip the generic conversion; anything else converts: the same
    bits, and the same errors for what the short path does not accept."""
    ab, ae, il, tl = _lattice_inputs()
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


# ------------------------------------------------------------------ both lanes
@pytest.mark.parametrize("family", ["ctc", "lattice"])
def test_lane_frees_its_results_with_the_graph(family, monkeypatch):
    """The declaration's lane Function keeps the gradients and the inputs, never the value:
    a reference cycle through the value would keep the input-sized gradients alive until
    the garbage collector runs. Dropping the loss unused frees them at once."""
    decl = ctc_loss_decl if family == "ctc" else op.lattice_decl
    real, held = decl.fast, []

    def spy(*args):
        out = real(*args)
        held.extend(weakref.ref(t) for t in out)
        return out

    monkeypatch.setattr(decl, "fast", spy)
    if family == "ctc":
        x, tg, il, tl = _ctc_inputs()
        x.requires_grad_()
    else:
        ab, ae, il, tl = _lattice_inputs()
        a, e = ab.requires_grad_(), ae.requires_grad_()
    gc.disable()
    try:
        for backward in (False, True):
            if family == "ctc":
                loss = seqloss.ctc_loss(x, tg, il, tl)
            else:
                loss = seqloss.transducer_lattice(a, e, il, tl, (1, 2), (0, 1)).sum()
            assert len(held) == (2 if family == "ctc" else 3)
            assert all(r() is not None for r in held[1:])  # the gradients, kept
            if backward:  # the graph kept, then dropped with the loss
                loss.backward(retain_graph=True)
                if family == "ctc":
                    x.grad = None
                else:
                    a.grad = e.grad = None
            del loss
            assert all(r() is None for r in held), "a reference cycle keeps them"
            held.clear()
    finally:
        gc.enable()
