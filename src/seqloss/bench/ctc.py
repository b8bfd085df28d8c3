"""CTC forward+backward: seqloss against torch and optax, time and peak memory.

    python benchmarks/bench_ctc.py [--sizes small|paper] [--repeat N] [--json FILE]
                                   [--no-memory] [--threads N]
    python -m seqloss.bench.ctc ...          (the same; ``seqloss bench --loss ctc`` too)

Pairings (float32, reduction="sum", blank 0, lengths uniform in 80-100% of the max):

- from logits: ``seqloss log_softmax+ctc`` and ``seqloss fused``
  (``fused_log_softmax=True``), each against ``torch log_softmax+ctc`` and
  ``optax ctc`` (``optax.ctc_loss`` takes logits; jitted value_and_grad);
- from given log-probs: ``seqloss ctc`` against ``torch ctc``.

Times are medians of interleaved rounds in one process; the ratio is
peer_time / seqloss_time (> 1: seqloss is faster). Peak memory is measured in
a fresh process per (implementation, case), see ``_common.py``.

Importable: ``cases(sizes)`` returns the case list, ``run(cases, ...)`` the
per-implementation rows, ``pair_rows(rows)`` the per-pairing ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from . import _common

MEM_CHILD = [sys.executable, "-m", "seqloss.bench.ctc"]

SIZES = {
    "paper": [(500, 16, 32, 100), (1000, 8, 1000, 200), (200, 32, 5000, 50)],
    "small": [(100, 4, 32, 20), (200, 4, 200, 40), (50, 8, 1000, 10)],
    "long": [(20000, 1, 30, 2000), (20000, 4, 30, 2000)],
    # Per-call overhead: a single short utterance, the demo's batch, a small batch.
    "tiny": [(20, 1, 10, 5), (26, 64, 7, 8), (50, 8, 20, 10)],
}

PAIRINGS = [
    ("logits", "seqloss log_softmax+ctc", ["torch log_softmax+ctc", "optax ctc"]),
    ("logits", "seqloss fused", ["torch log_softmax+ctc", "optax ctc"]),
    ("log-probs", "seqloss ctc", ["torch ctc"]),
]


def cases(sizes: str = "paper") -> list[dict]:
    """The benchmark cases: dicts with ``name, T, B, C, L, seed`` (JSON-serializable)."""
    return [
        {"name": f"T{T}-B{B}-C{C}-L{L}", "T": T, "B": B, "C": C, "L": L, "seed": 0}
        for T, B, C, L in SIZES[sizes]
    ]


def make_inputs(case: dict) -> dict:
    """Logits ``(T, B, C)`` float32, padded targets, lengths in 80-100% of the max."""
    T, B, C, L = case["T"], case["B"], case["C"], case["L"]
    g = torch.Generator().manual_seed(case.get("seed", 0))
    logits = torch.randn(T, B, C, generator=g)
    il = torch.randint(int(0.8 * T), T + 1, (B,), generator=g)
    tl = torch.randint(int(0.8 * L), L + 1, (B,), generator=g)
    tg = torch.randint(1, C, (B, L), generator=g)
    return {"logits": logits, "targets": tg, "input_lengths": il, "target_lengths": tl}


# --------------------------------------------------------------------------- implementations
def _seqloss_logsoftmax(case: dict):
    import seqloss

    d = make_inputs(case)
    x = d["logits"].requires_grad_()

    def fn():
        loss = seqloss.ctc_loss(x.log_softmax(-1), d["targets"], d["input_lengths"],
                                d["target_lengths"], reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _seqloss_fused(case: dict):
    import seqloss

    d = make_inputs(case)
    x = d["logits"].requires_grad_()

    def fn():
        loss = seqloss.ctc_loss(x, d["targets"], d["input_lengths"], d["target_lengths"],
                                reduction="sum", fused_log_softmax=True)
        return torch.autograd.grad(loss, x)[0]

    return fn


def _seqloss_logprobs(case: dict):
    import seqloss

    d = make_inputs(case)
    lp = d["logits"].log_softmax(-1).requires_grad_()

    def fn():
        loss = seqloss.ctc_loss(lp, d["targets"], d["input_lengths"], d["target_lengths"],
                                reduction="sum")
        return torch.autograd.grad(loss, lp)[0]

    return fn


def _torch_logsoftmax(case: dict):
    d = make_inputs(case)
    x = d["logits"].requires_grad_()

    def fn():
        loss = torch.nn.functional.ctc_loss(x.log_softmax(-1), d["targets"], d["input_lengths"],
                                            d["target_lengths"], reduction="sum")
        return torch.autograd.grad(loss, x)[0]

    return fn


def _torch_logprobs(case: dict):
    d = make_inputs(case)
    lp = d["logits"].log_softmax(-1).requires_grad_()

    def fn():
        loss = torch.nn.functional.ctc_loss(lp, d["targets"], d["input_lengths"],
                                            d["target_lengths"], reduction="sum")
        return torch.autograd.grad(loss, lp)[0]

    return fn


def _optax(case: dict):
    import jax
    import jax.numpy as jnp
    import optax

    d = make_inputs(case)
    T, L = case["T"], case["L"]
    logits = jnp.asarray(d["logits"].transpose(0, 1).contiguous().numpy())  # (B, T, C)
    il, tl = d["input_lengths"], d["target_lengths"]
    logit_pad = jnp.asarray((torch.arange(T)[None, :] >= il[:, None]).float().numpy())
    labels = jnp.asarray(d["targets"].to(torch.int32).numpy())
    label_pad = jnp.asarray((torch.arange(L)[None, :] >= tl[:, None]).float().numpy())

    @jax.jit
    def value_and_grad(z):
        return jax.value_and_grad(
            lambda z: optax.ctc_loss(z, logit_pad, labels, label_pad).sum())(z)

    def fn():
        _, g = value_and_grad(logits)
        return g.block_until_ready()

    return fn


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def implementations() -> dict[str, _common.Factory]:
    impls: dict[str, _common.Factory] = {
        "seqloss log_softmax+ctc": _seqloss_logsoftmax,
        "seqloss fused": _seqloss_fused,
        "torch log_softmax+ctc": _torch_logsoftmax,
        "seqloss ctc": _seqloss_logprobs,
        "torch ctc": _torch_logprobs,
    }
    if _have("optax") and _have("jax"):
        impls["optax ctc"] = _optax
    return impls


# --------------------------------------------------------------------------- runner
def run(case_list: list[dict], repeat: int = 5, memory: bool = True, impls: list[str] | None = None,
        log=print) -> list[dict]:
    """Time (interleaved, median) and optionally measure every implementation on every case.

    Returns one row per (case, implementation): ``case, T, B, C, L, impl, ms, times_ms, peak_mib``.
    """
    available = implementations()
    names = [n for n in (impls or list(available)) if n in available]
    return _common.run_cases(case_list, available, names, ("T", "B", "C", "L"), MEM_CHILD,
                             repeat, memory, log)


def pair_rows(rows: list[dict]) -> list[dict]:
    """Per case and pairing: seqloss vs each peer, ratio = peer_ms / seqloss_ms."""
    by = {(r["case"], r["impl"]): r for r in rows}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        for inp, ours, peers in PAIRINGS:
            if (case, ours) not in by:
                continue
            o = by[(case, ours)]
            for p in peers:
                if (case, p) not in by:
                    continue
                q = by[(case, p)]
                out.append({
                    "case": case, "input": inp, "seqloss": ours, "peer": p,
                    "seqloss_ms": o["ms"], "peer_ms": q["ms"], "ratio": q["ms"] / o["ms"],
                    "seqloss_mib": o["peak_mib"], "peer_mib": q["peak_mib"],
                })
    return out


PAIR_COLUMNS = [
    ("case", "case", ""), ("input", "input", ""), ("seqloss", "seqloss", ""), ("peer", "peer", ""),
    ("seqloss_ms", "seqloss ms", ".1f"), ("peer_ms", "peer ms", ".1f"),
    ("ratio", "peer/seqloss", ".2f"),
    ("seqloss_mib", "seqloss MiB", ".1f"), ("peer_mib", "peer MiB", ".1f"),
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows, "pairs": pairs}, f, indent=1)


if __name__ == "__main__":
    main()
