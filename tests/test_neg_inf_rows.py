"""A row of -inf logits (a state with no way out) on every path, against the full-joint loss.

API.md: a row (frame, lattice state, window row) whose logits are all ``-inf`` is avoided
by the paths; the loss is what the rest of the lattice gives (``+inf`` and a zero
gradient where no path remains, 0 with ``zero_infinity``), never NaN. The oracles: the
full-joint losses on the materialized joint, ``rnnt_loss`` on full windows, path
enumeration with a log-softmax that gives ``-inf`` on a row of ``-inf`` (written here),
the unfused CTC, and the documented ``+inf``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import backend_params
from torch import nn

import seqloss

NEG = float("-inf")
F64 = torch.float64
DTYPES = [pytest.param(d, id=str(d)[6:]) for d in
          (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
BACKENDS = backend_params("rnnt")


def _tol(dtype):
    """(rtol, atol relative to the largest entry) of two paths from the same rounded
    inputs: a few roundings to ``dtype`` apart (half gradients are rounded to it before
    the joint's parameters sum them)."""
    return {torch.float64: (1e-9, 1e-11), torch.float32: (2e-5, 2e-6),
            torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}[dtype]


def _close(got, want, dtype, what):
    rtol, atol = _tol(dtype)
    got, want = got.detach().double(), want.detach().double()
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{what}: {got} vs {want}"
    assert not torch.isnan(got).any(), f"{what}: NaN in {got}"
    torch.testing.assert_close(got.nan_to_num(posinf=0.0, neginf=0.0),
                               want.nan_to_num(posinf=0.0, neginf=0.0),
                               rtol=rtol, atol=atol * max(1.0, float(want.abs().max().nan_to_num(
                                   posinf=1.0))), msg=what)


def _guarded_log_softmax(x):
    """The oracles' log-softmax: ``-inf`` on a row of ``-inf`` (and no gradient there)."""
    dead = (x == NEG).all(-1, keepdim=True)
    return torch.log_softmax(torch.where(dead, 0.0, x), -1).masked_fill(dead, NEG)


# --------------------------------------------------------------------------- from the joint
class FlagJoint(nn.Module):
    """``Linear(tanh(enc + pred))`` in float64, cast to ``dtype``. The last feature of the
    encoder and predictor streams is a flag (not an input of the layers): where both are
    set, the state's logits are all ``-inf`` (``mode="labels"``: all but the last class,
    HAT's blank)."""

    def __init__(self, W, dtype, mode="row", He=4, Hp=4, H=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Linear(He - 1, H, dtype=F64)
        self.pred = nn.Linear(Hp - 1, H, dtype=F64)
        self.out = nn.Linear(H, W, dtype=F64)
        with torch.no_grad():
            self.out.weight.mul_(2.0)
        self.dtype, self.mode = dtype, mode

    def forward(self, e, p):
        h = torch.tanh(self.enc(e[..., :-1])[:, :, None] + self.pred(p[..., :-1])[:, None])
        x = self.out(h)
        flag = ((e[..., -1] > 0)[:, :, None] & (p[..., -1] > 0)[:, None, :])[..., None]
        if self.mode == "labels":
            flag = flag & (torch.arange(x.shape[-1]) != x.shape[-1] - 1)
        return torch.where(flag, NEG, x).to(self.dtype)


def _streams(B, T, U, states, He=4, Hp=4, seed=1):
    """Encoder and predictor streams flagging ``states``: ``[(b, t or None, u or None)]``
    (None: every frame, every context), at most one per sequence."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, He, generator=g, dtype=F64)
    pred = torch.randn(B, U + 1, Hp, generator=g, dtype=F64)
    enc[..., -1] = -1.0
    pred[..., -1] = -1.0
    for b, t, u in states:
        enc[b, slice(None) if t is None else t, -1] = 1.0
        pred[b, slice(None) if u is None else u, -1] = 1.0
    return enc.requires_grad_(), pred.requires_grad_()


KINDS = {
    "rnnt": (seqloss.rnnt_loss, seqloss.rnnt_loss_from_joint, 0, {}),
    "hat": (seqloss.hat_loss, seqloss.hat_loss_from_joint, 0, {}),
    "multiblank": (seqloss.multiblank_rnnt_loss, seqloss.multiblank_rnnt_loss_from_joint, 0,
                   {"big_blank_durations": [2]}),
    "tdt": (seqloss.tdt_loss, seqloss.tdt_loss_from_joint, 3, {"durations": [0, 1, 2]}),
}


def _from_joint_case(kind, dtype, backend, states, mode="row", V=6, zero_infinity=False):
    full, fj, D, kw = KINDS[kind]
    B, T, U = 2, 5, 3
    joint = FlagJoint(V + D, dtype, mode)
    enc, pred = _streams(B, T, U, states)
    g = torch.Generator().manual_seed(2)
    tg = torch.randint(0, V - 2, (B, U), generator=g)  # the top classes: the blanks
    Tl, tl = torch.tensor([T, T - 1]), torch.tensor([U, U - 1])
    kw = dict(kw, reduction="none", backend=backend, zero_infinity=zero_infinity)
    want = full(joint(enc, pred), tg, Tl, tl, **kw)
    got = fj(enc, pred, joint, tg, Tl, tl, **kw)
    w = torch.tensor([0.7, 1.3], dtype=want.dtype)
    leaves = [enc, pred, *joint.parameters()]
    gw = torch.autograd.grad((torch.where(torch.isinf(want), 0.0, want) * w).sum(), leaves)
    gg = torch.autograd.grad((torch.where(torch.isinf(got), 0.0, got) * w).sum(), leaves)
    return got, want, gg, gw


def _check_grads(gg, gw, dtype, what):
    for i, (a, b) in enumerate(zip(gg, gw, strict=True)):
        assert torch.isfinite(a).all(), f"{what}: gradient {i} not finite"
        _close(a, b, dtype, f"{what}: gradient {i}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_from_joint_dead_state_equals_the_full_joint(kind, backend, dtype):
    # state (t=2, u=1) of sequence 0: paths go round it, the loss is finite
    got, want, gg, gw = _from_joint_case(kind, dtype, backend, [(0, 2, 1)])
    assert torch.isfinite(want).all()
    _close(got, want, dtype, kind)
    _check_grads(gg, gw, dtype, kind)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hat_from_joint_labels_of_a_state_neg_inf(backend):
    # only the labels are -inf: the blank still leaves the state, no label does
    for dtype in (torch.float64, torch.float32):
        got, want, gg, gw = _from_joint_case("hat", dtype, backend, [(0, 2, 1)], mode="labels")
        assert torch.isfinite(want).all()
        _close(got, want, dtype, "hat labels")
        _check_grads(gg, gw, dtype, "hat labels")


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["rnnt", "hat"])
def test_from_joint_dead_frame_is_infinite(kind, backend, zero_infinity):
    # every state of frame 2 of sequence 0: no path crosses it
    got, want, gg, gw = _from_joint_case(kind, torch.float64, backend, [(0, 2, None)],
                                         zero_infinity=zero_infinity)
    assert float(want[0].detach()) == (0.0 if zero_infinity else float("inf"))
    _close(got, want, torch.float64, kind)
    _check_grads(gg, gw, torch.float64, kind)
    # the dead sequence contributes no gradient: only sequence 1's remains
    enc_g = gg[0]
    assert torch.equal(enc_g[0], torch.zeros_like(enc_g[0]))


@pytest.mark.parametrize("kind", ["rnnt", "hat"])
def test_from_joint_row_passes_dead_state(kind, monkeypatch):
    # the Numba backend's row prologue (taken from MIN_ROW_WIDTH classes on), forced
    rows = pytest.importorskip("seqloss.transducer.joint.numba_rows")
    monkeypatch.setattr(rows, "MIN_ROW_WIDTH", 1)
    for dtype in (torch.float64, torch.float32):
        got, want, gg, gw = _from_joint_case(kind, dtype, "numba", [(0, 2, 1), (1, 0, 2)])
        assert torch.isfinite(want).all()
        _close(got, want, dtype, kind)
        _check_grads(gg, gw, dtype, kind)


# --------------------------------------------------------------------------- arc log-probs
def _rnnt_logits(dtype, B=2, T=5, U=3, V=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=F64)
    x[0, 2, 1] = NEG  # a state with no way out
    x[1, 0, 2] = NEG
    tg = torch.randint(0, V - 1, (B, U), generator=g)  # blank V - 1
    return x.to(dtype).requires_grad_(), tg, torch.tensor([T, T - 1]), torch.tensor([U, U - 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params("lattice"))
def test_arc_logprobs_of_a_dead_row_feed_the_lattice(backend, dtype):
    x, tg, Tl, tl = _rnnt_logits(dtype)
    ab, ae = seqloss.transducer_arc_logprobs(x, tg, Tl, tl)
    assert ab[0, 2, 1] == NEG and ae[0, 2, 1] == NEG and ab[1, 0, 2] == NEG
    assert not (ab.isnan().any() or ae.isnan().any())
    ll = seqloss.transducer_lattice(ab[..., None], ae[..., None], Tl, tl, backend=backend)
    want = seqloss.rnnt_loss(x, tg, Tl, tl, reduction="none", backend=backend)
    _close(-ll, want, dtype, "lattice of arc log-probs")
    (gg,) = torch.autograd.grad(-ll.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    assert torch.isfinite(gg).all()
    _close(gg, gw, dtype, "gradient")
    assert torch.equal(gg[0, 2, 1], torch.zeros_like(gg[0, 2, 1]))


def test_arc_logprobs_from_joint_and_durations_dead_rows():
    # the joint twin, and TDT's duration block of -inf
    joint = FlagJoint(6, F64)
    enc, pred = _streams(2, 5, 3, [(0, 2, 1)])
    tg = torch.tensor([[0, 1, 2], [1, 2, 0]])
    Tl, tl = torch.tensor([5, 4]), torch.tensor([3, 2])
    ab, ae = seqloss.transducer_arc_logprobs_from_joint(enc, pred, joint, tg, Tl, tl)
    assert ab[0, 2, 1] == NEG and ae[0, 2, 1] == NEG
    g = torch.autograd.grad((ab.nan_to_num(neginf=0.0) + ae.nan_to_num(neginf=0.0)).sum(),
                            [enc, pred, *joint.parameters()])
    assert all(torch.isfinite(t).all() for t in g)
    x = torch.randn(2, 5, 4, 6 + 3, dtype=F64)
    x[0, 1, 2, 6:] = NEG  # durations only
    x[1, 3, 1] = NEG  # the whole row
    x.requires_grad_()
    ab, ae, ad = seqloss.transducer_arc_logprobs(x, tg, Tl, tl, durations=[0, 1, 2])
    assert (ad[0, 1, 2] == NEG).all() and (ad[1, 3, 1] == NEG).all()
    assert ab[1, 3, 1] == NEG and ae[1, 3, 1] == NEG and torch.isfinite(ab[0, 1, 2])
    assert not (ab.isnan().any() or ae.isnan().any() or ad.isnan().any())
    (gx,) = torch.autograd.grad(sum(t.nan_to_num(neginf=0.0).sum() for t in (ab, ae, ad)), x)
    assert torch.isfinite(gx).all() and (gx[1, 3, 1] == 0).all()


# --------------------------------------------------------------------------- pruned
def _k2_ll(px, py, S, T, rnnt_type):
    """log-sum over k2's paths (0, 0) -> (S, T) of px (S, T[+1]) / py (S+1, T) (DFS)."""
    scores = []

    def walk(s, t, acc):
        if (s, t) == (S, T):
            scores.append(torch.stack(acc).sum())
            return
        if t >= T:
            return
        if s < S:
            walk(s + 1, t if rnnt_type == "regular" else t + 1, [*acc, px[s, t]])
        walk(s, t + 1, [*acc, py[s, t]])

    walk(0, 0, [])
    return torch.logsumexp(torch.stack(scores), 0)


def _pruned_oracle(logits, symbols, term, rnnt_type):
    """Full windows (``ranges[b, t] = 0..S``): the k2 lattice on the guarded log-softmax."""
    B, T, S1, _ = logits.shape
    out = []
    for b in range(B):
        lp = _guarded_log_softmax(logits[b].double())  # (T, S+1, C)
        ext = torch.cat([symbols[b], torch.tensor([term])])
        px = lp.gather(2, ext[None, :, None].expand(T, S1, 1))[..., 0].T[:-1]  # (S, T)
        py = lp[..., term].T  # (S+1, T)
        if rnnt_type == "constrained":
            px = px + py[1:]
        out.append(-_k2_ll(px, py, S1 - 1, T, rnnt_type))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params("rnnt"))
@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
def test_pruned_dead_window_row(rnnt_type, backend, dtype):
    B, T, S, C = 2, 5, 3, 6
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, S + 1, C, generator=g, dtype=F64)
    x[0, 2, 1] = NEG
    x[1, 1, 3] = NEG
    x = x.to(dtype).requires_grad_()
    symbols = torch.randint(1, C, (B, S), generator=g)
    ranges = torch.arange(S + 1).expand(B, T, S + 1).contiguous()
    got = seqloss.rnnt_loss_pruned(x, symbols, ranges, 0, rnnt_type=rnnt_type,
                                   reduction="none", backend=backend)
    if rnnt_type == "regular":  # the full-joint loss
        want = seqloss.rnnt_loss(x, symbols, [T] * B, [S] * B, blank=0, reduction="none",
                                 backend=backend)
    else:
        want = _pruned_oracle(x, symbols, 0, rnnt_type)
    assert torch.isfinite(want).all()
    _close(got, want, dtype, rnnt_type)
    (gg,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    assert torch.isfinite(gg).all()
    _close(gg, gw, dtype, "gradient")


@pytest.mark.parametrize("backend", backend_params("rnnt"))
def test_pruned_hat_dead_window_row(backend):
    # use_hat_loss: a whole row of -inf, and a row whose labels alone are -inf
    B, T, S, C = 2, 5, 3, 6
    g = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, S + 1, C, generator=g, dtype=F64)
    x[0, 2, 1] = NEG
    x[1, 1, 2, 1:] = NEG  # labels of (t=1, s=2): the blank (0) still leaves it
    x.requires_grad_()
    symbols = torch.randint(1, C, (B, S), generator=g)
    ranges = torch.arange(S + 1).expand(B, T, S + 1).contiguous()
    got = seqloss.rnnt_loss_pruned(x, symbols, ranges, 0, use_hat_loss=True, reduction="none",
                                   backend=backend)
    want = seqloss.hat_loss(x, symbols, [T] * B, [S] * B, blank=0, reduction="none",
                            backend=backend)
    assert torch.isfinite(want).all()
    _close(got, want, F64, "hat pruned")
    (gg,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    _close(gg, gw, F64, "gradient")


# --------------------------------------------------------------------------- simple, smoothed
def _factored(dtype, where, seed=5):
    B, T, S, C = 2, 5, 3, 5
    g = torch.Generator().manual_seed(seed)
    am = torch.randn(B, T, C, generator=g, dtype=F64)
    lm = torch.randn(B, S + 1, C, generator=g, dtype=F64)
    if where == "am":
        am[0, 2] = NEG
    else:
        lm[0, 1] = NEG
    symbols = torch.randint(1, C, (B, S), generator=g)
    return am.to(dtype).requires_grad_(), lm.to(dtype).requires_grad_(), symbols


def _smoothed_oracle(lm, am, symbols, b, ls, as_, rnnt_type):
    """Sequence ``b`` of k2's smoothed loss (no boundary: the unigram over every context
    of the batch, a row of -inf contributing probabilities 0)."""
    am, lm = am.double(), lm.double()
    T, S1, C = am.shape[1], lm.shape[1], am.shape[2]
    unigram = _guarded_log_softmax(lm).exp().reshape(-1, C).mean(0)
    joint = _guarded_log_softmax(am[b][:, None, :] + lm[b][None, :, :])
    lm_only = _guarded_log_softmax(lm[b])[None].expand(T, S1, C)
    am_only = _guarded_log_softmax(am[b] + unigram.log())[:, None].expand(T, S1, C)
    lp = (1 - ls - as_) * joint + ls * lm_only + as_ * am_only
    ext = torch.cat([symbols[b], torch.tensor([0])])
    px = lp.gather(2, ext[None, :, None].expand(T, S1, 1))[..., 0].T[:-1]
    py = lp[..., 0].T
    if rnnt_type == "constrained":
        px = px + py[1:]
    return -_k2_ll(px, py, S1 - 1, T, rnnt_type)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params("rnnt"))
