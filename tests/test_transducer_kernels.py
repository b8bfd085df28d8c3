"""Transducer kernel specifics, at each backend's kernel interface.

Triton (on CPU under ``TRITON_INTERPRET=1``, set by conftest before the kernels are
imported; compiled on a CUDA machine): the general lattice, RNN-T's joint and the joint on
tables beyond RNN-T (multi-blank, TDT, mixed), dtypes, layouts, NaN, against the float64
reference kernels (``seqloss.transducer.joint.reference.joint_loss_forward``, whose lattice
is checked against brute force in test_lattice.py).

Numba: the joint's many-arc path (multi-blank, TDT) on lattices too long to enumerate.
There the oracle is a float64 forward recursion written here with ``torch.logsumexp`` over
each state's incoming arcs (NeMo's conventions, as in test_tdt.py / test_multiblank.py),
differentiated by autograd: no code shared with the kernels. The lattices are long and
the logits spread, so that occupations span hundreds of orders of magnitude: the path
skips states whose gradient row rounds to zero, stores values at or below half the
least float32 subnormal as 0 and runs beta on a ring of frames (durations up to 8).

Numba's row passes on CPU (``seqloss.transducer.joint.numba_rows``): the written-out
``exp`` against libm, rows of ``-inf``, wide rows against float64 and chunked torch ops,
every table against the float64 reference, and results independent of the thread count.
"""

from __future__ import annotations

import importlib
import importlib.util
import math

import numpy as np
import pytest
import torch
from conftest import device_for

import seqloss
from seqloss.testing import assert_close_budget
from seqloss.transducer.hat import hat_table
from seqloss.transducer.joint import reference as joint_ref
from seqloss.transducer.joint.table import Arc, JointTable, rnnt_table
from seqloss.transducer.lattice import reference as lattice_ref

_TRITON = importlib.util.find_spec("triton") is not None
LAT = importlib.import_module("seqloss.transducer.lattice.triton_cuda") if _TRITON else None
JOINT = importlib.import_module("seqloss.transducer.joint.triton_cuda") if _TRITON else None
triton_only = pytest.mark.skipif(not _TRITON, reason="triton is not installed")
numba_only = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")
DEVICE = device_for("triton")
NAN = float("nan")
INF = float("inf")


# ------------------------------------------------------------------ Triton: lattice, RNN-T joint
def _arcs(B, T, U1, Db, De, seed):
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(B, T, U1, Db, generator=g, dtype=torch.float64) - 1.0
    ae = torch.randn(B, T, U1, De, generator=g, dtype=torch.float64) - 1.0
    return ab, ae


def _poison_unread(ab, ae, il, tl):
    """NaN in every arc entry the lattice must not read (frames t >= T_b, rows u > U_b)."""
    ab, ae = ab.clone(), ae.clone()
    for b in range(ab.shape[0]):
        for x in (ab, ae):
            x[b, il[b]:] = NAN
            x[b, :, tl[b] + 1:] = NAN
        ae[b, :, tl[b]] = NAN  # no emission from the last row
    return ab, ae


LATTICES = [
    # (blank_durations, emit_durations)
    ((1,), (0,)),  # RNN-T
    ((1, 2, 4), (0, 1, 2)),  # multi-duration both ways
    ((1, 2), (0, 1, 2)),  # TDT with durations (0, 1, 2)
    ((2, 3), (1,)),  # no unit blank, no zero-duration emission
]


@triton_only
@pytest.mark.parametrize("durs", LATTICES,
                         ids=[f"b{d[0]}e{d[1]}".replace(" ", "") for d in LATTICES])
def test_triton_lattice_matches_reference(durs):
    bd, ed = durs
    B, T, U1 = 5, 9, 5
    ab, ae = _arcs(B, T, U1, len(bd), len(ed), seed=len(bd) * 10 + len(ed))
    il = torch.tensor([9, 4, 7, 1, 0])
    tl = torch.tensor([4, 2, 0, 3, 1])
    want = lattice_ref.transducer_lattice(ab, ae, il, tl, bd, ed, True)
    ab_p, ae_p = _poison_unread(ab, ae, il, tl)
    got = LAT.transducer_lattice(ab_p.to(DEVICE), ae_p.to(DEVICE), il, tl, bd, ed, True)
    names = ("log_likelihood", "occ_blank", "occ_emit")
    for name, a, e in zip(names, got, want, strict=True):
        assert a.dtype == torch.float64 and a.shape == e.shape
        assert_close_budget(a, e, rtol=1e-10, atol=1e-10, what=name)
    assert got[0][4].item() == -INF  # no frame, no path
    assert torch.count_nonzero(got[1][4]) == 0 and torch.count_nonzero(got[2][4]) == 0
    # Every unread entry has exactly zero occupation.
    for b in range(B):
        for occ in got[1:]:
            assert torch.count_nonzero(occ[b, il[b]:]) == 0
            assert torch.count_nonzero(occ[b, :, tl[b] + 1:]) == 0
    # Without occupations: the same log-likelihood, bit for bit.
    ll, e1, e2 = LAT.transducer_lattice(ab_p.to(DEVICE), ae_p.to(DEVICE), il, tl, bd, ed, False)
    assert torch.equal(ll, got[0]) and e1.numel() == 0 and e2.numel() == 0


@triton_only
def test_triton_lattice_infeasible_and_float32():
    """-inf arcs make sequences infeasible (zero occupations); float32 matches float64."""
    bd, ed = (1, 2), (0, 1)
    B, T, U1 = 3, 6, 4
    ab, ae = _arcs(B, T, U1, 2, 2, seed=3)
    ab[1] = -INF  # no blank arc: never reaches the last frame
    il = torch.tensor([6, 6, 3])
    tl = torch.tensor([3, 2, 3])
    ll, ob, oe = LAT.transducer_lattice(ab.float().to(DEVICE), ae.float().to(DEVICE), il, tl, bd,
                                        ed, True)
    want = lattice_ref.transducer_lattice(ab.float(), ae.float(), il, tl, bd, ed, True)
    assert ll.dtype == torch.float32
    assert (ll[1].item() == -INF and torch.count_nonzero(ob[1]) == 0
            and torch.count_nonzero(oe[1]) == 0)
    assert_close_budget(ll, want[0], rtol=1e-6, what="ll")
    assert_close_budget(ob, want[1], rtol=0, atol=1e-6, what="occ_blank")
    assert_close_budget(oe, want[2], rtol=0, atol=1e-6, what="occ_emit")


