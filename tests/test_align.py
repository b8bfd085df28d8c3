"""Forced alignment (ctc_align, rnnt_align): every backend against brute force and the contract."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import backend_params, device_for, other_backend

import seqloss
from seqloss import InputError

INF = float("inf")


@pytest.fixture(params=backend_params("align"))
def backend(request) -> str:
    return request.param


# ------------------------------------------------------------------ brute-force oracles
def _ctc_states(path: tuple[int, ...], target: tuple[int, ...], blank: int) -> list[int] | None:
    """The extended-label states of a frame labelling, or None if it does not collapse to target."""
    states, j, prev = [], 0, None
    for c in path:
        if c == blank:
            states.append(2 * j)
        else:
            if c != prev:
                if j >= len(target) or target[j] != c:
                    return None
                j += 1
            states.append(2 * j - 1)
        prev = c
    return states if j == len(target) else None


def brute_ctc_align(lp: torch.Tensor, target, blank: int):
    """Best labelling by enumeration, ties broken as torchaudio's backtrack does.

    The backtrack ends on the last label rather than the final blank, and at each
    frame prefers the predecessor state with the larger index (stay, then s-1,
    then s-2); among the best paths that is the smallest key
    ``(s[T-1], -s[T-2], ..., -s[0])``. Scores are summed left to right, as the
    recursion does, so float64 sums are bit-identical.
    """
    T, C = lp.shape
    target = tuple(target)
    vals = lp.tolist()
    best = None
    for path in itertools.product(range(C), repeat=T):
        states = _ctc_states(path, target, blank)
        if states is None:
            continue
        score = vals[0][path[0]]
        for t in range(1, T):
            score = score + vals[t][path[t]]
        key = (states[-1],) + tuple(-s for s in reversed(states[:-1]))
        if best is None or score > best[0] or (score == best[0] and key < best[1]):
            best = (score, key, path)
    return best  # None: no path


def brute_rnnt_align(blank_lp: torch.Tensor, emit_lp: torch.Tensor, T: int, U: int):
    """Best lattice path by enumeration; ties prefer the blank arc, walking back from the end."""
    bl, em = blank_lp.tolist(), emit_lp.tolist()
    best = None
    for emits in itertools.combinations(range(T - 1 + U), U):
        arcs = [1 if i in emits else 0 for i in range(T - 1 + U)]
        t = u = 0
        score = 0.0
        frames = []
        for a in arcs:
            if a:
                score = score + em[t][u]
                frames.append(t)
                u += 1
            else:
                score = score + bl[t][u]
                t += 1
        score = score + bl[T - 1][U]
        key = tuple(reversed(arcs))
        if best is None or score > best[0] or (score == best[0] and key < best[1]):
            best = (score, key, frames)
    return best


def _rnnt_lattice(lp: torch.Tensor, target):
    """``lp (T, U+1, V)`` -> blank ``(T, U+1)`` and emission ``(T, U)`` log-probs (blank = V-1)."""
    V = lp.shape[-1]
    bl = lp[..., V - 1]
    em = (torch.stack([lp[:, u, target[u]] for u in range(len(target))], dim=1) if len(target)
          else lp[:, :0, 0])
    return bl, em


# ------------------------------------------------------------------ CTC: brute force
CTC_TINY = [
    # (T, C, target, blank)
    (1, 3, [], 0),
    (3, 3, [], 1),
    (1, 3, [2], 0),
    (3, 3, [1, 1], 0),
    (4, 3, [1, 2], 0),
    (5, 3, [1, 1, 2], 0),
    (4, 4, [0, 1], 3),
    (5, 3, [2, 0], 1),
    (6, 3, [1, 2, 1], 0),
]


def _ctc_case_input(T, C, kind, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(T, C, generator=g, dtype=torch.float64).log_softmax(-1)
    if kind == "zeros":  # every path ties: the tie-breaking alone decides
        return torch.zeros(T, C, dtype=torch.float64)
    return torch.randint(-2, 1, (T, C), generator=g).to(torch.float64)  # many exact ties


@pytest.mark.parametrize("kind", ["random", "zeros", "ints"])
def test_ctc_brute_force(backend, kind):
    """All tiny cases in one batch per C: labels equal exactly, scores bit for bit."""
    device = device_for(backend)
    for C in sorted({c[1] for c in CTC_TINY}):
        for blank in sorted({c[3] for c in CTC_TINY if c[1] == C}):
            cases = [c for c in CTC_TINY if c[1] == C and c[3] == blank]
            T = max(c[0] for c in cases)
            S = max(len(c[2]) for c in cases)
            lp = torch.full((T, len(cases), C), float("nan"), dtype=torch.float64)
            tg = torch.full((len(cases), max(S, 1)), -1, dtype=torch.long)
            for b, (Tb, _, target, _) in enumerate(cases):
                lp[:Tb, b] = _ctc_case_input(Tb, C, kind, seed=b + 10 * Tb)
                tg[b, : len(target)] = torch.tensor(target, dtype=torch.long)
            il = [c[0] for c in cases]
            tl = [len(c[2]) for c in cases]
            # float64 for random values (exact sums); integer values are exact in float32 too.
            dtype = torch.float64 if kind == "random" else torch.float32
            labels, scores = seqloss.ctc_align(lp.to(device, dtype), tg.to(device), il, tl, blank,
                                               backend=backend)
            assert labels.dtype == torch.int64 and scores.dtype == dtype
            for b, (Tb, _, target, _) in enumerate(cases):
                best = brute_ctc_align(lp[:Tb, b], target, blank)
                assert best is not None
                want = torch.tensor(best[2])
                assert torch.equal(labels[b, :Tb].cpu(), want), (b, labels[b], want)
                got_scores = scores[b, :Tb].cpu().double()
                assert torch.equal(got_scores, lp[torch.arange(Tb), b, want])
                assert torch.equal(labels[b, Tb:].cpu(), torch.full((T - Tb,), blank))
                assert torch.count_nonzero(scores[b, Tb:]) == 0


def test_ctc_tie_rules_by_hand(backend):
    """Small hand-made ties, each pinning one rule of torchaudio's backtrack."""
    device = device_for(backend)
    # All-zero scores, target [1, 2]: every path ties. The end prefers the label (state 3)
    # and each step prefers staying, so every label is entered as early as it can be.
    lp = torch.zeros(4, 1, 3)
    labels, _ = seqloss.ctc_align(lp.to(device), [[1, 2]], [4], [2], backend=backend)
    assert labels[0].tolist() == [1, 2, 2, 2]
    # s-1 beats s-2 on a tie: target [1, 2], frame 2 may come from state 1
    # (skip: labels 1 1 2) or state 2 (labels 1 0 2) with equal scores.
    lp = torch.tensor([[0.0, 0.0, -9.0], [0.0, 0.0, -9.0], [-9.0, -9.0, 0.0]])[:, None]
    labels, _ = seqloss.ctc_align(lp.to(device), [[1, 2]], [3], [2], backend=backend)
    assert labels[0].tolist() == [1, 0, 2]
    # The final blank wins only when strictly greater.
    lp = torch.zeros(3, 1, 3)
    lp[2, 0, 0] = 1.0
    labels, scores = seqloss.ctc_align(lp.to(device), [[1]], [3], [1], backend=backend)
    assert labels[0].tolist() == [1, 0, 0] and scores[0].sum().item() == 1.0




