"""The registry of loss families: each family is named once, here.

It drives ``seqloss.diagnose`` (its ``kind``), the command line's choices
(``seqloss doctor``'s ``kind``, ``seqloss bench --loss``), ``seqloss bench`` and the
tests' parametrization (``tests/conftest.py``). A transducer on the full joint is
described by data (:class:`Transducer`): ``diagnose`` and the benchmark
(``seqloss.bench.transducer``) are generic functions of that entry and of the
variant's :class:`~seqloss.transducer.joint.table.JointTable`, so a new variant is its
module (its loss, its from-joint twin and its table's constructor, as ``hat.py``), one
entry here and the exports. CTC and the pruned loss keep
their own report and benchmark (their inputs are not a ``(B, T, U+1, V)`` joint).
Entries name modules and functions by dotted path, so reading the registry imports
nothing (no cycles, no kernel compilation).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

# The generic report and benchmark of a transducer family.
_TRANSDUCER_DIAGNOSE = "seqloss.diagnose:diagnose_transducer"
_TRANSDUCER_BENCH = "seqloss.bench.transducer:variant"


@dataclass(frozen=True)
class Peer:
    """Another implementation timed beside a transducer family in ``seqloss bench``.

    Attributes:
        name: its row's name (``"torchaudio"``, ``"transformers tdt_loss"``).
        factory: ``"module:function"``, ``f(inputs) -> (logits -> loss)`` with
            ``inputs`` the benchmark's dict (logits, targets, lengths, blank and the
            variant's own arguments).
        modules: what must be importable for it to run.
        slow: timed only on request (Python loops).
        cuda_only: timed only where CUDA is available.
        min_speedup: the issue's target for ``peer time / seqloss time`` (a note line).
    """

    name: str
    factory: str
    modules: tuple[str, ...]
    slow: bool = False
    cuda_only: bool = False
    min_speedup: float | None = None


@dataclass(frozen=True)
class Transducer:
    """What ``diagnose`` and the benchmark need to know of a transducer on the full joint.

    Attributes:
        table: ``"module:function"`` building the variant's ``JointTable`` from ``V`` and
            the call's arguments of the same names (``blank``, ``durations``, ...);
            ``None``: one blank, no duration block. The report reads the blank, the
            duration block's width and the big blanks' classes off it.
        log_probs: ``"module:function"``, ``f(logits float64, blank) -> log-probs`` of
            every class, where the variant does not normalize by log-softmax (HAT).
        pair_input: the logits may be the pair ``(token_logits, duration_logits)``.
        report: the report's extra fields, in order: a call argument (a list of ints
            is always shown, a number only when nonzero), ``"big_blank_classes"`` or
            ``"logits_layout"`` (read off the table and the input).
        bench_args: the variant's own arguments in the benchmark, ``((name, value), ...)``.
        bench_blank: the blank in the benchmark's token block (``0`` or ``-1``).
        bench_name: the seqloss row's name (default ``"seqloss <family>"``).
        baseline: also time ``rnnt_loss`` on the same logits (``"seqloss rnnt_loss"``).
        max_overhead: target of ``time / rnnt_loss time`` (a note line).
        peers: the other implementations timed.
    """

    table: str | None = None
    log_probs: str | None = None
    pair_input: bool = False
    report: tuple[str, ...] = ()
    bench_args: tuple[tuple[str, Any], ...] = ()
    bench_blank: int = -1
    bench_name: str | None = None
    baseline: bool = True
    max_overhead: float = 1.5
    peers: tuple[Peer, ...] = ()


@dataclass(frozen=True)
class Family:
    """One loss family.

    Attributes:
        name: the family's name (``diagnose(kind=...)``, ``seqloss bench --loss``).
        loss: ``"module:function"`` of the public loss.
        input_name: the loss's first argument (``"log_probs"``, ``"logits"``).
        kernels: the dispatch family whose backends implement the loss.
        transducer: a transducer on the full joint: the data its generic report and
            benchmark read (``diagnose`` and ``bench`` then stay ``None``).
        diagnose: ``"module:function"`` reporting per sequence, for the other families.
        bench: their benchmark module (``cases``, ``implementations``, ``run``, ``pair_rows``).
    """

    name: str
    loss: str
    input_name: str
    kernels: str
    transducer: Transducer | None = None
    diagnose: str | None = None
    bench: str | None = None

    def loss_fn(self) -> Any:
        return resolve(self.loss)

    def diagnose_fn(self) -> Any:
        """``f(arguments, input, loss, grad) -> Diagnosis``."""
        if self.diagnose is not None:
            return resolve(self.diagnose)
        return functools.partial(resolve(_TRANSDUCER_DIAGNOSE), self)

    def bench_module(self) -> Any:
        """The benchmark: a module, or the generic transducer benchmark of this entry
        (the same interface)."""
        if self.bench is not None:
            return importlib.import_module(self.bench)
        return resolve(_TRANSDUCER_BENCH)(self.name)


def resolve(path: str) -> Any:
    """The object a ``"module:function"`` path names."""
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


_TABLE = "seqloss.transducer.joint.table"
_PEERS = "seqloss.bench.peers"
_BIG_BLANKS = (2, 4, 8)  # the benchmark's big blanks: classes V - 2, V - 3, V - 4
_DURATIONS = (0, 1, 2, 3, 4)  # the benchmark's TDT durations: the last 5 classes

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("ctc", "seqloss.ctc.api:ctc_loss", "log_probs", "ctc",
               diagnose="seqloss.diagnose:_diagnose_ctc", bench="seqloss.bench.ctc"),
        Family("rnnt", "seqloss.transducer.rnnt:rnnt_loss", "logits", "transducer",
               transducer=Transducer(
                   table=f"{_TABLE}:rnnt_table", bench_blank=0, bench_name="seqloss",
                   baseline=False,
                   peers=(Peer("torchaudio", f"{_PEERS}:torchaudio_rnnt", ("torchaudio",)),
                          Peer("fast_rnnt", f"{_PEERS}:fast_rnnt", ("fast_rnnt",)),
                          # its CPU path is Python loops
                          Peer("warprnnt-numba", f"{_PEERS}:warprnnt_numba",
                               ("warprnnt_numba",), slow=True)))),
        Family("multiblank", "seqloss.transducer.multiblank:multiblank_rnnt_loss", "logits",
               "joint", transducer=Transducer(
                   table=f"{_TABLE}:multiblank_table",
                   report=("big_blank_durations", "big_blank_classes", "sigma",
                           "fastemit_lambda"),
                   bench_args=(("big_blank_durations", _BIG_BLANKS),),
                   # NeMo's pure-PyTorch reference: Python loops over (t, u), tens of seconds.
                   peers=(Peer("nemo MultiblankRNNTLossPytorch", f"{_PEERS}:nemo_multiblank",
                               ("nemo",), slow=True),))),
        Family("tdt", "seqloss.transducer.tdt:tdt_loss", "logits", "joint",
               transducer=Transducer(
                   table=f"{_TABLE}:tdt_table", pair_input=True,
                   report=("durations", "logits_layout", "sigma", "omega"),
                   bench_args=(("durations", _DURATIONS),),
                   peers=(Peer("transformers tdt_loss", f"{_PEERS}:transformers_tdt",
                               ("transformers",), min_speedup=20.0),
                          # NeMo's pure-PyTorch reference: Python loops over (b, t, u), and
                          # CUDA only (it allocates its alphas with .cuda()).
                          Peer("nemo TDTLossPytorch", f"{_PEERS}:nemo_tdt", ("nemo",),
                               slow=True, cuda_only=True)))),
        # The hybrid autoregressive transducer: a joint table (the "hat" normalizer: a
        # Bernoulli blank and a softmax over the labels; no peer has a full-joint HAT).
        Family("hat", "seqloss.transducer.hat:hat_loss", "logits", "joint",
               transducer=Transducer(
                   table="seqloss.transducer.hat:hat_table",
                   log_probs="seqloss.transducer.factored.arcs:hat_log_probs",
                   max_overhead=1.2)),
        # k2's pruned RNN-T (with its simple loss: seqloss.bench.pruned times the pipeline)
        Family("pruned", "seqloss.transducer.factored.api:rnnt_loss_pruned", "logits", "lattice",
               diagnose="seqloss.transducer.factored.diagnose_hook:diagnose_pruned",
               bench="seqloss.bench.pruned"),
    )
}

NAMES: tuple[str, ...] = tuple(FAMILIES)


def family(name: str) -> Family:
    """The family called ``name``; ``KeyError`` lists the valid names."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown loss family {name!r}: expected one of {NAMES}") from None
