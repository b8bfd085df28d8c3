"""Transducer alignment (rnnt_align, multiblank_rnnt_align, tdt_align, the lattice's
max-plus semiring) on every backend against brute-force Viterbi by path enumeration."""

from __future__ import annotations

import pytest
import torch
from conftest import backend_params, device_for

import seqloss
from seqloss import InputError
from seqloss.transducer.lattice.api import lattice_viterbi

INF = float("inf")


@pytest.fixture(params=backend_params("align"))
def backend(request) -> str:
    return request.param


# ------------------------------------------------------------------ brute-force oracle
def enumerate_paths(moves, Tb: int, Ub: int,
                    emit_can_end: bool = False) -> list[tuple[float, list, list, list]]:
    """Every path from (0, 0) to (Tb, Ub): ``(score, states, frames, durations)``.

    ``moves(t, u)`` lists the arcs out of ``(t, u)`` as ``(dt, du, score)``; an arc
    leaves a frame ``t < Tb``, a blank-like one (``du = 0``) lands at ``t + dt <= Tb``,
    an emission at ``t + dt < Tb`` (``<= Tb`` with ``emit_can_end``). Scores add left
    to right from 0.0, as a path is walked.
    """
    out = []

    def walk(t, u, score, states, frames, durs):
        if (t, u) == (Tb, Ub):
            out.append((score, states, frames, durs))
            return
        if t >= Tb:
            return
        for dt, du, s in moves(t, u):
            if du == 0 and t + dt <= Tb:
                walk(t + dt, u, score + s, [*states, (t + dt, u)], frames, durs)
            elif du == 1 and u < Ub and t + dt < Tb + emit_can_end:
                walk(t + dt, u + 1, score + s, [*states, (t + dt, u + 1)], [*frames, t],
                     [*durs, dt])

    walk(0, 0, 0.0, [(0, 0)], [], [])
    return out


def brute_viterbi(moves, Tb: int, Ub: int, emit_can_end: bool = False):
    """The best path, ties broken as documented: read backwards from the end, the path
    whose states come earliest in t (then latest in u) where best paths part.
    Returns ``(best score, frames, durations, max over all paths but NaN ones)`` or None
    (no path of nonzero probability)."""
    best = None
    paths = enumerate_paths(moves, Tb, Ub, emit_can_end)
    for score, states, frames, durs in paths:
        if not score > -INF:
            continue
        key = tuple((t, -u) for t, u in reversed(states[:-1]))
        if best is None or score > best[0] or (score == best[0] and key < best[1]):
            best = (score, key, frames, durs)
    if best is None:
        return None
    return best[0], best[2], best[3], max(p[0] for p in paths if p[0] == p[0])


def rnnt_moves(lp, target, blank):
    """``lp (T, U+1, V)`` log-probabilities as nested lists."""
    return lambda t, u: [(1, 0, lp[t][u][blank])] + (
        [(0, 1, lp[t][u][target[u]])] if u < len(target) else [])


def multiblank_moves(lp, target, blank, big):
    def moves(t, u):
        out = [(1, 0, lp[t][u][blank])]
        out += [(d, 0, lp[t][u][blank - 1 - i]) for i, d in enumerate(big)]
        if u < len(target):
            out.append((0, 1, lp[t][u][target[u]]))
        return out
    return moves


def tdt_moves(lp, lpd, target, blank, durations):
    def moves(t, u):
        out = [(d, 0, lp[t][u][blank] + lpd[t][u][k]) for k, d in enumerate(durations) if d > 0]
        if u < len(target):
            out += [(d, 1, lp[t][u][target[u]] + lpd[t][u][k]) for k, d in enumerate(durations)]
        return out
    return moves


# ------------------------------------------------------------------ tiny batches
# (T_b, U_b): zero-length targets, one frame, more tokens than frames.
TINY = [(1, 0), (3, 0), (1, 2), (2, 1), (3, 2), (4, 3), (2, 3), (5, 2), (4, 1)]


def _values(kind: str, shape, g):
    if kind == "random":
        return torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if kind == "zeros":  # every path ties: the tie-break alone decides
        return torch.zeros(shape, dtype=torch.float64)
    v = torch.randint(-2, 1, shape, generator=g).to(torch.float64)  # many exact ties
    if kind == "masked":  # -inf masks some classes (paths through them are impossible)
        v[torch.rand(shape, generator=g) < 0.2] = -INF
    return v


