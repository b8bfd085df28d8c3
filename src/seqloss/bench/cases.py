"""The benchmark cases: one registry of (loss, size grid, dtype) and one input factory per loss."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SIZES = ("small", "paper")
LOSSES = ("ctc", "rnnt")


@dataclass(frozen=True)
class Case:
    """One benchmark shape.

    CTC: ``T, B, C`` and target length ``L`` (``U`` unused). RNN-T: ``B, T, U, V``
    (``C`` is ``V``). Every sequence has the full length (torchaudio requires
    ``T == max(logit_lengths)`` and ``U == max(target_lengths)``).
    """

    loss: str
    B: int
    T: int
    C: int
    U: int
    tags: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        if self.loss == "ctc":
            return f"ctc T={self.T} B={self.B} C={self.C} L={self.U}"
        return f"rnnt B={self.B} T={self.T} U={self.U} V={self.C}"


CASES: dict[tuple[str, str], list[Case]] = {
    ("ctc", "small"): [
        Case("ctc", B=4, T=50, C=20, U=10),
        Case("ctc", B=8, T=100, C=32, U=20),
    ],
    ("ctc", "paper"): [
        Case("ctc", B=16, T=500, C=32, U=100),
        Case("ctc", B=32, T=200, C=1000, U=50),
        Case("ctc", B=8, T=1500, C=64, U=300),
    ],
    ("rnnt", "small"): [
        Case("rnnt", B=2, T=20, C=16, U=5),
        Case("rnnt", B=4, T=40, C=32, U=10),
    ],
    ("rnnt", "paper"): [
        Case("rnnt", B=8, T=150, C=500, U=40),
        Case("rnnt", B=4, T=300, C=1024, U=60),
    ],
}


def cases(loss: str, sizes: str) -> list[Case]:
    """The registered cases of ``loss`` ("ctc", "rnnt") at ``sizes`` ("small", "paper")."""
    if (loss, sizes) not in CASES:
        raise ValueError(f"no cases for loss={loss!r}, sizes={sizes!r}: expected {LOSSES} x {SIZES}")
    return CASES[(loss, sizes)]


@dataclass
class Inputs:
    """Random inputs of a case: unnormalized ``logits`` and int64 targets/lengths on ``device``.

    CTC: ``logits (T, B, C)``, blank 0. RNN-T: ``logits (B, T, U+1, V)``, blank ``V - 1``.
    """

    logits: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor
    target_lengths: torch.Tensor
    blank: int


def make_inputs(case: Case, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    if case.loss == "ctc":
        logits = torch.randn(case.T, case.B, case.C, generator=g)
        blank = 0
        targets = torch.randint(1, case.C, (case.B, case.U), generator=g)
    else:
        logits = torch.randn(case.B, case.T, case.U + 1, case.C, generator=g)
        blank = case.C - 1
        targets = torch.randint(0, case.C - 1, (case.B, case.U), generator=g)
    lengths = torch.full((case.B,), case.T, dtype=torch.int64)
    target_lengths = torch.full((case.B,), case.U, dtype=torch.int64)
    return Inputs(logits.to(device=device, dtype=dtype), targets.to(device), lengths.to(device),
                  target_lengths.to(device), blank)