def test_ctc_optimal_where_torchaudio_is_not(backend):
    """torchaudio 2.9's forced_align returns [1, 1, 2, 2] (score -1) here; the best
    path, by enumeration, scores 0 and is [1, 1, 0, 2]."""
    device = device_for(backend)
    lp = torch.tensor([[-2.0, 0, 0], [-2, 0, -1], [0, 0, -1], [-1, -1, 0]], dtype=torch.float64)
    labels, scores = seqloss.ctc_align(lp[:, None].to(device), [[1, 2]], [4], [2], backend=backend)
    best = brute_ctc_align(lp, [1, 2], 0)
    assert best[0] == 0.0 and list(best[2]) == [1, 1, 0, 2]
    assert labels[0].tolist() == [1, 1, 0, 2]
    assert scores[0].sum().item() == 0.0
    # Not the path torchaudio returns: that one scores less.
    ta_path = [1, 1, 2, 2]
    assert sum(lp[t, c].item() for t, c in enumerate(ta_path)) == -1.0


# ------------------------------------------------------------------ CTC: against torchaudio
def test_ctc_matches_torchaudio(backend):
    ta = pytest.importorskip("torchaudio.functional")
    device = device_for(backend)
    g = torch.Generator().manual_seed(3)
    # (An empty target is left out: torchaudio reads out of bounds there.)
    for T, C, target in [(20, 6, [1, 2, 2, 3]), (15, 5, [4, 4, 4]), (9, 4, [1])]:
        lp = torch.randn(1, T, C, generator=g)
        lp[0, 3:6] = 0.0  # uniform frames: their ties are settled by the rules alone
        lp = lp.log_softmax(-1)
        tg = torch.tensor([target], dtype=torch.int32)
        want_labels, want_scores = ta.forced_align(lp, tg, torch.tensor([T]),
                                                   torch.tensor([len(target)]))
        labels, scores = seqloss.ctc_align(lp.transpose(0, 1).to(device), tg.to(device), [T],
                                           [len(target)], backend=backend)
        assert torch.equal(labels.cpu(), want_labels.long())
        assert torch.equal(scores.cpu(), want_scores)