def tiny_batch(kind: str, W: int, labels: int, seed: int):
    """Logits ``(B, T, U+1, W)``: NaN wherever a sequence must not read; target padding -7."""
    g = torch.Generator().manual_seed(seed)
    B, T, U = len(TINY), max(c[0] for c in TINY), max(c[1] for c in TINY)
    x = torch.full((B, T + 1, U + 2, W), float("nan"), dtype=torch.float64)
    tg = torch.full((B, U), -7, dtype=torch.long)
    for b, (Tb, Ub) in enumerate(TINY):
        x[b, :Tb, : Ub + 1] = _values(kind, (Tb, Ub + 1, W), g)
        tg[b, :Ub] = torch.randint(0, labels, (Ub,), generator=g)
    return x, tg, [c[0] for c in TINY], [c[1] for c in TINY]


def _fused(kind: str) -> bool:
    # Random logits go through the log-softmax; the integer kinds are log-probabilities
    # given as they are (fused_log_softmax=False), so every sum is exact.
    return kind == "random"


def _lp(x: torch.Tensor, fused: bool, D: int = 0) -> list:
    """The oracle's log-probabilities (torch's own log_softmax, float64), per block."""
    if not fused:
        return x
    if not D:
        return x.log_softmax(-1)
    return torch.cat([x[..., :-D].log_softmax(-1), x[..., -D:].log_softmax(-1)], -1)


def _check(got_frames, got_scores, b, Ub, want, exact, got_durs=None):
    if want is None:
        assert got_scores[b].item() == -INF and (got_frames[b] == -1).all()
        if got_durs is not None:
            assert (got_durs[b] == -1).all()
        return
    score, frames, durs, best = want
    assert score == best  # the documented winner is a best path
    assert got_frames[b, :Ub].tolist() == frames, (b, got_frames[b], frames)
    assert (got_frames[b, Ub:] == -1).all()
    if got_durs is not None:
        assert got_durs[b, :Ub].tolist() == durs, (b, got_durs[b], durs)
        assert (got_durs[b, Ub:] == -1).all()
    if exact:
        assert got_scores[b].item() == score
    else:
        assert abs(got_scores[b].item() - score) <= 1e-12 * max(1.0, abs(score))


KINDS = ["random", "zeros", "ints", "masked"]


@pytest.mark.parametrize("kind", KINDS)
def test_rnnt_brute_force(backend, kind):
    device = device_for(backend)
    V, blank = 4, 3
    x, tg, ll, tl = tiny_batch(kind, V, 3, seed=1)
    fused = _fused(kind)
    frames, scores = seqloss.rnnt_align(x.to(device), tg.to(device), ll, tl, blank,
                                        fused_log_softmax=fused, backend=backend)
    assert frames.shape == tg.shape and frames.dtype == torch.int64
    assert scores.dtype == torch.float64
    lp = _lp(x, fused)
    for b, (Tb, Ub) in enumerate(TINY):
        want = brute_viterbi(rnnt_moves(lp[b].tolist(), tg[b, :Ub].tolist(), blank), Tb, Ub)
        _check(frames.cpu(), scores.cpu(), b, Ub, want, exact=not fused)


@pytest.mark.parametrize("kind", KINDS)
def test_multiblank_brute_force(backend, kind):
    device = device_for(backend)
    V, blank, big = 5, 4, [3, 2]  # big blanks: class 3 (3 frames), class 2 (2 frames)
    x, tg, ll, tl = tiny_batch(kind, V, 2, seed=2)
    fused = _fused(kind)
    frames, scores = seqloss.multiblank_rnnt_align(x.to(device), tg.to(device), ll, tl, big,
                                                   fused_log_softmax=fused, backend=backend)
    assert frames.shape == tg.shape and scores.dtype == torch.float64
    lp = _lp(x, fused)
    for b, (Tb, Ub) in enumerate(TINY):
        moves = multiblank_moves(lp[b].tolist(), tg[b, :Ub].tolist(), blank, big)
        _check(frames.cpu(), scores.cpu(), b, Ub, brute_viterbi(moves, Tb, Ub), not fused)


