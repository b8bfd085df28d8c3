"""Same-run before/after: every loss family's benchmark sizes on two commits, alternately.

    python benchmarks/bench_ab.py --old 14606d2 [--new HEAD] [--rounds 3] [--calls 9]
    python benchmarks/bench_ab.py --old 14606d2 --only ctc,rnnt

Each commit is checked out in a temporary git worktree; a fresh process per (commit,
round) imports that commit's ``seqloss`` (``PYTHONPATH`` = its ``src``), warms every
case up (Numba compiles, caches fill), then times each case's forward + backward
``--calls`` times; rounds alternate old, new, old, new... so both see the same
machine load. The table gives, per case, the minimum over every call of every
round, in ms, and new / old (a call under ~1 ms is timed as a loop of ~1 ms of calls,
and its sample is the loop's mean). Only public API that both commits have is used.

The cases are the sizes of the other benchmarks here (``bench_ctc.py``,
``bench_rnnt.py``, ``bench_variants.py``, ``bench_lattice.py``, ``bench_logmmexp.py``,
``bench_pruned.py``, ``bench_from_joint.py``), float32 on the CPU, 2 threads unless
``--threads``. Two derived rows hold what issue targets are stated as ratios within
one commit: ``from_joint / materialized`` and ``full joint / pruned pipeline``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = "--child"
SAMPLE_S = 1e-3  # below this a call is timed in loops of calls


# ----------------------------------------------------------------------------- child side
def _cases(only: set[str] | None):
    import torch
    from torch import nn

    import seqloss

    g = torch.Generator().manual_seed(0)

    def want(family: str) -> bool:
        return only is None or family in only

    def grad_of(loss, *xs):
        return torch.autograd.grad(loss, xs)

    cases = {}

    if want("ctc"):
        for T, B, C, S, fused in ((300, 8, 100, 40, False), (500, 16, 32, 100, True),
                                  (1000, 8, 1000, 200, False), (20, 1, 10, 5, False)):
            x = torch.randn(T, B, C, generator=g)
            if not fused:
                x = x.log_softmax(-1)
            x.requires_grad_()
            tg = torch.randint(1, C, (B, S), generator=g)
            il = torch.full((B,), T)
            tl = torch.full((B,), S)

            def f(x=x, tg=tg, il=il, tl=tl, fused=fused):
                kw = {"fused_log_softmax": True} if fused else {}
                grad_of(seqloss.ctc_loss(x, tg, il, tl, reduction="sum", **kw), x)
            cases[f"ctc_loss T{T} B{B} C{C} S{S}{' fused' if fused else ''}"] = f

    def joint_inputs(B, T, U, V, extra=0):
        x = torch.randn(B, T, U + 1, V + extra, generator=g).requires_grad_()
        tg = torch.randint(0, V - 1 - 3, (B, U), generator=g)
        return x, tg, torch.full((B,), T), torch.full((B,), U)

    if want("rnnt"):
        for B, T, U, V in ((8, 150, 40, 1024), (4, 200, 50, 128), (2, 500, 100, 128)):
            x, tg, Tl, Ul = joint_inputs(B, T, U, V)
            cases[f"rnnt_loss B{B} T{T} U{U} V{V}"] = (
                lambda x=x, tg=tg, Tl=Tl, Ul=Ul: grad_of(
                    seqloss.rnnt_loss(x, tg, Tl, Ul, reduction="sum"), x))

    if want("variants"):
        x, tg, Tl, Ul = joint_inputs(8, 150, 40, 1024)
        cases["multiblank_rnnt_loss [2,4,8] B8 T150 U40 V1024"] = (
            lambda x=x, tg=tg, Tl=Tl, Ul=Ul: grad_of(
                seqloss.multiblank_rnnt_loss(x, tg, Tl, Ul, [2, 4, 8], reduction="sum"), x))
        xd, tgd, Tld, Uld = joint_inputs(8, 150, 40, 1024, extra=5)
        cases["tdt_loss [0..4] B8 T150 U40 V1024"] = (
            lambda xd=xd, tgd=tgd, Tld=Tld, Uld=Uld: grad_of(
                seqloss.tdt_loss(xd, tgd, Tld, Uld, [0, 1, 2, 3, 4], reduction="sum"), xd))

    if want("lattice"):
        for B, T, U, bd, ed in ((4, 200, 50, (1,), (0,)), (8, 150, 40, (1,), (0,)),
                                (4, 200, 50, (1, 2, 3, 4), (0, 1, 2, 3, 4))):
            ab = torch.randn(B, T, U + 1, len(bd), generator=g, dtype=torch.float64) - 2
            ae = torch.randn(B, T, U + 1, len(ed), generator=g, dtype=torch.float64) - 2
            ab.requires_grad_()
            ae.requires_grad_()
            Tl, Ul = torch.full((B,), T), torch.full((B,), U)
            kind = "rnnt" if len(bd) == 1 else "tdt"
            cases[f"transducer_lattice {kind} B{B} T{T} U{U}"] = (
                lambda ab=ab, ae=ae, Tl=Tl, Ul=Ul, bd=bd, ed=ed: grad_of(
                    seqloss.transducer_lattice(ab, ae, Tl, Ul, bd, ed).sum(), ab, ae))

    if want("logmmexp"):
        for shape in ((8, 150, 256, 41), (16, 500, 512, 100)):
            Bm, M, K, N = shape
            a = torch.randn(Bm, M, K, generator=g).requires_grad_()
            b = torch.randn(Bm, K, N, generator=g).requires_grad_()
            cases[f"logmmexp ({Bm},{M},{K})x({K},{N})"] = (
                lambda a=a, b=b: grad_of(seqloss.logmmexp(a, b).sum(), a, b))

    if want("pruned"):
        B, T, S, C, s_range = 8, 300, 60, 500, 5
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
            grad_of(simple + pruned, am, lm)

        def full():
            logits = am[:, :, None] + lm[:, None]
            grad_of(seqloss.rnnt_loss(logits, sy, bnd[:, 3], bnd[:, 2], blank=0,
                                      reduction="sum"), am, lm)
        cases["pruned pipeline B8 T300 S60 C500 s_range5"] = pipeline
        cases["full joint rnnt_loss B8 T300 S60 C500"] = full

    if want("from_joint"):
        B, T, U, H, V = 8, 150, 40, 256, 1024

        class Joint(nn.Module):  # bench_from_joint.py's: Linear(tanh(enc + pred))
            def __init__(self) -> None:
                super().__init__()
                self.out = nn.Linear(H, V)

            def forward(self, e, p):  # (B, T, H), (B, U + 1, H) -> (B, T, U + 1, V)
                return self.out(torch.tanh(e[:, :, None] + p[:, None]))

        joint = Joint()
        enc = torch.randn(B, T, H, generator=g).requires_grad_()
        pred = torch.randn(B, U + 1, H, generator=g).requires_grad_()
        tg = torch.randint(0, V - 1, (B, U), generator=g)
        Tl, Ul = torch.full((B,), T), torch.full((B,), U)
        params = (enc, pred, *joint.parameters())

        def backward(loss):  # the parameters' gradients accumulate in .grad
            for p in params:
                p.grad = None
            loss.backward()

        def materialized():
            backward(seqloss.rnnt_loss(joint(enc, pred), tg, Tl, Ul, reduction="sum"))

        def from_joint():
            backward(seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, Ul, reduction="sum"))
        cases["rnnt materialized joint B8 T150 U40 H256 V1024"] = materialized
        cases["rnnt_loss_from_joint B8 T150 U40 H256 V1024"] = from_joint
    return cases


def child(only: set[str] | None, calls: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    cases = _cases(only)
    for fn in cases.values():  # compile and warm every case first
        fn()
    out = {}
    for name, fn in cases.items():
        # A sample of a fast case is a loop of calls (~1 ms of them; the per-call mean): a
        # single 30 us call's minimum moved by 5-10% between runs of the same code.
        t0 = time.perf_counter()
        fn()
        reps = max(1, min(1000, round(SAMPLE_S / (time.perf_counter() - t0))))
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            ts.append((time.perf_counter() - t0) / reps)
        out[name] = min(ts) * 1e3
    print(json.dumps(out))


# ----------------------------------------------------------------------------- parent side
def _worktree(repo: str, rev: str, where: str) -> str:
    path = os.path.join(where, rev.replace("/", "_"))
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "-q", path, rev],
                   check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the commit before (a git revision)")
    ap.add_argument("--new", default="HEAD", help="the commit after (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None,
                    help="comma list of: ctc,rnnt,variants,lattice,logmmexp,pruned,from_joint")
    ap.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else None
    if a.child:
        child(only, a.calls, a.threads)
        return
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True, cwd=os.path.dirname(os.path.abspath(__file__))
                          ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {k: _worktree(repo, rev, tmp) for k, rev in (("old", a.old), ("new", a.new))}
        best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
        try:
            for r in range(a.rounds):
                for k in ("old", "new"):
                    env = dict(os.environ, PYTHONPATH=os.path.join(trees[k], "src"))
                    argv = [sys.executable, os.path.abspath(__file__), CHILD, "--old", "-",
                            "--calls", str(a.calls), "--threads", str(a.threads)]
                    if a.only:
                        argv += ["--only", a.only]
                    res = subprocess.run(argv, env=env, capture_output=True, text=True)
                    if res.returncode:
                        sys.exit(f"{k} ({a.old if k == 'old' else a.new}) failed:\n{res.stderr}")
                    for name, ms in json.loads(res.stdout.strip().splitlines()[-1]).items():
                        best[k][name] = min(best[k].get(name, float("inf")), ms)
                    print(f"round {r + 1} {k} done", file=sys.stderr)
        finally:
            for path in trees.values():
                subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", path],
                               check=False)
    old, new = best["old"], best["new"]
    print(f"| case | old ({a.old}) ms | new ({a.new}) ms | new / old |")
    print("|---|---|---|---|")
    for name in new:
        if name in old:
            print(f"| {name} | {old[name]:.4g} | {new[name]:.4g} | {new[name] / old[name]:.3f} |")
        else:
            print(f"| {name} | - | {new[name]:.4g} | - |")
    for k, d in (("old", old), ("new", new)):
        m = d.get("rnnt materialized joint B8 T150 U40 H256 V1024")
        fj = d.get("rnnt_loss_from_joint B8 T150 U40 H256 V1024")
        full = d.get("full joint rnnt_loss B8 T300 S60 C500")
        pipe = d.get("pruned pipeline B8 T300 S60 C500 s_range5")
        if m and fj:
            print(f"{k}: rnnt_loss_from_joint / materialized = {fj / m:.2f}x")
        if full and pipe:
            print(f"{k}: full joint / pruned pipeline = {full / pipe:.2f}x")


if __name__ == "__main__":
    main()
