"""Benchmarks shipped with the package, so ``seqloss bench`` works from an installed wheel.

One benchmark per loss family, each with the same interface: ``cases(sizes)``
(:data:`SIZES`), ``implementations()`` (name -> factory ``make(case) -> fn``, ``fn()``
one forward + backward), ``run(cases, repeat, memory, impls, log)`` (interleaved
timing, optional peak memory in fresh processes) and ``pair_rows(rows)`` (seqloss
against each peer: ``ratio = peer_ms / seqloss_ms``). The transducer families share
one, read off their registry entries (:mod:`.transducer`, its peers in :mod:`.peers`);
CTC (:mod:`.ctc`: log-probs ``(T, B, C)``, three pairings) and the pruned pipeline
(:mod:`.pruned`: factored inputs, the pipeline against the full joint) have their own.
The machinery is in :mod:`._common`. The scripts in ``benchmarks/`` call this code.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .._core.registry import NAMES, family

LOSSES = NAMES  # one benchmark per registered family
SIZES = ("tiny", "small", "paper", "long")  # every family defines each of them


def module(loss: str) -> ModuleType | Any:
    """The benchmark of the family ``loss`` (see ``seqloss._core.registry``): a module, or
    a transducer family's :class:`.transducer.Variant` (the same interface)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return family(loss).bench_module()


def library(impl: str) -> str:
    """The library an implementation name belongs to ("torch log_softmax+ctc" -> "torch")."""
    return impl.split()[0]


__all__ = ["LOSSES", "SIZES", "library", "module"]