@pytest.mark.parametrize("pair", [False, True], ids=["joint", "pair"])
@pytest.mark.parametrize("kind", KINDS)
def test_tdt_brute_force(backend, kind, pair):
    device = device_for(backend)
    V, durations = 3, [0, 1, 2]  # blank = 2
    D = len(durations)
    x, tg, ll, tl = tiny_batch(kind, V + D, 2, seed=3)
    fused = _fused(kind)
    logits = (x[..., :V].to(device), x[..., V:].to(device)) if pair else x.to(device)
    frames, durs, scores = seqloss.tdt_align(logits, tg.to(device), ll, tl, durations,
                                             fused_log_softmax=fused, backend=backend)
    assert frames.shape == durs.shape == tg.shape and durs.dtype == torch.int64
    lp = _lp(x, fused, D)
    for b, (Tb, Ub) in enumerate(TINY):
        moves = tdt_moves(lp[b, ..., :V].tolist(), lp[b, ..., V:].tolist(), tg[b, :Ub].tolist(),
                          V - 1, durations)
        # TDT's arc is token + duration: the oracle adds them first as well, but a random
        # float64 sum may still round apart from the kernel's by an ulp.
        _check(frames.cpu(), scores.cpu(), b, Ub, brute_viterbi(moves, Tb, Ub), not fused,
               durs.cpu())


def test_tdt_pair_equals_joint(backend):
    device = device_for(backend)
    x, tg, ll, tl = tiny_batch("random", 6, 3, seed=4)  # V = 4, D = 2
    joint = seqloss.tdt_align(x.to(device), tg, ll, tl, [0, 1], backend=backend)
    pair = seqloss.tdt_align((x[..., :4].to(device), x[..., 4:].to(device)), tg, ll, tl, [0, 1],
                             backend=backend)
    for a, p in zip(joint, pair, strict=True):
        assert torch.equal(a, p)


# ------------------------------------------------------------------ the lattice, any durations
@pytest.mark.parametrize("seed", range(4))
def test_lattice_viterbi_brute_force(backend, seed):
    """The max-plus semiring itself: any blank and emission durations, emit_can_end;
    NaN arcs (a path through one is no best path: the oracle skips its NaN score)."""
    g = torch.Generator().manual_seed(seed)
    bd = [(1,), (1, 2), (3, 1, 2), (2, 1)][seed]
    ed = [(0,), (0, 1), (1, 0, 2), (0,)][seed]
    can = seed % 2 == 1
    Tl, Ul = [5, 3, 1, 4], [3, 2, 0, 1]
    B, T, U1 = len(Tl), 5, 4
    ab = torch.randint(-2, 1, (B, T, U1, len(bd)), generator=g).double()
    ae = torch.randint(-2, 1, (B, T, U1, len(ed)), generator=g).double()
    ab[torch.rand(ab.shape, generator=g) < 0.15] = -INF
    ab[torch.rand(ab.shape, generator=g) < 0.1] = float("nan")
    ae[torch.rand(ae.shape, generator=g) < 0.1] = float("nan")
    device = device_for(backend)
    score, frames, arcs = lattice_viterbi(ab.to(device), ae.to(device),
                                          torch.tensor(Tl, device=device),
                                          torch.tensor(Ul, device=device), bd, ed, can, backend)
    for b in range(B):
        Tb, Ub = Tl[b], Ul[b]

        def moves(t, u, b=b, Ub=Ub):
            out = [(d, 0, ab[b, t, u, i].item()) for i, d in enumerate(bd)]
            if u < Ub:
                out += [(e, 1, ae[b, t, u, j].item()) for j, e in enumerate(ed)]
            return out

        want = brute_viterbi(moves, Tb, Ub, can)
        if want is None:
            assert score[b].item() == -INF
            assert (frames[b] == -1).all() and (arcs[b] == -1).all()
            continue
        assert score[b].item() == want[0] == want[3]
        assert frames[b, :Ub].tolist() == want[1]
        assert [ed[j] for j in arcs[b, :Ub].tolist()] == want[2]
        assert (frames[b, Ub:] == -1).all() and (arcs[b, Ub:] == -1).all()


