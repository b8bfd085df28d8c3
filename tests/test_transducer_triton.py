"""Triton transducer kernels against the reference: the general lattice, dtypes, layouts, NaN.

On CPU these run under ``TRITON_INTERPRET=1`` (set by conftest before the kernels
are imported); on a CUDA machine they run the compiled kernels.
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for

from seqloss.testing import assert_close_budget
from seqloss.transducer.joint import reference as joint_ref
from seqloss.transducer.joint.table import rnnt_table
from seqloss.transducer.lattice import reference as lattice_ref

LAT = pytest.importorskip("seqloss.transducer.lattice.triton_cuda")
JOINT = pytest.importorskip("seqloss.transducer.joint.triton_cuda")
DEVICE = device_for("triton")
NAN = float("nan")
INF = float("inf")


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


@pytest.mark.parametrize("durs", LATTICES,
                         ids=[f"b{d[0]}e{d[1]}".replace(" ", "") for d in LATTICES])
def test_lattice_matches_reference(durs):
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


def test_lattice_infeasible_and_float32():
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


def test_lattice_noncontiguous_arcs():
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


def _fwd(mod, x, tg, il, tl, *, fused=True, clamp=-1.0, lam=0.0, scale=1.0, buf=None, blank=0):
    table = rnnt_table(x.shape[-1], blank, clamp, lam)
    return mod.joint_loss_forward(x, tg, il, tl, table, fused, True, buf, scale)


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_inputs(dtype, fused):
    """Half logits: float32 loss; the gradient is the float32 computation rounded once."""
    x, tg, il, tl = _rnnt_inputs(3, 7, 4, 9, seed=5)
    if not fused:
        x = x.log_softmax(-1)
    xh = x.to(dtype).to(DEVICE)
    loss, g = _fwd(JOINT, xh, tg, il, tl, fused=fused, clamp=0.3, lam=0.1, scale=0.5)
    loss32, g32 = _fwd(JOINT, xh.float(), tg, il, tl, fused=fused, clamp=0.3, lam=0.1, scale=0.5)
    assert loss.dtype == torch.float32 and g.dtype == dtype
    assert torch.equal(loss, loss32)
    assert torch.equal(g, g32.to(dtype))
    want, _ = _fwd(joint_ref, xh.double().cpu(), tg, il, tl, fused=fused, clamp=0.3, lam=0.1,
                   scale=0.5)
    assert_close_budget(loss, want, rtol=1e-5, what="loss")


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_noncontiguous_logits(packed):
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
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, **kw)
    loss, g = _fwd(JOINT, xs.to(DEVICE), tg, il, tl, **kw)
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-12, atol=1e-15, what="grad")
    # The in-place mode writes through the same strides.
    buf = xs.clone() if packed else xs.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    buf = buf.to(DEVICE)
    loss2, g2 = _fwd(JOINT, buf, tg, il, tl, buf=buf, **kw)
    assert g2.data_ptr() == buf.data_ptr()
    assert torch.equal(loss2, loss) and torch.equal(g2, g)


@pytest.mark.parametrize("fused", [False, True], ids=["logprobs", "fused"])
def test_nan_sequence_leaves_others_alone(fused):
    x, tg, il, tl = _rnnt_inputs(4, 6, 3, 6, seed=7, dtype=torch.float32)
    il[:], tl[:] = torch.tensor([6, 5, 3, 4]), torch.tensor([3, 1, 2, 0])
    if not fused:
        x = x.log_softmax(-1)
    clean_l, clean_g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, fused=fused)
    x[2, 1, 2, 4] = NAN
    x[0, 5, 3, 1] = INF  # the last row sequence 0 reads
    x[3, 4:, :, :] = NAN  # sequence 3's padding frames: never read
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, fused=fused)
    assert torch.isnan(loss[[0, 2]]).all()
    assert torch.equal(loss[[1, 3]], clean_l[[1, 3]]) and torch.equal(g[[1, 3]], clean_g[[1, 3]])
    for b in (0, 2):
        assert torch.isnan(g[b, : il[b], : tl[b] + 1]).all()
        assert (torch.count_nonzero(g[b, il[b]:]) == 0
                and torch.count_nonzero(g[b, :, tl[b] + 1:]) == 0)


def test_extreme_scale_and_neg_inf_rows():
    """Logits over thousands of nats stay finite; a row of -inf logits has no arc out of it."""
    x, tg, il, tl = _rnnt_inputs(2, 5, 3, 6, seed=8)
    x = x * 1000
    x[1, 0, 0, :] = -INF  # sequence 1 cannot leave (0, 0): infeasible, zero gradient
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, clamp=0.5)
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, clamp=0.5)
    assert loss[1].item() == INF and torch.count_nonzero(g[1]) == 0
    assert torch.isfinite(loss[0]) and torch.isfinite(g).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-12, atol=1e-15, what="grad")
