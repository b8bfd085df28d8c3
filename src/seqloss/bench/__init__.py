"""Benchmarks shipped with the package, so ``seqloss bench`` works from an installed wheel.

- :mod:`.cases`: the registry of cases (loss, size grid, dtype) and the input factory;
- :mod:`.peers`: one adapter per library (seqloss, torch, optax, torchaudio, fast_rnnt,
  warprnnt-numba), each forward + backward on the same logits;
- :mod:`.runner`: interleaved timing, the ratio table and JSON output.

The scripts in ``benchmarks/`` call the same code.
"""

from __future__ import annotations

from .cases import CASES, LOSSES, SIZES, Case, Inputs, cases, make_inputs
from .peers import PEERS, SEQLOSS, Peer, available_peers
from .runner import CaseResult, Timing, header, results_table, run_cases, steps_for, write_json

__all__ = [
    "CASES",
    "LOSSES",
    "PEERS",
    "SEQLOSS",
    "SIZES",
    "Case",
    "CaseResult",
    "Inputs",
    "Peer",
    "Timing",
    "available_peers",
    "cases",
    "header",
    "make_inputs",
    "results_table",
    "run_cases",
    "steps_for",
    "write_json",
]