# ------------------------------------------------------------------ the tie rule, by hand
def test_multiblank_tie_big_blank_wins(backend):
    """T=2, U=1, every score 0, the standard blank out of (0, 1) masked. Two best paths
    reach (2, 1): the big blank (2 frames) out of (0, 1), token at frame 0, and the
    blank out of (1, 1), token at frame 1. The big blank leaves the earlier frame: it
    wins, so the token is at frame 0 (a shortest-first rule would give frame 1)."""
    device = device_for(backend)
    lp = torch.zeros(1, 2, 2, 3)  # classes: 0 label, 1 big blank, 2 blank
    lp[0, 0, 1, 2] = -INF
    frames, scores = seqloss.multiblank_rnnt_align(lp.to(device), [[0]], [2], [1], [2],
                                                   fused_log_softmax=False, backend=backend)
    assert frames.tolist() == [[0]] and scores.tolist() == [0.0]
    moves = multiblank_moves(lp[0].tolist(), [0], 2, [2])
    assert brute_viterbi(moves, 2, 1)[1] == [0]


def test_tdt_tie_longest_emission_wins(backend):
    """T=2, U=1, every score 0, the blank out of (0, 1) masked (both its durations).
    Into (1, 1) tie the label emitted at frame 0 with duration 1 and at frame 1 with
    duration 0: the earlier frame wins, so frame 0, duration 1."""
    device = device_for(backend)
    tok, dur = torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3)  # blank 2, durations 0 1 2
    tok[0, 0, 1, 2] = -INF
    frames, durs, scores = seqloss.tdt_align((tok.to(device), dur.to(device)), [[0]], [2], [1],
                                             [0, 1, 2], fused_log_softmax=False, backend=backend)
    assert frames.tolist() == [[0]] and durs.tolist() == [[1]] and scores.tolist() == [0.0]


def test_tdt_tie_blank_beats_emission_from_the_same_frame(backend):
    """As above, but only the 2-frame blank out of (0, 1) masked (its duration logit):
    into (1, 1) the 1-frame blank out of (0, 1) and the label with duration 1 out of
    (0, 0) leave the same frame and tie; the blank wins, so the label is emitted at
    frame 0 with duration 0."""
    device = device_for(backend)
    tok, dur = torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3)
    dur[0, 0, 1, 2] = -INF
    x = torch.cat([tok, dur], -1)
    frames, durs, scores = seqloss.tdt_align(x.to(device), [[1]], [2], [1], [0, 1, 2],
                                             fused_log_softmax=False, backend=backend)
    assert frames.tolist() == [[0]] and durs.tolist() == [[0]] and scores.tolist() == [0.0]


def test_uniform_logits_tie_with_the_fused_log_softmax(backend):
    """Equal logits: every row's normalizer is the same, so every path ties exactly
    through the log-softmax too, on every backend, and the rule alone decides."""
    device = device_for(backend)
    x = torch.zeros(1, 4, 3, 3)
    frames, scores = seqloss.rnnt_align(x.to(device), [[0, 1]], [4], [2], backend=backend)
    assert frames.tolist() == [[0, 0]]
    assert abs(scores.item() - 6 * -torch.log(torch.tensor(3.0)).item()) < 1e-5


# ------------------------------------------------------------------ special cases
def test_masked_classes_with_the_fused_log_softmax(backend):
    """-inf logits mask classes; a row of -inf logits is a state with no way out (the
    losses' guarded log-softmax), not NaN; the best path goes around both."""
    device = device_for(backend)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64)
    x[0, 1:3, 0, 0] = -INF  # label 0 at u = 0, frames 1-2
    x[0, 2, 1] = -INF  # the whole row (2, 1)
    x[1, :, :, 3] = -INF  # blank masked everywhere: no path at all
    tg = torch.tensor([[0, 1], [1, 2]])
    frames, scores = seqloss.rnnt_align(x.to(device), tg, [5, 4], [2, 2], backend=backend)
    lp = x.log_softmax(-1)
    lp[0, 2, 1] = -INF  # torch's log_softmax of a -inf row is NaN
    want = brute_viterbi(rnnt_moves(lp[0].tolist(), [0, 1], 3), 5, 2)
    assert frames[0].tolist() == want[1]
    assert abs(scores[0].item() - want[0]) <= 1e-12 * abs(want[0])
    assert scores[1].item() == -INF and frames[1].tolist() == [-1, -1]