# ------------------------------------------------------------------ CTC: consistency
def _ctc_batch(T, B, C, S, *, seed=0, blank=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(T, B, C, generator=g, dtype=torch.float64) * 2).log_softmax(-1).to(dtype)
    il = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    tl = torch.minimum(torch.randint(0, S + 1, (B,), generator=g), il // 2)
    labels = torch.tensor([c for c in range(C) if c != blank])
    tg = labels[torch.randint(0, len(labels), (B, S), generator=g)]
    return lp, tg, il, tl


def _collapse(labels, blank):
    out, prev = [], None
    for c in labels:
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def _ctc_viterbi_score(lp, target, blank):
    """Best path score by a plain max recursion (float64), no tie-breaking involved."""
    ext = [blank]
    for c in target:
        ext += [c, blank]
    K = len(ext)
    d = [-INF] * K
    d[0] = lp[0, blank].item()
    if K > 1:
        d[1] = lp[0, ext[1]].item()
    for t in range(1, lp.shape[0]):
        nd = [-INF] * K
        for s in range(K):
            m = max(d[s], d[s - 1] if s else -INF,
                    d[s - 2] if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2] else -INF)
            nd[s] = m + lp[t, ext[s]].item()
        d = nd
    return max(d[-1], d[-2]) if K > 1 else d[0]


@pytest.mark.parametrize("concat", [False, True], ids=["padded", "concat"])
def test_ctc_consistency(backend, concat):
    """Labels collapse to the target, scores sum to the Viterbi score, batch == per sequence."""
    device = device_for(backend)
    T, B, C, S = (16, 4, 5, 5) if backend == "triton" else (30, 6, 7, 8)
    blank = C - 1
    lp, tg, il, tl = _ctc_batch(T, B, C, S, seed=1, blank=blank, dtype=torch.float64)
    tg[0, :3] = tg[0, 0]  # repeats
    targets = torch.cat([tg[b, : tl[b]] for b in range(B)]) if concat else tg
    labels, scores = seqloss.ctc_align(lp.to(device), targets.to(device), il.int(), tl.tolist(),
                                       blank, backend=backend)
    assert labels.shape == scores.shape == (B, T)
    for b in range(B):
        Tb, target = int(il[b]), tg[b, : tl[b]].tolist()
        assert _collapse(labels[b, :Tb].tolist(), blank) == target
        viterbi = _ctc_viterbi_score(lp[:Tb, b], target, blank)
        assert abs(scores[b].sum().item() - viterbi) <= 1e-9 * max(1.0, abs(viterbi))
        one_l, one_s = seqloss.ctc_align(lp[:Tb, b : b + 1].to(device),
                                         tg[b : b + 1, : tl[b]].to(device),
                                         [Tb], [int(tl[b])], blank, backend=backend)
        assert torch.equal(one_l[0], labels[b, :Tb]) and torch.equal(one_s[0], scores[b, :Tb])


@pytest.mark.reference_oracle
def test_ctc_backends_agree_bitwise(backend):
    lp, tg, il, tl = _ctc_batch(24, 5, 6, 6, seed=2)
    lp = (lp * 4).round() / 4  # quarter-integers: many exact ties, all sums exact
    want = seqloss.ctc_align(lp, tg, il, tl, backend="reference")
    device = device_for(backend)
    got = seqloss.ctc_align(lp.to(device), tg.to(device), il, tl, backend=backend)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_ctc_unbatched(backend):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(12, 1, 5, 4, seed=4)
    tl[0] = 3
    labels, scores = seqloss.ctc_align(lp[:, 0].to(device), tg[0, :3].to(device), int(il[0]), 3,
                                       backend=backend)
    bl, bs = seqloss.ctc_align(lp, tg, il, tl, backend=other_backend(backend))
    assert (labels.shape == (12,) and torch.equal(labels.cpu(), bl[0])
            and torch.equal(scores.cpu(), bs[0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64],
                         ids=["fp16", "bf16", "fp64"])
def test_ctc_dtypes_and_layout(backend, dtype):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(14, 3, 5, 4, seed=5, dtype=torch.float64)
    x = lp.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)  # (T, B, C), not contiguous
    assert not x.is_contiguous()
    labels, scores = seqloss.ctc_align(x.to(device).requires_grad_(), tg, il, tl, backend=backend)
    want_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert scores.dtype == want_dtype and not scores.requires_grad
    # Half inputs align exactly as their float32 values do.
    wl, ws = seqloss.ctc_align(x.to(want_dtype).contiguous(), tg, il, tl,
                               backend=other_backend(backend))
    assert torch.equal(labels.cpu(), wl) and torch.equal(scores.cpu(), ws)