@triton_only
def test_triton_lattice_noncontiguous_arcs():
    bd, ed = (1, 2), (0, 1)
    ab, ae = _arcs(2, 5, 4, 2, 2, seed=4)
    il, tl = torch.tensor([5, 3]), torch.tensor([3, 1])
    want = lattice_ref.transducer_lattice(ab, ae, il, tl, bd, ed, True)
    # Arcs laid out as (B, D, U+1, T) in memory, viewed as (B, T, U+1, D).
    abt = ab.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1)
    aet = ae.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1)
    got = LAT.transducer_lattice(abt.to(DEVICE), aet.to(DEVICE), il, tl, bd, ed, True)
    for a, e in zip(got, want, strict=True):
        assert_close_budget(a, e, rtol=1e-12, atol=1e-15, what="lattice")


# ------------------------------------------------------------------ RNN-T forward
def _rnnt_inputs(B, T, U, V, seed, *, pad_t=1, pad_u=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + pad_t, U + 1 + pad_u, V, generator=g, dtype=torch.float64) * 2
    tg = torch.randint(1, V, (B, U), generator=g)
    il = torch.randint(1, T + 1, (B,), generator=g)
    tl = torch.randint(0, U + 1, (B,), generator=g)
    il[0], tl[0] = T, U
    return x.to(dtype), tg, il, tl


def _pack(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1]) for b in range(len(il))])


def _rnnt_fwd(mod, x, tg, il, tl, *, fused=True, clamp=-1.0, lam=0.0, scale=1.0, buf=None, blank=0):
    table = rnnt_table(x.shape[-1], blank, clamp, lam)
    return mod.joint_loss_forward(x, tg, il, tl, table, fused, True, buf, scale)


@triton_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_triton_half_inputs(dtype, fused):
    """Half logits: float32 loss; the gradient is the float32 computation rounded once."""
    x, tg, il, tl = _rnnt_inputs(3, 7, 4, 9, seed=5)
    if not fused:
        x = x.log_softmax(-1)
    xh = x.to(dtype).to(DEVICE)
    loss, g = _rnnt_fwd(JOINT, xh, tg, il, tl, fused=fused, clamp=0.3, lam=0.1, scale=0.5)
    loss32, g32 = _rnnt_fwd(JOINT, xh.float(), tg, il, tl, fused=fused, clamp=0.3, lam=0.1,
                            scale=0.5)
    assert loss.dtype == torch.float32 and g.dtype == dtype
    assert torch.equal(loss, loss32)
    assert torch.equal(g, g32.to(dtype))
    want, _ = _rnnt_fwd(joint_ref, xh.double().cpu(), tg, il, tl, fused=fused, clamp=0.3, lam=0.1,
                   scale=0.5)
    assert_close_budget(loss, want, rtol=1e-5, what="loss")


@triton_only
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_triton_noncontiguous_logits(packed):
    x, tg, il, tl = _rnnt_inputs(3, 6, 3, 7, seed=6)
    if packed:
        x = _pack(x, il, tl)
        wide = torch.randn(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
        wide[:, ::2] = x
        xs = wide[:, ::2]  # class stride 2
    else:
        xs = x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # (t, u) strides swapped
    assert not xs.is_contiguous()
    kw = dict(clamp=0.2, lam=0.3, scale=0.25, blank=2)
    want_l, want_g = _rnnt_fwd(joint_ref, x, tg, il, tl, **kw)
    loss, g = _rnnt_fwd(JOINT, xs.to(DEVICE), tg, il, tl, **kw)
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-12, atol=1e-15, what="grad")
    # The in-place mode writes through the same strides.
    buf = xs.clone() if packed else xs.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    buf = buf.to(DEVICE)
    loss2, g2 = _rnnt_fwd(JOINT, buf, tg, il, tl, buf=buf, **kw)
    assert g2.data_ptr() == buf.data_ptr()
    assert torch.equal(loss2, loss) and torch.equal(g2, g)


@triton_only
@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_triton_nan_sequence_leaves_others_alone(fused):
    x, tg, il, tl = _rnnt_inputs(4, 6, 3, 6, seed=7, dtype=torch.float32)
    il[:], tl[:] = torch.tensor([6, 5, 3, 4]), torch.tensor([3, 1, 2, 0])
    if not fused:
        x = x.log_softmax(-1)
    clean_l, clean_g = _rnnt_fwd(JOINT, x.to(DEVICE), tg, il, tl, fused=fused)
    x[2, 1, 2, 4] = NAN
    x[0, 5, 3, 1] = INF  # the last row sequence 0 reads
    x[3, 4:, :, :] = NAN  # sequence 3's padding frames: never read
    loss, g = _rnnt_fwd(JOINT, x.to(DEVICE), tg, il, tl, fused=fused)
    assert torch.isnan(loss[[0, 2]]).all()
    assert torch.equal(loss[[1, 3]], clean_l[[1, 3]]) and torch.equal(g[[1, 3]], clean_g[[1, 3]])
    for b in (0, 2):
        assert torch.isnan(g[b, : il[b], : tl[b] + 1]).all()
        assert (torch.count_nonzero(g[b, il[b]:]) == 0
                and torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0)


@triton_only
def test_triton_extreme_scale_and_neg_inf_rows():
    """Logits over thousands of nats stay finite; a row of -inf logits has no arc out of it."""
    x, tg, il, tl = _rnnt_inputs(2, 5, 3, 6, seed=8)
    x = x * 1000
    x[1, 0, 0, :] = -INF  # sequence 1 cannot leave (0, 0): infeasible, zero gradient
    want_l, want_g = _rnnt_fwd(joint_ref, x, tg, il, tl, clamp=0.5)
    loss, g = _rnnt_fwd(JOINT, x.to(DEVICE), tg, il, tl, clamp=0.5)
    assert loss[1].item() == INF and torch.count_nonzero(g[1]) == 0
    assert torch.isfinite(loss[0]) and torch.isfinite(g).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-12, atol=1e-15, what="grad")


