"""The benchmark of every transducer family on the full joint, read off its registry entry.

    python -m seqloss.bench.transducer LOSS [--sizes tiny|small|paper|long] [--repeat N]
                                            [--json FILE] [--no-memory] [--threads N]
                                            [--impl NAME] [--with-slow]

``LOSS`` is a registered transducer family (``rnnt``, ``multiblank``, ``tdt``, ``hat``;
``seqloss bench --loss LOSS`` runs the same code). Cases: :data:`SIZES`, one float32
logits tensor ``(B, T, U+1, V)`` per case, full lengths, ``reduction="sum"``, forward
and backward (the gradient with respect to the logits by autograd). Every
implementation reads the same tensor; what differs per family comes from its entry
(:class:`seqloss._core.registry.Transducer`) and its joint table:

- the blank is ``bench_blank`` of the token block (RNN-T: 0, as torchaudio's default;
  the others: the last token class), the variant's own arguments are ``bench_args``
  (multi-blank: big blanks ``[2, 4, 8]``, classes ``V - 2, V - 3, V - 4``; TDT:
  durations ``[0, 1, 2, 3, 4]``, the last 5 classes), and the targets avoid every
  class the table makes blank-like;
- ``seqloss rnnt_loss`` (``baseline``): ``seqloss.rnnt_loss`` on the same tensor
  (blank ``V - 1``): the logits pass is the same, the lattice has fewer arcs per state;
- the peers (``seqloss.bench.peers``): torchaudio, fast_rnnt, warprnnt-numba (slow:
  Python loops on CPU), NeMo's pure-PyTorch references (slow), transformers'
  ``tdt_loss``.

Each pair row is ``ratio = other_ms / seqloss_ms`` (``> 1``: seqloss is faster), the
command line's convention; the row against the RNN-T baseline also carries
``overhead = variant_ms / rnnt_ms`` (target ``max_overhead``), and with memory the
extra peak of one call over the logits' bytes (target ``<= 1.1``: the gradient itself
is one logits' worth).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from .._core import registry
from . import _common

SIZES = {
    "paper": [(4, 200, 50, 256), (8, 150, 40, 1024), (2, 500, 100, 128)],
    "small": [(2, 20, 5, 16), (4, 50, 10, 64)],
    "tiny": [(1, 20, 5, 10), (8, 26, 8, 8)],
    "long": [(1, 2000, 200, 64)],
}
RNNT_BASELINE = "seqloss rnnt_loss"
_MODULE = "seqloss.bench.transducer"  # not __name__: "__main__" under python -m
# The issue's target for the extra peak memory of one call over the logits' bytes.
MAX_MEM_OVER_LOGITS = 1.1

PAIR_COLUMNS = [
    ("case", "case", ""), ("seqloss", "variant", ""), ("peer", "other", ""),
    ("seqloss_ms", "variant ms", ".2f"), ("peer_ms", "other ms", ".2f"),
    ("ratio", "other/variant", ".2f"), ("overhead", "variant/rnnt", ".2f"),
    ("seqloss_mem_over_logits", "variant mem/logits", ".2f"),
    ("peer_mem_over_logits", "other mem/logits", ".2f"),
]


def cases(sizes: str = "paper") -> list[dict]:
    """The benchmark cases: dicts with ``name, B, T, U, V, seed`` (JSON-serializable)."""
    return [
        {"name": f"B{B}-T{T}-U{U}-V{V}", "B": B, "T": T, "U": U, "V": V, "seed": 0}
        for B, T, U, V in SIZES[sizes]
    ]


def logits_mib(case: dict) -> float:
    """The float32 logits' size in MiB."""
    return case["B"] * case["T"] * (case["U"] + 1) * case["V"] * 4 / 2**20


LossFn = Callable[[dict], Callable[[torch.Tensor], torch.Tensor]]