def test_ctc_determinism(backend):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(20, 3, 6, 5, seed=6)
    a = seqloss.ctc_align(lp.to(device), tg, il, tl, backend=backend)
    b = seqloss.ctc_align(lp.to(device), tg, il, tl, backend=backend)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_ctc_nonfinite_and_padding(backend):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(12, 3, 5, 4, seed=7)
    il[:] = torch.tensor([12, 9, 7])
    clean = seqloss.ctc_align(lp, tg, il, tl, backend="reference")
    lp[3, 1, 4] = float("nan")  # read frame of sequence 1
    lp[8:, 2] = float("nan")  # padding frames of sequence 2: never read
    lp[9:, 1] = INF  # padding of sequence 1
    labels, scores = seqloss.ctc_align(lp.to(device), tg, il, tl, backend=backend)
    assert torch.isnan(scores[1, :9]).all() and (labels[1] == 0).all()
    assert torch.count_nonzero(scores[1, 9:]) == 0
    for b in (0, 2):
        assert (torch.equal(labels[b].cpu(), clean[0][b])
                and torch.equal(scores[b].cpu(), clean[1][b]))
    lp[3, 1, 4] = INF
    _, scores = seqloss.ctc_align(lp.to(device), tg, il, tl, backend=backend)
    assert torch.isnan(scores[1, :9]).all()


def test_ctc_zero_probability_and_zero_frames(backend):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(8, 3, 4, 2, seed=8)
    tg[:] = torch.tensor([1, 2])
    tl[:] = torch.tensor([2, 0, 2])
    il[:] = torch.tensor([8, 0, 6])
    lp[:, 0, 2] = -INF  # label 2 can never be emitted in sequence 0: every path has probability 0
    labels, scores = seqloss.ctc_align(lp.to(device), tg, il, tl, backend=backend)
    assert (labels[0] == 0).all() and (scores[0] == -INF).all()
    # zero frames, empty target
    assert (labels[1] == 0).all() and torch.count_nonzero(scores[1]) == 0
    assert _collapse(labels[2, :6].tolist(), 0) == [1, 2] and torch.isfinite(scores[2]).all()


def test_ctc_errors(backend):
    device = device_for(backend)
    lp, tg, il, tl = _ctc_batch(10, 3, 5, 6, seed=9)
    tg[1, :6] = torch.tensor([1, 1, 1, 2, 2, 3])
    tl[1], il[1] = 6, 8  # needs 6 + 3 repeats = 9 frames
    x = lp.to(device)
    with pytest.raises(InputError, match=r"input_lengths\[1\] = 8 .* at least 9 frames"):
        seqloss.ctc_align(x, tg, il, tl, backend=backend)
    # validate=False: no alignment exists, so blank labels and -inf scores on its frames.
    labels, scores = seqloss.ctc_align(x, tg, il, tl, backend=backend, validate=False)
    assert (labels[1] == 0).all() and (scores[1, :8] == -INF).all() and (scores[1, 8:] == 0).all()
    tl[1] = 2
    bad = tg.clone()
    bad[2, 0] = 7
    with pytest.raises(InputError, match=r"targets\[2, 0\] = 7"):
        seqloss.ctc_align(x, bad, il, tl.clamp(min=1), backend=backend)
    with pytest.raises(InputError, match=r"input_lengths\[0\] = 11"):
        seqloss.ctc_align(x, tg, [11, 8, 5], tl, backend=backend)
    with pytest.raises(InputError, match="target_lengths must have shape"):
        seqloss.ctc_align(x, tg, il, tl[:2], backend=backend)
    with pytest.raises(TypeError):
        seqloss.ctc_align(x, tg.float(), il, tl, backend=backend)
    with pytest.raises(InputError, match="blank"):
        seqloss.ctc_align(x, tg, il, tl, blank=5, backend=backend)


# ------------------------------------------------------------------ RNN-T: brute force
RNNT_TINY = [(1, 0), (3, 0), (1, 2), (2, 1), (3, 2), (4, 3), (2, 3), (5, 2)]  # (T_b, U_b)


def _rnnt_tiny_batch(kind, V=3, seed=0):
    """The tiny cases in one batch, NaN wherever a sequence must not read."""
    B = len(RNNT_TINY)
    T = max(c[0] for c in RNNT_TINY)
    U = max(c[1] for c in RNNT_TINY)
    g = torch.Generator().manual_seed(seed)
    x = torch.full((B, T, U + 1, V), float("nan"), dtype=torch.float64)
    tg = torch.full((B, U), -1, dtype=torch.long)
    for b, (Tb, Ub) in enumerate(RNNT_TINY):
        if kind == "random":
            v = torch.randn(Tb, Ub + 1, V, generator=g, dtype=torch.float64)
        elif kind == "zeros":
            v = torch.zeros(Tb, Ub + 1, V, dtype=torch.float64)
        else:
            v = torch.randint(-2, 1, (Tb, Ub + 1, V), generator=g).to(torch.float64)
        x[b, :Tb, : Ub + 1] = v
        tg[b, :Ub] = torch.randint(0, V - 1, (Ub,), generator=g)
    return x, tg, [c[0] for c in RNNT_TINY], [c[1] for c in RNNT_TINY]


