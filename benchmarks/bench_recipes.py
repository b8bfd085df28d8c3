"""The training-recipe features against the losses they extend: time and peak memory.

Three targets (issue "training-recipe features"), each a same-run ratio:

- ``delay_penalty``: each loss with ``delay_penalty=0.5`` against the same call with
  ``0.0`` (target: at most 1.03x); CTC also at 0.01 (k2's streaming recipes use
  0.0015-0.015): a large penalty spreads a frame's states past float64's range, which
  sends CTC's Numba sequences from its scaled-probability path to the extended one;
- ``hat_loss`` against ``rnnt_loss`` on the same logits (target: at most 1.2x);
- ``transducer_arc_logprobs``: forward + backward against one ``torch.logsumexp``
  over the logits (its one pass), and its extra peak memory over the logits' bytes
  (target: one gradient's worth, i.e. at most ~1.1x the logits).

Forward + backward, implementations interleaved in one process, medians with
[min-max]. Peak memory: growth of the peak RSS over one call in a fresh process.

    python benchmarks/bench_recipes.py                 # B=8 T=150 U=40 V=1024, 2 threads
    python benchmarks/bench_recipes.py --repeat 9 --only dp
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

import seqloss
from seqloss.bench import _common


def _inputs(a: argparse.Namespace) -> dict:
    g = torch.Generator().manual_seed(0)
    B, T, U, V = a.B, a.T, a.U, a.V
    return {
        "logits": torch.randn(B, T, U + 1, V, generator=g, requires_grad=True),
        "ctc": torch.randn(T * 2, B, a.C, generator=g).log_softmax(-1).requires_grad_(True),
        "tg": torch.randint(0, V - 9, (B, U), generator=g),
        "ctc_tg": torch.randint(1, a.C, (B, U), generator=g),
        "Tl": torch.full((B,), T), "tl": torch.full((B,), U), "ctc_Tl": torch.full((B,), 2 * T),
    }


def _calls(d: dict) -> dict[str, object]:
    x, tg, Tl, tl = d["logits"], d["tg"], d["Tl"], d["tl"]

    def back(loss: torch.Tensor) -> torch.Tensor:
        x.grad = None
        d["ctc"].grad = None
        loss.backward()
        return loss.detach()

    def ctc(dp: float):
        return lambda: back(seqloss.ctc_loss(d["ctc"], d["ctc_tg"], d["ctc_Tl"], tl,
                                             reduction="sum", delay_penalty=dp))

    def rnnt(dp: float):
        return lambda: back(seqloss.rnnt_loss(x, tg, Tl, tl, reduction="sum", delay_penalty=dp))

    def multiblank(dp: float):
        return lambda: back(seqloss.multiblank_rnnt_loss(x, tg, Tl, tl, [2, 4, 8],
                                                         reduction="sum", delay_penalty=dp))

    def tdt(dp: float):
        return lambda: back(seqloss.tdt_loss(x, tg, Tl, tl, [0, 1, 2, 3, 4], reduction="sum",
                                             delay_penalty=dp))

    def arcs():
        b, e = seqloss.transducer_arc_logprobs(x, tg, Tl, tl)
        x.grad = None
        (b.masked_fill(b.isinf(), 0).sum() + e.masked_fill(e.isinf(), 0).sum()).backward()
        return b.detach()

    def lse():
        x.grad = None
        y = torch.logsumexp(x, -1)
        y.sum().backward()
        return y.detach()

    return {
        "ctc dp=0": ctc(0.0), "ctc dp=0.01": ctc(0.01), "ctc dp=0.5": ctc(0.5),
        "rnnt dp=0": rnnt(0.0), "rnnt dp=0.5": rnnt(0.5),
        "multiblank dp=0": multiblank(0.0), "multiblank dp=0.5": multiblank(0.5),
        "tdt dp=0": tdt(0.0), "tdt dp=0.5": tdt(0.5),
        "hat": lambda: back(seqloss.hat_loss(x, tg, Tl, tl, reduction="sum")),
        "rnnt": rnnt(0.0),
        "arc_logprobs": arcs, "logsumexp": lse,
    }


GROUPS = {
    "dp": [("ctc dp=0.01", "ctc dp=0"), ("ctc dp=0.5", "ctc dp=0"), ("rnnt dp=0.5", "rnnt dp=0"),
           ("multiblank dp=0.5", "multiblank dp=0"), ("tdt dp=0.5", "tdt dp=0")],
    "hat": [("hat", "rnnt")],
    "arcs": [("arc_logprobs", "logsumexp")],
}
TARGETS = {"dp": 1.03, "hat": 1.2}


def _child(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads)
    fn = _calls(_inputs(a))[a.mem_child]
    fn()
    print(f"PEAK_MIB {_common.peak_of_call(fn):.3f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in (("B", 8), ("T", 150), ("U", 40), ("V", 1024), ("C", 100)):
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=sorted(GROUPS), action="append")
    p.add_argument("--mem-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mem_child:
        _child(a)
        return
    torch.set_num_threads(a.threads)
    print(json.dumps({"machine": _common.machine_info(), "B": a.B, "T": a.T, "U": a.U,
                      "V": a.V, "C": a.C, "threads": a.threads, "repeat": a.repeat}))
    calls = _calls(_inputs(a))
    for group in a.only or list(GROUPS):
        names = list(dict.fromkeys(n for pair in GROUPS[group] for n in pair))
        # Each pair interleaved on its own: in one cycle of every call, each call always
        # follows the same one (rotation keeps the cyclic order), and CTC's after TDT's
        # 200 MB gradient ran 1.11-1.15x slower than after another CTC call.
        ratios = []
        for mine, base in GROUPS[group]:
            times = _common.interleaved_times({mine: calls[mine], base: calls[base]}, a.repeat)
            med = {n: _common.median_ms(t) for n, t in times.items()}
            for n in (mine, base):
                lo, hi = min(times[n]) * 1e3, max(times[n]) * 1e3
                print(f"  {n:>18}: {med[n]:8.1f} ms [{lo:.1f}-{hi:.1f}]")
            ratios.append((mine, base, med[mine] / med[base]))
        for mine, base, r in ratios:
            tgt = TARGETS.get(group)
            verdict = "" if tgt is None else (" ok" if r <= tgt else f" OVER target {tgt}")
            print(f"  {mine} / {base}: {r:.3f}x{verdict}")
        if group == "arcs":
            mib = a.B * a.T * (a.U + 1) * a.V * 4 / 2**20
            for n in names:
                cmd = [sys.executable, __file__, "--mem-child", n] + [
                    f"--{k}={getattr(a, k)}" for k in ("B", "T", "U", "V", "C", "threads")]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                peak = float(out.stdout.strip().splitlines()[-1].split()[1])
                print(f"  {n:>18}: peak +{peak:.0f} MiB = {peak / mib:.2f}x the logits "
                      f"({mib:.0f} MiB)")


if __name__ == "__main__":
    main()
