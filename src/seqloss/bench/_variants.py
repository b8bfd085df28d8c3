"""Multi-blank RNN-T and TDT beside seqloss's own ``rnnt_loss``, and their peers.

The machinery behind :mod:`seqloss.bench.multiblank` and :mod:`seqloss.bench.tdt`
(each is one :class:`Variant` of this module, with the interface of
:mod:`seqloss.bench.rnnt`: ``cases``, ``implementations``, ``run``, ``pair_rows``).

Cases: the RNN-T benchmark's sizes (:data:`seqloss.bench.rnnt.SIZES`), one float32
logits tensor ``(B, T, U+1, V)`` per case, full lengths, ``reduction="sum"``,
forward and backward (the gradient with respect to the logits by autograd). Every
implementation reads the same tensor:

- multi-blank: big blanks ``[2, 4, 8]``; the standard blank is class ``V - 1``, the
  big blanks ``V - 2, V - 3, V - 4`` (NeMo's layout); targets in ``[0, V - 5]``;
- TDT: durations ``[0, 1, 2, 3, 4]``: the first ``V - 5`` classes are the token
  logits (blank ``V - 6``), the last 5 the duration logits; targets in ``[0, V - 7]``;
- ``seqloss rnnt_loss``: the baseline, ``seqloss.rnnt_loss`` on the same tensor
  (blank ``V - 1``, the same targets): the logits pass is the same, the lattice
  has fewer arcs per state.

Each pair row is ``ratio = other_ms / variant_ms`` (``> 1``: the variant is
faster), the command line's convention; the row against the RNN-T baseline also
carries ``overhead = variant_ms / rnnt_ms`` (target ``<= 1.5``), and with memory
the extra peak of one call over the logits' bytes (target ``<= 1.1``: the gradient
itself is one logits' worth).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _common
from .rnnt import SIZES

BIG_BLANK_DURATIONS = [2, 4, 8]
TDT_DURATIONS = [0, 1, 2, 3, 4]
RNNT_BASELINE = "seqloss rnnt_loss"

# Targets of the issue (this CPU): time against rnnt_loss, extra peak memory over the
# logits' bytes, speed-up against transformers' pure-PyTorch tdt_loss.
MAX_OVERHEAD = 1.5
MAX_MEM_OVER_LOGITS = 1.1
MIN_SPEEDUP_TRANSFORMERS = 20.0


def cases(sizes: str = "paper") -> list[dict]:
    """The benchmark cases: dicts with ``name, B, T, U, V, seed`` (JSON-serializable)."""
    return [
        {"name": f"B{B}-T{T}-U{U}-V{V}", "B": B, "T": T, "U": U, "V": V, "seed": 0}
        for B, T, U, V in SIZES[sizes]
    ]


def logits_mib(case: dict) -> float:
    """The float32 logits' size in MiB."""
    return case["B"] * case["T"] * (case["U"] + 1) * case["V"] * 4 / 2**20


def _grad_of(make_inputs: Callable[[dict], dict],
             loss_fn: Callable[[dict], Callable]) -> _common.Factory:
    """``loss_fn(d) -> (x -> loss)`` into a factory of one forward + backward."""

    def factory(case: dict):
        d = make_inputs(case)
        x = d["logits"].requires_grad_()
        call = loss_fn(d)

        def fn():
            return torch.autograd.grad(call(x), x)[0]

        return fn

    return factory