@pytest.mark.parametrize("kind", ["random", "zeros", "ints"])
def test_rnnt_brute_force(backend, kind):
    """Log-probs given directly (fused_log_softmax=False): frames equal, scores bit for bit."""
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_tiny_batch(kind)
    if kind == "random":
        x = x.log_softmax(-1)
    dtype = torch.float64 if kind == "random" else torch.float32
    frames, scores = seqloss.rnnt_align(x.to(device, dtype), tg.to(device), ll, tl,
                                        fused_log_softmax=False, backend=backend)
    assert frames.shape == tg.shape and frames.dtype == torch.int64 and scores.dtype == dtype
    for b, (Tb, Ub) in enumerate(RNNT_TINY):
        bl, em = _rnnt_lattice(x[b, :Tb, : Ub + 1], tg[b, :Ub].tolist())
        score, _, want = brute_rnnt_align(bl, em, Tb, Ub)
        assert frames[b, :Ub].tolist() == want, (b, frames[b], want)
        assert (frames[b, Ub:] == -1).all()
        assert scores[b].item() == score


def test_rnnt_brute_force_fused(backend):
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_tiny_batch("random", V=4, seed=1)
    frames, scores = seqloss.rnnt_align(x.to(device), tg.to(device), ll, tl, backend=backend)
    lp = x.log_softmax(-1)
    for b, (Tb, Ub) in enumerate(RNNT_TINY):
        bl, em = _rnnt_lattice(lp[b, :Tb, : Ub + 1], tg[b, :Ub].tolist())
        score, _, want = brute_rnnt_align(bl, em, Tb, Ub)
        assert frames[b, :Ub].tolist() == want
        assert abs(scores[b].item() - score) <= 1e-12 * max(1.0, abs(score))


def test_rnnt_tie_rule_by_hand(backend):
    """All arcs tie: blank wins every tie walking back, so tokens come as early as possible."""
    device = device_for(backend)
    x = torch.zeros(1, 4, 3, 3)
    frames, scores = seqloss.rnnt_align(x.to(device), [[0, 1]], [4], [2], fused_log_softmax=False,
                                        backend=backend)
    assert frames[0].tolist() == [0, 0] and scores.item() == 0.0
    x[0, 2, 1, 1] = 1.0  # emitting token 2 at frame 2 is now strictly better
    frames, scores = seqloss.rnnt_align(x.to(device), [[0, 1]], [4], [2], fused_log_softmax=False,
                                        backend=backend)
    assert frames[0].tolist() == [0, 2] and scores.item() == 1.0


# ------------------------------------------------------------------ RNN-T: consistency
def _rnnt_batch(B, T, U, V, *, seed=0, dtype=torch.float32, pad_t=0, pad_u=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T + pad_t, U + 1 + pad_u, V, generator=g,
                     dtype=torch.float64) * 2).to(dtype)
    ll = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
    tl = torch.randint(0, U + 1, (B,), generator=g)
    tg = torch.randint(0, V - 1, (B, U), generator=g)
    return x, tg, ll, tl


def _path_score(lp, target, frames, Tb):
    """Score of the lattice path that emits token u at frames[u] (lp: (T, U+1, V), blank V-1)."""
    V = lp.shape[-1]
    score, t = 0.0, 0
    for u, f in enumerate(frames):
        while t < f:
            score += lp[t, u, V - 1].item()
            t += 1
        score += lp[t, u, target[u]].item()
    u = len(frames)
    while t < Tb:
        score += lp[t, u, V - 1].item()
        t += 1
    return score


def test_rnnt_consistency(backend):
    """Frames are monotone and in the sequence, the score is the path's, batch == per sequence."""
    device = device_for(backend)
    B, T, U, V = (3, 6, 4, 5) if backend == "triton" else (5, 12, 6, 7)
    x, tg, ll, tl = _rnnt_batch(B, T, U, V, seed=2, dtype=torch.float64, pad_t=2, pad_u=1)
    tl[0] = 0
    frames, scores = seqloss.rnnt_align(x.to(device), tg.to(device), ll.int(), tl.tolist(),
                                        backend=backend)
    lp = x.log_softmax(-1)
    for b in range(B):
        Tb, Ub = int(ll[b]), int(tl[b])
        f = frames[b, :Ub].tolist()
        assert f == sorted(f) and all(0 <= v < Tb for v in f) and (frames[b, Ub:] == -1).all()
        want = _path_score(lp[b], tg[b].tolist(), f, Tb)
        assert abs(scores[b].item() - want) <= 1e-10 * max(1.0, abs(want))
        f1, s1 = seqloss.rnnt_align(x[b : b + 1, :Tb, : Ub + 1].to(device),
                                    tg[b : b + 1, :Ub].to(device),
                                    [Tb], [Ub], backend=backend)
        assert torch.equal(f1[0], frames[b, :Ub]) and torch.equal(s1[0], scores[b])