# ------------------------------------------------------------------ Triton: joint tables
V = 7
BLANK = V - 1
DURS = (0, 1, 2, 3)  # TDT's durations


def _table(kind: str, **kw) -> JointTable:
    if kind == "multiblank":  # RNN-T plus a big blank of duration 2 at blank - 1
        return JointTable((Arc(1, token=BLANK), Arc(2, token=BLANK - 1)), (Arc(0),), V, **kw)
    if kind == "tdt":  # token logits, then one duration logit per entry of DURS
        blanks = tuple(Arc(d, token=BLANK, duration_logit=k) for k, d in enumerate(DURS) if d > 0)
        emits = tuple(Arc(d, duration_logit=k) for k, d in enumerate(DURS))
        return JointTable(blanks, emits, V, len(DURS), **kw)
    if kind == "mixed":  # arcs with and without a duration term, two blank classes
        blanks = (Arc(1, token=BLANK), Arc(2, token=BLANK, duration_logit=1), Arc(3, token=2))
        emits = (Arc(0, duration_logit=0), Arc(1), Arc(2, duration_logit=1))
        return JointTable(blanks, emits, V, 2, **kw)
    raise AssertionError(kind)


def _inputs(table, B=4, T=6, U=3, *, seed=0, fused=True, pad_t=1, pad_u=1, scale=2.0, lengths=None):
    """Padded logits with NaN in the padding (never read), targets avoiding the blank classes."""
    g = torch.Generator().manual_seed(seed)
    V, D = table.num_tokens, table.num_durations
    x = torch.randn(B, T + pad_t, U + 1 + pad_u, V + D, generator=g, dtype=torch.float64) * scale
    if not fused:  # log-probabilities, per block
        x = torch.cat([x[..., :V].log_softmax(-1), x[..., V:].log_softmax(-1)], -1)
    tg = torch.randint(0, BLANK - 1, (B, U), generator=g)
    il = torch.randint(1, T + 1, (B,), generator=g)
    tl = torch.randint(0, U + 1, (B,), generator=g)
    il[0], tl[0] = T, U
    il[-1], tl[-1] = 1, 0  # a single frame, no label
    if lengths is not None:
        il, tl = torch.tensor(lengths[0]), torch.tensor(lengths[1])
    for b in range(B):
        x[b, il[b]:] = NAN
        x[b, :, tl[b] + 1:] = NAN
    return x, tg, il, tl


def _fwd(mod, x, tg, il, tl, table, fused=True, *, compute_grad=True, buf=None, scale=1.0):
    return mod.joint_loss_forward(x, tg, il, tl, table, fused, compute_grad, buf, scale)


CASES = [
    pytest.param("multiblank", dict(sigma=0.05, fastemit_lambda=0.2),
                 id="multiblank-sigma-fastemit"),
    pytest.param("multiblank", dict(clamp=0.3, emit_can_end=True), id="multiblank-clamp-canend"),
    pytest.param("tdt", dict(sigma=0.05, clamp=0.4), id="tdt-sigma-clamp"),
    pytest.param("tdt", dict(fastemit_lambda=0.1, emit_can_end=True), id="tdt-fastemit-canend"),
    pytest.param("mixed", dict(sigma=0.1, fastemit_lambda=0.3, clamp=0.25, emit_can_end=True),
                 id="mixed-all"),
]


@triton_only
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logprobs"])
@pytest.mark.parametrize(("kind", "opts"), CASES)
def test_triton_float64_matches_reference(kind, opts, fused, packed):
    table = _table(kind, **opts)
    x, tg, il, tl = _inputs(table, seed=len(kind) + 3 * fused + packed, fused=fused)
    if packed:
        x = _pack(x, il, tl)
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, table, fused, scale=0.5)
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table, fused, scale=0.5)
    assert loss.dtype == torch.float64 and g.dtype == torch.float64 and g.shape == x.shape
    assert torch.isfinite(want_l).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-11, atol=1e-14, what="grad")
    if not packed:  # padding: exactly zero
        for b in range(len(il)):
            assert torch.count_nonzero(g[b, il[b]:]) == 0
            assert torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0
    # Without the gradient: the same loss, bit for bit.
    loss2, e = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table, fused, compute_grad=False)
    assert torch.equal(loss2, loss) and e.numel() == 0


@triton_only
@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_triton_float32_against_float64(kind):
    table = _table(kind, sigma=0.05, fastemit_lambda=0.1, clamp=0.5)
    x, tg, il, tl = _inputs(table, seed=11)
    x32 = x.float()
    want_l, want_g = _fwd(joint_ref, x32.double(), tg, il, tl, table)  # on the rounded inputs
    loss, g = _fwd(JOINT, x32.to(DEVICE), tg, il, tl, table)
    assert loss.dtype == torch.float32 and g.dtype == torch.float32
    assert_close_budget(loss, want_l, rtol=1e-6, atol=1e-6, what="loss")
    assert_close_budget(g, want_g, rtol=1e-5, atol=1e-6, what="grad")


@triton_only
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logprobs"])
@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_triton_bf16_is_float32_rounded_once(kind, fused):
    table = _table(kind, sigma=0.02, clamp=0.3, fastemit_lambda=0.1)
    x, tg, il, tl = _inputs(table, B=3, T=5, U=2, seed=5, fused=fused, pad_t=0, pad_u=0)
    xh = x.to(torch.bfloat16).to(DEVICE)
    loss, g = _fwd(JOINT, xh, tg, il, tl, table, fused, scale=0.5)
    loss32, g32 = _fwd(JOINT, xh.float(), tg, il, tl, table, fused, scale=0.5)
    assert loss.dtype == torch.float32 and g.dtype == torch.bfloat16
    assert torch.equal(loss, loss32)
    assert torch.equal(g, g32.to(torch.bfloat16))
    want_l, want_g = _fwd(joint_ref, xh.double().cpu(), tg, il, tl, table, fused, scale=0.5)
    assert_close_budget(loss, want_l, rtol=1e-5, what="loss")
    # bfloat16 keeps 8 bits: half an ulp of the largest entry, plus float32's own error.
    assert_close_budget(g, want_g, rtol=2 ** -8, atol=1e-6, what="grad")


