"""The registry of loss families: each family is named once, here.

It drives ``seqloss.diagnose`` (its ``kind``), the command line's choices
(``seqloss doctor``'s ``kind``, ``seqloss bench --loss``), ``seqloss bench`` (one
benchmark module per family) and the tests' parametrization (``tests/conftest.py``).
Entries name modules and functions by dotted path, so reading the registry imports
nothing (no cycles, no kernel compilation).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One loss family.

    Attributes:
        name: the family's name (``diagnose(kind=...)``, ``seqloss bench --loss``).
        loss: ``"module:function"`` of the public loss.
        input_name: the loss's first argument (``"log_probs"``, ``"logits"``).
        diagnose: ``"module:function"`` reporting per sequence for ``diagnose``.
        bench: the benchmark module (``cases``, ``implementations``, ``run``, ``pair_rows``).
        kernels: the dispatch family whose backends implement the loss.
    """

    name: str
    loss: str
    input_name: str
    diagnose: str
    bench: str
    kernels: str

    def loss_fn(self) -> Any:
        return _resolve(self.loss)

    def diagnose_fn(self) -> Any:
        return _resolve(self.diagnose)

    def bench_module(self) -> Any:
        return importlib.import_module(self.bench)


def _resolve(path: str) -> Any:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("ctc", "seqloss.ctc.api:ctc_loss", "log_probs",
               "seqloss.diagnose:_diagnose_ctc", "seqloss.bench.ctc", "ctc"),
        Family("rnnt", "seqloss.transducer.rnnt:rnnt_loss", "logits",
               "seqloss.diagnose:_diagnose_rnnt", "seqloss.bench.rnnt", "transducer"),
        Family("multiblank", "seqloss.transducer.multiblank:multiblank_rnnt_loss", "logits",
               "seqloss.diagnose:_diagnose_multiblank", "seqloss.bench.multiblank", "joint"),
        Family("tdt", "seqloss.transducer.tdt:tdt_loss", "logits",
               "seqloss.diagnose:_diagnose_tdt", "seqloss.bench.tdt", "joint"),
        # The hybrid autoregressive transducer: its arcs by row passes, the RNN-T lattice.
        Family("hat", "seqloss.transducer.hat:hat_loss", "logits",
               "seqloss.diagnose:_diagnose_hat", "seqloss.bench.hat", "lattice"),
        # k2's pruned RNN-T (with its simple loss: seqloss.bench.pruned times the pipeline)
        Family("pruned", "seqloss.transducer.factored.api:rnnt_loss_pruned", "logits",
               "seqloss.transducer.factored.diagnose_hook:diagnose_pruned",
               "seqloss.bench.pruned", "lattice"),
    )
}

NAMES: tuple[str, ...] = tuple(FAMILIES)


def family(name: str) -> Family:
    """The family called ``name``; ``KeyError`` lists the valid names."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown loss family {name!r}: expected one of {NAMES}") from None
