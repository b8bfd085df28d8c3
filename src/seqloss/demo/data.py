"""A tiny synthetic speech-like task and tiny models, shared by ``seqloss demo``,
``examples/ddp_ctc.py`` and the tests. Nothing is downloaded.

The task: a random label string (ids ``1..K``, ``0`` is the blank) is "spoken"
as a sequence of frames, each label held for 2-3 frames, with 0-2 silent
(blank) frames between labels (at least one between two equal labels, else
they would merge) and around the utterance. A frame is the one-hot vector of
what is being spoken plus Gaussian noise. The models must learn to segment the
frames and emit each label once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

NUM_LABELS = 6  # label ids 1..NUM_LABELS
BLANK = 0
NUM_CLASSES = NUM_LABELS + 1
FEATURES = NUM_CLASSES
HIDDEN = 48


@dataclass
class Batch:
    """``x (B, T, F)``, ``targets (B, S)`` padded with 0, lengths ``(B,)`` int64."""

    x: Tensor
    targets: Tensor
    input_lengths: Tensor
    target_lengths: Tensor

    def shard(self, rank: int, world: int) -> Batch:
        """Items ``rank, rank + world, ...`` (for data-parallel training)."""
        sl = slice(rank, None, world)
        return Batch(self.x[sl], self.targets[sl], self.input_lengths[sl], self.target_lengths[sl])

    def label_list(self, b: int) -> list[int]:
        return self.targets[b, : int(self.target_lengths[b])].tolist()


def make_batch(
    batch_size: int,
    generator: torch.Generator,
    *,
    min_labels: int = 2,
    max_labels: int = 6,
    noise: float = 0.4,
) -> Batch:
    """A batch of the synthetic task, deterministic given ``generator``'s state."""

    def randint(lo: int, hi: int) -> int:  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=generator))

    frames: list[list[int]] = []
    labels: list[list[int]] = []
    for _ in range(batch_size):
        n = randint(min_labels, max_labels)
        lab = [randint(1, NUM_LABELS) for _ in range(n)]
        seq = [BLANK] * randint(0, 2)
        for i, c in enumerate(lab):
            if i:
                gap = randint(1 if lab[i - 1] == c else 0, 2)
                seq += [BLANK] * gap
            seq += [c] * randint(2, 3)
        seq += [BLANK] * randint(0, 2)
        frames.append(seq)
        labels.append(lab)
    T = max(len(f) for f in frames)
    S = max(len(s) for s in labels)
    ids = torch.zeros(batch_size, T, dtype=torch.int64)
    targets = torch.zeros(batch_size, S, dtype=torch.int64)
    for b, (f, s) in enumerate(zip(frames, labels, strict=True)):
        ids[b, : len(f)] = torch.tensor(f)
        targets[b, : len(s)] = torch.tensor(s)
    x = nn.functional.one_hot(ids, FEATURES).float()
    x = x + noise * torch.randn(x.shape, generator=generator)
    input_lengths = torch.tensor([len(f) for f in frames])
    target_lengths = torch.tensor([len(s) for s in labels])
    return Batch(x, targets, input_lengths, target_lengths)


class Encoder(nn.Module):
    """Frame projection and a one-layer unidirectional GRU: ``(B, T, F) -> (B, T, H)``."""

    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.rnn(torch.tanh(self.proj(x)))[0]


