"""RNN-T forward+backward: seqloss against torchaudio, optimized_transducer, fast_rnnt and
warprnnt-numba.

    python benchmarks/bench_rnnt.py [--repeat N] [--threads N] [--no-memory] [--json FILE]
                                    [--with-warprnnt-numba] [--cases NAME,...]

Cases (float32, full lengths, blank 0, reduction="sum"): (B=4, T=200, U=50, V=256),
(B=8, T=150, U=40, V=1024), (B=2, T=500, U=100, V=128). Every implementation
importable in the running environment is measured; the others are skipped
(see CONTRIBUTING.md, "Peer libraries").

Reported per (implementation, case):
- time: median of interleaved rounds in one process (each implementation once
  per round, so a noisy shared machine slows all alike);
- ``x floor``: that time divided by one ``torch.logsumexp`` pass over ``V`` of
  the same logits, measured in the same rounds: the loss needs one ``exp`` per
  logit, so this pass is the floor;
- ``x seqloss``: the implementation's time over seqloss's;
- peak extra memory of one call as a multiple of the logits' size, in a fresh
  process per (implementation, case): VmHWM - VmRSS after ``clear_refs``, with
  ``MALLOC_MMAP_THRESHOLD_=65536`` (CONTRIBUTING.md, "Benchmarks"). The gradient
  the call returns counts.

Implementations:
- ``seqloss``: ``rnnt_loss`` (auto backend: numba on CPU), gradient by autograd;
- ``seqloss inplace``: ``inplace_grad=True``; each call first copies the pristine
  logits into the working leaf (the copy is timed, no allocation);
- ``optimized_transducer``: packed logits, ``from_log_softmax=False`` (it writes
  the gradient over its input, as seqloss's in-place mode; same copy first);
- ``fast_rnnt``: ``fast_rnnt.rnnt_loss`` (full joint), boundary from the lengths;
- ``torchaudio``: ``torchaudio.functional.rnnt_loss`` (int32 targets/lengths);
- ``warprnnt-numba``: only with ``--with-warprnnt-numba`` (its CPU path is
  Python loops: tens of seconds per call or more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

from seqloss.bench import module

rnnt_bench = module("rnnt")  # seqloss.bench.transducer's RNN-T benchmark

THREADS = 2
# The one RNN-T case list (seqloss.bench.transducer, also behind `seqloss bench`).
CASES = rnnt_bench.cases("paper")
make_inputs = rnnt_bench.make_inputs


# --------------------------------------------------------------------------- implementations
def _floor(case: dict):
    x = make_inputs(case)["logits"]
    return lambda: torch.logsumexp(x, -1)


def _seqloss(case: dict):
    import seqloss

    d = make_inputs(case)
    x = d["logits"].requires_grad_()

    def fn():
        loss = seqloss.rnnt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                 blank=0, reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _seqloss_inplace(case: dict):
    import seqloss

    d = make_inputs(case)
    x0 = d["logits"]
    x = x0.clone().requires_grad_()

    def fn():
        with torch.no_grad():
            x.copy_(x0)
        loss = seqloss.rnnt_loss(x, d["targets"], d["logit_lengths"], d["target_lengths"],
                                 blank=0, reduction="sum", inplace_grad=True)
        return torch.autograd.grad(loss, x)[0]

    return fn


def _optimized_transducer(case: dict):
    import optimized_transducer

    d = make_inputs(case)
    x0 = d["logits"].reshape(-1, case["V"])  # full lengths: packed == padded rows
    x = x0.clone().requires_grad_()
    tg = d["targets"].int()
    il, tl = d["logit_lengths"].int(), d["target_lengths"].int()

    def fn():
        with torch.no_grad():
            x.copy_(x0)
        loss = optimized_transducer.transducer_loss(x, tg, il, tl, blank=0, from_log_softmax=False,
                                                    reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _fast_rnnt(case: dict):
    import fast_rnnt

    d = make_inputs(case)
    x = d["logits"].requires_grad_()
    B = case["B"]
    boundary = torch.zeros(B, 4, dtype=torch.int64)
    boundary[:, 2] = d["target_lengths"]
    boundary[:, 3] = d["logit_lengths"]

    def fn():
        loss = fast_rnnt.rnnt_loss(x, d["targets"], termination_symbol=0, boundary=boundary,
                                   reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _torchaudio(case: dict):
    import warnings

    import torchaudio.functional as F

    warnings.filterwarnings("ignore")
    d = make_inputs(case)
    x = d["logits"].requires_grad_()
    tg = d["targets"].int()
    il, tl = d["logit_lengths"].int(), d["target_lengths"].int()

    def fn():
        loss = F.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _warprnnt_numba(case: dict):
    from warprnnt_numba import RNNTLossNumba

    d = make_inputs(case)
    x = d["logits"].requires_grad_()
    f = RNNTLossNumba(blank=0, reduction="sum")

    def fn():
        loss = f(x, d["targets"].int(), d["logit_lengths"].int(), d["target_lengths"].int())
        return torch.autograd.grad(loss, x)[0]

    return fn


IMPLS = {
    "logsumexp (floor)": _floor,
    "seqloss": _seqloss,
    "seqloss inplace": _seqloss_inplace,
    "optimized_transducer": _optimized_transducer,
    "fast_rnnt": _fast_rnnt,
    "torchaudio": _torchaudio,
    "warprnnt-numba": _warprnnt_numba,
}
PEER_MODULES = {
    "optimized_transducer": "optimized_transducer",
    "fast_rnnt": "fast_rnnt",
    "torchaudio": "torchaudio",
    "warprnnt-numba": "warprnnt_numba",
}


def available(with_warprnnt: bool) -> list[str]:
    import importlib.util

    out = []
    for name in IMPLS:
        mod = PEER_MODULES.get(name)
        if name == "warprnnt-numba" and not with_warprnnt:
            continue
        if mod is not None and importlib.util.find_spec(mod) is None:
            continue
        out.append(name)
    return out


def run(cases: list[dict], impls: list[str], repeat: int, memory: bool) -> list[dict]:
    rows = []
    for case in cases:
        fns = {}
        for name in impls:
            try:
                fns[name] = IMPLS[name](case)
            except Exception as e:  # noqa: BLE001 -- a broken peer is reported, not fatal
                sys.stderr.write(f"[skip] {name} {case['name']}: {type(e).__name__}: {e}\n")
        slow = {k: v for k, v in fns.items() if k == "warprnnt-numba"}
        fast = {k: v for k, v in fns.items() if k not in slow}
        times = _common.interleaved_times(fast, repeat=repeat)
        for k, v in slow.items():
            times.update(_common.interleaved_times({k: v}, repeat=1, warmup=0))
        floor = _common.median_ms(times["logsumexp (floor)"])
        ours = _common.median_ms(times["seqloss"]) if "seqloss" in times else None
        nbytes = case["B"] * case["T"] * (case["U"] + 1) * case["V"] * 4
        for name, ts in times.items():
            ms = _common.median_ms(ts)
            row = {"case": case["name"], "impl": name, "ms": ms, "x_floor": ms / floor,
                   "x_seqloss": ms / ours if ours else None}
            if memory and name != "logsumexp (floor)":
                mib = _common.peak_memory_subprocess(os.path.abspath(__file__), name, case)
                row["peak_x_logits"] = None if mib is None else mib * 2**20 / nbytes
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--mem-child":
        os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
        _common.mem_child_main(IMPLS, argv[1:], threads=THREADS)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--with-warprnnt-numba", action="store_true")
    p.add_argument("--cases", default="")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = [c for c in CASES if not args.cases or c["name"] in args.cases.split(",")]
    impls = available(args.with_warprnnt_numba)
    print(json.dumps(_common.machine_info()))
    rows = run(cases, impls, args.repeat, not args.no_memory)
    print()
    print(_common.format_table(rows, [
        ("case", "case", ""), ("impl", "implementation", ""), ("ms", "time (ms)", ".1f"),
        ("x_floor", "x logsumexp", ".2f"), ("x_seqloss", "x seqloss", ".2f"),
        ("peak_x_logits", "peak extra (x logits)", ".2f"),
    ]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": _common.machine_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
