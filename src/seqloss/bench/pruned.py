"""Simple -> prune -> pruned RNN-T beside the full-joint rnnt_loss, and fast_rnnt's losses.

    python -m seqloss.bench.pruned [--sizes tiny|small|paper|long] [--repeat N]
                                   [--json FILE] [--no-memory] [--threads N] [--impl NAME]

Cases: float32 ``am (B, T, C)``, ``lm (B, S+1, C)``, symbols ``(B, S)``, termination
symbol 0, full boundaries, ``reduction="sum"``; every call is a forward and a backward
to ``am`` and ``lm``. The joiner is the additive one (``am_pruned + lm_pruned``), so
every implementation scores the same model. Implementations:

- ``seqloss pipeline``: ``rnnt_loss_simple(return_grad=True)`` -> ``get_rnnt_prune_ranges``
  -> ``do_rnnt_pruning`` -> joiner -> ``rnnt_loss_pruned``, loss = simple + pruned
  (fast_rnnt's README recipe); ``seqloss full-joint``: ``rnnt_loss`` on the broadcast
  joint ``am[:, :, None] + lm[:, None]`` (target: pipeline >= 5x faster, >= 5x less
  peak memory);
- ``seqloss simple`` / ``smoothed`` / ``pruned-step`` (the pruned loss on precomputed
  ranges, joiner included), and fast_rnnt's same four when it is importable
  (targets: simple within 1.5x of fast_rnnt's, the pruned step no slower).

Times are medians of interleaved rounds; memory is the extra peak RSS of one call in a
fresh process (the returned gradients count). Same interface as :mod:`seqloss.bench.transducer`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch

from . import _common

MEM_CHILD = [sys.executable, "-m", "seqloss.bench.pruned"]

SIZES = {
    "paper": [(8, 300, 60, 500, 5)],
    "small": [(4, 100, 20, 100, 5)],
    "tiny": [(2, 20, 5, 16, 3)],
    "long": [(2, 1000, 150, 500, 5)],
}


def cases(sizes: str = "paper") -> list[dict]:
    """Dicts with ``name, B, T, S, C, s_range, seed``."""
    return [
        {"name": f"B{B}-T{T}-S{S}-C{C}-r{R}", "B": B, "T": T, "S": S, "C": C, "s_range": R,
         "seed": 0}
        for B, T, S, C, R in SIZES[sizes]
    ]


def make_inputs(case: dict) -> dict:
    B, T, S, C = case["B"], case["T"], case["S"], case["C"]
    g = torch.Generator().manual_seed(case.get("seed", 0))
    boundary = torch.zeros(B, 4, dtype=torch.int64)
    boundary[:, 2] = S
    boundary[:, 3] = T
    return {
        "am": torch.randn(B, T, C, generator=g).requires_grad_(),
        "lm": torch.randn(B, S + 1, C, generator=g).requires_grad_(),
        "symbols": torch.randint(1, C, (B, S), generator=g),
        "boundary": boundary,
        "s_range": case["s_range"],
    }


def _lib(name: str):
    if name == "seqloss":
        import seqloss

        return seqloss
    import fast_rnnt

    return fast_rnnt


def _kw(lib, rnnt_type: str = "regular") -> dict:
    return {} if lib.__name__ == "fast_rnnt" else {"rnnt_type": rnnt_type}


def _simple(lib_name: str):
    def factory(case: dict):
        lib, d = _lib(lib_name), make_inputs(case)

        def fn():
            loss = lib.rnnt_loss_simple(d["lm"], d["am"], d["symbols"], 0, d["boundary"],
                                        reduction="sum", **_kw(lib))
            return torch.autograd.grad(loss, (d["am"], d["lm"]))

        return fn

    return factory


def _smoothed(lib_name: str):
    def factory(case: dict):
        lib, d = _lib(lib_name), make_inputs(case)

        def fn():
            loss = lib.rnnt_loss_smoothed(d["lm"], d["am"], d["symbols"], 0, 0.1, 0.1,
                                          d["boundary"], reduction="sum", **_kw(lib))
            return torch.autograd.grad(loss, (d["am"], d["lm"]))

        return fn

    return factory


def _ranges(lib, d: dict) -> torch.Tensor:
    _, (px_grad, py_grad) = lib.rnnt_loss_simple(
        d["lm"].detach(), d["am"].detach(), d["symbols"], 0, d["boundary"], reduction="sum",
        return_grad=True, **_kw(lib))
    return lib.get_rnnt_prune_ranges(px_grad, py_grad, d["boundary"], d["s_range"])


def _pruned_step(lib_name: str):
    def factory(case: dict):
        lib, d = _lib(lib_name), make_inputs(case)
        ranges = _ranges(lib, d)

        def fn():
            am_p, lm_p = lib.do_rnnt_pruning(d["am"], d["lm"], ranges)
            loss = lib.rnnt_loss_pruned(am_p + lm_p, d["symbols"], ranges, 0, d["boundary"],
                                        reduction="sum", **_kw(lib))
            return torch.autograd.grad(loss, (d["am"], d["lm"]))

        return fn

    return factory


def _pipeline(lib_name: str):
    def factory(case: dict):
        lib, d = _lib(lib_name), make_inputs(case)

        def fn():
            simple, (px_grad, py_grad) = lib.rnnt_loss_simple(
                d["lm"], d["am"], d["symbols"], 0, d["boundary"], reduction="sum",
                return_grad=True, **_kw(lib))
            ranges = lib.get_rnnt_prune_ranges(px_grad, py_grad, d["boundary"], d["s_range"])
            am_p, lm_p = lib.do_rnnt_pruning(d["am"], d["lm"], ranges)
            pruned = lib.rnnt_loss_pruned(am_p + lm_p, d["symbols"], ranges, 0, d["boundary"],
                                          reduction="sum", **_kw(lib))
            return torch.autograd.grad(simple + pruned, (d["am"], d["lm"]))

        return fn

    return factory


def _full_joint(case: dict):
    import seqloss

    d = make_inputs(case)
    B, T, S = case["B"], case["T"], case["S"]
    il, tl = torch.full((B,), T), torch.full((B,), S)

    def fn():
        logits = d["am"][:, :, None, :] + d["lm"][:, None, :, :]
        loss = seqloss.rnnt_loss(logits, d["symbols"], il, tl, blank=0, reduction="sum")
        return torch.autograd.grad(loss, (d["am"], d["lm"]))

    return fn


IMPLS: dict[str, tuple[_common.Factory, tuple[str, ...]]] = {
    "seqloss pipeline": (_pipeline("seqloss"), ("seqloss",)),
    "seqloss full-joint": (_full_joint, ("seqloss",)),
    "seqloss simple": (_simple("seqloss"), ("seqloss",)),
    "seqloss smoothed": (_smoothed("seqloss"), ("seqloss",)),
    "seqloss pruned-step": (_pruned_step("seqloss"), ("seqloss",)),
    "fast_rnnt pipeline": (_pipeline("fast_rnnt"), ("fast_rnnt",)),
    "fast_rnnt simple": (_simple("fast_rnnt"), ("fast_rnnt",)),
    "fast_rnnt smoothed": (_smoothed("fast_rnnt"), ("fast_rnnt",)),
    "fast_rnnt pruned-step": (_pruned_step("fast_rnnt"), ("fast_rnnt",)),
}

# (ours, theirs): the comparisons that carry a target
PAIRS = [
    ("seqloss pipeline", "seqloss full-joint"),
    ("seqloss simple", "fast_rnnt simple"),
    ("seqloss smoothed", "fast_rnnt smoothed"),
    ("seqloss pruned-step", "fast_rnnt pruned-step"),
    ("seqloss pipeline", "fast_rnnt pipeline"),
]


def implementations(with_slow: bool = False) -> dict[str, _common.Factory]:
    """The importable implementations (name -> factory)."""
    return {name: f for name, (f, mods) in IMPLS.items()
            if all(importlib.util.find_spec(m) is not None for m in mods)}


def run(case_list: list[dict], repeat: int = 5, memory: bool = True, impls: list[str] | None = None,
        log=print, with_slow: bool = False) -> list[dict]:
    """One row per (case, implementation): ``case, B, T, S, C, s_range, impl, ms, peak_mib``."""
    available = implementations()
    names = [n for n in (impls or list(available)) if n in available]
    return _common.run_cases(case_list, available, names, ("B", "T", "S", "C", "s_range"),
                             MEM_CHILD, repeat, memory, log)


def pair_rows(rows: list[dict]) -> list[dict]:
    """Per case and pair: ``ratio = peer_ms / seqloss_ms`` (> 1: ours is faster)."""
    by = {(r["case"], r["impl"]): r for r in rows}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        for ours, theirs in PAIRS:
            if (case, ours) not in by or (case, theirs) not in by:
                continue
            o, q = by[(case, ours)], by[(case, theirs)]
            out.append({
                "case": case, "input": "am, lm", "seqloss": ours, "peer": theirs,
                "seqloss_ms": o["ms"], "peer_ms": q["ms"], "ratio": q["ms"] / o["ms"],
                "seqloss_mib": o["peak_mib"], "peer_mib": q["peak_mib"],
                "mem_ratio": (q["peak_mib"] / o["peak_mib"]
                              if o["peak_mib"] and q["peak_mib"] is not None else None),
            })
    return out


# The targets (README, "Pruned RNN-T"): the pipeline at least this many times faster than
# the full joint and with this many times less peak memory; ours at most this many times
# fast_rnnt's time for the simple loss and the pruned step.
MIN_SPEEDUP = MIN_LESS_MEMORY = 5.0
MAX_SIMPLE, MAX_PRUNED_STEP = 1.5, 1.0


def _ok(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def notes(pairs: list[dict]) -> list[str]:
    """The targets, against what was measured, each met (ok) or MISSED."""
    out = []
    for p in pairs:
        if p["peer"] == "seqloss full-joint":
            out.append(f"{p['case']}: pipeline {_common.faster(p['ratio'])} than the full-joint "
                       f"rnnt_loss (target >= {MIN_SPEEDUP:.0f}x faster) "
                       f"{_ok(p['ratio'] >= MIN_SPEEDUP)}")
            if p["mem_ratio"] is not None:
                out.append(f"{p['case']}: pipeline {_common.less_memory(p['mem_ratio'])} peak "
                           f"memory than the full-joint rnnt_loss (target >= "
                           f"{MIN_LESS_MEMORY:.0f}x less) {_ok(p['mem_ratio'] >= MIN_LESS_MEMORY)}")
        elif p["peer"] == "fast_rnnt simple":
            out.append(f"{p['case']}: simple at {1 / p['ratio']:.2f}x fast_rnnt's time "
                       f"(target <= {MAX_SIMPLE}x; fast_rnnt's is inexact) "
                       f"{_ok(1 / p['ratio'] <= MAX_SIMPLE)}")
        elif p["peer"] == "fast_rnnt pruned-step":
            out.append(f"{p['case']}: pruned step at {1 / p['ratio']:.2f}x fast_rnnt's time "
                       f"(target <= {MAX_PRUNED_STEP:.0f}x) "
                       f"{_ok(1 / p['ratio'] <= MAX_PRUNED_STEP)}")
    return out


PAIR_COLUMNS = [
    ("case", "case", ""), ("seqloss", "ours", ""), ("peer", "peer", ""),
    ("seqloss_ms", "ours ms", ".1f"), ("peer_ms", "peer ms", ".1f"),
    ("ratio", "peer/ours", ".2f"), ("seqloss_mib", "ours MiB", ".1f"),
    ("peer_mib", "peer MiB", ".1f"),
]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--mem-child":
        threads = int(os.environ.get("SEQLOSS_BENCH_THREADS", "2"))
        _common.mem_child_main(implementations(), argv[1:], threads=threads)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the rows, ratios and machine info to this file")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SEQLOSS_BENCH_THREADS"] = str(args.threads)
    info = _common.machine_info()
    print(json.dumps(info))
    rows = run(cases(args.sizes), repeat=args.repeat, memory=not args.no_memory, impls=args.impl)
    pairs = pair_rows(rows)
    print()
    print(_common.format_table(pairs, PAIR_COLUMNS))
    for line in notes(pairs):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows, "pairs": pairs}, f, indent=1)


if __name__ == "__main__":
    main()
