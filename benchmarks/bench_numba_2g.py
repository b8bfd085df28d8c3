"""The Numba CTC path on a log-probability tensor of more than 2**31 elements.

    python benchmarks/bench_numba_2g.py [--grad] [--json FILE]

``(T, B, C) = (64, 2**20 + 1, 32)``: 2,147,485,696 float32 elements (8.6 GB; ``--grad``
doubles it), so the last sequences' elements lie past ``2**31`` and any 32-bit offset
arithmetic would read the wrong memory. Every sequence holds the same uniform
log-probabilities except the last two, which get their own random ones; their losses
(and with ``--grad`` their gradient rows) are compared with torch's CTC on those two
sequences alone, and the first sequence's with torch's on its own row. Refuses to run
(exit 2) when ``/proc/meminfo``'s MemAvailable is short of what it needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import seqloss

T, B, C, S = 64, 2**20 + 1, 32, 8


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grad", action="store_true", help="forward and backward (twice the memory)")
    p.add_argument("--json")
    a = p.parse_args()
    n = T * B * C
    need = n * 4 * (2 if a.grad else 1) * 1.15 + 2**30
    have = _available_bytes()
    if have < need:
        print(f"skipped: needs {need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available")
        return 2
    assert n > 2**31
    g = torch.Generator().manual_seed(0)
    x = torch.full((T, B, C), -float(torch.log(torch.tensor(float(C)))), dtype=torch.float32)
    tail = torch.randn(T, 2, C, generator=g).log_softmax(-1)
    x[:, -2:] = tail
    x.requires_grad_(a.grad)
    targets = torch.randint(1, C, (B, S), generator=g)
    il = torch.full((B,), T, dtype=torch.int64)
    tl = torch.full((B,), S, dtype=torch.int64)
    t0 = time.perf_counter()
    loss = seqloss.ctc_loss(x, targets, il, tl, reduction="none", backend="numba")
    grad = None
    if a.grad:
        loss.sum().backward()
        grad = x.grad
    seconds = time.perf_counter() - t0
    # Oracle: torch's CTC on the first and the last two sequences alone.
    ref_first = torch.nn.functional.ctc_loss(x.detach()[:, :1].double(), targets[:1], il[:1],
                                             tl[:1], reduction="none")
    tail64 = tail.double().requires_grad_(a.grad)
    ref_tail = torch.nn.functional.ctc_loss(tail64, targets[-2:], il[-2:], tl[-2:],
                                            reduction="none")
    err = max(abs(float(loss[0]) - float(ref_first[0])),
              *(abs(float(u) - float(v)) for u, v in zip(loss[-2:], ref_tail, strict=True)))
    out = {"T": T, "B": B, "C": C, "elements": n, "grad": a.grad, "seconds": round(seconds, 1),
           "max_abs_loss_error": err}
    if a.grad:
        ref_tail.sum().backward()
        # torch's gradient is exp(lp) - occupation; seqloss's is -occupation (README).
        ref_g = tail64.grad - tail64.detach().exp()
        out["max_abs_grad_error"] = float((grad[:, -2:].double() - ref_g).abs().max())
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    ok = err < 1e-3 and out.get("max_abs_grad_error", 0.0) < 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