@triton_only
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_triton_in_place_and_deterministic(packed):
    table = _table("mixed", sigma=0.05, clamp=0.3, fastemit_lambda=0.2)
    x, tg, il, tl = _inputs(table, seed=9, pad_t=0, pad_u=0)
    x = (_pack(x, il, tl) if packed else x).float().to(DEVICE)
    loss, g = _fwd(JOINT, x, tg, il, tl, table)
    loss_b, g_b = _fwd(JOINT, x, tg, il, tl, table)
    assert torch.equal(loss, loss_b) and torch.equal(g, g_b)  # bitwise repeat
    buf = x.clone()
    loss2, g2 = _fwd(JOINT, buf, tg, il, tl, table, buf=buf)
    assert g2.data_ptr() == buf.data_ptr()
    assert torch.equal(loss2, loss) and torch.equal(g2, g)


@triton_only
def test_triton_nan_inf_and_neg_inf_rows():
    """NaN/+inf in either block poisons its sequence only; -inf duration logits remove arcs."""
    table = _table("tdt", sigma=0.05)
    x, tg, il, tl = _inputs(table, B=5, seed=13, lengths=([6, 5, 4, 3, 2], [3, 1, 2, 0, 1]))
    clean_l, clean_g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table)
    x = x.clone()
    x[0, 5, 3, 2] = INF  # a token logit of the last row sequence 0 reads
    x[2, 1, 0, V + 2] = NAN  # a duration logit
    x[1, 0, 0, V:] = -INF  # no duration out of (0, 0): sequence 1 has no path
    x[3, 1, 0, V + 1 :] = -INF  # only duration 0 left at (1, 0): emissions only there
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table)
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, table)
    assert torch.isnan(loss[[0, 2]]).all() and loss[1].item() == INF
    assert torch.isfinite(loss[[3, 4]]).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-11, atol=1e-14, what="grad")
    assert torch.equal(loss[4], clean_l[4]) and torch.equal(g[4], clean_g[4])
    for b in (0, 2):
        assert torch.isnan(g[b, : il[b], : tl[b] + 1]).all()
        assert torch.count_nonzero(g[b, il[b]:]) == 0
        assert torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0
    assert torch.count_nonzero(g[1]) == 0


@triton_only
def test_triton_extreme_scale():
    """Logits over thousands of nats: finite, and float64-accurate (arcs and lattice in float64)."""
    table = _table("tdt", clamp=0.5, sigma=0.05)
    x, tg, il, tl = _inputs(table, B=2, T=5, U=2, seed=8, pad_t=0, pad_u=0, scale=2000.0)
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, table)
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-11, atol=1e-14, what="grad")


@triton_only
def test_triton_width_must_match_the_table():
    table = _table("tdt")
    x, tg, il, tl = _inputs(table, B=1, T=2, U=1, seed=1, pad_t=0, pad_u=0)
    with pytest.raises(ValueError, match="V \\+ D"):
        _fwd(JOINT, x[..., :-1].to(DEVICE), tg, il, tl, table)


# ------------------------------------------------------------------ Numba: long lattices
def _batch(B, T, U, W, *, seed, scale=3.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T + 1, U + 2, W, generator=g, dtype=torch.float64) * scale
    il = torch.tensor([T, T - 3, T - 7][:B])
    tl = torch.tensor([U, U - 1, U - 3][:B])
    for b in range(B):  # padding never read
        x[b, il[b]:] = float("nan")
        x[b, :, tl[b] + 1:] = float("nan")
    return x.to(dtype), il, tl


def _dp(blank_arcs, emit_arcs, Tb, Ub, z):
    """``-log p`` by the forward recursion; arcs: lists of ``(duration, score(t, u))``.

    ``z[t, u]`` (zeros) is added to every arc leaving ``(t, u)``: the gradient with
    respect to it is the state's occupation (of the arcs leaving it).
    """
    alpha = {(0, 0): torch.zeros((), dtype=torch.float64)}
    for t in range(Tb + 1):
        for u in range(Ub + 1):
            if (t, u) == (0, 0):
                continue
            terms = []
            for d, score in blank_arcs:
                if t - d >= 0 and (t - d, u) in alpha:
                    terms.append(alpha[(t - d, u)] + score(t - d, u) + z[t - d, u])
            if u > 0 and t < Tb:  # an emission lands on a frame < T_b
                for d, score in emit_arcs:
                    if 0 <= t - d < Tb and (t - d, u - 1) in alpha:
                        terms.append(alpha[(t - d, u - 1)] + score(t - d, u - 1) + z[t - d, u - 1])
            if terms:
                alpha[(t, u)] = torch.logsumexp(torch.stack(terms), 0)
    return -alpha[(Tb, Ub)]


def _oracle_multiblank(x, tg, il, tl, big, sigma):
    x = x.detach().double().requires_grad_()
    z = torch.zeros(x.shape[:3], dtype=torch.float64, requires_grad=True)
    V = x.shape[-1]
    losses = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        lp = torch.log_softmax(x[b, :Tb, : Ub + 1], -1) - sigma
        blanks = [(1, lambda t, u, lp=lp: lp[t, u, V - 1])]
        blanks += [(d, lambda t, u, lp=lp, c=V - 2 - i: lp[t, u, c]) for i, d in enumerate(big)]
        emits = [(0, lambda t, u, lp=lp, y=tg[b]: lp[t, u, y[u]])]
        losses.append(_dp(blanks, emits, Tb, Ub, z[b]))
    loss = torch.stack(losses)
    g, occ = torch.autograd.grad(loss.sum(), (x, z))
    return loss.detach(), g, -occ


