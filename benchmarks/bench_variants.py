"""Multi-blank RNN-T and TDT forward+backward beside seqloss's rnnt_loss and the peers.

    python benchmarks/bench_variants.py [--sizes tiny|small|paper|long] [--repeat N]
                                        [--threads N] [--no-memory] [--json FILE]
                                        [--loss multiblank|tdt] [--with-slow]

The RNN-T benchmark's ``(B, T, U+1, V)`` sizes (float32, full lengths,
``reduction="sum"``), one logits tensor per case read by every implementation:
multi-blank with big blanks ``[2, 4, 8]`` (classes ``V-2, V-3, V-4``, standard blank
``V-1``), TDT with durations ``[0, 1, 2, 3, 4]`` (the last 5 classes are the duration
logits), and ``seqloss.rnnt_loss`` on the same tensor. Peers when importable:
transformers' ``tdt_loss`` (on the two views of the tensor), NeMo's pure-PyTorch
``MultiblankRNNTLossPytorch`` / ``TDTLossPytorch`` (``--with-slow``; the TDT one
runs on CUDA only).

Reported per case: times (medians of interleaved rounds in one process), ``variant /
rnnt`` (target <= 1.5 on CPU), ``other / variant`` (transformers: target >= 20),
and the extra peak memory of one call over the logits' bytes in a fresh process
(target <= 1.1; the returned gradient counts). The same code as ``seqloss bench
--loss multiblank|tdt`` (``python -m seqloss.bench.transducer tdt``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

from seqloss.bench import transducer

VARIANTS = {"multiblank": transducer.variant("multiblank"), "tdt": transducer.variant("tdt")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="paper", choices=sorted(transducer.SIZES))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--json", help="write rows, pairs and machine info to this file")
    ap.add_argument("--loss", choices=sorted(VARIANTS), action="append",
                    help="only this variant (repeatable; default both)")
    ap.add_argument("--with-slow", action="store_true",
                    help="also NeMo's Python-loop references (minutes per call)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SEQLOSS_BENCH_THREADS"] = str(args.threads)
    info = _common.machine_info()
    print(json.dumps(info))
    out: dict = {"machine": info}
    for name in args.loss or list(VARIANTS):
        v = VARIANTS[name]
        rows = v.run(transducer.cases(args.sizes), repeat=args.repeat, memory=not args.no_memory,
                     with_slow=args.with_slow)
        pairs = v.pair_rows(rows)
        print(f"\n{name}\n")
        print(_common.format_table(pairs, transducer.PAIR_COLUMNS))
        print()
        print("\n".join(v.notes(pairs)), flush=True)
        out[name] = {"rows": rows, "pairs": pairs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
