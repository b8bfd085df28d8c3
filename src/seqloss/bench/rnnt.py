"""RNN-T forward+backward: seqloss against torchaudio, fast_rnnt and warprnnt-numba.

    python -m seqloss.bench.rnnt [--sizes small|paper] [--repeat N] [--json FILE]
                                 [--no-memory] [--threads N] [--impl NAME]
                                 [--with-warprnnt-numba]

Cases: float32 logits ``(B, T, U+1, V)``, full lengths (torchaudio requires
``T == max(logit_lengths)``), blank 0, ``reduction="sum"``; the gradient with respect
to the logits by autograd. Every implementation importable in the running
environment is measured (warprnnt-numba only on request: its CPU path is Python
loops). Times are medians of interleaved rounds in one process; the ratio is
peer_time / seqloss_time (> 1: seqloss is faster). Same interface as
:mod:`seqloss.bench.ctc`: ``cases(sizes)``, ``implementations()``, ``run(...)``,
``pair_rows(rows)``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch

from . import _common

MEM_CHILD = [sys.executable, "-m", "seqloss.bench.rnnt"]

SIZES = {
    "paper": [(4, 200, 50, 256), (8, 150, 40, 1024), (2, 500, 100, 128)],
    "small": [(2, 20, 5, 16), (4, 50, 10, 64)],
    "tiny": [(1, 20, 5, 10), (8, 26, 8, 8)],
    "long": [(1, 2000, 200, 64)],
}


def cases(sizes: str = "paper") -> list[dict]:
    """The benchmark cases: dicts with ``name, B, T, U, V, seed`` (JSON-serializable)."""
    return [
        {"name": f"B{B}-T{T}-U{U}-V{V}", "B": B, "T": T, "U": U, "V": V, "seed": 0}
        for B, T, U, V in SIZES[sizes]
    ]


def make_inputs(case: dict) -> dict:
    B, T, U, V = case["B"], case["T"], case["U"], case["V"]
    g = torch.Generator().manual_seed(case.get("seed", 0))
    return {
        "logits": torch.randn(B, T, U + 1, V, generator=g),
        "targets": torch.randint(1, V, (B, U), generator=g),
        "logit_lengths": torch.full((B,), T, dtype=torch.int64),
        "target_lengths": torch.full((B,), U, dtype=torch.int64),
    }


def _grad_of(loss_fn):
    def factory(case: dict):
        d = make_inputs(case)
        x = d["logits"].requires_grad_()
        call = loss_fn(d)

        def fn():
            return torch.autograd.grad(call(x), x)[0]

        return fn

    return factory


@_grad_of
def _seqloss(d: dict):
    import seqloss

    return lambda x: seqloss.rnnt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                       blank=0, reduction="sum")


@_grad_of
def _torchaudio(d: dict):
    import torchaudio.functional as AF

    tg, il, tl = (d[k].to(torch.int32) for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: AF.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum")


@_grad_of
def _fast_rnnt(d: dict):
    import fast_rnnt

    B = d["logits"].shape[0]
    boundary = torch.zeros(B, 4, dtype=torch.int64)
    boundary[:, 2] = d["target_lengths"]
    boundary[:, 3] = d["logit_lengths"]
    return lambda x: fast_rnnt.rnnt_loss(logits=x, symbols=d["targets"], termination_symbol=0,
                                         boundary=boundary, reduction="sum")


@_grad_of
def _warprnnt_numba(d: dict):
    import warprnnt_numba

    tg, il, tl = (d[k].to(torch.int32) for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: warprnnt_numba.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum")


IMPLS: dict[str, tuple[_common.Factory, tuple[str, ...]]] = {
    "seqloss": (_seqloss, ("seqloss",)),
    "torchaudio": (_torchaudio, ("torchaudio",)),
    "fast_rnnt": (_fast_rnnt, ("fast_rnnt",)),
    "warprnnt-numba": (_warprnnt_numba, ("warprnnt_numba",)),
}
SLOW = {"warprnnt-numba"}


def implementations(with_slow: bool = False) -> dict[str, _common.Factory]:
    """The importable implementations (name -> factory); slow peers only on request."""
    out = {}
    for name, (factory, modules) in IMPLS.items():
        if name in SLOW and not with_slow:
            continue
        if all(importlib.util.find_spec(m) is not None for m in modules):
            out[name] = factory
    return out


def run(case_list: list[dict], repeat: int = 5, memory: bool = True, impls: list[str] | None = None,
        log=print, with_slow: bool = False) -> list[dict]:
    """One row per (case, implementation): ``case, B, T, U, V, impl, ms, times_ms, peak_mib``."""
    available = implementations(with_slow or bool(impls and SLOW & set(impls)))
    names = [n for n in (impls or list(available)) if n in available]
    return _common.run_cases(case_list, available, names, ("B", "T", "U", "V"), MEM_CHILD,
                             repeat, memory, log)


def pair_rows(rows: list[dict]) -> list[dict]:
    """Per case: seqloss against each peer, ratio = peer_ms / seqloss_ms."""
    by = {(r["case"], r["impl"]): r for r in rows}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        if (case, "seqloss") not in by:
            continue
        o = by[(case, "seqloss")]
        for (c, name), q in by.items():
            if c != case or name == "seqloss":
                continue
            out.append({
                "case": case, "input": "logits", "seqloss": "seqloss", "peer": name,
                "seqloss_ms": o["ms"], "peer_ms": q["ms"], "ratio": q["ms"] / o["ms"],
                "seqloss_mib": o["peak_mib"], "peer_mib": q["peak_mib"],
            })
    return out


PAIR_COLUMNS = [
    ("case", "case", ""), ("peer", "peer", ""), ("seqloss_ms", "seqloss ms", ".1f"),
    ("peer_ms", "peer ms", ".1f"), ("ratio", "peer/seqloss", ".2f"),
    ("seqloss_mib", "seqloss MiB", ".1f"), ("peer_mib", "peer MiB", ".1f"),
]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--mem-child":
        threads = int(os.environ.get("SEQLOSS_BENCH_THREADS", "2"))
        _common.mem_child_main(implementations(with_slow=True), argv[1:], threads=threads)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the rows, ratios and machine info to this file")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    ap.add_argument("--with-warprnnt-numba", action="store_true",
                    help="also time warprnnt-numba (Python loops on CPU: slow)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SEQLOSS_BENCH_THREADS"] = str(args.threads)
    info = _common.machine_info()
    print(json.dumps(info))
    rows = run(cases(args.sizes), repeat=args.repeat, memory=not args.no_memory, impls=args.impl,
               with_slow=args.with_warprnnt_numba)
    pairs = pair_rows(rows)
    print()
    print(_common.format_table(pairs, PAIR_COLUMNS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows, "pairs": pairs}, f, indent=1)


if __name__ == "__main__":
    main()