def _oracle_tdt(x, tg, il, tl, durs, sigma):
    x = x.detach().double().requires_grad_()
    z = torch.zeros(x.shape[:3], dtype=torch.float64, requires_grad=True)
    D = len(durs)
    V = x.shape[-1] - D
    losses = []
    for b in range(x.shape[0]):
        Tb, Ub = int(il[b]), int(tl[b])
        lp = torch.log_softmax(x[b, :Tb, : Ub + 1, :V], -1) - sigma
        ld = torch.log_softmax(x[b, :Tb, : Ub + 1, V:], -1)
        blanks = [(d, lambda t, u, lp=lp, ld=ld, k=k: lp[t, u, V - 1] + ld[t, u, k])
                  for k, d in enumerate(durs) if d > 0]
        emits = [(d, lambda t, u, lp=lp, ld=ld, k=k, y=tg[b]: lp[t, u, y[u]] + ld[t, u, k])
                 for k, d in enumerate(durs)]
        losses.append(_dp(blanks, emits, Tb, Ub, z[b]))
    loss = torch.stack(losses)
    g, occ = torch.autograd.grad(loss.sum(), (x, z))
    return loss.detach(), g, -occ


def _targets(B, U, n_classes, seed):
    g = torch.Generator().manual_seed(seed + 100)
    return torch.randint(0, n_classes, (B, U), generator=g)


def _check(loss, g, want, want_g, occ, il, tl, dtype):
    valid = torch.zeros_like(want_g, dtype=torch.bool)
    for b in range(want_g.shape[0]):
        valid[b, : il[b], : tl[b] + 1] = True
    assert torch.isfinite(g).all()
    assert (g[~valid] == 0).all()
    assert g.dtype == dtype
    # Each row (state) against its own scale, the state's occupation: an entry is
    # softmax * occupation minus an arc's occupation, which may cancel.
    row = occ[..., None].expand_as(want_g)
    err = (g.double() - want_g).abs()
    if dtype == torch.float64:
        assert_close_budget(loss, want, rtol=1e-11, what="loss")
        assert bool((err <= 1e-9 * want_g.abs() + 1e-12 * row).all()), float(
            (err / row).nan_to_num().max())
        return
    assert_close_budget(loss.double(), want, rtol=1e-5, what="loss")
    # The wide dynamic range the test is for: rows far below float32's range come out
    # as exactly 0, and rows of small but representable states keep their accuracy.
    tiny_rows = valid & (row < 2.0**-151)
    assert bool(tiny_rows.any())
    assert (g[tiny_rows] == 0).all()
    ok = valid & (row > 1e-30)
    assert bool((valid & (row > 1e-30) & (row < 1e-10)).any())
    assert bool((err[ok] <= 1e-3 * want_g.abs()[ok] + 1e-5 * row[ok]).all()), \
        float((err[ok] / row[ok]).max())


@numba_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("kw", [{}, {"sigma": 0.05}], ids=["plain", "sigma"])
def test_multiblank_long(dtype, kw):
    big = [2, 4, 8]
    x, il, tl = _batch(3, 40, 14, 12, seed=1, scale=10.0, dtype=dtype)
    tg = _targets(3, 14, 12 - 1 - len(big), 1)
    xr = x.clone().requires_grad_()
    loss = seqloss.multiblank_rnnt_loss(xr, tg, il, tl, big, blank=-1, reduction="none",
                                        backend="numba", **kw)
    (g,) = torch.autograd.grad(loss.sum(), xr)
    want, want_g, occ = _oracle_multiblank(x, tg, il, tl, big, kw.get("sigma", 0.0))
    _check(loss.double(), g, want, want_g, occ, il, tl, dtype)


@numba_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
def test_tdt_long(dtype, pair):
    durs = [0, 1, 2, 3, 4]
    D = len(durs)
    x, il, tl = _batch(3, 40, 6, 9 + D, seed=2, scale=5.0, dtype=dtype)
    tg = _targets(3, 6, 9 - 1, 2)
    if pair:
        a = x[..., :-D].contiguous().requires_grad_()
        b = x[..., -D:].contiguous().requires_grad_()
        loss = seqloss.tdt_loss((a, b), tg, il, tl, durs, blank=-1, sigma=0.02,
                                reduction="none", backend="numba")
        g = torch.cat(torch.autograd.grad(loss.sum(), (a, b)), -1)
    else:
        xr = x.clone().requires_grad_()
        loss = seqloss.tdt_loss(xr, tg, il, tl, durs, blank=-1, sigma=0.02, reduction="none",
                                backend="numba")
        (g,) = torch.autograd.grad(loss.sum(), xr)
    want, want_g, occ = _oracle_tdt(x, tg, il, tl, durs, 0.02)
    _check(loss.double(), g, want, want_g, occ, il, tl, dtype)


@numba_only
def test_tdt_long_clamp_and_mean():
    durs = [0, 1, 2, 3, 4]
    x, il, tl = _batch(3, 30, 5, 8 + 5, seed=3)
    tg = _targets(3, 5, 7, 3)
    xr = x.clone().requires_grad_()
    loss = seqloss.tdt_loss(xr, tg, il, tl, durs, blank=-1, clamp=0.05, reduction="mean_batch",
                            backend="numba")
    (g,) = torch.autograd.grad(loss, xr)
    want, want_g, _ = _oracle_tdt(x, tg, il, tl, durs, 0.0)
    assert_close_budget(loss, want.mean(), rtol=1e-11, what="loss")
    want_g = torch.nan_to_num(want_g.clamp(-0.05, 0.05)) / 3
    assert_close_budget(g, want_g, rtol=1e-9, atol=1e-300, what="grad")


# ------------------------------------------------------------------ Numba: the joint's row passes
if importlib.util.find_spec("numba") is not None:
    from numba import njit

    from seqloss._core.numba_exp import vexp, vlog1pexp
    from seqloss.transducer.joint import numba_cpu, numba_rows
else:  # the tests below are numba_only
    def njit(**kw):
        return lambda f: f

@njit(cache=False)
def _exp_array(x, out):
    for i in range(x.shape[0]):
        out[i] = vexp(x[i])


@numba_only
@pytest.mark.parametrize("dtype, lo, ulps", [(np.float32, -87.0, 4), (np.float64, -707.0, 2)],
                         ids=["fp32", "fp64"])