@pytest.mark.reference_oracle
def test_rnnt_backends_agree_bitwise(backend):
    x, tg, ll, tl = _rnnt_batch(4, 8, 5, 6, seed=3)
    x = (x * 2).round() / 2  # half-integers: exact sums, many ties
    want = seqloss.rnnt_align(x, tg, ll, tl, fused_log_softmax=False, backend="reference")
    device = device_for(backend)
    got = seqloss.rnnt_align(x.to(device), tg.to(device), ll, tl, fused_log_softmax=False,
                             backend=backend)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64],
                         ids=["fp16", "bf16", "fp64"])
def test_rnnt_dtypes_and_layout(backend, dtype):
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_batch(3, 6, 3, 5, seed=4, dtype=torch.float64)
    xt = x.to(dtype).transpose(1, 2).contiguous().transpose(1, 2)  # (B, T, U+1, V), not contiguous
    assert not xt.is_contiguous()
    frames, scores = seqloss.rnnt_align(xt.to(device).requires_grad_(), tg, ll, tl, backend=backend)
    want_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert scores.dtype == want_dtype and not scores.requires_grad
    wf, ws = seqloss.rnnt_align(xt.to(want_dtype).contiguous().to(device), tg, ll, tl,
                                backend=backend)
    assert torch.equal(frames, wf) and torch.equal(scores, ws)
    # Against another backend: Numba's fused log-softmax (the losses' row prologue) may
    # differ from the reference's in the last bits.
    rf, rs = seqloss.rnnt_align(xt.to(want_dtype).contiguous(), tg, ll, tl,
                                backend=other_backend(backend))
    assert torch.equal(frames.cpu(), rf)
    torch.testing.assert_close(scores.cpu(), rs, rtol=1e-6 if dtype != torch.float64 else 1e-14,
                               atol=0)


def test_rnnt_blank_index(backend):
    """blank=0 on classes rotated by one gives the same alignment as blank=-1."""
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_batch(3, 6, 3, 5, seed=5, dtype=torch.float64)
    a = seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend)
    b = seqloss.rnnt_align(x.roll(1, dims=-1).to(device), tg + 1, ll, tl, blank=0, backend=backend)
    assert torch.equal(a[0], b[0])
    # the log-softmax sums in another order
    assert ((a[1] - b[1]).abs() <= 1e-12 * a[1].abs()).all()


def test_rnnt_nonfinite_and_padding(backend):
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_batch(3, 6, 3, 5, seed=6, pad_t=1, pad_u=1)
    ll[:] = torch.tensor([6, 4, 5])
    tl[:] = torch.tensor([3, 2, 1])
    clean = seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend)
    clean = clean[0].cpu(), clean[1].cpu()
    x[1, 2, 1, 0] = float("nan")  # read by sequence 1 (any class counts)
    x[2, 5:] = float("nan")  # frames past sequence 2's length
    x[2, :, 2:] = INF  # rows past its target length
    tg[2, 1:] = -7  # target padding: never read, never validated
    frames, scores = seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend)
    assert torch.isnan(scores[1]) and (frames[1] == -1).all()
    for b in (0, 2):
        assert (torch.equal(frames[b].cpu(), clean[0][b])
                and torch.equal(scores[b].cpu(), clean[1][b]))
    x[1, 2, 1, 0] = 0.0
    x[1, 3, 0, 4] = INF
    _, scores = seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend)
    assert torch.isnan(scores[1])
    # A log-prob of -inf masks a class; a path avoiding it stays finite.
    x[1, 3, 0, 4] = -INF
    frames, scores = seqloss.rnnt_align(x.to(device), tg, ll, tl, fused_log_softmax=False,
                                        backend=backend)
    assert torch.isfinite(scores).all()


def test_rnnt_zero_probability_empty_target_and_errors(backend):
    device = device_for(backend)
    x, tg, ll, tl = _rnnt_batch(3, 5, 2, 4, seed=7)
    ll[:] = torch.tensor([5, 3, 4])
    tl[:] = torch.tensor([2, 0, 2])
    x[0, :, :, 3] = -INF  # blank is never possible for sequence 0
    frames, scores = seqloss.rnnt_align(x.to(device), tg, ll, tl, fused_log_softmax=False,
                                        backend=backend)
    assert scores[0].item() == -INF and (frames[0] == -1).all()
    assert (frames[1] == -1).all()
    assert abs(scores[1].item() - x[1, :3, 0, 3].double().sum().item()) <= 1e-6
    ll[2] = 0
    with pytest.raises(InputError, match=r"logit_lengths\[2\] = 0"):
        seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend)
    frames, scores = seqloss.rnnt_align(x.to(device), tg, ll, tl, backend=backend, validate=False)
    assert scores[2].item() == -INF and (frames[2] == -1).all()
    ll[2] = 4
    with pytest.raises(InputError, match=r"targets\[0, 1\] = 3 equals blank"):
        seqloss.rnnt_align(x.to(device), torch.tensor([[0, 3], [1, 1], [2, 2]]), ll, tl,
                           backend=backend)
    with pytest.raises(InputError, match=r"target_lengths\[1\] = 3"):
        seqloss.rnnt_align(x.to(device), tg, ll, [2, 3, 1], backend=backend)
    with pytest.raises(InputError, match=r"logit_lengths\[0\] = 6"):
        seqloss.rnnt_align(x.to(device), tg, [6, 3, 4], tl, backend=backend)
    with pytest.raises(InputError, match="logits must be"):
        seqloss.rnnt_align(x[0].to(device), tg, ll, tl, backend=backend)
    with pytest.raises(InputError, match="blank"):
        seqloss.rnnt_align(x.to(device), tg, ll, tl, blank=4, backend=backend)