@pytest.mark.parametrize("fn", ["simple", "smoothed"])
@pytest.mark.parametrize("where", ["am", "lm"])
def test_simple_and_smoothed_dead_frame_or_context(where, fn, backend, dtype):
    # an am frame or an lm row of -inf: every path crosses it, sequence 0 has none
    am, lm, symbols = _factored(dtype, where)
    loss = getattr(seqloss, f"rnnt_loss_{fn}")
    for zi in (False, True):
        got = loss(lm, am, symbols, 0, reduction="none", zero_infinity=zi, backend=backend)
        assert float(got[0].detach()) == (0.0 if zi else float("inf")), (zi, got)
        assert torch.isfinite(got[1])
        # the dead sequence passes no gradient back, sequence 1's are finite
        g0 = torch.autograd.grad(got[0], [am, lm], allow_unused=True, retain_graph=True)
        assert all(t is None or (t == 0).all() for t in g0)
        ga, gl = torch.autograd.grad(got.nan_to_num(posinf=0.0).sum(), [am, lm])
        assert torch.isfinite(ga).all() and torch.isfinite(gl).all()
    if fn == "simple":  # sequence 1 as on its own
        alone = loss(lm[1:], am[1:], symbols[1:], 0, reduction="none", backend=backend)
    else:
        alone = _smoothed_oracle(lm, am, symbols, 1, 0.1, 0.1, "regular")[None]
    _close(got[1:], alone, dtype, f"{fn} sequence 1")