def test_exp_against_libm(dtype, lo, ulps):
    x = np.concatenate([np.linspace(lo, 1.0, 200001), [0.0, -0.0, 1e-30, -1e-30]]).astype(dtype)
    out = np.empty_like(x)
    _exp_array(x, out)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(dtype)).astype(np.float64)
    err = np.abs(out.astype(np.float64) - want) / ulp
    assert err.max() <= ulps, (float(err.max()), float(x[np.argmax(err)]))


@njit(cache=False)
def _log1pexp_array(x, out):
    for i in range(x.shape[0]):
        out[i] = vlog1pexp(x[i])


@numba_only
def test_log1pexp_against_libm():
    # The lattice's logaddexp correction: log1p(exp(d)) for d <= 0, within 3 ulp of libm's
    # (itself within 1) over float64's normal range, exactly 0 below it and at -inf.
    x = np.concatenate([-np.geomspace(1e-300, 708.0, 200001), [0.0, -0.0]])
    out = np.empty_like(x)
    _log1pexp_array(x, out)
    want = np.log1p(np.exp(x))
    err = np.abs(out - want) / np.spacing(want)
    assert err.max() <= 3, (float(err.max()), float(x[np.argmax(err)]))
    special = np.array([-np.inf, np.nan, -1e4, -746.0])
    out = np.empty_like(special)
    _log1pexp_array(special, out)
    assert out[0] == 0.0 and np.isnan(out[1]) and (out[2:] == 0.0).all()


@numba_only
@pytest.mark.parametrize("dtype, below", [(np.float32, [-1e4, -104.0, -88.0]),
                                          (np.float64, [-1e4, -750.0, -709.0])],
                         ids=["fp32", "fp64"])
def test_exp_special_values(dtype, below):
    x = np.array([-np.inf, np.nan, *below], dtype=dtype)
    out = np.empty_like(x)
    _exp_array(x, out)
    assert out[0] == 0.0  # exp(-inf): an exact zero (a masked class)
    assert np.isnan(out[1])  # NaN survives: the caller's NaN check is the row's sum
    # Below the normal range: exactly 0 (no subnormal results, no microcode assists).
    assert (out[2:] == 0).all()
    assert (np.exp(x[2:].astype(np.float64)) < np.finfo(dtype).tiny).all()


@pytest.fixture(autouse=True)
def rows_everywhere(monkeypatch):
    """The row passes for every width here (by default only rows of >= 16 classes in the
    joint, >= 512 in from_joint's tiles)."""
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 1)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 1)


def _rows_batch(B, T, U, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=dtype) * 3
    tg = torch.randint(1, V, (B, U), generator=g)
    il = torch.full((B,), T)
    tl = torch.full((B,), U)
    il[-1], tl[-1] = T - 2, U - 1
    return x, tg, il, tl


def _loss_grad(x, *args, **kw):
    x = x.detach().clone().requires_grad_()
    loss = seqloss.rnnt_loss(x, *args, blank=0, reduction="none", **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), g


@njit(cache=False)
def _grad_row_call(buf, o, V, scaled, w, desc, cls, occ, o0, nc, y, oy, hb, gb, clamp, gscale,
                   tiny):
    numba_rows.grad_row(buf, o, V, scaled, w, desc, cls, occ, o0, nc, y, oy, hb, gb, clamp,
                        gscale, tiny)


@numba_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scaled, desc", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("clamp, gscale", [(0.0, 1.0), (0.05, 0.25)])
@pytest.mark.parametrize("hb, y", [(-1, 3), (5, 3), (-1, -1)])
def test_grad_row_against_the_formula(dtype, scaled, desc, clamp, gscale, hb, y):
    """The Numba joint's one row epilogue (row passes, HAT, the many-arc tables) against
    its formula in float64 numpy: ``clamp(row w - occupations at their classes - oy at y,
    HAT's blank set) * gscale``, products and differences under ``tiny`` written as 0 (the
    subnormal flush; the descending pass's products exact); the rest of the buffer
    untouched."""
    rng = np.random.default_rng(7)
    V, o = 11, 6
    buf = rng.uniform(0.0, 1.0, 2 * o + V).astype(dtype)
    buf[o + 2] = 1e-30  # times w: below float32's smallest normal
    before = buf.copy()
    w = dtype(0.37e-8 if dtype == np.float32 else 0.37)
    cls = np.array([1, 7, 1], np.int64)  # a class twice: both occupations subtracted
    occ = np.array([9.0, 0.1, 0.2, 0.05, 9.0])
    tiny = float(np.finfo(dtype).tiny)
    _grad_row_call(buf, o, V, scaled, w, desc, cls, occ, 1, 3, y, 0.125, hb, -0.5, clamp,
                   gscale, tiny)

    def flush(v):
        return 0.0 if abs(v) < tiny else v

    row = before[o:o + V].astype(np.float64)
    if not scaled:
        want = np.zeros(V)
    else:
        want = np.array([(r * float(w)) if desc else flush(float(dtype(r * w))) for r in row])
    for k in range(3):
        want[cls[k]] = flush(float(dtype(want[cls[k]])) - occ[1 + k])
    if hb >= 0:
        want[hb] = flush(-0.5)
    if y >= 0:
        want[y] = flush(float(dtype(want[y])) - 0.125)
    if clamp > 0:
        want = np.clip(want.astype(dtype), -dtype(clamp), dtype(clamp)).astype(np.float64)
    want = want.astype(dtype) * dtype(gscale)
    if gscale != 1.0:  # a reduction's factor: its products flushed
        want = np.array([flush(float(v)) for v in want])
    want = want.astype(np.float64)
    got = buf[o:o + V].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
    assert np.array_equal(buf[:o], before[:o]) and np.array_equal(buf[o + V:], before[o + V:])
    if scaled and not desc:
        assert got[2] == 0.0 if dtype == np.float32 else got[2] != 0.0  # the flush


