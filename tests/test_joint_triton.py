"""The Triton joint on tables beyond RNN-T (multi-blank, TDT, mixed) against the float64 reference.

On CPU these run under ``TRITON_INTERPRET=1`` (set by conftest before the kernels
are imported); on a CUDA machine they run the compiled kernels. The oracle is
``seqloss.transducer.joint.reference.joint_loss_forward`` in float64 on the same
inputs (its lattice is itself checked against brute force in ``test_lattice.py``).
"""

from __future__ import annotations

import pytest
import torch
from conftest import device_for

from seqloss.testing import assert_close_budget
from seqloss.transducer.joint import reference as joint_ref
from seqloss.transducer.joint.table import Arc, JointTable

JOINT = pytest.importorskip("seqloss.transducer.joint.triton_cuda")
DEVICE = device_for("triton")
NAN = float("nan")
INF = float("inf")

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


def _pack(x, il, tl):
    return torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1]) for b in range(len(il))])


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


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logprobs"])
@pytest.mark.parametrize(("kind", "opts"), CASES)
def test_float64_matches_reference(kind, opts, fused, packed):
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


@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_float32_against_float64(kind):
    table = _table(kind, sigma=0.05, fastemit_lambda=0.1, clamp=0.5)
    x, tg, il, tl = _inputs(table, seed=11)
    x32 = x.float()
    want_l, want_g = _fwd(joint_ref, x32.double(), tg, il, tl, table)  # on the rounded inputs
    loss, g = _fwd(JOINT, x32.to(DEVICE), tg, il, tl, table)
    assert loss.dtype == torch.float32 and g.dtype == torch.float32
    assert_close_budget(loss, want_l, rtol=1e-6, atol=1e-6, what="loss")
    assert_close_budget(g, want_g, rtol=1e-5, atol=1e-6, what="grad")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logprobs"])
@pytest.mark.parametrize("kind", ["multiblank", "tdt"])
def test_bf16_is_float32_rounded_once(kind, fused):
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


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_in_place_and_deterministic(packed):
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


def test_nan_inf_and_neg_inf_rows():
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


def test_extreme_scale():
    """Logits over thousands of nats: finite, and float64-accurate (arcs and lattice in float64)."""
    table = _table("tdt", clamp=0.5, sigma=0.05)
    x, tg, il, tl = _inputs(table, B=2, T=5, U=2, seed=8, pad_t=0, pad_u=0, scale=2000.0)
    want_l, want_g = _fwd(joint_ref, x, tg, il, tl, table)
    loss, g = _fwd(JOINT, x.to(DEVICE), tg, il, tl, table)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert_close_budget(loss, want_l, rtol=1e-12, what="loss")
    assert_close_budget(g, want_g, rtol=1e-11, atol=1e-14, what="grad")


def test_width_must_match_the_table():
    table = _table("tdt")
    x, tg, il, tl = _inputs(table, B=1, T=2, U=1, seed=1, pad_t=0, pad_u=0)
    with pytest.raises(ValueError, match="V \\+ D"):
        _fwd(JOINT, x[..., :-1].to(DEVICE), tg, il, tl, table)
