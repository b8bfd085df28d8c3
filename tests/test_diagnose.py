"""seqloss.diagnose: feasibility counts, non-finite locations, gradients, reports.

The per-sequence values it reports for multi-blank RNN-T, TDT and HAT are checked
against path enumeration (``seqloss.testing.brute_force_lattice``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import seqloss
from seqloss.diagnose import Diagnosis
from seqloss.testing import brute_force_lattice

NAN, INF = float("nan"), float("inf")


def _lp(T, B, C, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, C, generator=g, dtype=torch.float64).log_softmax(-1)


def test_ctc_feasibility_counts_repeats():
    targets = torch.tensor([[1, 1, 2, 0], [1, 2, 3, 0], [2, 2, 2, 2], [3, 0, 0, 0], [0, 0, 0, 0]])
    tl = [3, 3, 4, 1, 0]
    il = [4, 3, 6, 0, 0]
    r = seqloss.diagnose("ctc", _lp(8, 5, 5), targets, il, tl)
    needed = [s.frames_needed for s in r.sequences]
    assert needed == [4, 3, 7, 1, 0]
    assert [s.repeats for s in r.sequences] == [1, 0, 3, 0, 0]
    assert [s.feasible for s in r.sequences] == [True, True, False, False, True]
    assert r.infeasible == [2, 3]
    s2 = r.sequences[2]
    assert s2.loss == INF and s2.grad_max == 0.0 and s2.status == "infeasible"
    assert "needs 7 frames (4 labels + 3 repeats), has 6" in s2.verdict
    # Zero frames and an empty target is feasible with loss 0.
    assert r.sequences[4].loss == 0.0 and r.sequences[4].status == "ok"
    assert not r.ok


def test_ctc_zero_infinity_still_reports_infeasible():
    r = seqloss.diagnose("ctc", _lp(3, 1, 4), [[1, 1]], [2], [2], zero_infinity=True)
    s = r.sequences[0]
    assert s.loss == 0.0 and not s.feasible and "zero_infinity" in s.verdict


def test_ctc_nonfinite_location():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 3, 6, generator=g, dtype=torch.float64)
    logits[2, 0, 5] = -INF  # a masked class is valid
    x = logits.log_softmax(-1)
    x[3, 1, 2] = NAN
    x[7, 1, 4] = INF
    x[5, 2, 1] = INF
    x[9, 0, 3] = NAN  # padding of sequence 0 (length 8): never read, not reported
    targets = torch.tensor([[1, 2], [3, 4], [1, 1]])
    r = seqloss.diagnose("ctc", x, targets, [8, 10, 10], [2, 2, 2])
    s0, s1, s2 = r.sequences
    assert s0.nonfinite is None and s0.status == "ok" and math.isfinite(s0.loss)
    assert s1.nonfinite is not None
    assert (s1.nonfinite.value, s1.nonfinite.frame, s1.nonfinite.cls) == ("nan", 3, 2)
    assert s1.nonfinite.count == 2
    assert "NaN at frame 3, class 2" in s1.verdict and s1.status == "nonfinite"
    assert (s2.nonfinite.value, s2.nonfinite.frame, s2.nonfinite.cls) == ("+inf", 5, 1)
    assert math.isnan(s1.loss) and math.isnan(s1.grad_max)
    assert r.nonfinite == [1, 2]


def test_ctc_grad_max_and_min_log_prob():
    x = _lp(6, 2, 5, seed=3)
    targets = torch.tensor([[1, 2], [3, 3]])
    r = seqloss.diagnose("ctc", x, targets, [6, 5], [2, 2], backend="reference")
    xg = x.clone().requires_grad_()
    loss = seqloss.ctc_loss(xg, targets, [6, 5], [2, 2], reduction="none", backend="reference")
    (g,) = torch.autograd.grad(loss.sum(), xg)
    loss = loss.detach()
    for b, s in enumerate(r.sequences):
        assert s.loss == pytest.approx(float(loss[b]))
        assert s.grad_max == pytest.approx(float(g[:, b].abs().max()))
    assert r.sequences[1].min_log_prob == pytest.approx(float(x[:5, 1].min()))
    assert r.ok and r.summary() == "all 2 sequences ok"


def test_ctc_unnormalized_warning_and_fused():
    logits = torch.randn(6, 1, 5, dtype=torch.float64) * 3
    r = seqloss.diagnose("ctc", logits, [[1, 2]], [6], [2])
    assert r.sequences[0].status == "warning" and "not normalized" in r.sequences[0].verdict
    assert r.ok  # a warning is not a failure
    r = seqloss.diagnose("ctc", logits, [[1, 2]], [6], [2], fused_log_softmax=True)
    assert r.sequences[0].status == "ok"


def test_unbatched_and_positional_reduction():
    x = _lp(5, 1, 4)[:, 0]
    r = seqloss.diagnose("ctc", x, torch.tensor([1, 2]), 5, 2, 0, "sum")
    assert len(r.sequences) == 1 and r.sequences[0].frames_needed == 2


def test_validation_errors_propagate():
    with pytest.raises(seqloss.InputError, match="targets"):
        seqloss.diagnose("ctc", _lp(5, 1, 4), [[7]], [5], [1])
    with pytest.raises(TypeError):
        seqloss.diagnose("ctc", _lp(5, 1, 4), torch.tensor([[1.0]]), [5], [1])
    with pytest.raises(seqloss.InputError, match="kind"):
        seqloss.diagnose("warp", _lp(5, 1, 4), [[1]], [5], [1])


def test_report_str_and_json():
    x = _lp(4, 2, 4)
    x[1, 0, 1] = NAN
    r = seqloss.diagnose("ctc", x, [[1, 2], [2, 2]], [4, 2], [2, 2])
    assert isinstance(r, Diagnosis)
    d = r.to_dict()
    text = json.dumps(d, allow_nan=False)  # strict JSON: non-finite floats are strings
    back = json.loads(text)
    assert back["ok"] is False
    assert back["sequences"][0]["nonfinite"] == {"value": "nan", "frame": 1, "class": 1, "count": 1}
    assert back["sequences"][0]["loss"] == "nan"
    assert back["sequences"][1]["loss"] == "inf"
    s = str(r)
    assert "verdict" in s and "NaN at frame 1, class 1" in s and "infeasible" in s
    assert len(s.splitlines()) == 5  # header, columns, 2 sequences, summary
    assert s.splitlines()[-1].startswith("2 sequences:")




def test_rnnt_feasibility_and_nonfinite():
    g = torch.Generator().manual_seed(0)
    B, T, U, V = 3, 4, 2, 5
    logits = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    logits[1, 2, 1, 3] = NAN
    logits[2, 3, 2, 0] = NAN  # past sequence 2's length: not read
    targets = torch.tensor([[1, 2], [0, 1], [2, 2]], dtype=torch.int32)
    r = seqloss.diagnose("rnnt", logits, targets, [4, 4, 0], [2, 2, 2])
    s0, s1, s2 = r.sequences
    assert s0.status == "ok" and s0.frames_needed == 1 and math.isfinite(s0.loss)
    assert s0.grad_max > 0
    assert (s1.nonfinite.frame, s1.nonfinite.u, s1.nonfinite.cls) == (2, 1, 3)
    assert "u 1" in s1.verdict
    assert s2.status == "infeasible" and s2.loss == INF and s2.grad_max == 0.0
    assert r.blank == V - 1
    json.dumps(r.to_dict(), allow_nan=False)


def test_doctor_names_an_unknown_key():
    lp = _lp(7, 3, 5)
    tg, il, tl = torch.tensor([[1, 2, 3]] * 3), torch.tensor([7, 6, 6]), torch.tensor([3, 2, 2])
    with pytest.raises(seqloss.InputError, match=r"'target_length'.*did you mean 'target_lengths'"):
        seqloss.diagnose("ctc", log_probs=lp, targets=tg, input_lengths=il, target_length=tl)



# ------------------------------------------------------------------ column lengths
def _ctc_needed(labels: list[int]) -> int:
    return len(labels) + sum(a == b for a, b in zip(labels, labels[1:], strict=False))


@pytest.mark.parametrize("shape", ["flat", "column"])
def test_diagnose_ctc_counts_repeats_with_column_lengths(shape):
    lp = torch.randn(4, 2, 3).log_softmax(-1)
    tg = torch.tensor([[2, 0], [1, 1]])
    il, tl = torch.tensor([1, 2]), torch.tensor([1, 2])
    if shape == "column":
        il, tl = il[:, None], tl[:, None]
    d = seqloss.diagnose("ctc", lp, tg, il, tl)
    got = [(s.frames, s.target_length, s.repeats, s.frames_needed, s.feasible) for s in d.sequences]
    want = [(1, 1, 0, _ctc_needed([2]), True), (2, 2, 1, _ctc_needed([1, 1]), False)]
    assert got == want
    assert d.sequences[1].status == "infeasible"


@pytest.mark.parametrize("kind", ["rnnt", "multiblank", "tdt"])
def test_diagnose_transducers_take_column_lengths(kind):
    V = {"rnnt": 4, "multiblank": 5, "tdt": 7}[kind]
    x = torch.randn(2, 3, 3, V)
    tg = torch.tensor([[1, 2], [2, 1]])
    il, tl = torch.tensor([3, 2]), torch.tensor([2, 1])
    extra = {"rnnt": (), "multiblank": ([2],), "tdt": ([0, 1, 2],)}[kind]
    flat = seqloss.diagnose(kind, x, tg, il, tl, *extra)
    col = seqloss.diagnose(kind, x, tg, il[:, None], tl[:, None], *extra)
    assert [(s.frames, s.target_length) for s in col.sequences] == [(3, 2), (2, 1)]
    assert col.to_dict()["sequences"] == flat.to_dict()["sequences"]


# ------------------------------------------------------------------ multi-blank, TDT, HAT
TDT_DURS = [0, 1, 2, 3, 4]


def _oracle(x, tg, il, tl, blank_arcs, emit_arcs, dur=None):
    """Per-sequence loss and the largest |d loss_b / d input| by enumerating every path.

    ``blank_arcs``: (token, duration, duration_logit or None); ``emit_arcs``:
    (duration, duration_logit or None); ``dur``: duration logits (TDT) or None.
    """
    parts = [x.detach().double().requires_grad_()]
    if dur is not None:
        parts.append(dur.detach().double().requires_grad_())
    losses, gmax = [], []
    for b in range(x.shape[0]):
        Tb, U = int(il[b]), int(tl[b])
        lp = parts[0][b, :Tb, : U + 1].log_softmax(-1)  # what sequence b reads
        ld = parts[1][b, :Tb, : U + 1].log_softmax(-1) if dur is not None else None
        y = torch.cat([tg[b, :U], tg.new_zeros(1)])
        ye = lp.gather(2, y[None, :, None].expand(lp.shape[0], -1, 1))[..., 0]
        ab = torch.stack([lp[..., k] + (0 if j is None else ld[..., j])
                          for k, _, j in blank_arcs], -1)
        ae = torch.stack([ye + (0 if j is None else ld[..., j]) for _, j in emit_arcs], -1)
        ll = brute_force_lattice(ab, ae, Tb, U, tuple(d for _, d, _ in blank_arcs),
                                 tuple(d for d, _ in emit_arcs))
        loss = -ll
        losses.append(float(loss.detach()))
        if math.isfinite(losses[-1]):
            gs = torch.autograd.grad(loss, parts, allow_unused=True, materialize_grads=True)
            gmax.append(max(float(g.abs().max()) for g in gs))
        else:
            gmax.append(0.0)
    return losses, gmax


def _mb_arcs(V, durs):
    blank = V - 1
    return [(blank, 1, None)] + [(blank - 1 - i, d, None) for i, d in enumerate(durs)], [(0, None)]


def _tdt_arcs(V, durs):
    blanks = [(V - 1, d, k) for k, d in enumerate(durs) if d > 0]
    return blanks, [(d, k) for k, d in enumerate(durs)]


def test_diagnose_multiblank_against_brute_force():
    g = torch.Generator().manual_seed(3)
    B, T, U, V = 3, 5, 2, 7
    durs = [2, 3]
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    x[1, 3, 0, V - 3] = NAN  # big blank 1 (duration 3) of sequence 1
    x[0, 4, 2, 0] = NAN  # past sequence 0's 4 frames: never read
    tg = torch.randint(0, V - 3, (B, U), generator=g)
    il, tl = torch.tensor([4, 5, 0]), torch.tensor([2, 1, 2])
    r = seqloss.diagnose("multiblank", x, tg, il, tl, durs, sigma=0.0)
    want_l, want_g = _oracle(x, tg, il, tl, *_mb_arcs(V, durs))
    s0, s1, s2 = r.sequences
    assert s0.status == "ok" and s0.nonfinite is None
    assert s0.loss == pytest.approx(want_l[0], rel=1e-10)
    assert s0.grad_max == pytest.approx(want_g[0], rel=1e-6)  # reported in float32
    assert (s1.nonfinite.frame, s1.nonfinite.u, s1.nonfinite.cls) == (3, 0, V - 3)
    assert s1.status == "nonfinite" and math.isnan(s1.loss)
    assert s2.status == "infeasible" and s2.loss == INF and s2.grad_max == 0.0
    assert "zero frames" in s2.verdict
    assert r.blank == V - 1 and r.kind == "multiblank"
    assert r.extra["big_blank_durations"] == durs
    assert r.extra["big_blank_classes"] == [V - 2, V - 3]  # NeMo: blank - 1 - i
    d = r.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["big_blank_classes"] == [V - 2, V - 3]
    assert "big blank durations [2, 3]" in str(r).splitlines()[0]


@pytest.mark.parametrize("layout", ["concatenated", "pair"])
def test_diagnose_tdt_against_brute_force(layout):
    g = torch.Generator().manual_seed(5)
    B, T, U, V = 3, 5, 2, 5
    D_ = len(TDT_DURS)
    tok = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    dur = torch.randn(B, T, U + 1, D_, generator=g, dtype=torch.float64)
    dur[1, 2, 1, 3] = INF  # duration logit 3 (3 frames) of sequence 1
    tok[2, 4, 0, 1] = NAN  # past sequence 2's 4 frames: never read
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([5, 4, 4]), torch.tensor([2, 2, 1])
    logits = torch.cat([tok, dur], -1) if layout == "concatenated" else (tok, dur)
    r = seqloss.diagnose("tdt", logits, tg, il, tl, TDT_DURS)
    want_l, want_g = _oracle(tok, tg, il, tl, *_tdt_arcs(V, TDT_DURS), dur=dur)
    s0, s1, s2 = r.sequences
    for s, b in ((s0, 0), (s2, 2)):
        assert s.status == "ok" and s.nonfinite is None
        assert s.loss == pytest.approx(want_l[b], rel=1e-10)
        assert s.grad_max == pytest.approx(want_g[b], rel=1e-6)  # reported in float32
    nf = s1.nonfinite
    assert (nf.value, nf.frame, nf.u, nf.cls, nf.block) == ("+inf", 2, 1, 3, "duration")
    assert "duration class 3" in s1.verdict and math.isnan(s1.loss)
    assert r.blank == V - 1 and r.shape == (B, T, U + 1, V + D_)
    assert r.extra["durations"] == TDT_DURS and r.extra["logits_layout"] == layout
    assert json.loads(json.dumps(r.to_dict(), allow_nan=False))["sequences"][1]["nonfinite"][
        "block"] == "duration"


def test_diagnose_tdt_passes_the_variant_arguments():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 4 + 3, generator=g, dtype=torch.float64)
    tg, il, tl = torch.tensor([[1, 2], [0, 1]]), [4, 3], [2, 2]
    r = seqloss.diagnose("tdt", x, tg, il, tl, [0, 1, 2], sigma=0.05, omega=0.25,
                         zero_infinity=True)
    want = seqloss.tdt_loss(x, tg, il, tl, [0, 1, 2], sigma=0.05, omega=0.25, reduction="none")
    assert [s.loss for s in r.sequences] == pytest.approx(want.tolist(), rel=1e-12)
    assert r.extra == {"durations": [0, 1, 2], "logits_layout": "concatenated",
                       "sigma": 0.05, "omega": 0.25}
    assert r.zero_infinity
    with pytest.raises(seqloss.InputError, match="did you mean 'durations'"):
        seqloss.diagnose("tdt", x, tg, il, tl, duration=[0, 1, 2])


def test_diagnose_hat_against_brute_force():
    from seqloss.testing.oracles import brute_force_lattice

    g = torch.Generator().manual_seed(5)
    B, T, U, V = 3, 4, 2, 6
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    x[1, 2, 1, 0] = NAN  # a label class read by sequence 1
    x[0, 3, 0, 2] = NAN  # past sequence 0's 3 frames: never read
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    il, tl = torch.tensor([3, 4, 0]), torch.tensor([2, 1, 2])
    r = seqloss.diagnose("hat", x, tg, il, tl)
    # The oracle: HAT's arcs written out here, every path listed.
    zb = x[..., V - 1]
    lab = torch.log_softmax(x[..., : V - 1], -1) + torch.nn.functional.logsigmoid(-zb)[..., None]
    ab = torch.nn.functional.logsigmoid(zb)[..., None]
    ae = lab.gather(-1, torch.cat([tg, tg[:, :1]], 1)[:, None, :, None].expand(B, T, U + 1, 1))
    want0 = -float(brute_force_lattice(ab[0], ae[0], 3, 2, (1,), (0,)))
    s0, s1, s2 = r.sequences
    assert s0.status == "ok" and s0.loss == pytest.approx(want0, rel=1e-10)
    assert s0.min_log_prob == pytest.approx(float(torch.minimum(
        lab[0, :3].min(), ab[0, :3].min())), rel=1e-12)
    assert s1.status == "nonfinite" and (s1.nonfinite.frame, s1.nonfinite.u) == (2, 1)
    assert s2.status == "infeasible" and s2.loss == INF and s2.grad_max == 0.0
    assert r.kind == "hat" and r.blank == V - 1
