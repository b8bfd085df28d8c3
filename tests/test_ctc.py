"""CTC: every backend against brute force, torch, gradcheck and the contract's edge cases;
the input checks (every bad input raises before any kernel runs, naming argument and index).

Each backend's kernel specifics are in test_ctc_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import device_for
from hypothesis import given
from hypothesis import strategies as st

import seqloss
from seqloss import InputError
from seqloss.testing import assert_close_budget, brute_force_ctc

INF = float("inf")


def _batch(T, B, C, S, *, blank=0, seed=0, dtype=torch.float32, min_frac=0.6, device="cpu",
           scale=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, B, C, generator=g, dtype=torch.float64) * scale
    il = torch.randint(max(1, int(T * min_frac)), T + 1, (B,), generator=g)
    tl = torch.randint(0, S + 1, (B,), generator=g)
    tl = torch.minimum(tl, il // 2)
    labels = [c for c in range(C) if c != blank]
    tg = torch.tensor(labels)[torch.randint(0, len(labels), (B, S), generator=g)]
    return logits.to(device=device, dtype=dtype), tg.to(device), il.to(device), tl.to(device)


# ------------------------------------------------------------------ brute force
TINY = [
    # (T, C, target, blank)
    (1, 3, [], 0),
    (1, 3, [2], 0),
    (3, 3, [1, 1], 0),
    (4, 3, [1, 2], 0),
    (5, 3, [1, 1, 2], 0),
    (4, 4, [0, 1], 3),
    (5, 4, [2, 2], 3),
    (2, 3, [1, 1], 0),  # infeasible: needs 3 frames
]


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("case", TINY, ids=[f"T{c[0]}C{c[1]}L{len(c[2])}b{c[3]}" for c in TINY])
def test_brute_force(ctc_backend, case, fused):
    T, C, target, blank = case
    device = device_for(ctc_backend)
    g = torch.Generator().manual_seed(len(target) * 31 + T)
    x = torch.randn(T, C, generator=g, dtype=torch.float64) * 1.5
    xin = x.clone().to(device).requires_grad_()
    loss = seqloss.ctc_loss(xin.unsqueeze(1),
                            torch.tensor([target], dtype=torch.long).reshape(1, -1),
                            [T], [len(target)], blank=blank, reduction="sum",
                            fused_log_softmax=fused, backend=ctc_backend)
    (grad,) = torch.autograd.grad(loss, xin)
    xo = x.clone().requires_grad_()
    lp = xo.log_softmax(-1) if fused else xo
    want = brute_force_ctc(lp, target, blank)
    if torch.isinf(want):
        assert loss.item() == INF
        assert torch.count_nonzero(grad) == 0
        return
    (want_grad,) = torch.autograd.grad(want, xo)
    assert abs(loss.item() - want.item()) <= 1e-10 * max(1.0, abs(want.item()))
    assert (grad.cpu() - want_grad).abs().max().item() <= 1e-10


# ------------------------------------------------------------------ against torch
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("blank_last", [False, True], ids=["blank0", "blankC-1"])
@pytest.mark.parametrize("concat", [False, True], ids=["padded", "concat"])
def test_matches_torch(ctc_backend, reduction, blank_last, concat):
    T, B, C, S = (30, 4, 7, 8) if ctc_backend == "triton" else (40, 6, 12, 12)
    blank = C - 1 if blank_last else 0
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(T, B, C, S, blank=blank, seed=1, scale=1.0)
    tl[0] = 0
    targets = torch.cat([tg[b, : tl[b]] for b in range(B)]) if concat else tg
    x1 = logits.clone().to(device).requires_grad_()
    ours = seqloss.ctc_loss(x1.log_softmax(-1), targets.to(device), il, tl, blank, reduction,
                            backend=ctc_backend)
    (ours_g,) = torch.autograd.grad(ours.sum(), x1)
    # torch in float64 on the same float32 values: torch's own float32 rounding
    # (about 2e-5 at T=40) would otherwise dominate the comparison.
    x2 = logits.double().requires_grad_()
    ref = F.ctc_loss(x2.log_softmax(-1), targets, il, tl, blank, reduction)
    (ref_g,) = torch.autograd.grad(ref.sum(), x2)
    assert ours.dtype == torch.float32
    assert_close_budget(ours, ref, rtol=1e-5, atol_scale=1e-6, what="loss")
    assert_close_budget(ours_g, ref_g, rtol=1e-5, atol_scale=1e-6, atol=1e-7, what="grad")


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_infeasible_matches_torch(ctc_backend, zero_infinity):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(10, 3, 5, 6, seed=2)
    tg[1, :6] = torch.tensor([1, 1, 1, 2, 2, 3])
    tl[1], il[1] = 6, 8  # needs 6 + 3 repeats = 9 frames
    x = logits.clone().to(device).requires_grad_()
    ours = seqloss.ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none",
                            zero_infinity=zero_infinity, backend=ctc_backend)
    (g,) = torch.autograd.grad(ours.sum(), x)
    ref = F.ctc_loss(logits.log_softmax(-1), tg, il, tl, reduction="none",
                     zero_infinity=zero_infinity)
    assert ours[1].item() == (0.0 if zero_infinity else INF)
    assert torch.count_nonzero(g[:, 1]) == 0
    assert_close_budget(ours, ref, rtol=1e-5, what="loss")
    assert torch.isfinite(g).all()


# ------------------------------------------------------------------ gradcheck
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_gradcheck(ctc_backend, fused):
    device = device_for(ctc_backend)
    # The Triton interpreter costs ~0.25 s per call and gradcheck makes one call per
    # input element: a smaller (equally exhaustive) input keeps it affordable.
    shape = (4, 2, 3, 2) if ctc_backend == "triton" else (6, 3, 4, 3)
    logits, tg, il, tl = _batch(*shape, seed=3, dtype=torch.float64, device=device)
    lp = logits if fused else logits.log_softmax(-1)
    lp = lp.detach().requires_grad_()
    f = lambda z: seqloss.ctc_loss(z, tg, il, tl, reduction="none", fused_log_softmax=fused,
                                   backend=ctc_backend)
    # Interpreted Triton and the reference (a Python loop over frames: ~0.02 s a call, two
    # calls per element) check one random direction (fast_mode); test_brute_force checks
    # their gradient element by element, Numba's here.
    assert torch.autograd.gradcheck(f, (lp,), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    fast_mode=ctc_backend != "numba")


# ------------------------------------------------------------------ extremes and dtypes
def test_extreme_logits_finite(ctc_backend):
    device = device_for(ctc_backend)
    T, B, C, S = 20, 3, 6, 5
    logits, tg, il, tl = _batch(T, B, C, S, seed=4, dtype=torch.float64)
    peaked = torch.sign(logits) * 1e4  # log-probs reach about -2e4
    lp64 = peaked.log_softmax(-1)
    want = F.ctc_loss(lp64, tg, il, tl, reduction="none")  # float64
    x = lp64.float().to(device).requires_grad_()
    got = seqloss.ctc_loss(x, tg, il, tl, reduction="none", backend=ctc_backend)
    (g,) = torch.autograd.grad(got.sum(), x)
    assert torch.isfinite(got).all() and torch.isfinite(g).all()
    assert_close_budget(got, want, rtol=1e-6, what="loss")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_half_equals_float32_on_rounded(ctc_backend, dtype, fused):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(25, 3, 6, 6, seed=5)
    lp = logits if fused else logits.log_softmax(-1)
    half = lp.to(dtype).to(device).requires_grad_()
    f32 = half.detach().float().requires_grad_()
    a = seqloss.ctc_loss(half, tg, il, tl, reduction="sum", fused_log_softmax=fused,
                         backend=ctc_backend)
    b = seqloss.ctc_loss(f32, tg, il, tl, reduction="sum", fused_log_softmax=fused,
                         backend=ctc_backend)
    assert a.dtype == torch.float32
    (ga,) = torch.autograd.grad(a, half)
    (gb,) = torch.autograd.grad(b, f32)
    assert ga.dtype == dtype
    assert_close_budget(a, b, rtol=1e-6, what="loss")
    # The gradient is rounded once to the half dtype.
    eps = torch.finfo(dtype).eps
    assert_close_budget(ga.float(), gb.to(dtype).float(), rtol=eps, atol=eps * 1e-2, what="grad")


def test_float64_loss_dtype_and_noncontiguous(ctc_backend):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(15, 4, 5, 4, seed=6, dtype=torch.float64)
    btc = logits.transpose(0, 1).contiguous().to(device)  # (B, T, C)
    x = btc.transpose(0, 1)  # (T, B, C), not contiguous
    assert not x.is_contiguous()
    a = seqloss.ctc_loss(x.log_softmax(-1), tg, il, tl, reduction="none", backend=ctc_backend)
    b = F.ctc_loss(logits.log_softmax(-1), tg, il, tl, reduction="none")
    assert a.dtype == torch.float64
    assert_close_budget(a, b, rtol=1e-12, what="loss")


def test_determinism(ctc_backend):
    device = device_for(ctc_backend)
    # The interpreter runs a grid's programs one after another: a small size is enough.
    interpreted = ctc_backend == "triton" and device.type == "cpu"
    logits, tg, il, tl = _batch(12 if interpreted else 30, 4, 8, 6, seed=7, device=device)
    outs = []
    for _ in range(2):
        x = logits.clone().requires_grad_()
        loss = seqloss.ctc_loss(x, tg, il, tl, reduction="sum", fused_log_softmax=True,
                                backend=ctc_backend)
        (g,) = torch.autograd.grad(loss, x)
        outs.append((loss, g))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


# ------------------------------------------------------------------ non-finite input and padding
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("bad", [float("nan"), INF], ids=["nan", "posinf"])
def test_nonfinite_poisons_one_sequence(ctc_backend, fused, bad):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(12, 3, 5, 4, seed=8)
    il[:] = torch.tensor([12, 9, 7])
    lp = logits if fused else logits.log_softmax(-1)
    clean = lp.clone()
    lp[3, 1, 4] = bad  # read frame of sequence 1, a class outside its target maybe
    lp[10, 2, :] = float("nan")  # padding frame of sequence 2: never read
    x = lp.to(device).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction="none", fused_log_softmax=fused,
                            backend=ctc_backend)
    (g,) = torch.autograd.grad(loss.sum(), x)
    want = F.ctc_loss(clean.double().log_softmax(-1) if fused else clean.double(), tg, il, tl,
                      reduction="none")
    assert torch.isnan(loss[1])
    assert torch.isnan(g[:9, 1]).all()
    assert torch.count_nonzero(g[9:, 1]) == 0
    assert_close_budget(loss[[0, 2]], want[[0, 2]], rtol=1e-6, what="other sequences")
    assert torch.isfinite(g[:, [0, 2]]).all()
    assert torch.count_nonzero(g[7:, 2]) == 0


def test_neg_inf_is_a_valid_log_prob(ctc_backend):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(10, 2, 5, 3, seed=9, dtype=torch.float64)
    tg[:] = torch.tensor([1, 2, 3])
    lp = logits.log_softmax(-1)
    lp[:, :, 4] = -INF  # class 4 masked out, never a target
    x = lp.to(device).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction="none", backend=ctc_backend)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert torch.count_nonzero(g[:, :, 4]) == 0
    ref = F.ctc_loss(lp, tg, il, tl, reduction="none")
    assert_close_budget(loss, ref, rtol=1e-10, what="loss")


@pytest.mark.parametrize("mask", [-1e19, "finfo_min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("fused", [False, True], ids=["log_probs", "fused"])
def test_huge_finite_masks_are_exact(ctc_backend, mask, dtype, fused):
    """A label masked with a huge finite value at some frames (``masked_fill(m,
    finfo.min)``): the loss and gradient of the paths that remain, by brute force."""
    device = device_for(ctc_backend)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 1, 4, generator=g, dtype=torch.float64)
    x = x if fused else x.log_softmax(-1)
    m = torch.finfo(dtype).min if mask == "finfo_min" else mask
    x[2, 0, 1] = m  # label 1 at frame 2
    x[4, 0, 0] = m  # blank at frame 4
    x = x.to(dtype)
    xd = x[:, 0].double().requires_grad_()
    ref = brute_force_ctc(xd.log_softmax(-1) if fused else xd, [1, 2])
    (gref,) = torch.autograd.grad(ref, xd)
    xx = x.to(device).requires_grad_()
    loss = seqloss.ctc_loss(xx, [[1, 2]], [6], [2], reduction="sum", backend=ctc_backend,
                            fused_log_softmax=fused)
    (gx,) = torch.autograd.grad(loss, xx)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(gx[:, 0].double().cpu(), gref, rtol=tol, atol=tol)


def test_all_paths_masked_is_infeasible(ctc_backend):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(6, 1, 4, 2, seed=10, dtype=torch.float64)
    tg[:] = torch.tensor([1, 2])
    tl[:] = 2
    il[:] = 6
    lp = logits.log_softmax(-1)
    lp[:, :, 2] = -INF  # the target's label 2 can never be emitted
    x = lp.to(device).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction="none", backend=ctc_backend)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert loss.item() == INF and torch.count_nonzero(g) == 0


def test_zero_frames(ctc_backend):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(5, 3, 4, 2, seed=11)
    il[:] = torch.tensor([0, 0, 5])
    tl[:] = torch.tensor([0, 1, 1])
    x = logits.log_softmax(-1).to(device).requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, reduction="none", backend=ctc_backend)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert loss[0].item() == 0.0 and loss[1].item() == INF and torch.isfinite(loss[2])
    assert torch.count_nonzero(g[:, :2]) == 0


def test_unbatched(ctc_backend):
    device = device_for(ctc_backend)
    logits, tg, il, tl = _batch(12, 1, 5, 4, seed=12)
    lp = logits[:, 0].log_softmax(-1).to(device)
    for red in ["none", "sum", "mean"]:
        t0 = tg[0, : tl[0]]
        a = seqloss.ctc_loss(lp, t0, int(il[0]), int(tl[0]), reduction=red, backend=ctc_backend)
        b = F.ctc_loss(lp.cpu(), t0, il[0], tl[0], reduction=red)
        assert a.shape == b.shape
        assert_close_budget(a, b, rtol=1e-5, what=red)


@given(
    T=st.integers(1, 12),
    B=st.integers(1, 4),
    C=st.integers(2, 6),
    S=st.integers(0, 6),
    blank_last=st.booleans(),
    seed=st.integers(0, 2**16),
    repeats=st.booleans(),
)
def test_hypothesis_against_torch(T, B, C, S, blank_last, seed, repeats):
    blank = C - 1 if blank_last else 0
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * 3
    il = torch.randint(0, T + 1, (B,), generator=g)
    tl = torch.randint(0, S + 1, (B,), generator=g)
    labels = torch.tensor([c for c in range(C) if c != blank])
    n = 1 if repeats else len(labels)
    tg = labels[torch.randint(0, n, (B, S), generator=g)]
    lp = x.log_softmax(-1)
    for backend in ("reference", "numba"):
        try:
            ours = seqloss.ctc_loss(lp, tg, il, tl, blank, "none", backend=backend)
        except ImportError:
            continue
        ref = F.ctc_loss(lp, tg, il, tl, blank, "none")
        assert_close_budget(ours, ref, rtol=1e-9, atol=1e-9, what=backend)


# ------------------------------------------------------------------ input checks
def _ok(T=8, B=3, C=5, S=4):
    lp = torch.randn(T, B, C).log_softmax(-1)
    tg = torch.randint(1, C, (B, S))
    il = torch.full((B,), T)
    tl = torch.full((B,), S - 1)
    return lp, tg, il, tl


def test_input_error_is_value_and_runtime_error():
    assert issubclass(InputError, ValueError) and issubclass(InputError, RuntimeError)


@pytest.mark.parametrize("backend", ["reference", "numba", "numba-pool"])
def test_value_errors_name_argument_and_index(backend, monkeypatch):
    if backend == "numba-pool":
        # A batch this small runs on the calling thread in one Numba call (checks
        # included); force the pool's path, whose checks run in a call of their own.
        from seqloss.ctc import numba_cpu

        monkeypatch.setattr(numba_cpu, "POOL_MIN_CELLS", 0)
        old = torch.get_num_threads()
        torch.set_num_threads(2)
        monkeypatch.setattr(numba_cpu, "_ctc_chunk", _no_kernel)
        backend = "numba"
        try:
            _value_cases(backend)
        finally:
            torch.set_num_threads(old)
        return
    _value_cases(backend)


def _no_kernel(*args):
    raise AssertionError("a kernel ran before the checks raised")


def _value_cases(backend: str) -> None:
    lp, tg, il, tl = _ok()
    cases = [
        (dict(il=torch.tensor([8, -1, 8])), r"input_lengths\[1\] = -1 is negative"),
        (dict(il=torch.tensor([8, 8, 9])), r"input_lengths\[2\] = 9 exceeds"),
        (dict(tl=torch.tensor([3, -2, 3])), r"target_lengths\[1\] = -2 is negative"),
        (dict(tl=torch.tensor([5, 3, 3])), r"target_lengths\[0\] = 5 exceeds targets.size\(1\)"),
        (dict(tg=torch.tensor([[1, 2, 3, 0], [1, 7, 1, 1], [1, 1, 1, 1]])),
         r"targets\[1, 1\] = 7 is out of range"),
        (dict(tg=torch.tensor([[1, 2, 3, 0], [1, 1, 1, 1], [1, -3, 1, 1]])),
         r"targets\[2, 1\] = -3 is out of range"),
        (dict(tg=torch.tensor([[1, 0, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1]])),
         r"targets\[0, 1\] = 0 equals blank"),
    ]
    for kw, msg in cases:
        args = dict(lp=lp, tg=tg, il=il, tl=tl) | kw
        with pytest.raises(InputError, match=msg):
            seqloss.ctc_loss(args["lp"], args["tg"], args["il"], args["tl"], backend=backend)


def test_padding_ids_are_not_validated():
    lp, tg, il, tl = _ok()
    tg[:, -1] = -1  # ESPnet pads with -1; target_lengths = S - 1 never reads it
    loss = seqloss.ctc_loss(lp, tg, il, tl, reduction="none")
    assert torch.isfinite(loss).all()


def test_concatenated_targets_errors():
    lp, _, il, _ = _ok()
    tl = torch.tensor([2, 1, 2])
    with pytest.raises(InputError, match="sum to 5 but the concatenated 1-D targets hold 4"):
        seqloss.ctc_loss(lp, torch.tensor([1, 2, 3, 4]), il, tl)
    with pytest.raises(InputError, match=r"batch item 1, position 0"):
        seqloss.ctc_loss(lp, torch.tensor([1, 2, 9, 4, 4]), il, tl)


def test_shape_errors():
    lp, tg, il, tl = _ok()
    with pytest.raises(InputError, match="input_lengths must have shape \\(3,\\)"):
        seqloss.ctc_loss(lp, tg, il[:2], tl)
    with pytest.raises(InputError, match="target_lengths must have shape \\(3,\\)"):
        seqloss.ctc_loss(lp, tg, il, torch.tensor([1, 1, 1, 1]))
    with pytest.raises(InputError, match="targets must have shape \\(B=3, S\\)"):
        seqloss.ctc_loss(lp, tg[:2], il, tl)
    with pytest.raises(InputError, match="log_probs must be"):
        seqloss.ctc_loss(lp[None], tg, il, tl)
    with pytest.raises(InputError, match="blank = 5 is out of range"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=5)
    with pytest.raises(InputError, match="blank = -1 is out of range"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=-1)
    with pytest.raises(InputError, match="reduction"):
        seqloss.ctc_loss(lp, tg, il, tl, reduction="avg")
    with pytest.raises(InputError, match="backend='cuda'"):
        seqloss.ctc_loss(lp, tg, il, tl, backend="cuda")
    with pytest.raises(InputError, match="targets must be"):
        seqloss.ctc_loss(lp, tg[None], il, tl)


def test_type_errors():
    lp, tg, il, tl = _ok()
    with pytest.raises(TypeError, match="log_probs must be float16"):
        seqloss.ctc_loss(lp.long(), tg, il, tl)
    with pytest.raises(TypeError, match="targets must be an int32 or int64 tensor"):
        seqloss.ctc_loss(lp, tg.float(), il, tl)
    with pytest.raises(TypeError, match="input_lengths must be an int32 or int64 tensor"):
        seqloss.ctc_loss(lp, tg, il.float(), tl)
    with pytest.raises(TypeError, match="target_lengths\\[0\\] must be an int"):
        seqloss.ctc_loss(lp, tg, il, [3.0, 3, 3])
    with pytest.raises(TypeError, match="blank must be an int"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=0.0)


def test_lengths_as_python_sequences_and_int32():
    lp, tg, il, tl = _ok()
    a = seqloss.ctc_loss(lp, tg, il.tolist(), tl.tolist(), reduction="none")
    b = seqloss.ctc_loss(lp, tg.int(), il.int(), tl.int(), reduction="none")
    c = seqloss.ctc_loss(lp, tg.tolist(), tuple(il.tolist()), tl, reduction="none")
    assert torch.equal(a, b) and torch.equal(a, c)


def test_validate_false_skips_value_checks_but_computes_valid_input():
    lp, tg, il, tl = _ok()
    a = seqloss.ctc_loss(lp, tg, il, tl, validate=False)
    b = seqloss.ctc_loss(lp, tg, il, tl)
    assert torch.equal(a, b)


def test_double_backward_raises():
    lp, tg, il, tl = _ok()
    x = lp.double().requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, backend="reference")
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        g.sum().backward()


def test_env_var_selects_backend(monkeypatch):
    lp, tg, il, tl = _ok()
    monkeypatch.setenv("SEQLOSS_BACKEND", "bogus")
    with pytest.raises(InputError, match="SEQLOSS_BACKEND='bogus'"):
        seqloss.ctc_loss(lp, tg, il, tl)
    monkeypatch.setenv("SEQLOSS_BACKEND", "reference")
    a = seqloss.ctc_loss(lp, tg, il, tl)
    monkeypatch.delenv("SEQLOSS_BACKEND")
    b = seqloss.ctc_loss(lp, tg, il, tl, backend="reference")
    assert torch.equal(a, b)


# ------------------------------------------------------------------ the registered op
def test_opcheck():
    x, tg, il, tl = _batch(6, 2, 5, 3, dtype=torch.float64)
    x = x.requires_grad_()
    for fused, reduction, zinf, dp in ((False, "none", False, 0.0),
                                       (True, "mean_target", True, 0.3),
                                       (False, "sum", False, -0.2)):
        args = (x, tg, il, tl, 0, fused, reduction, zinf, dp, "reference", True, True)
        torch.library.opcheck(torch.ops.seqloss.ctc_loss.default, args)
