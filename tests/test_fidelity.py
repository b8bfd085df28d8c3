"""Drop-in fidelity: what peers' test suites and a real training loop expect of a loss.

Each test here is one finding of the fidelity issue: it failed before the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import device_for

import seqloss
from seqloss.testing import brute_force_ctc, brute_force_rnnt


def _ctc_batch(T=7, B=3, C=5, S=3, seed=0, layout="tbc"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64) if layout == "btc" else \
        torch.randn(T, B, C, generator=g, dtype=torch.float64)
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([S] + [S - 1] * (B - 1))
    return x, tg, il, tl


def _rnnt_batch(B=2, T=3, U=2, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 1, (B, U), generator=g)  # blank is V - 1
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([U] + [U - 1] * (B - 1))
    return x, tg, il, tl


def _brute_ctc_grad(lp, tg, il, tl, reduction):
    """The gradient of the reduced CTC loss w.r.t. log-probs ``(T, B, C)``, by brute force."""
    w = 1.0 / tl.clamp(min=1).double() / len(tl) if reduction == "mean" else torch.ones(len(tl))
    out = torch.zeros_like(lp)
    for b in range(len(tl)):
        xb = lp[: il[b], b].clone().requires_grad_()
        (gb,) = torch.autograd.grad(brute_force_ctc(xb, tg[b, : tl[b]].tolist()) * w[b], xb)
        out[: il[b], b] = gb
    return out


# ------------------------------------------------------------------ item 2: compile, transposed
@pytest.mark.parametrize("fused", [False, True], ids=["log_softmax", "fused"])
def test_inductor_compile_transposed_ctc_matches_eager(fused):
    torch._dynamo.reset()
    x0, tg, il, tl = _ctc_batch(T=9, B=3, C=6, layout="btc")
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
    x0, tg, il, tl = _rnnt_batch(B=2, T=4, U=2, V=5)
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


# ------------------------------------------------------------------ item 3: autograd.grad
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_autograd_grad_is_plain_tensor_ctc(ctc_backend, reduction):
    x, tg, il, tl = _ctc_batch()
    x = x.log_softmax(-1).to(device_for(ctc_backend)).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction=reduction, backend=ctc_backend)
    (g,) = torch.autograd.grad(loss, x)
    assert not g.requires_grad and g.grad_fn is None
    g.cpu().numpy()  # fails on a tensor attached to the graph
    torch.testing.assert_close(g.cpu(), _brute_ctc_grad(x.detach().cpu(), tg, il, tl, reduction),
                               rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_autograd_grad_is_plain_tensor_rnnt(rnnt_backend, reduction):
    x, tg, il, tl = _rnnt_batch()
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


# ------------------------------------------------------------------ item 4: retain_graph
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_retain_graph_zero_grad_backward_again_ctc(ctc_backend, reduction):
    x, tg, il, tl = _ctc_batch()
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
    x, tg, il, tl = _rnnt_batch()
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
    x, tg, il, tl = _ctc_batch()
    x = x.log_softmax(-1).requires_grad_()
    seqloss.ctc_loss(x, tg, il, tl).backward()
    g = x.grad.clone()
    x.grad.zero_()
    seqloss.ctc_loss(x, tg, il, tl).backward()
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)


# ------------------------------------------------------------------ item 5: lengths and targets
LENGTH_FORMS = {
    "0-d tensor": lambda v: torch.tensor(v),
    "(1,1) tensor": lambda v: torch.tensor([[v]]),
    "numpy array": lambda v: np.array([v]),
    "numpy int32 array": lambda v: np.array([v], dtype=np.int32),
    "numpy scalars": lambda v: [np.int64(v)],
}


@pytest.mark.parametrize("form", list(LENGTH_FORMS), ids=list(LENGTH_FORMS))
def test_ctc_length_forms_batch_of_one(form):
    x, tg, _, _ = _ctc_batch(T=6, B=1, C=4, S=2)
    lp = x.log_softmax(-1)
    make = LENGTH_FORMS[form]
    got = seqloss.ctc_loss(lp, tg, make(6), make(2), reduction="none")
    want = brute_force_ctc(lp[:, 0], tg[0].tolist())
    torch.testing.assert_close(got, want.reshape(1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("form", list(LENGTH_FORMS), ids=list(LENGTH_FORMS))
def test_rnnt_length_forms_batch_of_one(form):
    x, tg, _, _ = _rnnt_batch(B=1, T=3, U=2, V=4)
    make = LENGTH_FORMS[form]
    got = seqloss.rnnt_loss(x, tg, make(3), make(2), reduction="none")
    want = brute_force_rnnt(x[0].log_softmax(-1), tg[0].tolist(), blank=3)
    torch.testing.assert_close(got, want.reshape(1), rtol=1e-10, atol=1e-10)


def test_numpy_lengths_batched_equal_tensor_lengths():
    x, tg, il, tl = _ctc_batch()
    lp = x.log_softmax(-1)
    a = seqloss.ctc_loss(lp, tg, il.numpy(), tl.numpy().astype(np.int32), reduction="none")
    b = seqloss.ctc_loss(lp, tg, il, tl, reduction="none")
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    a = seqloss.ctc_align(lp, tg, il.numpy(), list(np.asarray(tl)))
    b = seqloss.ctc_align(lp, tg, il, tl)
    assert torch.equal(a[0], b[0])


def test_bad_length_forms_still_raise():
    x, tg, il, tl = _ctc_batch()
    lp = x.log_softmax(-1)
    with pytest.raises(TypeError, match="input_lengths"):
        seqloss.ctc_loss(lp, tg, np.array([7.0, 6.0, 6.0]), tl)
    with pytest.raises(seqloss.InputError, match=r"input_lengths must have shape \(3,\)"):
        seqloss.ctc_loss(lp, tg, torch.tensor(7), tl)  # 0-D only for a batch of one
    with pytest.raises(seqloss.InputError, match=r"target_lengths must have shape \(3,\)"):
        seqloss.ctc_loss(lp, tg, il, tl[None, :])


def test_ragged_nested_targets_name_the_argument():
    lp = torch.randn(6, 2, 5).log_softmax(-1)
    with pytest.raises(seqloss.InputError, match=r"targets .*ragged.*row 1 has 1"):
        seqloss.ctc_loss(lp, [[1, 2, 3], [1]], [6, 6], [3, 1])
    # Padded nested lists are fine, padding never read.
    a = seqloss.ctc_loss(lp, [[1, 2, 3], [1, -1, -1]], [6, 6], [3, 1], reduction="none")
    b = seqloss.ctc_loss(lp, torch.tensor([[1, 2, 3], [1, 0, 0]]), [6, 6], [3, 1], reduction="none")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ------------------------------------------------------------------ item 6: empty batch
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


# ------------------------------------------------------------------ mean_volume
def test_rnnt_mean_volume(rnnt_backend):
    x, tg, il, tl = _rnnt_batch(B=3, T=3, U=2, V=4)
    x = x.to(device_for(rnnt_backend))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = seqloss.rnnt_loss(x1, tg, il, tl, reduction="mean_volume", backend=rnnt_backend)
    per = seqloss.rnnt_loss(x2, tg, il, tl, reduction="none", backend="reference")
    want = per.sum() / tl.sum()
    torch.testing.assert_close(a, want, rtol=1e-10, atol=1e-10)
    a.backward()
    want.backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)
    # Every U_b = 0: the divisor is 1 (NeMo's), so the value is the plain sum.
    z = torch.zeros_like(tl)
    a = seqloss.rnnt_loss(x, tg, il, z, reduction="mean_volume", backend=rnnt_backend)
    s = seqloss.rnnt_loss(x, tg, il, z, reduction="sum", backend=rnnt_backend)
    torch.testing.assert_close(a, s, rtol=1e-12, atol=0)


# ------------------------------------------------------------------ item 10: error types
def test_dtype_errors_are_runtime_errors_too():
    lp = torch.randn(6, 1, 4).log_softmax(-1)
    with pytest.raises(RuntimeError, match="log_probs"):
        seqloss.ctc_loss(lp.long(), [[1]], [6], [1])
    with pytest.raises(RuntimeError, match="input_lengths"):
        seqloss.ctc_loss(lp, [[1]], torch.tensor([6.0]), [1])
    with pytest.raises(RuntimeError, match="targets"):
        seqloss.ctc_loss(lp, torch.tensor([[1.0]]), [6], [1])
    with pytest.raises(RuntimeError, match="logits"):
        seqloss.rnnt_loss(torch.zeros(1, 2, 2, 3, dtype=torch.int32), [[1]], [2], [1])
    with pytest.raises(RuntimeError, match="input_lengths"):
        F.ctc_loss(lp, torch.tensor([[1]]), torch.tensor([6.0]), torch.tensor([1]))  # torch's own


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ctc_align_labels_have_the_targets_dtype(ctc_backend, dtype):
    x, tg, il, tl = _ctc_batch()
    lp = x.log_softmax(-1).to(device_for(ctc_backend))
    labels, _ = seqloss.ctc_align(lp, tg.to(dtype), il, tl, backend=ctc_backend)
    assert labels.dtype == dtype
    labels, _ = seqloss.ctc_align(lp, tg.tolist(), il, tl, backend=ctc_backend)
    assert labels.dtype == torch.int64


# ------------------------------------------------------------------ item 11: modules, func
def test_module_repr_names_non_default_arguments():
    assert (repr(seqloss.RNNTLoss(clamp=0.5, reduction="sum"))
            == "RNNTLoss(clamp=0.5, reduction='sum')")
    assert repr(seqloss.CTCLoss()) == "CTCLoss()"
    assert (repr(seqloss.CTCLoss(blank=3, zero_infinity=True))
            == "CTCLoss(blank=3, zero_infinity=True)")


@pytest.mark.parametrize("module", [seqloss.CTCLoss, seqloss.RNNTLoss])
def test_torchscript_says_unsupported(module):
    with pytest.raises(NotImplementedError, match="TorchScript"):
        torch.jit.script(module())


def test_torch_func_grad_ctc_and_rnnt():
    x, tg, il, tl = _ctc_batch()
    g = torch.func.grad(lambda z: seqloss.ctc_loss(z.log_softmax(-1), tg, il, tl))(x)
    y = x.clone().requires_grad_()
    F.ctc_loss(y.log_softmax(-1), tg, il, tl).backward()
    torch.testing.assert_close(g, y.grad, rtol=1e-9, atol=1e-12)

    x, tg, il, tl = _rnnt_batch()
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
    x, tg, il, tl = _ctc_batch()
    w = torch.tensor([0.5, -2.0, 3.0], dtype=x.dtype)
    loss, vjp = torch.func.vjp(
        lambda z: seqloss.ctc_loss(z.log_softmax(-1), tg, il, tl, reduction="none"), x)
    (g,) = vjp(w)
    y = x.clone().requires_grad_()
    want = F.ctc_loss(y.log_softmax(-1), tg, il, tl, reduction="none")
    want.backward(w)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g, y.grad, rtol=1e-9, atol=1e-12)


def test_doctor_names_an_unknown_key():
    x, tg, il, tl = _ctc_batch()
    with pytest.raises(seqloss.InputError, match=r"'target_length'.*did you mean 'target_lengths'"):
        seqloss.diagnose("ctc", log_probs=x.log_softmax(-1), targets=tg, input_lengths=il,
                         target_length=tl)


# ------------------------------------------------------------------ the incoming gradient's forms
@pytest.mark.parametrize("form", ["sum", "sum_x2", "vector_ones", "vector_mixed", "scalar_half"])
def test_incoming_gradient_forms_scale_the_saved_one(form):
    """The backward hands the saved gradient on only for an incoming gradient of ones
    (a 0-stride expand from ``sum``, a vector, a scalar), and scales it otherwise."""
    x, tg, il, tl = _rnnt_batch(B=3)
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


# ------------------------------------------------------------------ zero frames, argument forms
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


def test_packed_lengths_of_a_batch_of_one_as_0d_tensors():
    V = 5
    x = torch.randn(3 * 2, V, dtype=torch.float64)
    want = seqloss.rnnt_loss_packed(x, [[0]], [3], [1])
    for il, tl in ((torch.tensor(3), torch.tensor(1)), (torch.tensor([[3]]), torch.tensor([[1]])),
                   (np.array(3), np.array(1))):
        torch.testing.assert_close(seqloss.rnnt_loss_packed(x, [[0]], il, tl), want, rtol=0, atol=0)


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


@pytest.mark.parametrize("form", [np.int64, np.int32, torch.tensor], ids=["np64", "np32", "tensor"])
def test_blank_as_an_integral_scalar(form):
    """torch takes a numpy integer or a 0-D integer tensor as ``blank``."""
    x, tg, il, tl = _ctc_batch(C=5)
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, blank=0, reduction="none")
    torch.testing.assert_close(seqloss.ctc_loss(lp, tg, il, tl, blank=form(0), reduction="none"),
                               want, rtol=1e-10, atol=1e-10)
    xr, tgr, ilr, tlr = _rnnt_batch()
    torch.testing.assert_close(seqloss.rnnt_loss(xr, tgr, ilr, tlr, blank=form(3)),
                               seqloss.rnnt_loss(xr, tgr, ilr, tlr, blank=3), rtol=0, atol=0)
    with pytest.raises(TypeError, match="blank"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=torch.tensor(0.0))


def test_all_empty_nested_targets():
    """``[[], [], []]`` (all-silence utterances) is a padded ``(B, 0)`` batch, not floats."""
    x, _, il, _ = _ctc_batch(B=3)
    lp = x.log_softmax(-1)
    zero = torch.zeros(3, dtype=torch.long)
    want = F.ctc_loss(lp, torch.zeros(3, 0, dtype=torch.long), il, zero, reduction="none")
    got = seqloss.ctc_loss(lp, [[], [], []], il, [0, 0, 0], reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_length_beyond_int64_names_the_argument():
    x, tg, _, tl = _ctc_batch(B=3)
    with pytest.raises(seqloss.InputError, match=r"input_lengths\[0\]"):
        seqloss.ctc_loss(x.log_softmax(-1), tg, [2**70, 4, 3], tl)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8], ids=str)
def test_narrow_integer_lengths_and_targets_as_torch_takes_them(dtype):
    x, tg, il, tl = _ctc_batch()
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, reduction="none")
    got = seqloss.ctc_loss(lp, tg.to(dtype), il.to(dtype), tl.to(dtype), reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    xr, tgr, ilr, tlr = _rnnt_batch()
    torch.testing.assert_close(seqloss.rnnt_loss(xr, tgr.to(dtype), ilr.to(dtype), tlr.to(dtype)),
                               seqloss.rnnt_loss(xr, tgr, ilr, tlr), rtol=0, atol=0)


def test_length_columns_as_torch_takes_them():
    x, tg, il, tl = _ctc_batch()
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, reduction="none")
    got = seqloss.ctc_loss(lp, tg, il[:, None], tl[:, None], reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(seqloss.InputError, match="input_lengths"):
        seqloss.ctc_loss(lp, tg, il[None, :].expand(2, -1), tl)