def test_zero_frames_and_zero_probability(backend):
    """Infeasible: zero frames raise (validate=False: frames -1, score -inf); a sequence
    every path of which crosses a -inf gets frames -1, score -inf; durations -1 too."""
    device = device_for(backend)
    x = torch.randn(3, 3, 3, 6, generator=torch.Generator().manual_seed(6))
    tg = torch.tensor([[0, 1], [1, 0], [0, 0]])
    ll, tl = [3, 0, 2], [2, 1, 0]
    for fn, args in [(seqloss.rnnt_align, ()), (seqloss.multiblank_rnnt_align, ([2],)),
                     (seqloss.tdt_align, ([0, 1],))]:
        with pytest.raises(InputError, match=r"logit_lengths\[1\] = 0"):
            fn(x.to(device), tg, ll, tl, *args, backend=backend)
        out = fn(x.to(device), tg, ll, tl, *args, backend=backend, validate=False)
        frames, scores = out[0].cpu(), out[-1].cpu()
        assert scores[1].item() == -INF and (frames[1] == -1).all()
        assert torch.isfinite(scores[[0, 2]]).all()
        if fn is seqloss.tdt_align:
            assert (out[1][1] == -1).all()
    y = x.clone()
    y[0, :, 2, :4] = -INF  # the last row's blank-like classes: no way to the end
    frames, durs, scores = seqloss.tdt_align(y.to(device), tg, [3, 2, 2], tl, [0, 1],
                                             backend=backend)
    assert scores[0].item() == -INF and (frames[0] == -1).all() and (durs[0] == -1).all()
    assert torch.isfinite(scores[1:]).all()