@numba_only
def test_rows_of_neg_inf_have_no_arc_out():
    x, tg, il, tl = _rows_batch(2, 6, 3, 9, seed=1, dtype=torch.float64)
    x[0, 2, 1] = -math.inf  # state (t=2, u=1) of sequence 0: no arc leaves it
    x[1, 0, 0, 1:] = -math.inf  # only the blank leaves the start
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x, tg, il, tl, backend="reference")
    assert torch.isfinite(a).all() and torch.isfinite(ga).all()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    torch.testing.assert_close(ga, gb, rtol=1e-12, atol=1e-15)
    assert torch.count_nonzero(ga[0, 2, 1]) == 0


@numba_only
@pytest.mark.parametrize("V", [1, 17, 4099], ids=["V1", "V17", "V4099"])
def test_row_widths_against_float64(V):
    # Widths around the 16 lanes of the row max (a tail, none, one class only); a wide
    # row of float32 summed in float32 stays within float32's rounding of the float64 loss.
    x, tg, il, tl = _rows_batch(2, 5, 2, max(V, 2), seed=2)
    x = x[..., :V].contiguous()
    tg = tg.clamp(max=V - 1) if V > 1 else tg
    if V == 1:  # blank only: an empty target
        tl[:] = 0
        tg = tg[:, :0]
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x.double(), tg, il, tl, backend="reference")
    torch.testing.assert_close(a.double(), b, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(ga.double(), gb, rtol=1e-4, atol=2e-7)


@numba_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_same_bits_for_any_thread_count(dtype):
    from seqloss._core.numba_pool import CELL, INLINE_WORK

    # Big enough that every pass, the lattice's too, runs on the pool at 2 threads.
    B, T, U = 3, 200, 40
    assert B * T * (U + 1) * CELL >= INLINE_WORK
    x, tg, il, tl = _rows_batch(B, T, U, 64, seed=3, dtype=dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a, ga = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.2)
        torch.set_num_threads(2)
        b, gb = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(a, b) and torch.equal(ga, gb)


@numba_only
def test_huge_logits_keep_their_digits():
    # Log-probs as (x - m) - log(s): with logits of 1e4 nothing of float32's precision
    # is lost to the shift (x - (m + log s) would round away the small part).
    x, tg, il, tl = _rows_batch(2, 6, 3, 11, seed=4)
    x = x + 1e4
    a, ga = _loss_grad(x, tg, il, tl, backend="numba")
    b, gb = _loss_grad(x.double(), tg, il, tl, backend="reference")
    torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ga.double(), gb, rtol=1e-4, atol=1e-6)


def _grads(fn, x, *args, **kw):
    xs = tuple(t.detach().clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,)))
    loss = fn(xs if isinstance(x, tuple) else xs[0], *args, reduction="none", **kw)
    gs = torch.autograd.grad(loss.sum(), xs)
    return loss.detach(), torch.cat(gs, -1)


def _rows_pack(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1]) for b in range(len(il))])


ROW_CASES = {
    "rnnt": lambda x, tg, il, tl, V, **kw: (seqloss.rnnt_loss, x[..., :V], (tg, il, tl),
                                            dict(blank=0, **kw)),
    "rnnt-logprobs": lambda x, tg, il, tl, V, **kw: (seqloss.rnnt_loss,
                                                     x[..., :V].log_softmax(-1), (tg, il, tl),
                                                     dict(blank=0, fused_log_softmax=False,
                                                          **kw)),
    "rnnt-packed": lambda x, tg, il, tl, V, **kw: (seqloss.rnnt_loss_packed,
                                                   _rows_pack(x[..., :V], il, tl), (tg, il, tl),
                                                   dict(blank=0, **kw)),
    "multiblank": lambda x, tg, il, tl, V, **kw: (seqloss.multiblank_rnnt_loss, x[..., :V],
                                                  (tg, il, tl),
                                                  dict(blank=V - 1, big_blank_durations=[2, 3],
                                                       **kw)),
    "tdt": lambda x, tg, il, tl, V, **kw: (seqloss.tdt_loss, x, (tg, il, tl),
                                           dict(blank=V - 1, durations=[0, 1, 2], **kw)),
    "tdt-pair": lambda x, tg, il, tl, V, **kw: (seqloss.tdt_loss, (x[..., :V], x[..., V:]),
                                                (tg, il, tl),
                                                dict(blank=V - 1, durations=[0, 1, 2], **kw)),
}


@numba_only
@pytest.mark.parametrize("kw", [{}, {"clamp": 0.05}, {"fastemit_lambda": 0.01}],
                         ids=["plain", "clamp", "fastemit"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_every_table_against_the_reference(case, dtype, kw):
    if "fastemit_lambda" in kw and case.startswith("tdt"):
        pytest.skip("FastEmit is a multi-blank/RNN-T option")
    V = 13
    x, tg, il, tl = _rows_batch(3, 7, 4, V + 3, seed=5, dtype=dtype)
    tg = tg % (V - 4) + 1  # never a blank-like class of any table here
    fn, xin, args, opts = ROW_CASES[case](x, tg, il, tl, V, **kw)
    a, ga = _grads(fn, xin, *args, backend="numba", **opts)
    xref = tuple(t.double() for t in xin) if isinstance(xin, tuple) else xin.double()
    b, gb = _grads(fn, xref, *args, backend="reference", **opts)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-7)
    torch.testing.assert_close(a.double(), b, **tol)
    torch.testing.assert_close(ga.double(), gb, **tol)


@numba_only
@pytest.mark.parametrize("case", sorted(ROW_CASES))
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "posinf"])
def test_nonfinite_poisons_one_sequence(case, bad):
    V = 13
    x, tg, il, tl = _rows_batch(3, 7, 4, V + 3, seed=6)
    tg = tg % (V - 4) + 1
    clean = _grads(*ROW_CASES[case](x, tg, il, tl, V)[:2], tg, il, tl, backend="numba",
                   **ROW_CASES[case](x, tg, il, tl, V)[3])
    x = x.clone()
    x[1, 2, 1, 3] = bad  # a token logit of sequence 1
    fn, xin, args, opts = ROW_CASES[case](x, tg, il, tl, V)
    loss, g = _grads(fn, xin, *args, backend="numba", **opts)
    assert torch.isnan(loss[1]) and not torch.isnan(loss[[0, 2]]).any()
    torch.testing.assert_close(loss[[0, 2]], clean[0][[0, 2]], rtol=0, atol=0)


