"""seqloss.logmmexp against the broadcast formula and the unsafe max-shift matmul.

    python benchmarks/bench_logmmexp.py [--repeat N] [--threads N] [--no-memory] [--exact]

Inputs are a simple-RNN-T-shaped pair: ``a = am (B, M=T, K=C)`` and ``b = lm^T
(B, K=C, N=S+1)``, float32 logits ``scale * randn``. Each implementation runs one
forward and backward (gradients of both inputs, incoming gradient ``randn``):

- ``seqloss``: ``seqloss.logmmexp`` (backend "auto": the CPU fast path);
- ``reference``: ``seqloss.logmmexp(..., backend="reference")`` (blocked, exact);
- ``broadcast``: ``torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], -2)``
  (exact, O(B M K N) memory);
- ``maxshift``: ``log(exp(a - max a) @ exp(b - max b) + tiny) + max a + max b``, k2's
  and fast_rnnt's formula (fast, wrong where the maxima sit on different ``k``);
- ``numba_exact`` (with ``--exact``; forward only): a plain exact Numba kernel, two
  passes over ``K`` per entry (max, then sum of exponentials), parallel over rows:
  the blocked exact kernel the fast path was measured against.

Times are interleaved medians in one process; peak memory is the extra peak RSS of
one call in a fresh process per (implementation, case) (``seqloss.bench._common``).
Targets (issue 10): ``seqloss`` within 3x ``maxshift``'s time and with at least 10x
less memory than ``broadcast``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

import seqloss

CASES = [
    {"name": "B8-M300-K500-N61", "B": 8, "M": 300, "K": 500, "N": 61, "scale": 1.0},
    {"name": "B4-M500-K2000-N101", "B": 4, "M": 500, "K": 2000, "N": 101, "scale": 1.0},
    {"name": "B8-M300-K500-N61-s30", "B": 8, "M": 300, "K": 500, "N": 61, "scale": 30.0},
]


def _inputs(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    B, M, K, N, s = case["B"], case["M"], case["K"], case["N"], case["scale"]
    a = torch.randn(B, M, K, generator=g) * s
    b = (torch.randn(B, N, K, generator=g) * s).transpose(1, 2)  # lm^T: a transposed view
    gout = torch.randn(B, M, N, generator=g)
    return a, b, gout


def _fwd_bwd(f):
    def make(case: dict):
        a0, b0, gout = _inputs(case)

        def run():
            a = a0.detach().requires_grad_()
            b = b0.detach().requires_grad_()
            out = f(a, b)
            return torch.autograd.grad(out, (a, b), gout)

        return run

    return make


def _maxshift(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ma = a.detach().amax(-1, keepdim=True)
    mb = b.detach().amax(-2, keepdim=True)
    tiny = torch.finfo(a.dtype).tiny
    return torch.log(torch.exp(a - ma) @ torch.exp(b - mb) + tiny) + ma + mb


def _broadcast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], dim=-2)


_EXACT = None


def _numba_exact_kernel():
    global _EXACT
    if _EXACT is None:
        import numba

        @numba.njit(parallel=True, cache=False, fastmath=False)
        def exact(a, b, out):
            B, M, K = a.shape
            N = b.shape[2]
            for r in numba.prange(B * M):
                bi, i = r // M, r % M
                for j in range(N):
                    m = -math.inf
                    for k in range(K):
                        v = a[bi, i, k] + b[bi, k, j]
                        m = v if v > m else m
                    if m == -math.inf:
                        out[bi, i, j] = m
                        continue
                    s = 0.0
                    for k in range(K):
                        s += math.exp(a[bi, i, k] + b[bi, k, j] - m)
                    out[bi, i, j] = math.log(s) + m

        _EXACT = exact
    return _EXACT


def _numba_exact(case: dict):
    a, b, _ = _inputs(case)
    an = a.numpy()
    bn = b.contiguous().numpy()
    kern = _numba_exact_kernel()

    def run():
        out = torch.empty(a.shape[0], a.shape[1], b.shape[2])
        kern(an, bn, out.numpy())
        return out

    return run


def implementations() -> dict[str, _common.Factory]:
    return {
        "seqloss": _fwd_bwd(seqloss.logmmexp),
        "reference": _fwd_bwd(lambda a, b: seqloss.logmmexp(a, b, backend="reference")),
        "broadcast": _fwd_bwd(_broadcast),
        "maxshift": _fwd_bwd(_maxshift),
        "numba_exact": _numba_exact,
    }


def _errors(case: dict) -> dict[str, float]:
    """Largest absolute error of seqloss and maxshift against float64 broadcasting (small B)."""
    a, b, _ = _inputs(case)
    a, b = a[:1], b[:1]
    exact = _broadcast(a.double(), b.double())
    return {
        "seqloss": (seqloss.logmmexp(a, b).double() - exact).abs().max().item(),
        "maxshift": (_maxshift(a, b).double() - exact).abs().max().item(),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--mem-child":
        threads = int(os.environ.get("SEQLOSS_BENCH_THREADS", "2"))
        _common.mem_child_main(implementations(), argv[1:], threads=threads)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--exact", action="store_true", help="also the exact Numba kernel (slow)")
    ap.add_argument("--reference", action="store_true", help="also the reference backend (slow)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SEQLOSS_BENCH_THREADS"] = str(args.threads)
    print(json.dumps(_common.machine_info()))
    impls = implementations()
    names = ["seqloss", "maxshift", "broadcast"]
    if args.reference:
        names.append("reference")
    if args.exact:
        names.append("numba_exact")
    cases = [c for c in CASES if not args.cases or c["name"] in args.cases.split(",")]
    rows = []
    for case in cases:
        fns = {n: impls[n](case) for n in names}
        times = _common.interleaved_times(fns, args.repeat)
        del fns
        err = _errors(case)
        for n in names:
            peak = None
            if not args.no_memory:
                peak = _common.peak_memory_subprocess(os.path.abspath(__file__), n, case)
            rows.append({"case": case["name"], "impl": n, "ms": _common.median_ms(times[n]),
                         "peak_mib": peak, "max_err": err.get(n)})
            print(f"  {case['name']:24s} {n:12s} {rows[-1]['ms']:9.2f} ms"
                  + ("" if peak is None else f" {peak:9.1f} MiB"), flush=True)
    print()
    for case in cases:
        r = {x["impl"]: x for x in rows if x["case"] == case["name"]}
        ms = r["seqloss"]["ms"] / r["maxshift"]["ms"]
        line = f"{case['name']}: time seqloss/maxshift = {ms:.2f}x"
        if r["seqloss"]["peak_mib"] and r["broadcast"]["peak_mib"]:
            line += (f", memory broadcast/seqloss = "
                     f"{r['broadcast']['peak_mib'] / max(r['seqloss']['peak_mib'], 1e-3):.1f}x")
        print(line)
    print()
    print(_common.format_table(rows, [("case", "case", ""), ("impl", "impl", ""),
                                      ("ms", "ms (fwd+bwd)", ".2f"),
                                      ("peak_mib", "peak MiB", ".1f"),
                                      ("max_err", "max abs err (nats)", ".3g")]))


if __name__ == "__main__":
    main()
