"""Gradient precision of every differentiable public function against float64.

    python benchmarks/bench_precision.py [--cases NAME ...]

For each case of ``seqloss.testing.precision`` (CTC T=5000, S=1000; transducers T=1000,
U=100; the lattice also at T=4000), the relative Frobenius error of the gradient in
float32, float16 and bfloat16 against float64 on the same rounded inputs (target:
float32 <= 2e-6; half within its unit roundoff, 4.9e-4 / 3.9e-3). Where fast_rnnt is
importable (``../shared/peers``), its ``rnnt_loss_simple`` and ``rnnt_loss_smoothed``
on the same inputs as seqloss's, in float32 against its own float64.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

from seqloss.testing import precision as P

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fast_rnnt_cases() -> dict:
    try:
        import fast_rnnt
    except ImportError:
        return {}
    lm, am, sy = P._factored()
    lm2, am2, sy2 = P._factored(seed=11)

    def simple(lm, am):
        return fast_rnnt.rnnt_loss_simple(lm, am, sy, 0, reduction="none")

    def smoothed(lm, am):
        return fast_rnnt.rnnt_loss_smoothed(lm, am, sy2, 0, 0.1, 0.1, reduction="none")

    return {"fast_rnnt.rnnt_loss_simple": (simple, [lm, am]),
            "fast_rnnt.rnnt_loss_smoothed": (smoothed, [lm2, am2])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=None)
    args = ap.parse_args(argv)
    print(_common.machine_info())
    print("| function | float32 | float16 | bfloat16 |\n|---|---|---|---|")
    for name, make in P.CASES.items():
        if args.cases and name not in args.cases:
            continue
        fn, inputs = make()
        errs = [P.gradient_error(fn, inputs, dt) for dt in DTYPES]
        print(f"| {name} | " + " | ".join(f"{e:.2g}" for e in errs) + " |", flush=True)
    for name, (fn, inputs) in _fast_rnnt_cases().items():
        print(f"| {name} (peer) | {P.gradient_error(fn, inputs, torch.float32):.2g} | - | - |",
              flush=True)


if __name__ == "__main__":
    main()