class TinyCTC(nn.Module):
    """Encoder and a linear output layer; returns ``(T, B, C)`` log-probabilities."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.encoder = Encoder(hidden=hidden)
        self.out = nn.Linear(hidden, NUM_CLASSES)

    def logits(self, x: Tensor) -> Tensor:
        return self.out(self.encoder(x)).transpose(0, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.logits(x).log_softmax(-1)


class TinyRNNT(nn.Module):
    """Encoder, a GRU prediction network fed the blank as start symbol, an additive joint.

    ``forward(x, targets) -> logits (B, T, U+1, C)`` for ``seqloss.rnnt_loss`` with
    ``blank=BLANK``.
    """

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.encoder = Encoder(hidden=hidden)
        self.embed = nn.Embedding(NUM_CLASSES, hidden)
        self.predictor = nn.GRU(hidden, hidden, batch_first=True)
        self.enc_proj = nn.Linear(hidden, hidden)
        self.pred_proj = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, NUM_CLASSES)

    def predict(self, y: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, state = self.predictor(self.embed(y), state)
        return self.pred_proj(out), state

    def joint(self, enc: Tensor, pred: Tensor) -> Tensor:
        return self.out(torch.tanh(enc + pred))

    def forward(self, x: Tensor, targets: Tensor) -> Tensor:
        enc = self.enc_proj(self.encoder(x))  # (B, T, H)
        start = torch.full((targets.shape[0], 1), BLANK, dtype=torch.int64, device=targets.device)
        pred, _ = self.predict(torch.cat([start, targets.long()], dim=1))  # (B, U+1, H)
        return self.joint(enc[:, :, None], pred[:, None])


def ctc_greedy(log_probs: Tensor, lengths: Tensor) -> list[list[int]]:
    """Best-path decoding of ``(T, B, C)``: argmax, merge repeats, drop blanks."""
    best = log_probs.argmax(-1).T.tolist()
    out = []
    for b, row in enumerate(best):
        seq, prev = [], BLANK
        for c in row[: int(lengths[b])]:
            if c != prev and c != BLANK:
                seq.append(c)
            prev = c
        out.append(seq)
    return out


TDT_DURATIONS = (0, 1, 2, 3, 4)


class TinyTDT(TinyRNNT):
    """:class:`TinyRNNT` whose joint also predicts a duration: ``forward(x, targets) ->
    logits (B, T, U+1, C + D)``, the ``C`` token logits then ``D = len(durations)``
    duration logits, for ``seqloss.tdt_loss`` with ``blank=BLANK``."""

    def __init__(self, hidden: int = HIDDEN, durations: tuple[int, ...] = TDT_DURATIONS) -> None:
        super().__init__(hidden=hidden)
        self.durations = tuple(durations)
        self.out = nn.Linear(hidden, NUM_CLASSES + len(self.durations))


@torch.no_grad()
def rnnt_greedy_steps(model: TinyRNNT, x: Tensor, lengths: Tensor,
                      max_symbols: int = 3) -> tuple[list[list[int]], list[int]]:
    """Frame-synchronous greedy decoding, at most ``max_symbols`` emissions per frame.

    Returns the hypotheses and, per utterance, the decoding steps: the joint
    evaluations (one per emission, plus the blank that ends each frame).
    """
    enc = model.enc_proj(model.encoder(x))
    out, steps = [], []
    for b in range(x.shape[0]):
        y = torch.full((1, 1), BLANK, dtype=torch.int64)
        pred, state = model.predict(y)
        seq: list[int] = []
        n = 0
        for t in range(int(lengths[b])):
            for _ in range(max_symbols):
                k = int(model.joint(enc[b, t], pred[0, 0]).argmax())
                n += 1
                if k == BLANK:
                    break
                seq.append(k)
                pred, state = model.predict(torch.tensor([[k]]), state)
        out.append(seq)
        steps.append(n)
    return out, steps


def rnnt_greedy(model: TinyRNNT, x: Tensor, lengths: Tensor,
                max_symbols: int = 3) -> list[list[int]]:
    """Frame-synchronous greedy decoding, at most ``max_symbols`` emissions per frame."""
    return rnnt_greedy_steps(model, x, lengths, max_symbols)[0]


@torch.no_grad()
def tdt_greedy(model: TinyRNNT, x: Tensor, lengths: Tensor, durations: tuple[int, ...],
               max_symbols: int = 3) -> tuple[list[list[int]], list[int]]:
    """Greedy TDT decoding (Xu et al., 2023), as NeMo's greedy TDT decoder.

    At each step the joint's argmax token and argmax duration: a token is emitted
    (and fed to the predictor), then the decoder jumps that many frames; a blank
    jumps at least one frame (a blank of duration 0 would loop). After
    ``max_symbols`` emissions without leaving a frame it moves on by one. The joint's
    last ``len(durations)`` outputs are the duration logits.

    Returns the hypotheses and, per utterance, the decoding steps (joint evaluations).
    """
    enc = model.enc_proj(model.encoder(x))
    D = len(durations)
    out, steps = [], []
    for b in range(x.shape[0]):
        y = torch.full((1, 1), BLANK, dtype=torch.int64)
        pred, state = model.predict(y)
        seq: list[int] = []
        n = t = here = 0
        Tb = int(lengths[b])
        while t < Tb:
            z = model.joint(enc[b, t], pred[0, 0])
            n += 1
            k = int(z[:-D].argmax())
            d = int(durations[int(z[-D:].argmax())])
            if k == BLANK:
                d = max(d, 1)
            else:
                seq.append(k)
                pred, state = model.predict(torch.tensor([[k]]), state)
                here += 1
                if d == 0 and here >= max_symbols:
                    d = 1
            if d > 0:
                here = 0
            t += d
        out.append(seq)
        steps.append(n)
    return out, steps


def edit_distance(a: list[int], b: list[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