@pytest.mark.parametrize("rnnt_type", ["modified", "constrained"])
def test_smoothed_dead_context_other_topologies(rnnt_type):
    am, lm, symbols = _factored(F64, "lm")
    T, S = am.shape[1], symbols.shape[1]
    got = seqloss.rnnt_loss_smoothed(lm, am, symbols, 0, rnnt_type=rnnt_type, reduction="none")
    assert float(got[0].detach()) == float("inf") and T >= S
    _close(got[1], _smoothed_oracle(lm, am, symbols, 1, 0.1, 0.1, rnnt_type), F64, rnnt_type)


# --------------------------------------------------------------------------- fused CTC
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params("ctc"))
def test_fused_ctc_dead_frame_is_infinite(backend, dtype):
    T, B, C = 6, 2, 4
    g = torch.Generator().manual_seed(6)
    x = torch.randn(T, B, C, generator=g, dtype=F64)
    x[2, 0] = NEG
    x = x.to(dtype).requires_grad_()
    tg = torch.tensor([[1, 2], [2, 3]])
    for zi in (False, True):
        got = seqloss.ctc_loss(x, tg, [T, T], [2, 2], reduction="none", zero_infinity=zi,
                               fused_log_softmax=True, backend=backend)
        lp = _guarded_log_softmax(x.float() if dtype in (torch.float16, torch.bfloat16) else x)
        want = seqloss.ctc_loss(lp, tg, [T, T], [2, 2], reduction="none", zero_infinity=zi,
                                backend=backend)
        assert float(got[0].detach()) == (0.0 if zi else float("inf"))
        _close(got, want, dtype, "fused ctc")
        (gg,) = torch.autograd.grad(got.nan_to_num(posinf=0.0).sum(), x)
        (gw,) = torch.autograd.grad(want.nan_to_num(posinf=0.0).sum(), x)
        assert torch.isfinite(gg).all() and (gg[:, 0] == 0).all()
        _close(gg, gw, dtype, "fused ctc gradient")