@numba_only
def test_inplace_gradient_is_bit_identical():
    x, tg, il, tl = _rows_batch(3, 9, 4, 33, seed=7)
    a, ga = _loss_grad(x, tg, il, tl, backend="numba", clamp=0.3)
    xi = x.clone().requires_grad_()
    h = xi * 1.0  # a non-leaf: the gradient may overwrite it
    loss = seqloss.rnnt_loss(h, tg, il, tl, blank=0, reduction="none", backend="numba",
                             clamp=0.3, inplace_grad=True)
    (gi,) = torch.autograd.grad(loss.sum(), xi)
    assert torch.equal(loss.detach(), a) and torch.equal(gi, ga)


@numba_only
@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_passes_against_chunked_torch_ops(monkeypatch, case):
    V = 700
    x, tg, il, tl = _rows_batch(3, 12, 5, V + 3, seed=8)
    tg = tg % (V - 4) + 1
    fn, xin, args, opts = ROW_CASES[case](x, tg, il, tl, V, clamp=0.2)
    a, ga = _grads(fn, xin, *args, backend="numba", **opts)
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 10**9)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 10**9)
    b, gb = _grads(fn, xin, *args, backend="numba", **opts)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    # The two exps (vectorized in Numba, torch's) differ by an ulp or two; an entry
    # ``softmax * total - occupation`` of terms up to 1 then differs by a few float32
    # ulps of 1 after the cancellation (seen: 4.6e-8 on an AMD EPYC, duration column).
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=3e-7)


@numba_only
def test_wide_rows_take_the_row_passes_by_default(monkeypatch):
    # Every table from the joint's own width (16 by default; 128 here), whatever
    # from_joint's tiles take (MIN_ROW_WIDTH: 512 by default).
    monkeypatch.setattr(numba_rows, "MIN_ROW_WIDTH", 512)
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 128)
    calls = []
    orig = numba_rows.RowPasses.prologue

    def spy(self, g=None, arcs=None, **kw):
        calls.append(self.V)
        return orig(self, g, arcs, **kw)

    monkeypatch.setattr(numba_rows.RowPasses, "prologue", spy)
    for V in (127, 128, 511, 512):
        x, tg, il, tl = _rows_batch(2, 4, 2, V, seed=9)
        _loss_grad(x, tg, il, tl, backend="numba")
        seqloss.multiblank_rnnt_loss(x.requires_grad_(), tg % (V - 3) + 1, il, tl, blank=V - 1,
                                     big_blank_durations=[2], backend="numba").backward()
    assert calls == [128, 128, 511, 511, 512, 512]


# ------------------------------------------------------------------ Numba: one row epilogue
# Every gradient row of the Numba joint is written by numba_rows.grad_row: the cases
# here are those whose prologue is torch's chunked ops (narrow RNN-T rows, a caller's
# buffer for the many-arc tables, log-probabilities, half precision through float32
# chunk temporaries, classes not at unit stride), against the float64 reference on the
# same (rounded) inputs.
def _epilogue_table(kind):
    if kind == "rnnt":
        return rnnt_table(V, BLANK, 0.3, 0.2)
    if kind == "hat":
        return hat_table(V, BLANK, 0.3, 0.2)
    return _table(kind, sigma=0.05, clamp=0.3, fastemit_lambda=0.2, emit_can_end=kind == "mixed")


def _classes_outer(x):
    """``x``'s values with the classes outermost in memory (stride along them > 1)."""
    return x.movedim(-1, 0).contiguous().movedim(0, -1)


# (rtol, atol) of the gradient against float64: float32's own error; half precision's
# rounding of the float32 result (half an ulp) on top.
EPILOGUE_TOL = {torch.float64: (1e-10, 1e-13), torch.float32: (1e-5, 1e-6),
                torch.float16: (2.0**-11, 1e-6), torch.bfloat16: (2.0**-8, 1e-6)}


@numba_only
@pytest.mark.parametrize("layout", ["own", "inplace", "strided-inplace"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logprobs"])
@pytest.mark.parametrize("dtype", list(EPILOGUE_TOL), ids=["fp64", "fp32", "fp16", "bf16"])
@pytest.mark.parametrize("kind", ["rnnt", "hat", "multiblank", "tdt", "mixed"])
def test_every_epilogue_against_the_reference(monkeypatch, kind, dtype, fused, layout):
    half = dtype in (torch.float16, torch.bfloat16)
    if kind == "hat" and (not fused or (layout == "inplace" and not half)):
        pytest.skip("a 'hat' table takes raw logits; its row passes (float32/float64 at unit "
                    "stride) write no gradient over them")
    monkeypatch.setattr(numba_cpu, "TABLE_MIN_ROW_WIDTH", 10**9)  # torch's chunked prologue
    table = _epilogue_table(kind)
    x, tg, il, tl = _inputs(table, seed=len(kind) + 7 * fused, fused=fused)
    xh = x.to(dtype)
    want_l, want_g = _fwd(joint_ref, xh.double(), tg, il, tl, table, fused, scale=0.5)
    xin = _classes_outer(xh) if layout.startswith("strided") else xh.clone()
    buf = xin if layout.endswith("inplace") else None
    loss, g = _fwd(numba_cpu, xin, tg, il, tl, table, fused, buf=buf, scale=0.5)
    assert g.dtype == dtype and (buf is None or g.data_ptr() == buf.data_ptr())
    assert_close_budget(loss, want_l, rtol=1e-12 if dtype == torch.float64 else 1e-5,
                        what="loss")
    rtol, atol = EPILOGUE_TOL[dtype]
    assert_close_budget(g, want_g, rtol=rtol, atol=atol, what="grad")
    for b in range(len(il)):  # padding: exactly zero
        assert torch.count_nonzero(g[b, il[b]:]) == 0
        assert torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0
    if half and kind != "hat":
        # The float32 computation on the same values (the same path), rounded once.
        x32 = xh.float()
        _, g32 = _fwd(numba_cpu, x32, tg, il, tl, table, fused, buf=x32, scale=0.5)
        assert torch.equal(g, g32.to(dtype))