@dataclass
class Variant:
    """One variant's benchmark: its inputs, implementations and command line."""

    name: str  # "multiblank" or "tdt"
    module: str  # "seqloss.bench.multiblank"
    make_inputs: Callable[[dict], dict]
    impls: dict[str, tuple[Callable[[dict], Callable], tuple[str, ...]]]
    slow: frozenset[str] = frozenset()
    cuda_only: frozenset[str] = frozenset()
    max_overhead: float = MAX_OVERHEAD  # target: variant time / rnnt_loss time

    @property
    def seqloss_name(self) -> str:
        return f"seqloss {self.name}"

    @property
    def mem_child(self) -> list[str]:
        return [sys.executable, "-m", self.module]

    def implementations(self, with_slow: bool = False) -> dict[str, _common.Factory]:
        """The importable implementations (name -> factory); slow peers only on request."""
        out = {}
        for name, (loss_fn, modules) in self.impls.items():
            if name in self.slow and not with_slow:
                continue
            if name in self.cuda_only and not torch.cuda.is_available():
                continue
            if all(importlib.util.find_spec(m) is not None for m in modules):
                out[name] = _grad_of(self.make_inputs, loss_fn)
        return out

    def run(self, case_list: list[dict], repeat: int = 5, memory: bool = True,
            impls: list[str] | None = None, log=print,
            with_slow: bool = False) -> list[dict]:
        """One row per (case, implementation): ``case, B..V, impl, ms, times_ms, peak_mib``."""
        available = self.implementations(with_slow or bool(impls and self.slow & set(impls)))
        names = [n for n in (impls or list(available)) if n in available]
        return _common.run_cases(case_list, available, names, ("B", "T", "U", "V"),
                                 self.mem_child, repeat, memory, log)

    def pair_rows(self, rows: list[dict]) -> list[dict]:
        """Per case: the seqloss variant against each other implementation."""
        by = {(r["case"], r["impl"]): r for r in rows}
        me = self.seqloss_name
        out = []
        for case in dict.fromkeys(r["case"] for r in rows):
            if (case, me) not in by:
                continue
            o = by[(case, me)]
            mib = logits_mib(o)
            for (c, name), q in by.items():
                if c != case or name == me:
                    continue
                p = {
                    "case": case, "input": "logits", "seqloss": me, "peer": name,
                    "seqloss_ms": o["ms"], "peer_ms": q["ms"], "ratio": q["ms"] / o["ms"],
                    "seqloss_mib": o["peak_mib"], "peer_mib": q["peak_mib"],
                    "logits_mib": mib,
                    "seqloss_mem_over_logits": _over(o["peak_mib"], mib),
                    "peer_mem_over_logits": _over(q["peak_mib"], mib),
                }
                if name == RNNT_BASELINE:
                    p["overhead"] = o["ms"] / q["ms"]
                out.append(p)
        return out

    def notes(self, pairs: list[dict]) -> list[str]:
        """One line per pair against a target of the issue, with pass or miss."""
        lines = []
        for p in pairs:
            if p["peer"] == RNNT_BASELINE:
                ok = p["overhead"] <= self.max_overhead
                lines.append(f"{p['case']}: {self.name} / rnnt_loss time {p['overhead']:.2f}x "
                             f"(target <= {self.max_overhead}) {'ok' if ok else 'MISSED'}")
                m = p["seqloss_mem_over_logits"]
                if m is not None:
                    ok = m <= MAX_MEM_OVER_LOGITS
                    lines.append(f"{p['case']}: {self.name} extra peak memory {m:.2f}x the "
                                 f"logits (target <= {MAX_MEM_OVER_LOGITS}) "
                                 f"{'ok' if ok else 'MISSED'}")
            elif p["peer"].startswith("transformers"):
                ok = p["ratio"] >= MIN_SPEEDUP_TRANSFORMERS
                lines.append(f"{p['case']}: {self.name} {p['ratio']:.1f}x faster than "
                             f"{p['peer']} (target >= {MIN_SPEEDUP_TRANSFORMERS:.0f}x) "
                             f"{'ok' if ok else 'MISSED'}")
        return lines

    def main(self, argv: list[str] | None = None) -> None:
        argv = sys.argv[1:] if argv is None else argv
        if argv and argv[0] == "--mem-child":
            threads = int(os.environ.get("SEQLOSS_BENCH_THREADS", "2"))
            _common.mem_child_main(self.implementations(with_slow=True), argv[1:],
                                   threads=threads)
            return
        ap = argparse.ArgumentParser(description=f"{self.name} forward+backward beside "
                                     "seqloss.rnnt_loss and the installed peers")
        ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
        ap.add_argument("--repeat", type=int, default=5)
        ap.add_argument("--json", help="write the rows, ratios and machine info to this file")
        ap.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory subprocesses")
        ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
        ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
        ap.add_argument("--with-slow", action="store_true",
                        help="also time the Python-loop references (" + ", ".join(sorted(self.slow))
                        + ")")
        args = ap.parse_args(argv)
        torch.set_num_threads(args.threads)
        os.environ["SEQLOSS_BENCH_THREADS"] = str(args.threads)
        info = _common.machine_info()
        print(json.dumps(info))
        rows = self.run(cases(args.sizes), repeat=args.repeat, memory=not args.no_memory,
                        impls=args.impl, with_slow=args.with_slow)
        pairs = self.pair_rows(rows)
        print()
        print(_common.format_table(pairs, PAIR_COLUMNS))
        print()
        print("\n".join(self.notes(pairs)))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "rows": rows, "pairs": pairs}, f, indent=1)


def _over(peak: float | None, mib: float) -> float | None:
    return None if peak is None else peak / mib


PAIR_COLUMNS = [
    ("case", "case", ""), ("seqloss", "variant", ""), ("peer", "other", ""),
    ("seqloss_ms", "variant ms", ".2f"), ("peer_ms", "other ms", ".2f"),
    ("ratio", "other/variant", ".2f"), ("overhead", "variant/rnnt", ".2f"),
    ("seqloss_mem_over_logits", "variant mem/logits", ".2f"),
    ("peer_mem_over_logits", "other mem/logits", ".2f"),
]


