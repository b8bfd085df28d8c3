"""Multi-blank RNN-T and TDT through the family registry: diagnose, doctor, bench, demo.

The losses themselves are tested in their own files; here the per-sequence values
that ``diagnose`` reports are checked against path enumeration
(``seqloss.testing.brute_force_lattice``), the benchmark's ratios against rows made
by hand, and the demo's step counts against a scripted joint.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import BACKENDS
from rich.console import Console

import seqloss
from seqloss import bench, cli
from seqloss._core import registry
from seqloss.demo import data as D
from seqloss.diagnose import KINDS, diagnose_transducer
from seqloss.testing import brute_force_lattice

NAN, INF = float("nan"), float("inf")
TDT_DURS = [0, 1, 2, 3, 4]


# ------------------------------------------------------------------ oracles
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


# ------------------------------------------------------------------ registry
@pytest.mark.parametrize("name,fn", [
    ("multiblank", "multiblank_rnnt_loss"),
    ("tdt", "tdt_loss"),
])
def test_registry_entries(name, fn):
    fam = registry.family(name)
    assert fam.loss_fn() is getattr(seqloss, fn)
    assert fam.input_name == "logits" and fam.kernels == "joint"
    # The generic transducer report and benchmark, read off the entry: no per-variant code.
    assert fam.diagnose is None and fam.bench is None and fam.transducer is not None
    assert fam.diagnose_fn().func is diagnose_transducer
    mod = fam.bench_module()
    assert mod.name == name and mod.seqloss_name == f"seqloss {name}"
    for attr in ("cases", "implementations", "run", "pair_rows"):
        assert callable(getattr(mod, attr))
    assert name in registry.NAMES and name in bench.LOSSES
    assert name in KINDS


def test_backend_fixtures_for_the_new_families(multiblank_backend, tdt_backend):
    # conftest makes one <family>_backend fixture per registered family.
    assert multiblank_backend in BACKENDS and tdt_backend in BACKENDS


def test_cli_choices_name_the_new_families():
    p = cli.build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    loss = next(a for a in sub.choices["bench"]._actions if a.dest == "loss")
    assert {"multiblank", "tdt"} <= set(loss.choices)


# ------------------------------------------------------------------ diagnose
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


# ------------------------------------------------------------------ doctor
def _tdt_batch(pair: bool):
    g = torch.Generator().manual_seed(0)
    tok = torch.randn(2, 4, 3, 5, generator=g)
    dur = torch.randn(2, 4, 3, 3, generator=g)
    return {"kind": "tdt", "logits": (tok, dur) if pair else torch.cat([tok, dur], -1),
            "targets": torch.tensor([[1, 2], [3, 0]]), "logit_lengths": torch.tensor([4, 0]),
            "target_lengths": torch.tensor([2, 1]), "durations": [0, 1, 2], "blank": -1}


@pytest.mark.parametrize("pair", [False, True], ids=["concatenated", "pair"])
def test_doctor_saved_tdt_batch(tmp_path, capsys, pair):
    d = _tdt_batch(pair)
    torch.save(d, tmp_path / "tdt.pt")
    assert cli.main(["doctor", str(tmp_path / "tdt.pt")]) == 1
    out = capsys.readouterr().out
    assert "seqloss.diagnose: tdt" in out and "durations [0, 1, 2]" in out
    assert "zero frames" in out and out.strip().splitlines()[-1] == "2 sequences: 1 infeasible [1]"
    d["logit_lengths"] = torch.tensor([4, 3])
    torch.save(d, tmp_path / "clean.pt")
    assert cli.main(["doctor", "--json", str(tmp_path / "clean.pt")]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is True and rep["kind"] == "tdt" and rep["durations"] == [0, 1, 2]
    assert rep["logits_layout"] == ("pair" if pair else "concatenated")


def test_doctor_tdt_unknown_key_and_invalid(tmp_path, capsys):
    d = _tdt_batch(False)
    d["duration"] = d.pop("durations")
    torch.save(d, tmp_path / "typo.pt")
    assert cli.main(["doctor", str(tmp_path / "typo.pt")]) == 1
    out = capsys.readouterr().out
    assert "unknown argument 'duration'" in out and "did you mean 'durations'" in out
    d = _tdt_batch(False)
    d["targets"] = torch.tensor([[1, 4], [3, 0]])  # 4 is the blank (V = 5, blank -1)
    torch.save(d, tmp_path / "blank.pt")
    assert cli.main(["doctor", str(tmp_path / "blank.pt")]) == 1
    out = capsys.readouterr().out
    assert "tdt arguments in" in out and "InputError" in out and "targets" in out


def test_doctor_multiblank(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    torch.save({"kind": "multiblank", "logits": torch.randn(2, 4, 3, 6, generator=g),
                "targets": torch.tensor([[1, 2], [0, 0]]), "logit_lengths": torch.tensor([4, 4]),
                "target_lengths": torch.tensor([2, 1]), "big_blank_durations": [2, 3]},
               tmp_path / "mb.pt")
    assert cli.main(["doctor", str(tmp_path / "mb.pt")]) == 0
    out = capsys.readouterr().out
    assert "big blank classes [4, 3]" in out and "all 2 sequences ok" in out


# ------------------------------------------------------------------ bench
@pytest.mark.parametrize("loss", ["multiblank", "tdt"])
def test_bench_cases_and_inputs(loss):
    mod = bench.module(loss)
    rnnt_bench = bench.module("rnnt")

    for sizes in bench.SIZES:
        assert [(c["B"], c["T"], c["U"], c["V"]) for c in mod.cases(sizes)] == \
            [(c["B"], c["T"], c["U"], c["V"]) for c in rnnt_bench.cases(sizes)]
    for case in mod.cases("small"):
        d = mod.make_inputs(case)
        V = case["V"]
        assert d["logits"].shape == (case["B"], case["T"], case["U"] + 1, V)
        # Targets are never a blank-like class: multi-blank's 4 blanks are the last
        # classes; TDT's blank is the last token class before the 5 duration logits.
        top = V - 5 if loss == "multiblank" else V - 5 - 2
        assert int(d["targets"].max()) <= top and int(d["targets"].min()) >= 0
        torch.testing.assert_close(d["logits"], mod.make_inputs(case)["logits"], rtol=0, atol=0)
    names = set(mod.implementations())
    assert {f"seqloss {loss}", "seqloss rnnt_loss"} <= names


# The classes each family's benchmark must never draw as a target (written out here, not
# read off the tables the benchmark reads): its blank-like classes, and TDT's durations.
_BENCH_NOT_TARGETS = {
    "rnnt": lambda V: {0},
    "multiblank": lambda V: {V - 1, V - 2, V - 3, V - 4},
    "tdt": lambda V: {V - 6, *range(V - 5, V)},
    "hat": lambda V: {V - 1},
}


@pytest.mark.parametrize("loss", sorted(_BENCH_NOT_TARGETS))
def test_bench_of_every_transducer_family_from_its_entry(loss):
    mod = bench.module(loss)
    assert registry.family(loss).bench is None  # the generic benchmark, read off the entry
    case = mod.cases("tiny")[1]
    d = mod.make_inputs(case)
    V = case["V"]
    banned = _BENCH_NOT_TARGETS[loss](V)
    assert not set(d["targets"].unique().tolist()) & banned
    grad = mod.implementations()[mod.seqloss_name](case)()
    assert grad.shape == d["logits"].shape and bool(torch.isfinite(grad).all())


def test_bench_pair_rows_by_hand():
    mod = bench.module("tdt")
    case = {"B": 2, "T": 8, "U": 3, "V": 16}  # logits 2*8*4*16*4 bytes = 4 KiB
    mib = 4096 / 2**20
    rows = [
        {**case, "case": "c", "impl": "seqloss tdt", "ms": 3.0, "peak_mib": 1.05 * mib},
        {**case, "case": "c", "impl": "seqloss rnnt_loss", "ms": 2.5, "peak_mib": mib},
        {**case, "case": "c", "impl": "transformers tdt_loss", "ms": 90.0, "peak_mib": None},
    ]
    pairs = mod.pair_rows(rows)
    by = {p["peer"]: p for p in pairs}
    assert set(by) == {"seqloss rnnt_loss", "transformers tdt_loss"}
    rn = by["seqloss rnnt_loss"]
    assert rn["ratio"] == pytest.approx(2.5 / 3.0) and rn["overhead"] == pytest.approx(1.2)
    assert rn["seqloss_mem_over_logits"] == pytest.approx(1.05)
    assert rn["peer_mem_over_logits"] == pytest.approx(1.0)
    tf = by["transformers tdt_loss"]
    assert tf["ratio"] == pytest.approx(30.0) and "overhead" not in tf
    assert tf["peer_mem_over_logits"] is None
    notes = mod.notes(pairs)
    assert "c: tdt / rnnt_loss time 1.20x (target <= 1.5) ok" in notes
    assert "c: tdt extra peak memory 1.05x the logits (target <= 1.1) ok" in notes
    assert "c: tdt 30.0x faster than transformers tdt_loss (target >= 20x) ok" in notes
    rows[0]["ms"] = 4.0  # 4.0 / 2.5 = 1.6 > 1.5
    assert any(n.endswith("MISSED") and "1.60x" in n for n in mod.notes(mod.pair_rows(rows)))


@pytest.mark.parametrize("loss", ["multiblank", "tdt"])
def test_bench_run_tiny(loss):
    mod = bench.module(loss)
    case = mod.cases("tiny")[:1]
    rows = mod.run(case, repeat=1, memory=False,
                   impls=[f"seqloss {loss}", "seqloss rnnt_loss"], log=None)
    assert [r["impl"] for r in rows] == [f"seqloss {loss}", "seqloss rnnt_loss"]
    assert all(r["ms"] > 0 and r["peak_mib"] is None for r in rows)
    (p,) = mod.pair_rows(rows)
    assert p["overhead"] == pytest.approx(rows[0]["ms"] / rows[1]["ms"])


def test_bench_cli_tdt_prints_targets(capsys):
    assert cli.main(["bench", "--loss", "tdt", "--sizes", "tiny", "--repeats", "1",
                     "--peers", ""]) == 0
    out = capsys.readouterr().out
    assert "B1-T20-U5-V10" in out and "seqloss rnnt_loss" in out
    assert "tdt / rnnt_loss time" in out and "target <= 1.5" in out


# ------------------------------------------------------------------ demo
class _Scripted(torch.nn.Module):
    """A transducer whose joint output is read off a script: ``x[b, t, n]`` is the
    output at frame ``t`` after ``n`` emissions (the predictor counts them)."""

    def encoder(self, x):
        return x

    def enc_proj(self, x):
        return x

    def predict(self, y, state=None):
        n = 0 if state is None else state + 1
        return torch.full((1, 1), n), n

    def joint(self, enc_t, pred):
        return enc_t[int(pred)]


def _row(C, D_, token, dur=None):
    r = torch.zeros(C + D_)
    r[token] = 1.0
    if dur is not None:
        r[C + dur] = 1.0
    return r


def test_tdt_greedy_steps_on_a_script():
    C, durs = 3, (0, 1, 2, 3, 4)
    T, N = 7, 4
    x = torch.zeros(1, T, N, C + len(durs))
    x[0, 0, 0] = _row(C, 5, 1, 2)  # frame 0: emit 1, jump 2 frames
    x[0, 2, 1] = _row(C, 5, 0, 3)  # frame 2: blank, jump 3
    x[0, 5, 1] = _row(C, 5, 2, 0)  # frame 5: emit 2, stay
    x[0, 5, 2] = _row(C, 5, 0, 0)  # frame 5: blank of duration 0 -> moves one frame
    x[0, 6, 2] = _row(C, 5, 0, 4)  # frame 6: blank, jump past the end
    hyp, steps = D.tdt_greedy(_Scripted(), x, torch.tensor([T]), durs)
    assert hyp == [[1, 2]] and steps == [5]
    # A token of duration 0, over and over: after max_symbols emissions it moves on.
    x = torch.zeros(1, 2, 8, C + len(durs))
    x[0, :, :] = _row(C, 5, 1, 0)
    hyp, steps = D.tdt_greedy(_Scripted(), x, torch.tensor([2]), durs, max_symbols=3)
    assert hyp == [[1] * 6] and steps == [6]


def test_rnnt_greedy_steps_on_a_script():
    C = 3
    x = torch.zeros(1, 3, 4, C)
    x[0, 0, 0, 1] = 1  # frame 0: emit 1, then (n = 1) blank
    x[0, 0, 1, 0] = 1
    x[0, 1, 1, 0] = 1  # frame 1: blank
    x[0, 2, 1, 2] = 1  # frame 2: emit 2, emit 1, blank
    x[0, 2, 2, 1] = 1
    x[0, 2, 3, 0] = 1
    hyp, steps = D.rnnt_greedy_steps(_Scripted(), x, torch.tensor([3]))
    assert hyp == [[1, 2, 1]] and steps == [2 + 1 + 3]
    assert D.rnnt_greedy(_Scripted(), x, torch.tensor([3])) == hyp


def test_tiny_tdt_model_trains_with_tdt_loss():
    torch.manual_seed(0)
    model = D.TinyTDT()
    b = D.make_batch(4, torch.Generator().manual_seed(0))
    logits = model(b.x, b.targets)
    assert logits.shape == (*b.x.shape[:2], b.targets.shape[1] + 1,
                            D.NUM_CLASSES + len(D.TDT_DURATIONS))
    loss = seqloss.tdt_loss(logits, b.targets, b.input_lengths, b.target_lengths,
                            model.durations, blank=D.BLANK)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and model.out.weight.grad.abs().sum() > 0


def test_demo_reports_tdt_steps(tmp_path):
    from seqloss.demo.run import run_demo

    console = Console(record=True, width=200)
    threads = torch.get_num_threads()
    numba = pytest.importorskip("numba")
    nthreads = numba.get_num_threads()
    try:
        assert run_demo(steps=2, out=str(tmp_path), console=console) == 0
    finally:  # the demo runs single-threaded; later tests in this process do not
        torch.set_num_threads(threads)
        numba.set_num_threads(nthreads)
    text = console.export_text()
    assert "TDT loss (per label) falling" in text and "steps per frame" in text
    assert "TDT decodes in" in text and "where RNN-T takes" in text


# ------------------------------------------------------------------ HAT through the registry
def test_hat_registry_entry_and_cli_choice():
    fam = registry.family("hat")
    assert fam.loss_fn() is seqloss.hat_loss and fam.input_name == "logits"
    assert fam.diagnose_fn().func is diagnose_transducer
    mod = fam.bench_module()
    assert {"seqloss hat", "seqloss rnnt_loss"} <= set(mod.implementations())
    assert "hat" in KINDS and "hat" in bench.LOSSES
    p = cli.build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    loss = next(a for a in sub.choices["bench"]._actions if a.dest == "loss")
    assert "hat" in loss.choices


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