@pytest.mark.parametrize("variant", ["rnnt", "multiblank", "tdt", "tdt_pair"])
def test_nonfinite_poisons_only_its_sequence_and_padding_is_never_read(backend, variant):
    device = device_for(backend)
    g = torch.Generator().manual_seed(7)
    W = 6
    x = torch.randn(3, 6, 4, W, generator=g)
    tg = torch.tensor([[0, 1, 1], [1, 0, -7], [0, -7, -7]])
    ll, tl = [6, 4, 5], [3, 2, 1]

    def run(x):
        x = x.to(device)
        if variant == "rnnt":
            return seqloss.rnnt_align(x, tg, ll, tl, backend=backend)
        if variant == "multiblank":
            return seqloss.multiblank_rnnt_align(x, tg, ll, tl, [2, 3], backend=backend)
        if variant == "tdt":
            return seqloss.tdt_align(x, tg, ll, tl, [0, 1, 2], backend=backend)
        return seqloss.tdt_align((x[..., :3], x[..., 3:]), tg, ll, tl, [0, 1, 2],
                                 backend=backend)

    clean = [t.cpu() for t in run(x)]
    x[1, 4:] = float("nan")  # frames past sequence 1's length
    x[1, :, 3:] = INF  # rows past its target length
    x[2, :, 2:] = float("nan")
    got = [t.cpu() for t in run(x)]
    for a, b in zip(got, clean, strict=True):
        assert torch.equal(a, b)  # padding never read
    x[1, 3, 2, W - 1] = float("nan")  # read by sequence 1 (the last class: a duration in TDT)
    x[2, 0, 1, 0] = INF
    got = [t.cpu() for t in run(x)]
    assert torch.isnan(got[-1][1:]).all()
    for t in got[:-1]:
        assert (t[1:] == -1).all()
    for a, b in zip(got, clean, strict=True):
        assert torch.equal(a[0], b[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32"])
def test_dtypes_and_layout(backend, dtype):
    """Half inputs align as their float32 values; any layout; float32 scores."""
    device = device_for(backend)
    x = torch.randn(2, 5, 3, 7, generator=torch.Generator().manual_seed(8)).to(dtype)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    tg, ll, tl = [[0, 1], [2, 0]], [5, 3], [2, 1]
    for fn, args in [(seqloss.multiblank_rnnt_align, ([2],)), (seqloss.tdt_align, ([0, 1],))]:
        got = fn(xt.to(device).requires_grad_(), tg, ll, tl, *args, backend=backend)
        want = fn(x.float().to(device), tg, ll, tl, *args, backend=backend)
        assert got[-1].dtype == torch.float32 and not got[-1].requires_grad
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_scores_accumulate_in_float64():
    """float32 log-probabilities, float64 accumulation, one rounding: the score is the
    float64 sum of the path's float32 arcs, rounded once."""
    T = 3000
    x = torch.full((1, T, 1, 2), -0.1)  # only blanks: one path
    x[..., 0] = -1.0
    frames, scores = seqloss.rnnt_align(x, [[]], [T], [0], fused_log_softmax=False,
                                        backend="numba" if _has("numba") else "reference")
    want = torch.tensor(-0.1, dtype=torch.float32).double().item() * T
    assert scores.item() == torch.tensor(want, dtype=torch.float32).item()


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_empty_batch_and_target_widths(backend):
    device = device_for(backend)
    f, d, s = seqloss.tdt_align(torch.randn(0, 3, 2, 6).to(device), [], [], [], [0, 1],
                                backend=backend)
    assert f.shape == d.shape == (0, 0) and s.shape == (0,)
    f, s = seqloss.multiblank_rnnt_align(torch.randn(0, 3, 2, 4).to(device), [], [], [], [2],
                                         backend=backend)
    assert f.shape == (0, 0) and s.shape == (0,)
    # Targets wider than the lattice (S > U) and narrower (S < U): frames are (B, S).
    x = torch.randn(1, 4, 4, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    f, d, s = seqloss.tdt_align(x.to(device), [[0, 1, 2, 0, 1]], [4], [2], [0, 1],
                                backend=backend)
    assert f.shape == (1, 5) and (f[0, 2:] == -1).all() and (d[0, 2:] == -1).all()
    f2, d2, s2 = seqloss.tdt_align(x.to(device), [[0, 1]], [4], [2], [0, 1], backend=backend)
    assert torch.equal(f[:, :2], f2) and torch.equal(d[:, :2], d2) and torch.equal(s, s2)


def test_argument_errors(backend):
    device = device_for(backend)
    x = torch.randn(2, 3, 3, 6).to(device)
    tg, ll, tl = [[0, 1], [1, 2]], [3, 3], [2, 2]
    with pytest.raises(InputError, match=r"targets\[1, 1\] = 2 equals the blank-like class 2"):
        seqloss.multiblank_rnnt_align(x[..., :4], tg, ll, tl, [2], backend=backend)
    with pytest.raises(InputError, match=r"big_blank_durations\[0\] = 1"):
        seqloss.multiblank_rnnt_align(x, tg, ll, tl, [1], backend=backend)
    with pytest.raises(InputError, match="do not fit below blank"):
        seqloss.multiblank_rnnt_align(x[..., :3], [[0, 0], [0, 0]], ll, tl, [2, 3, 4],
                                      backend=backend)
    with pytest.raises(InputError, match="must contain 0 and 1"):
        seqloss.tdt_align(x, tg, ll, tl, [1, 2], backend=backend)
    with pytest.raises(InputError, match=r"targets\[1, 1\] = 3 equals blank = 3"):
        seqloss.tdt_align(x, [[0, 1], [1, 3]], ll, tl, [0, 1], backend=backend)
    with pytest.raises(InputError, match=r"duration_logits.size\(-1\) = 3"):
        seqloss.tdt_align((x[..., :4], x[..., 3:]), tg, ll, tl, [0, 1], backend=backend)
    with pytest.raises(InputError, match=r"target_lengths\[0\] = 3"):
        seqloss.tdt_align(x, tg, ll, [3, 2], [0, 1], backend=backend)
    with pytest.raises(InputError, match=r"logit_lengths\[1\] = 4"):
        seqloss.multiblank_rnnt_align(x, tg, [3, 4], tl, [2], backend=backend)
    with pytest.raises(TypeError, match="fused_log_softmax"):
        seqloss.tdt_align(x, tg, ll, tl, [0, 1], fused_log_softmax="yes", backend=backend)
