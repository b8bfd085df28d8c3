"""ctc_align on torchaudio's call shapes: ``batch_first``, omitted lengths, layout messages.

torchaudio's ``forced_align(log_probs (1, T, C), targets (1, L))`` takes batch-first
log-probs and optional lengths. The oracles are test_align's: brute-force enumeration
of every labelling, and a plain float64 max recursion for the best score.
"""

from __future__ import annotations

import pytest
import torch
from conftest import backend_params, device_for
from test_align import (
    CTC_TINY,
    _collapse,
    _ctc_batch,
    _ctc_case_input,
    _ctc_viterbi_score,
    brute_ctc_align,
)

import seqloss
from seqloss import InputError


@pytest.fixture(params=backend_params("align"))
def backend(request) -> str:
    return request.param


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