# ------------------------------------------------------------------ CTC: torchaudio's call shapes
# torchaudio's forced_align(log_probs (1, T, C), targets (1, L)) takes batch-first log-probs
# and optional lengths: batch_first, omitted lengths, layout messages.
def _check_viterbi(labels, scores, lp_tbc, tg, il, tl, blank):
    """Each sequence's labels collapse to its target and its scores sum to the Viterbi score."""
    for b in range(lp_tbc.shape[1]):
        Tb, target = int(il[b]), tg[b, : int(tl[b])].tolist()
        assert _collapse(labels[b, :Tb].tolist(), blank) == target
        viterbi = _ctc_viterbi_score(lp_tbc[:Tb, b], target, blank)
        assert abs(scores[b].sum().item() - viterbi) <= 1e-9 * max(1.0, abs(viterbi))


def test_torchaudio_call_shapes_against_brute_force(backend):
    """``ctc_align(lp (1, T, C), targets (1, L), batch_first=True)``, lengths omitted or
    given as torchaudio takes them: the brute-force best path, labels in the targets' dtype."""
    device = device_for(backend)
    for i, (T, C, target, blank) in enumerate(CTC_TINY):
        for kind in ("random", "ints"):
            lp = _ctc_case_input(T, C, kind, seed=i)
            best = brute_ctc_align(lp, target, blank)
            want = torch.tensor(best[2], dtype=torch.int32)
            x = lp[None].to(device)  # (1, T, C)
            tg = torch.tensor([target], dtype=torch.int32).reshape(1, len(target)).to(device)
            for lengths in ((), (torch.tensor([T]), torch.tensor([len(target)]))):
                labels, scores = seqloss.ctc_align(x, tg, *lengths, blank=blank,
                                                   batch_first=True, backend=backend)
                assert labels.shape == scores.shape == (1, T) and labels.dtype == torch.int32
                assert torch.equal(labels[0].cpu(), want), (i, kind, labels, want)
                assert torch.equal(scores[0].cpu(), lp[torch.arange(T), want.long()])


@pytest.mark.parametrize("concat", [False, True], ids=["padded", "concat"])
def test_batch_first_equals_time_first_transposed(backend, concat):
    device = device_for(backend)
    T, B, C, S = (16, 4, 5, 5) if backend == "triton" else (30, 6, 7, 8)
    lp, tg, il, tl = _ctc_batch(T, B, C, S, seed=11, blank=2, dtype=torch.float64)
    targets = torch.cat([tg[b, : tl[b]] for b in range(B)]) if concat else tg
    bf = lp.transpose(0, 1).contiguous().to(device)  # (B, T, C), as a batch-first model gives
    labels, scores = seqloss.ctc_align(bf, targets.to(device), il, tl, 2, batch_first=True,
                                       backend=backend)
    assert labels.shape == scores.shape == (B, T)
    _check_viterbi(labels.cpu(), scores.cpu(), lp, tg, il, tl, 2)
    want = seqloss.ctc_align(lp.to(device), targets.to(device), il, tl, 2, backend=backend)
    assert torch.equal(labels, want[0]) and torch.equal(scores, want[1])


