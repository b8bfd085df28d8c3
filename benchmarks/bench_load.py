"""The losses on a busy machine: a tiny call and the pruned pipeline beside busy processes.

    python benchmarks/bench_load.py [--rounds 3] [--calls 200] [--repeat 5] [--threads 2]
    python benchmarks/bench_load.py --old 4988aaa [--new HEAD]    # two commits, alternately

Two figures, each idle and beside processes that only burn CPU (started and stopped
here; each also stops by itself after ``--busy-s`` seconds or when its parent is gone):

- the tiny call: ``rnnt_loss`` B=1, T=20, U=5, V=32 plus ``ctc_loss`` B=1, T=20, C=32,
  S=5 on log-probabilities, forward and backward; the median of ``--calls`` calls, idle
  and beside TWO busy processes (target: loaded within 3x of idle), and loaded on one
  thread (no parallel region to wait on: the floor on a busy machine);
- the pruned pipeline (``rnnt_loss_simple`` -> ``get_rnnt_prune_ranges`` ->
  ``do_rnnt_pruning`` -> ``rnnt_loss_pruned``) and the full-joint ``rnnt_loss``, B=8,
  T=300, S=60, C=500, s_range=5, interleaved, medians of ``--repeat``; idle and beside
  ONE busy process (target: the pipeline >= 3x faster than the full joint loaded).

A round is one fresh process doing all four conditions, idle and loaded alternately, so
the two see the same machine; the table gives the median over rounds of each round's
median (and the minimum), and the ratios. With ``--old`` the rounds alternate between two
commits, each checked out in a temporary git worktree (as ``bench_ab.py``). The load
average at each round's start is printed: "idle" means nothing of ours beside the call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = "--child"
# A busy process: spins until its deadline or until its parent is gone (an orphan's
# parent becomes another process), whichever comes first.
BUSY = """
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), os.getppid()
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(100000):
        pass
