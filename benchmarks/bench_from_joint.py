"""Losses from the joint network against the materialized pipeline: time and peak memory.

The materialized pipeline: ``logits = joint(enc, pred)``, the full-joint loss
(``rnnt_loss``, ``multiblank_rnnt_loss`` or ``tdt_loss``), the backward through the
joint. The other: ``*_loss_from_joint`` (tiles of ``chunk_elements`` logits). The
joint is ``Linear(tanh(enc + pred))``; ``enc`` and ``pred`` require grad.

Time: forward + backward, the two implementations interleaved in one process,
medians. Peak memory: the growth of the peak RSS over one forward + backward in a
fresh process per implementation (after a small warm-up call), so the allocator of
one does not hide the other.

    python benchmarks/bench_from_joint.py                       # B=8 T=150 U=40 H=256 V=1024
    python benchmarks/bench_from_joint.py --variant tdt --repeat 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

import seqloss


class Joint(nn.Module):
    def __init__(self, H: int, W: int) -> None:
        super().__init__()
        self.out = nn.Linear(H, W)

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(e[:, :, None] + p[:, None]))


DURS = [0, 1, 2, 3, 4]
BIG = [2, 4, 8]


def _setup(a: argparse.Namespace, T: int | None = None):
    torch.manual_seed(0)
    T = a.T if T is None else T
    D = len(DURS) if a.variant == "tdt" else 0
    joint = Joint(a.H, a.V + D)
    enc = torch.randn(a.B, T, a.H, requires_grad=True)
    pred = torch.randn(a.B, a.U + 1, a.H, requires_grad=True)
    tg = torch.randint(0, a.V - 1 - len(BIG), (a.B, a.U))
    Tl = torch.full((a.B,), T)
    tl = torch.full((a.B,), a.U)
    return joint, enc, pred, tg, Tl, tl


def _step(a: argparse.Namespace, impl: str, joint, enc, pred, tg, Tl, tl) -> float:
    kw = {"chunk_elements": a.chunk} if impl == "from_joint" else {}
    if a.variant == "rnnt":
        if impl == "from_joint":
            loss = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, **kw)
        else:
            loss = seqloss.rnnt_loss(joint(enc, pred), tg, Tl, tl)
    elif a.variant == "tdt":
        if impl == "from_joint":
            loss = seqloss.tdt_loss_from_joint(enc, pred, joint, tg, Tl, tl, DURS, **kw)
        else:
            loss = seqloss.tdt_loss(joint(enc, pred), tg, Tl, tl, DURS)
    else:
        if impl == "from_joint":
            loss = seqloss.multiblank_rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, BIG, **kw)
        else:
            loss = seqloss.multiblank_rnnt_loss(joint(enc, pred), tg, Tl, tl, BIG)
    loss.backward()
    return float(loss.detach())


def _hwm_mib() -> float:
    """This process's peak RSS (VmHWM: per address space, so not inherited from the
    parent as ``ru_maxrss`` is across fork + exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_child(a: argparse.Namespace, impl: str) -> None:
    torch.set_num_threads(a.threads)
    small = _setup(a, T=4)
    _step(a, impl, *small)  # warm-up: numba compilation, allocator
    del small
    args = _setup(a)
    base = _hwm_mib()
    _step(a, impl, *args)
    print(json.dumps({"peak_mib": _hwm_mib() - base}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=150)
    p.add_argument("--U", type=int, default=40)
    p.add_argument("--H", type=int, default=256)
    p.add_argument("--V", type=int, default=1024)
    p.add_argument("--variant", choices=["rnnt", "tdt", "multiblank"], default="rnnt")
    p.add_argument("--chunk", type=int, default=None,
                   help="chunk_elements (default: the library's)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--impls", default="materialized,from_joint")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._child:
        _peak_child(a, a._child)
        return
    torch.set_num_threads(a.threads)
    impls = a.impls.split(",")
    args = _setup(a)
    times: dict[str, list[float]] = {i: [] for i in impls}
    for i in impls:  # warm-up
        _step(a, i, *args)
    for _ in range(a.repeat):
        for i in impls:
            for t in (args[0], args[1], args[2]):
                for q in (t.parameters() if isinstance(t, nn.Module) else [t]):
                    q.grad = None
            t0 = time.perf_counter()
            _step(a, i, *args)
            times[i].append(time.perf_counter() - t0)
    print(f"{a.variant} B={a.B} T={a.T} U={a.U} H={a.H} V={a.V} chunk={a.chunk} "
          f"threads={a.threads} repeat={a.repeat}")
    med = {i: statistics.median(times[i]) * 1e3 for i in impls}
    peaks = {}
    if not a.no_memory:
        for i in impls:
            cmd = [sys.executable, __file__, "--_child", i] + [
                f"--{k}={v}" for k, v in (("B", a.B), ("T", a.T), ("U", a.U), ("H", a.H),
                                          ("V", a.V), ("variant", a.variant),
                                          ("threads", a.threads))]
            if a.chunk is not None:
                cmd.append(f"--chunk={a.chunk}")
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            peaks[i] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]
    for i in impls:
        mem = f"  peak +{peaks[i]:.0f} MiB" if i in peaks else ""
        print(f"  {i:>13}: {med[i]:8.1f} ms (runs: {', '.join(f'{t * 1e3:.0f}' for t in times[i])})"
              f"{mem}")
    if "materialized" in med and "from_joint" in med:
        r = med["from_joint"] / med["materialized"]
        line = f"  time ratio from_joint / materialized: {r:.2f}x"
        if peaks:
            line += f"; memory ratio materialized / from_joint: " \
                    f"{peaks['materialized'] / max(peaks['from_joint'], 1e-9):.1f}x"
        print(line)


if __name__ == "__main__":
    main()