def test_omitted_lengths_are_the_full_extents(backend):
    device = device_for(backend)
    T, B, C, S = 12, 3, 5, 4
    lp, tg, _, _ = _ctc_batch(T, B, C, S, seed=12, dtype=torch.float64)
    il, tl = torch.full((B,), T), torch.full((B,), S)
    x, tgd = lp.to(device), tg.to(device)
    full = seqloss.ctc_align(x, tgd, il, tl, backend=backend)
    _check_viterbi(full[0].cpu(), full[1].cpu(), lp, tg, il, tl, 0)
    for got in (seqloss.ctc_align(x, tgd, backend=backend),
                seqloss.ctc_align(x, tgd, il, backend=backend),
                seqloss.ctc_align(x, tgd, target_lengths=tl, backend=backend)):
        assert torch.equal(got[0], full[0]) and torch.equal(got[1], full[1])
    # Only one omitted: the other is used as given.
    short_tl = torch.tensor([4, 2, 0])
    got = seqloss.ctc_align(x, tgd, target_lengths=short_tl, backend=backend)
    _check_viterbi(got[0].cpu(), got[1].cpu(), lp, tg, il, short_tl, 0)
    # A batch of one with concatenated (1-D) targets: every id.
    one = seqloss.ctc_align(x[:, :1], tgd[0], backend=backend)
    assert torch.equal(one[0], full[0][:1]) and torch.equal(one[1], full[1][:1])
    # Unbatched (T, C), (S,): batch_first does not apply.
    for bf in (False, True):
        un = seqloss.ctc_align(x[:, 0], tgd[0], batch_first=bf, backend=backend)
        assert torch.equal(un[0], full[0][0]) and torch.equal(un[1], full[1][0])


def test_b_equal_t_follows_the_flag(backend):
    """``B == T``: both readings fit every shape, so nothing is guessed; each reading
    gives the brute-force alignment of its own sequences."""
    device = device_for(backend)
    n, C = 5, 3
    g = torch.Generator().manual_seed(13)
    x = torch.randn(n, n, C, generator=g, dtype=torch.float64).log_softmax(-1)
    tg = torch.tensor([[1, 2], [2, 2], [1, 1], [2, 1], [1, 2]])
    results = {}
    for bf in (False, True):
        labels, scores = seqloss.ctc_align(x.to(device), tg.to(device), batch_first=bf,
                                           backend=backend)
        for b in range(n):
            seq = x[b] if bf else x[:, b]
            want = torch.tensor(brute_ctc_align(seq, tg[b].tolist(), 0)[2])
            assert torch.equal(labels[b].cpu(), want), (bf, b)
            assert torch.equal(scores[b].cpu(), seq[torch.arange(n), want])
        results[bf] = labels.cpu()
    assert not torch.equal(results[False], results[True])  # the flag was not ignored


def test_layout_messages():
    T, C = 7, 5
    g = torch.Generator().manual_seed(14)
    bf = torch.randn(1, T, C, generator=g).log_softmax(-1)  # torchaudio's (1, T, C)
    tg = torch.tensor([[1, 2, 2]], dtype=torch.int32)
    to_true = r"read as \(T, B, C\) \(batch_first=False\).*pass batch_first=True"
    with pytest.raises(InputError, match=r"^targets must have shape \(B=7, S\).*" + to_true):
        seqloss.ctc_align(bf, tg)
    with pytest.raises(InputError, match=r"^input_lengths must have shape \(7,\).*" + to_true):
        seqloss.ctc_align(bf, tg, torch.tensor([T]), torch.tensor([3]))
    # Time-first log-probs given with batch_first=True.
    tf, tgb, il, tl = _ctc_batch(9, 3, C, 3, seed=15)
    with pytest.raises(InputError, match=r"read as \(B, T, C\) \(batch_first=True\).*"
                                         r"pass batch_first=False"):
        seqloss.ctc_align(tf, tgb, il, tl, batch_first=True)
    # Arguments that fit neither reading: no layout hint.
    with pytest.raises(InputError, match="input_lengths must have shape") as e:
        seqloss.ctc_align(tf, tgb, [9, 9, 9, 9], tl)
    assert "batch_first" not in str(e.value)
    with pytest.raises(InputError, match=r"target_lengths is required .* B = 3"):
        seqloss.ctc_align(tf, torch.tensor([1, 2, 3]), il)
    with pytest.raises(TypeError, match="batch_first"):
        seqloss.ctc_align(tf, tgb, il, tl, batch_first="yes")


def test_matches_torchaudio_forced_align_without_lengths():
    ta = pytest.importorskip("torchaudio.functional")
    g = torch.Generator().manual_seed(16)
    for T, C, target in [(20, 6, [1, 2, 2, 3]), (9, 4, [1])]:
        lp = torch.randn(1, T, C, generator=g).log_softmax(-1)
        tg = torch.tensor([target], dtype=torch.int32)
        want = ta.forced_align(lp, tg)
        got = seqloss.ctc_align(lp, tg, batch_first=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ------------------------------------------------------------------ CTC: the labels' dtype
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ctc_labels_have_the_targets_dtype(backend, dtype):
    lp, tg, il, tl = _ctc_batch(7, 3, 5, 3, dtype=torch.float64)
    lp = lp.to(device_for(backend))
    labels, _ = seqloss.ctc_align(lp, tg.to(dtype), il, tl, backend=backend)
    assert labels.dtype == dtype
    labels, _ = seqloss.ctc_align(lp, tg.tolist(), il, tl, backend=backend)
    assert labels.dtype == torch.int64
