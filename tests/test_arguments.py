"""Argument forms across the public functions: flags, lengths, targets, ``blank``, backends.

What torch and the libraries seqloss replaces accept is accepted with the same meaning
(lengths as 0-D or ``(B, 1)`` tensors, numpy arrays and scalars, narrow integer dtypes;
nested-list targets; ``blank`` as a numpy integer or 0-D tensor; a flag as a 0-D tensor),
checked against torch's ``ctc_loss``, brute force, or the canonical form of the same call;
anything else raises a ``TypeError`` or ``seqloss.InputError`` naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ctc_batch, device_for, rnnt_batch

import seqloss
from seqloss import InputError
from seqloss.testing import brute_force_ctc, brute_force_rnnt


def _add_joint(e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return e[:, :, None, :] + p[:, None, :, :]


# ------------------------------------------------------------------ flags
def _small_ctc():
    return (torch.randn(3, 1, 3).log_softmax(-1), torch.tensor([[1]]), torch.tensor([3]),
            torch.tensor([1]))


def _small_joint(V=4):
    return torch.randn(1, 3, 2, V), torch.tensor([[1]]), torch.tensor([3]), torch.tensor([1])


def _small_factored():
    return torch.randn(1, 2, 4), torch.randn(1, 3, 4), torch.tensor([[1]]), 3


def _calls():
    """(id, flag, call(flag value)) for every boolean flag of every public function."""
    lat = (torch.randn(1, 3, 2, 1), torch.randn(1, 3, 2, 1), torch.tensor([3]), torch.tensor([1]))
    enc, pred = torch.randn(1, 3, 4), torch.randn(1, 2, 4)
    tdt = (torch.randn(1, 3, 2, 7), torch.tensor([[1]]), torch.tensor([3]), torch.tensor([1]))
    fj = (enc, pred, _add_joint, torch.tensor([[1]]), torch.tensor([3]), torch.tensor([1]))
    lm, am, sym, term = _small_factored()
    pruned = (torch.randn(1, 3, 2, 4), sym, torch.arange(2).expand(1, 3, 2).contiguous(), term)
    px, py = torch.rand(1, 1, 4), torch.rand(1, 2, 3)
    out = []
    for f in ("zero_infinity", "fused_log_softmax", "validate"):
        out.append((f"ctc_loss-{f}", f, lambda v, f=f: seqloss.ctc_loss(*_small_ctc(), **{f: v})))
        out.append((f"CTCLoss-{f}", f, lambda v, f=f: seqloss.CTCLoss(**{f: v})(*_small_ctc())))
    for f in ("zero_infinity", "fused_log_softmax", "validate", "inplace_grad"):
        out.append((f"rnnt_loss-{f}", f,
                    lambda v, f=f: seqloss.rnnt_loss(*_small_joint(), **{f: v})))
        out.append((f"RNNTLoss-{f}", f,
                    lambda v, f=f: seqloss.RNNTLoss(**{f: v})(*_small_joint())))
        out.append((f"rnnt_loss_packed-{f}", f, lambda v, f=f: seqloss.rnnt_loss_packed(
            torch.randn(6, 4), torch.tensor([1]), torch.tensor([3]), torch.tensor([1]),
            **{f: v})))
    for f in ("zero_infinity", "validate"):
        out.append((f"multiblank_rnnt_loss-{f}", f, lambda v, f=f: seqloss.multiblank_rnnt_loss(
            *_small_joint(5), [2], **{f: v})))
        out.append((f"MultiBlankRNNTLoss-{f}", f, lambda v, f=f: seqloss.MultiBlankRNNTLoss(
            [2], **{f: v})(*_small_joint(5))))
        out.append((f"tdt_loss-{f}", f, lambda v, f=f: seqloss.tdt_loss(*tdt, [0, 1, 2], **{f: v})))
        out.append((f"TDTLoss-{f}", f,
                    lambda v, f=f: seqloss.TDTLoss([0, 1, 2], **{f: v})(*tdt)))
        out.append((f"rnnt_loss_from_joint-{f}", f,
                    lambda v, f=f: seqloss.rnnt_loss_from_joint(*fj, **{f: v})))
        out.append((f"multiblank_rnnt_loss_from_joint-{f}", f,
                    lambda v, f=f: seqloss.multiblank_rnnt_loss_from_joint(
                        torch.randn(1, 3, 5), torch.randn(1, 2, 5), *fj[2:], [2], **{f: v})))
        out.append((f"tdt_loss_from_joint-{f}", f,
                    lambda v, f=f: seqloss.tdt_loss_from_joint(
                        torch.randn(1, 3, 7), torch.randn(1, 2, 7), *fj[2:], [0, 1, 2],
                        **{f: v})))
        out.append((f"rnnt_loss_pruned-{f}", f,
                    lambda v, f=f: seqloss.rnnt_loss_pruned(*pruned, **{f: v})))
    for f in ("zero_infinity", "validate", "return_grad"):
        out.append((f"rnnt_loss_simple-{f}", f,
                    lambda v, f=f: seqloss.rnnt_loss_simple(lm, am, sym, term, **{f: v})))
        out.append((f"rnnt_loss_smoothed-{f}", f,
                    lambda v, f=f: seqloss.rnnt_loss_smoothed(lm, am, sym, term, **{f: v})))
    for f in ("emit_can_end", "validate"):
        out.append((f"transducer_lattice-{f}", f,
                    lambda v, f=f: seqloss.transducer_lattice(*lat, **{f: v})))
    out.append(("ctc_align-validate", "validate",
                lambda v: seqloss.ctc_align(*_small_ctc(), validate=v)))
    for f in ("fused_log_softmax", "validate"):
        out.append((f"rnnt_align-{f}", f,
                    lambda v, f=f: seqloss.rnnt_align(*_small_joint(), **{f: v})))
    out.append(("get_rnnt_prune_ranges-validate", "validate",
                lambda v: seqloss.get_rnnt_prune_ranges(px, py, None, 2, validate=v)))
    for f in ("zero_infinity", "fused_log_softmax"):
        out.append((f"diagnose-{f}", f,
                    lambda v, f=f: seqloss.diagnose("ctc", *_small_ctc(), **{f: v})))
    return out


FLAG_CALLS = [pytest.param(f, c, id=i) for i, f, c in _calls()]


@pytest.mark.parametrize(("flag", "call"), FLAG_CALLS)
def test_flag_tensor_of_many_values_is_a_type_error_naming_it(flag, call):
    for bad in (torch.tensor([True, False]), torch.tensor([1, 0]), "False", None, 2, 1.0):
        with pytest.raises(TypeError, match=flag):
            call(bad)


@pytest.mark.parametrize(("flag", "call"), FLAG_CALLS)
def test_flag_zero_dim_tensor_reads_as_its_bool(flag, call):
    # bool() of a 0-D bool or integer tensor is unambiguous: the same as the Python bool.
    if flag == "inplace_grad":
        pytest.skip("inplace_grad=True needs logits that require grad")
    for v in (torch.tensor(True), torch.tensor(False), torch.tensor(1), 0):
        torch.manual_seed(0)
        got = call(v)
        torch.manual_seed(0)
        want = call(bool(v))
        if isinstance(got, tuple):  # return_grad, the alignments: the first output
            got, want = got[0], want[0]
        if hasattr(got, "to_dict"):  # diagnose
            assert got.to_dict() == want.to_dict()
        else:
            assert torch.equal(got, want)


def test_flag_helper():
    from seqloss._core.checks import flag

    assert flag(True, "x") is True and flag(0, "x") is False
    assert flag(torch.tensor(True), "x") is True
    assert flag(torch.tensor(0, dtype=torch.uint8), "x") is False
    assert flag(np.bool_(True), "x") is True
    for bad in (torch.tensor([True]), torch.tensor(2), torch.tensor(1.0), "True", None, 2, -1):
        with pytest.raises(TypeError, match="x must be a bool"):
            flag(bad, "x")


# ------------------------------------------------------------------ lengths
def test_rnnt_loss_packed_takes_column_lengths(rnnt_backend):
    # rnnt_loss takes (B, 1) lengths (as torch's ctc_loss does); the packed layout too.
    device = device_for(rnnt_backend)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 3, 5, generator=g, dtype=torch.float64).to(device)
    tg = torch.tensor([[1, 2], [3, 1]])
    il, tl = torch.tensor([3, 2]), torch.tensor([2, 1])
    rows = torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, 5) for b in range(2)])
    want = seqloss.rnnt_loss(x, tg, il, tl, reduction="none", backend=rnnt_backend)
    for a, c in ((il[:, None], tl[:, None]), (il[:, None], tl), (il, tl[:, None])):
        got = seqloss.rnnt_loss_packed(rows, tg, a, c, reduction="none", backend=rnnt_backend)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        # and as rnnt_loss takes them
        torch.testing.assert_close(seqloss.rnnt_loss(x, tg, a, c, reduction="none",
                                                     backend=rnnt_backend), want)


def test_rnnt_loss_packed_takes_empty_column_lengths():
    col = torch.zeros(0, 1, dtype=torch.int64)
    empty = torch.zeros(0, 5)
    for red in ("none", "sum", "mean"):
        got = seqloss.rnnt_loss_packed(empty, torch.zeros(0, 0, dtype=torch.int64), col, col,
                                       reduction=red)
        want = seqloss.rnnt_loss(torch.zeros(0, 1, 1, 5), torch.zeros(0, 0, dtype=torch.int64),
                                 col, col, reduction=red)
        assert got.shape == want.shape and torch.equal(got, want)


def test_rnnt_loss_packed_refuses_other_shapes():
    with pytest.raises(InputError, match="logit_lengths"):
        seqloss.rnnt_loss_packed(torch.randn(6, 4), torch.tensor([[1]]), torch.tensor([[3, 3]]),
                                 torch.tensor([1]))
    with pytest.raises(InputError, match="logit_lengths"):
        seqloss.rnnt_loss_packed(torch.randn(6, 4), torch.tensor([[1]]),
                                 torch.tensor([[[3]]]), torch.tensor([1]))


LENGTH_FORMS = {
    "0-d tensor": lambda v: torch.tensor(v),
    "(1,1) tensor": lambda v: torch.tensor([[v]]),
    "numpy array": lambda v: np.array([v]),
    "numpy int32 array": lambda v: np.array([v], dtype=np.int32),
    "numpy scalars": lambda v: [np.int64(v)],
}


@pytest.mark.parametrize("form", list(LENGTH_FORMS), ids=list(LENGTH_FORMS))
def test_ctc_length_forms_batch_of_one(form):
    x, tg, _, _ = ctc_batch(T=6, B=1, C=4, S=2)
    lp = x.log_softmax(-1)
    make = LENGTH_FORMS[form]
    got = seqloss.ctc_loss(lp, tg, make(6), make(2), reduction="none")
    want = brute_force_ctc(lp[:, 0], tg[0].tolist())
    torch.testing.assert_close(got, want.reshape(1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("form", list(LENGTH_FORMS), ids=list(LENGTH_FORMS))
def test_rnnt_length_forms_batch_of_one(form):
    x, tg, _, _ = rnnt_batch(B=1, T=3, U=2, V=4)
    make = LENGTH_FORMS[form]
    got = seqloss.rnnt_loss(x, tg, make(3), make(2), reduction="none")
    want = brute_force_rnnt(x[0].log_softmax(-1), tg[0].tolist(), blank=3)
    torch.testing.assert_close(got, want.reshape(1), rtol=1e-10, atol=1e-10)


def test_numpy_lengths_batched_equal_tensor_lengths():
    x, tg, il, tl = ctc_batch()
    lp = x.log_softmax(-1)
    a = seqloss.ctc_loss(lp, tg, il.numpy(), tl.numpy().astype(np.int32), reduction="none")
    b = seqloss.ctc_loss(lp, tg, il, tl, reduction="none")
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    a = seqloss.ctc_align(lp, tg, il.numpy(), list(np.asarray(tl)))
    b = seqloss.ctc_align(lp, tg, il, tl)
    assert torch.equal(a[0], b[0])


def test_bad_length_forms_still_raise():
    x, tg, il, tl = ctc_batch()
    lp = x.log_softmax(-1)
    with pytest.raises(TypeError, match="input_lengths"):
        seqloss.ctc_loss(lp, tg, np.array([7.0, 6.0, 6.0]), tl)
    with pytest.raises(seqloss.InputError, match=r"input_lengths must have shape \(3,\)"):
        seqloss.ctc_loss(lp, tg, torch.tensor(7), tl)  # 0-D only for a batch of one
    with pytest.raises(seqloss.InputError, match=r"target_lengths must have shape \(3,\)"):
        seqloss.ctc_loss(lp, tg, il, tl[None, :])


def test_packed_lengths_of_a_batch_of_one_as_0d_tensors():
    V = 5
    x = torch.randn(3 * 2, V, dtype=torch.float64)
    want = seqloss.rnnt_loss_packed(x, [[0]], [3], [1])
    for il, tl in ((torch.tensor(3), torch.tensor(1)), (torch.tensor([[3]]), torch.tensor([[1]])),
                   (np.array(3), np.array(1))):
        torch.testing.assert_close(seqloss.rnnt_loss_packed(x, [[0]], il, tl), want, rtol=0, atol=0)


def test_length_beyond_int64_names_the_argument():
    x, tg, _, tl = ctc_batch(B=3)
    with pytest.raises(seqloss.InputError, match=r"input_lengths\[0\]"):
        seqloss.ctc_loss(x.log_softmax(-1), tg, [2**70, 4, 3], tl)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8], ids=str)
def test_narrow_integer_lengths_and_targets_as_torch_takes_them(dtype):
    x, tg, il, tl = ctc_batch()
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, reduction="none")
    got = seqloss.ctc_loss(lp, tg.to(dtype), il.to(dtype), tl.to(dtype), reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    xr, tgr, ilr, tlr = rnnt_batch()
    torch.testing.assert_close(seqloss.rnnt_loss(xr, tgr.to(dtype), ilr.to(dtype), tlr.to(dtype)),
                               seqloss.rnnt_loss(xr, tgr, ilr, tlr), rtol=0, atol=0)


def test_length_columns_as_torch_takes_them():
    x, tg, il, tl = ctc_batch()
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, reduction="none")
    got = seqloss.ctc_loss(lp, tg, il[:, None], tl[:, None], reduction="none")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(seqloss.InputError, match="input_lengths"):
        seqloss.ctc_loss(lp, tg, il[None, :].expand(2, -1), tl)


# ------------------------------------------------------------------ targets, blank, dtypes
def test_ragged_nested_targets_name_the_argument():
    lp = torch.randn(6, 2, 5).log_softmax(-1)
    with pytest.raises(seqloss.InputError, match=r"targets .*ragged.*row 1 has 1"):
        seqloss.ctc_loss(lp, [[1, 2, 3], [1]], [6, 6], [3, 1])
    # Padded nested lists are fine, padding never read.
    a = seqloss.ctc_loss(lp, [[1, 2, 3], [1, -1, -1]], [6, 6], [3, 1], reduction="none")
    b = seqloss.ctc_loss(lp, torch.tensor([[1, 2, 3], [1, 0, 0]]), [6, 6], [3, 1], reduction="none")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


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


@pytest.mark.parametrize("form", [np.int64, np.int32, torch.tensor], ids=["np64", "np32", "tensor"])
def test_blank_as_an_integral_scalar(form):
    """torch takes a numpy integer or a 0-D integer tensor as ``blank``."""
    x, tg, il, tl = ctc_batch(C=5)
    lp = x.log_softmax(-1)
    want = F.ctc_loss(lp, tg, il, tl, blank=0, reduction="none")
    torch.testing.assert_close(seqloss.ctc_loss(lp, tg, il, tl, blank=form(0), reduction="none"),
                               want, rtol=1e-10, atol=1e-10)
    xr, tgr, ilr, tlr = rnnt_batch()
    torch.testing.assert_close(seqloss.rnnt_loss(xr, tgr, ilr, tlr, blank=form(3)),
                               seqloss.rnnt_loss(xr, tgr, ilr, tlr, blank=3), rtol=0, atol=0)
    with pytest.raises(TypeError, match="blank"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=torch.tensor(0.0))


# ------------------------------------------------------------------ modules, backends
def test_module_repr_names_non_default_arguments():
    assert (repr(seqloss.RNNTLoss(clamp=0.5, reduction="sum"))
            == "RNNTLoss(clamp=0.5, reduction='sum')")
    assert repr(seqloss.CTCLoss()) == "CTCLoss()"
    assert (repr(seqloss.CTCLoss(blank=3, zero_infinity=True))
            == "CTCLoss(blank=3, zero_infinity=True)")


def test_triton_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pytest.importorskip("triton")
    x, tg, il, tl = ctc_batch(T=6)
    with pytest.raises(InputError, match="Triton kernels run on CUDA"):
        seqloss.ctc_loss(x, tg, il, tl, backend="triton")