# --------------------------------------------------------------------------- the shared rule
def test_logspace_rule():
    from seqloss._core import logspace

    x = torch.tensor([[NEG, NEG, NEG], [0.5, NEG, -1.0], [float("nan"), 0.0, 1.0]],
                     dtype=F64, requires_grad=True)
    z = logspace.log_normalizer(x)
    assert z[0] == NEG and torch.isfinite(z[1]) and torch.isnan(z[2])
    lp = logspace.log_softmax(x)
    assert (lp[0] == NEG).all() and torch.isnan(lp[2]).all()
    torch.testing.assert_close(lp[1], torch.log_softmax(x[1], -1))
    torch.testing.assert_close(logspace.sub_normalizer(x, z[:, None])[:2], lp[:2])
    sm = logspace.softmax_given(x.detach(), z.detach()[:, None])
    assert (sm[0] == 0).all() and torch.isnan(sm[2]).all()
    torch.testing.assert_close(logspace.softmax(x)[:2], sm[:2])
    (g,) = torch.autograd.grad(lp[:2].nan_to_num(neginf=0.0).sum() + z[:2].sum(), x)
    assert torch.equal(g[0], torch.zeros(3, dtype=F64)) and torch.isfinite(g[1]).all()


# --------------------------------------------------------------------------- distributed_mean
@pytest.mark.parametrize("group", ["world", 3, object(), dist.group])
def test_distributed_mean_group_must_be_a_process_group(group, tmp_path, monkeypatch):
    for init in (False, True):
        if init:
            if Path("/sys/class/net/lo").exists():
                monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                                    world_size=1)
        try:
            with pytest.raises(TypeError, match="group") as e:
                seqloss.distributed_mean(torch.ones(3), group=group)
            assert isinstance(e.value, RuntimeError)
            with pytest.raises(TypeError, match="group"):  # before anything else
                seqloss.distributed_mean("not a tensor", weights=[-1], group=group)
            if init:
                m = seqloss.distributed_mean(torch.ones(3), group=dist.group.WORLD)
                assert float(m) == 1.0
        finally:
            if init:
                dist.destroy_process_group()