"""


class Busy:
    """``n`` processes burning a CPU each while the ``with`` block runs."""

    def __init__(self, n: int, limit_s: float) -> None:
        self.n, self.limit_s, self.procs = n, limit_s, []

    def __enter__(self) -> Busy:
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(self.limit_s)])
                      for _ in range(self.n)]
        time.sleep(0.3)  # running before the timing starts
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


# ----------------------------------------------------------------------------- child side
def _tiny():
    import torch

    import seqloss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 20, 6, 32, generator=g).requires_grad_()
    tg = torch.randint(1, 32, (1, 5), generator=g)
    lp = torch.randn(20, 1, 32, generator=g).log_softmax(-1).requires_grad_()
    ctg = torch.randint(1, 32, (1, 5), generator=g)
    T, U = torch.tensor([20]), torch.tensor([5])

    def tiny():
        loss = (seqloss.rnnt_loss(x, tg, T, U, reduction="sum")
                + seqloss.ctc_loss(lp, ctg, T, U, reduction="sum"))
        return torch.autograd.grad(loss, (x, lp))

    return tiny


def _pruned():
    import torch

    import seqloss

    B, T, S, C, s_range = 8, 300, 60, 500, 5
    g = torch.Generator().manual_seed(0)
    am = torch.randn(B, T, C, generator=g).requires_grad_()
    lm = torch.randn(B, S + 1, C, generator=g).requires_grad_()
    sy = torch.randint(1, C, (B, S), generator=g)
    bnd = torch.zeros(B, 4, dtype=torch.int64)
    bnd[:, 2] = S
    bnd[:, 3] = T

    def pipeline():
        simple, (px, py) = seqloss.rnnt_loss_simple(lm, am, sy, 0, bnd, reduction="sum",
                                                    return_grad=True)
        ranges = seqloss.get_rnnt_prune_ranges(px, py, bnd, s_range)
        am_p, lm_p = seqloss.do_rnnt_pruning(am, lm, ranges)
        pruned = seqloss.rnnt_loss_pruned(am_p + lm_p, sy, ranges, 0, bnd, reduction="sum")
        return torch.autograd.grad(simple + pruned, (am, lm))

    def full():
        loss = seqloss.rnnt_loss(am[:, :, None] + lm[:, None], sy, bnd[:, 3], bnd[:, 2],
                                 blank=0, reduction="sum")
        return torch.autograd.grad(loss, (am, lm))

    return pipeline, full


def _times(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def child(calls: int, repeat: int, threads: int, busy_s: float) -> None:
    import torch

    from seqloss.bench._common import interleaved_times

    torch.set_num_threads(threads)
    tiny = _tiny()
    pipeline, full = _pruned()
    for fn in (tiny, pipeline, full):  # compile and warm up
        fn()
    out = {"load": os.getloadavg()[0]}
    for busy in (0, 2):
        with Busy(busy, busy_s):
            out[f"tiny busy{busy}"] = _times(tiny, calls)
            if busy:  # the same call on one thread: what is left when no region waits
                torch.set_num_threads(1)
                out["tiny busy2 1thread"] = _times(tiny, calls)
                torch.set_num_threads(threads)
    for busy in (0, 1):
        with Busy(busy, busy_s):
            t = interleaved_times({"pipeline": pipeline, "full": full}, repeat)
        out[f"pipeline busy{busy}"] = [1e3 * s for s in t["pipeline"]]
        out[f"full busy{busy}"] = [1e3 * s for s in t["full"]]
    print(json.dumps(out))


# ----------------------------------------------------------------------------- parent side
def _worktree(repo: str, rev: str, where: str) -> str:
    path = os.path.join(where, rev.replace("/", "_"))
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "-q", path, rev],
                   check=True)
    return path


def _report(name: str, rounds: list[dict], threads: int) -> None:
    def med(key):  # the median over rounds of each round's median; the minimum of all
        return (statistics.median(statistics.median(r[key]) for r in rounds),
                min(min(r[key]) for r in rounds))

    print(f"\n{name}: load average at each round's start "
          + ", ".join(f"{r['load']:.1f}" for r in rounds))
    print("| case | idle ms (median / min) | loaded ms (median / min) | loaded / idle |")
    print("|---|---|---|---|")
    rows = {}
    for case, busy in (("tiny", 2), ("pipeline", 1), ("full", 1)):
        i, b = med(f"{case} busy0"), med(f"{case} busy{busy}")
        rows[case] = (i[0], b[0])
        label = {"tiny": "tiny call (RNN-T B1 T20 U5 V32 + CTC B1 T20)",
                 "pipeline": "pruned pipeline B8 T300 S60 C500 r5",
                 "full": "full-joint rnnt_loss B8 T300 S60 C500"}[case]
        print(f"| {label}, {busy} busy | {i[0]:.3f} / {i[1]:.3f} | {b[0]:.3f} / {b[1]:.3f} "
              f"| {b[0] / i[0]:.2f}x |")
    (ti, tb), (pi, pb), (fi, fb) = rows["tiny"], rows["pipeline"], rows["full"]
    t1 = med("tiny busy2 1thread")[0]
    print(f"{name}: tiny call loaded / idle = {tb / ti:.2f}x (target <= 3x); loaded, "
          f"{threads} threads / 1 thread = {tb / t1:.2f}x")
    print(f"{name}: full joint / pipeline idle = {fi / pi:.2f}x, "
          f"with 1 busy process = {fb / pb:.2f}x (target >= 3x loaded)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200, help="tiny calls per condition")
    ap.add_argument("--repeat", type=int, default=5, help="pipeline/full calls per condition")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy-s", type=float, default=120.0,
                    help="a busy process stops by itself after this many seconds")
    ap.add_argument("--old", help="also run this commit, alternately (a git revision)")
    ap.add_argument("--new", default="HEAD", help="with --old: the commit after (default HEAD)")
    ap.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.calls, a.repeat, a.threads, a.busy_s)
        return
    argv = [sys.executable, os.path.abspath(__file__), CHILD, "--calls", str(a.calls),
            "--repeat", str(a.repeat), "--threads", str(a.threads), "--busy-s", str(a.busy_s)]
    with tempfile.TemporaryDirectory() as tmp:
        if a.old:
            repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                                  text=True, check=True,
                                  cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
            trees = {a.old: _worktree(repo, a.old, tmp), a.new: _worktree(repo, a.new, tmp)}
            envs = {k: dict(os.environ, PYTHONPATH=os.path.join(p, "src"))
                    for k, p in trees.items()}
        else:
            trees, envs = {}, {"this tree": dict(os.environ)}
        results: dict[str, list[dict]] = {k: [] for k in envs}
        try:
            for r in range(a.rounds):
                for k, env in envs.items():
                    res = subprocess.run(argv, env=env, capture_output=True, text=True)
                    if res.returncode:
                        sys.exit(f"{k} failed:\n{res.stderr[-4000:]}")
                    results[k].append(json.loads(res.stdout.strip().splitlines()[-1]))
                    print(f"round {r + 1} {k} done", file=sys.stderr)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", path],
                               check=False)
    for k, rounds in results.items():
        _report(k, rounds, a.threads)


if __name__ == "__main__":
    main()