# --------------------------------------------------------------------------- inputs
def _lengths(B: int, T: int, U: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((B,), T, dtype=torch.int64), torch.full((B,), U, dtype=torch.int64)


def multiblank_inputs(case: dict) -> dict:
    """Logits ``(B, T, U+1, V)``; targets avoid the standard blank and the 3 big blanks."""
    B, T, U, V = case["B"], case["T"], case["U"], case["V"]
    g = torch.Generator().manual_seed(case.get("seed", 0))
    nb = len(BIG_BLANK_DURATIONS)
    il, tl = _lengths(B, T, U)
    return {
        "logits": torch.randn(B, T, U + 1, V, generator=g),
        "targets": torch.randint(0, V - 1 - nb, (B, U), generator=g),
        "logit_lengths": il, "target_lengths": tl, "blank": V - 1,
    }


def tdt_inputs(case: dict) -> dict:
    """Logits ``(B, T, U+1, V)``: ``V - 5`` token logits (blank last), 5 duration logits."""
    B, T, U, V = case["B"], case["T"], case["U"], case["V"]
    g = torch.Generator().manual_seed(case.get("seed", 0))
    vt = V - len(TDT_DURATIONS)
    il, tl = _lengths(B, T, U)
    return {
        "logits": torch.randn(B, T, U + 1, V, generator=g),
        "targets": torch.randint(0, vt - 1, (B, U), generator=g),
        "logit_lengths": il, "target_lengths": tl, "blank": vt - 1, "num_tokens": vt,
    }


# --------------------------------------------------------------------------- implementations
def _rnnt(d: dict):
    import seqloss

    V = d["logits"].shape[-1]
    return lambda x: seqloss.rnnt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                       blank=V - 1, reduction="sum")


def _seqloss_multiblank(d: dict):
    import seqloss

    return lambda x: seqloss.multiblank_rnnt_loss(
        x, d["targets"], d["logit_lengths"], d["target_lengths"], BIG_BLANK_DURATIONS,
        blank=d["blank"], reduction="sum")


def _nemo_multiblank(d: dict):
    from ..testing import nemo_rnnt_pytorch

    loss = nemo_rnnt_pytorch().MultiblankRNNTLossPytorch(d["blank"], BIG_BLANK_DURATIONS,
                                                         reduction="sum")
    tg, il, tl = (d[k] for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: loss(acts=x, labels=tg, act_lens=il, label_lens=tl)


def _seqloss_hat(d: dict):
    import seqloss

    V = d["logits"].shape[-1]
    return lambda x: seqloss.hat_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                      blank=V - 1, reduction="sum")


def _seqloss_tdt(d: dict):
    import seqloss

    return lambda x: seqloss.tdt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                      TDT_DURATIONS, blank=d["blank"], reduction="sum")


def _transformers_tdt(d: dict):
    from transformers.loss.loss_tdt import tdt_loss

    vt = d["num_tokens"]
    tg, il, tl = (d[k].to(torch.int32) for k in ("targets", "logit_lengths", "target_lengths"))
    # Its (token_logits, duration_logits) pair: views of the one tensor, no copy.
    return lambda x: tdt_loss(x[..., :vt], x[..., vt:], tg, il, tl, blank_token_id=d["blank"],
                              durations=TDT_DURATIONS, reduction="sum")


def _nemo_tdt(d: dict):
    from ..testing import nemo_rnnt_pytorch

    loss = nemo_rnnt_pytorch().TDTLossPytorch(d["blank"], TDT_DURATIONS, reduction="sum")
    # It allocates its alphas with .cuda(): its inputs go there (the copies are timed).
    tg, il, tl = (d[k].cuda() for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: loss(acts=x.cuda(), labels=tg, act_lens=il, label_lens=tl)


MULTIBLANK = Variant(
    "multiblank", "seqloss.bench.multiblank", multiblank_inputs,
    {
        "seqloss multiblank": (_seqloss_multiblank, ("seqloss",)),
        RNNT_BASELINE: (_rnnt, ("seqloss",)),
        # NeMo's pure-PyTorch reference: Python loops over (t, u), tens of seconds.
        "nemo MultiblankRNNTLossPytorch": (_nemo_multiblank, ("nemo",)),
    },
    slow=frozenset({"nemo MultiblankRNNTLossPytorch"}),
)

TDT = Variant(
    "tdt", "seqloss.bench.tdt", tdt_inputs,
    {
        "seqloss tdt": (_seqloss_tdt, ("seqloss",)),
        RNNT_BASELINE: (_rnnt, ("seqloss",)),
        "transformers tdt_loss": (_transformers_tdt, ("transformers",)),
        # NeMo's pure-PyTorch reference: Python loops over (b, t, u), and CUDA only
        # (it allocates its alphas with .cuda()).
        "nemo TDTLossPytorch": (_nemo_tdt, ("nemo",)),
    },
    slow=frozenset({"nemo TDTLossPytorch"}),
    cuda_only=frozenset({"nemo TDTLossPytorch"}),
)

# HAT on the same logits as rnnt_loss (blank V - 1; the labels are the other classes).
HAT = Variant(
    "hat", "seqloss.bench.hat", multiblank_inputs,
    {
        "seqloss hat": (_seqloss_hat, ("seqloss",)),
        RNNT_BASELINE: (_rnnt, ("seqloss",)),
    },
    max_overhead=1.2,
)