class Variant:
    """One transducer family's benchmark, built from its registry entry.

    The interface of a benchmark module (``cases``, ``make_inputs``,
    ``implementations``, ``run``, ``pair_rows``, ``notes``, ``IMPLS``, ``MEM_CHILD``).
    """

    SIZES = SIZES
    PAIR_COLUMNS = PAIR_COLUMNS
    cases = staticmethod(cases)

    def __init__(self, fam: registry.Family) -> None:
        if fam.transducer is None:
            raise ValueError(f"{fam.name} is not a transducer family on the full joint")
        self.family, self.spec, self.name = fam, fam.transducer, fam.name
        self.seqloss_name = self.spec.bench_name or f"seqloss {fam.name}"
        self.MEM_CHILD = [sys.executable, "-m", _MODULE, fam.name]
        impls: dict[str, tuple[LossFn, tuple[str, ...]]] = {
            self.seqloss_name: (self._seqloss, ("seqloss",))}
        if self.spec.baseline:
            impls[RNNT_BASELINE] = (_rnnt_baseline, ("seqloss",))
        for p in self.spec.peers:
            impls[p.name] = (registry.resolve(p.factory), p.modules)
        self.IMPLS = impls
        self.slow = frozenset(p.name for p in self.spec.peers if p.slow)
        self.cuda_only = frozenset(p.name for p in self.spec.peers if p.cuda_only)

    # ----------------------------------------------------------------- inputs
    def _table(self, V: int, blank: int) -> Any:
        if self.spec.table is None:
            return None
        return registry.resolve(self.spec.table)(V, blank, **dict(self.spec.bench_args))

    def make_inputs(self, case: dict) -> dict:
        """Logits ``(B, T, U+1, V)`` (the token block, then the table's duration logits),
        targets that are never a blank-like class, full lengths, the blank and the
        variant's own arguments."""
        B, T, U, V = case["B"], case["T"], case["U"], case["V"]
        g = torch.Generator().manual_seed(case.get("seed", 0))
        first = self._table(V, self.spec.bench_blank % V)
        vt = V - (first.num_durations if first is not None else 0)
        blank = self.spec.bench_blank % vt
        table = self._table(vt, blank)
        blanks = {blank, *(table.blank_tokens if table is not None else ())}
        labels = [c for c in range(vt) if c not in blanks]  # one run: the blanks sit at an end
        return {
            "logits": torch.randn(B, T, U + 1, V, generator=g),
            "targets": torch.randint(labels[0], labels[-1] + 1, (B, U), generator=g),
            "logit_lengths": torch.full((B,), T, dtype=torch.int64),
            "target_lengths": torch.full((B,), U, dtype=torch.int64),
            "blank": blank, "num_tokens": vt,
            **{k: list(v) for k, v in self.spec.bench_args},
        }

    def _seqloss(self, d: dict) -> Callable[[torch.Tensor], torch.Tensor]:
        loss = self.family.loss_fn()
        own = {k: d[k] for k, _ in self.spec.bench_args}
        return lambda x: loss(x, d["targets"], d["logit_lengths"], d["target_lengths"], **own,
                              blank=d["blank"], reduction="sum")

    # ----------------------------------------------------------------- timing
    def _factory(self, loss_fn: LossFn) -> _common.Factory:
        """``loss_fn(d) -> (x -> loss)`` into a factory of one forward + backward."""

        def factory(case: dict):
            d = self.make_inputs(case)
            x = d["logits"].requires_grad_()
            call = loss_fn(d)

            def fn():
                return torch.autograd.grad(call(x), x)[0]

            return fn

        return factory

    def implementations(self, with_slow: bool = False) -> dict[str, _common.Factory]:
        """The importable implementations (name -> factory); slow peers only on request."""
        out = {}
        for name, (loss_fn, modules) in self.IMPLS.items():
            if name in self.slow and not with_slow:
                continue
            if name in self.cuda_only and not torch.cuda.is_available():
                continue
            if all(importlib.util.find_spec(m) is not None for m in modules):
                out[name] = self._factory(loss_fn)
        return out

    def run(self, case_list: list[dict], repeat: int = 5, memory: bool = True,
            impls: list[str] | None = None, log=print,
            with_slow: bool = False) -> list[dict]:
        """One row per (case, implementation): ``case, B..V, impl, ms, times_ms, peak_mib``."""
        available = self.implementations(with_slow or bool(impls and self.slow & set(impls)))
        names = [n for n in (impls or list(available)) if n in available]
        return _common.run_cases(case_list, available, names, ("B", "T", "U", "V"),
                                 self.MEM_CHILD, repeat, memory, log)

    # ----------------------------------------------------------------- report
    def pair_rows(self, rows: list[dict]) -> list[dict]:
        """Per case: seqloss against each other implementation."""
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
        target = {p.name: p.min_speedup for p in self.spec.peers if p.min_speedup}
        lines = []
        for p in pairs:
            if p["peer"] == RNNT_BASELINE:
                mx = self.spec.max_overhead
                ok = p["overhead"] <= mx
                lines.append(f"{p['case']}: {self.name} / rnnt_loss time {p['overhead']:.2f}x "
                             f"(target <= {mx}) {'ok' if ok else 'MISSED'}")
                m = p["seqloss_mem_over_logits"]
                if m is not None:
                    ok = m <= MAX_MEM_OVER_LOGITS
                    lines.append(f"{p['case']}: {self.name} extra peak memory {m:.2f}x the "
                                 f"logits (target <= {MAX_MEM_OVER_LOGITS}) "
                                 f"{'ok' if ok else 'MISSED'}")
            elif p["peer"] in target:
                want = target[p["peer"]]
                ok = p["ratio"] >= want
                lines.append(f"{p['case']}: {self.name} {_common.faster(p['ratio'])} than "
                             f"{p['peer']} (target >= {want:.0f}x faster) "
                             f"{'ok' if ok else 'MISSED'}")
        return lines

    def main(self, argv: list[str]) -> None:
        if argv and argv[0] == "--mem-child":
            threads = int(os.environ.get("SEQLOSS_BENCH_THREADS", "2"))
            _common.mem_child_main(self.implementations(with_slow=True), argv[1:],
                                   threads=threads)
            return
        ap = argparse.ArgumentParser(prog=f"python -m {_MODULE} {self.name}",
                                     description=f"{self.name} forward+backward beside the "
                                     "installed peers")
        ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
        ap.add_argument("--repeat", type=int, default=5)
        ap.add_argument("--json", help="write the rows, ratios and machine info to this file")
        ap.add_argument("--no-memory", action="store_true",
                        help="skip the peak-memory subprocesses")
        ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
        ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
        ap.add_argument("--with-slow", action="store_true",
                        help="also time the slow peers (" + ", ".join(sorted(self.slow)) + ")")
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


def _rnnt_baseline(d: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    import seqloss

    V = d["logits"].shape[-1]
    return lambda x: seqloss.rnnt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                       blank=V - 1, reduction="sum")


def _over(peak: float | None, mib: float) -> float | None:
    return None if peak is None else peak / mib


@functools.cache
def variant(name: str) -> Variant:
    """The benchmark of the registered transducer family ``name``."""
    return Variant(registry.family(name))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    names = [n for n in registry.NAMES if registry.family(n).transducer is not None]
    if not argv or argv[0] not in names:
        sys.exit(f"usage: python -m {_MODULE} {{{','.join(names)}}} [options]")
    variant(argv[0]).main(argv[1:])


if __name__ == "__main__":
    main()
