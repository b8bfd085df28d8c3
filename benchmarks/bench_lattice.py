"""seqloss.transducer_lattice on RNN-T arcs against the recursion inside rnnt_loss.

    python benchmarks/bench_lattice.py [--repeat N] [--threads N] [--sizes paper|small]

For each RNN-T case (seqloss.bench.transducer's list), the float64 arc scores that
``rnnt_loss`` builds (blank and target log-probabilities), then, interleaved in one
process:

- ``inner``: the CPU backend's lattice kernel as ``rnnt_loss`` calls it (alpha,
  beta and the arc occupations, float64);
- ``public``: ``seqloss.transducer_lattice`` on the same arcs, forward and backward
  (the op's checks, dispatch, the same kernel, and the backward's hand-off).

The ratio public / inner is the public op's overhead (target: <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

import seqloss
from seqloss.bench import module
from seqloss.transducer.lattice import numba_cpu

rnnt_bench = module("rnnt")  # seqloss.bench.transducer's RNN-T benchmark


def _arcs(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = rnnt_bench.make_inputs(case)
    lp = d["logits"].double().log_softmax(-1)
    B, T, U1, V = lp.shape
    tg = d["targets"]
    ab = lp[..., :1].contiguous()  # blank 0
    ae = torch.cat([lp[:, :, : U1 - 1].gather(3, tg[:, None, :, None].expand(B, T, U1 - 1, 1)),
                    torch.zeros(B, T, 1, 1, dtype=lp.dtype)], 2).contiguous()
    return ab, ae, d["logit_lengths"], d["target_lengths"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="paper", choices=sorted(rnnt_bench.SIZES))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(_common.machine_info())
    print("| case | inner ms | public ms | public / inner |\n|---|---|---|---|")
    for case in rnnt_bench.cases(args.sizes):
        ab, ae, il, tl = _arcs(case)

        def inner(ab=ab, ae=ae, il=il, tl=tl):
            return numba_cpu.transducer_lattice(ab, ae, il, tl, (1,), (0,), True)

        def public(ab=ab, ae=ae, il=il, tl=tl):
            a = ab.detach().requires_grad_()
            e = ae.detach().requires_grad_()
            ll = seqloss.transducer_lattice(a, e, il, tl, backend="numba")
            return torch.autograd.grad(ll.sum(), (a, e))

        times = _common.interleaved_times({"inner": inner, "public": public}, args.repeat)
        ti, tp = _common.median_ms(times["inner"]), _common.median_ms(times["public"])
        print(f"| {case['name']} | {ti:.2f} | {tp:.2f} | {tp / ti:.2f} |", flush=True)


if __name__ == "__main__":
    main()
