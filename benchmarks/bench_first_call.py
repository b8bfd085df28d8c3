"""First call of each public entry point on a fresh Numba cache: wall and CPU seconds.

    python benchmarks/bench_first_call.py [--cases NAME ...] [--json FILE]

Each case runs in a subprocess of its own with ``NUMBA_CACHE_DIR`` set to a new temporary
folder, so nothing compiled by an earlier case or run is reused: the figure is what a user
waits for on a fresh install (Numba compiles the kernels the call reaches, for the dtypes it
uses). The subprocess imports torch and seqloss and builds small inputs before the clock
starts; the timed part is the call (forward, and backward for the losses). CPU is the
subprocess's user + system time over the same span, the steadier figure on a shared
machine. ``cached`` is a second call in the same process (the compiled code in memory);
``warm cache`` runs the case again in a new process reading the cache the first one wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_PRELUDE = """
import time, torch, seqloss
torch.manual_seed(0)
B, T, U, V = 2, 8, 3, 6
il, tl = torch.full((B,), T), torch.full((B,), U)
tg = torch.randint(0, V - 2, (B, U))
def joint(width, dtype=torch.float32):
    return torch.randn(B, T, U + 1, width, dtype=dtype).requires_grad_()
def enc_pred(width):
    lin = torch.nn.Linear(4, width)
    return (torch.randn(B, T, 4).requires_grad_(), torch.randn(B, U + 1, 4),
            lambda e, p: lin(torch.tanh(e[:, :, None] + p[:, None])))
"""

# name -> code run twice (first call, then cached); each defines nothing the other reads
CASES = {
    "ctc_loss float32": (
        "x = torch.randn(30, 3, 6).log_softmax(-1).requires_grad_()\n"
        "seqloss.ctc_loss(x, torch.randint(1, 6, (3, 5)), torch.full((3,), 30),"
        " torch.full((3,), 5)).backward()"),
    "ctc_loss float64": (
        "x = torch.randn(30, 3, 6, dtype=torch.float64).log_softmax(-1).requires_grad_()\n"
        "seqloss.ctc_loss(x, torch.randint(1, 6, (3, 5)), torch.full((3,), 30),"
        " torch.full((3,), 5)).backward()"),
    "rnnt_loss": "seqloss.rnnt_loss(joint(V), tg, il, tl).backward()",
    "tdt_loss": "seqloss.tdt_loss(joint(V + 3), tg, il, tl, [0, 1, 2], blank=V - 1).backward()",
    "multiblank_rnnt_loss": (
        "seqloss.multiblank_rnnt_loss(joint(V), tg, il, tl, [2]).backward()"),
    "rnnt_loss_simple": (
        "am = torch.randn(B, T, V).requires_grad_()\n"
        "lm = torch.randn(B, U + 1, V).requires_grad_()\n"
        "bd = torch.tensor([[0, 0, U, T]] * B)\n"
        "seqloss.rnnt_loss_simple(lm, am, tg, V - 1, bd).backward()"),
    "rnnt_loss_pruned": (
        "am = torch.randn(B, T, V).requires_grad_()\n"
        "lm = torch.randn(B, U + 1, V).requires_grad_()\n"
        "bd = torch.tensor([[0, 0, U, T]] * B)\n"
        "_, (px, py) = seqloss.rnnt_loss_simple(lm, am, tg, V - 1, bd, return_grad=True)\n"
        "r = seqloss.get_rnnt_prune_ranges(px, py, bd, 2)\n"
        "a, l = seqloss.do_rnnt_pruning(am, lm, r)\n"
        "seqloss.rnnt_loss_pruned(a + l, tg, r, V - 1, bd).backward()"),
    "transducer_lattice": (
        "lp = joint(V).log_softmax(-1)\n"
        "seqloss.transducer_lattice(lp[..., -1:], lp[..., :1], il, tl).sum().backward()"),
    "ctc_align": (
        "x = torch.randn(30, 3, 6).log_softmax(-1)\n"
        "seqloss.ctc_align(x, torch.randint(1, 6, (3, 5)), torch.full((3,), 30),"
        " torch.full((3,), 5))"),
    "rnnt_align": "seqloss.rnnt_align(joint(V).detach(), tg, il, tl)",
    "rnnt_loss_packed": (
        "x = torch.randn(int(sum(il * (tl + 1))), V).requires_grad_()\n"
        "seqloss.rnnt_loss_packed(x, tg, il, tl).backward()"),
    "hat_loss": "seqloss.hat_loss(joint(V), tg, il, tl).backward()",
    "rnnt_loss_smoothed": (
        "am = torch.randn(B, T, V).requires_grad_()\n"
        "lm = torch.randn(B, U + 1, V).requires_grad_()\n"
        "bd = torch.tensor([[0, 0, U, T]] * B)\n"
        "seqloss.rnnt_loss_smoothed(lm, am, tg, V - 1, boundary=bd).backward()"),
    "logmmexp": (
        "a = torch.randn(2, 5, 7).requires_grad_()\n"
        "seqloss.logmmexp(a, torch.randn(2, 7, 4)).sum().backward()"),
    "multiblank_rnnt_align": (
        "seqloss.multiblank_rnnt_align(joint(V).detach(), tg, il, tl, [2])"),
    "tdt_align": "seqloss.tdt_align(joint(V + 3).detach(), tg, il, tl, [0, 1, 2], blank=V - 1)",
    "transducer_arc_logprobs": (
        "x = joint(V)\n"
        "sum(o.masked_fill(o.isinf(), 0).sum()"
        " for o in seqloss.transducer_arc_logprobs(x, tg, il, tl)).backward()"),
    # the losses from the joint: encoder (B, T, 4), predictor (B, U + 1, 4), an additive joint
    "rnnt_loss_from_joint": "seqloss.rnnt_loss_from_joint(*enc_pred(V), tg, il, tl).backward()",
    "tdt_loss_from_joint": (
        "seqloss.tdt_loss_from_joint(*enc_pred(V + 3), tg, il, tl, [0, 1, 2], blank=V - 1)"
        ".backward()"),
    "multiblank_rnnt_loss_from_joint": (
        "seqloss.multiblank_rnnt_loss_from_joint(*enc_pred(V), tg, il, tl, [2]).backward()"),
    "hat_loss_from_joint": "seqloss.hat_loss_from_joint(*enc_pred(V), tg, il, tl).backward()",
}

_CHILD = _PRELUDE + """
import json, sys
code = sys.argv[1]
res = {}
for key in ("first", "cached"):
    c0, w0 = time.process_time(), time.perf_counter()
    exec(code)
    res[key] = (time.perf_counter() - w0, time.process_time() - c0)
print(json.dumps(res))
"""


def run_case(code: str, cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    p = subprocess.run([sys.executable, "-c", _CHILD, code], env=env, capture_output=True,
                       text=True)
    if p.returncode:
        raise RuntimeError(f"case failed:\n{code}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", choices=sorted(CASES), default=list(CASES))
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    rows = []
    print(f"{'entry point':24s} {'first wall':>10s} {'first CPU':>10s} {'cached':>8s} "
          f"{'warm cache':>10s}  (seconds)")
    for name in args.cases:
        with tempfile.TemporaryDirectory(prefix="seqloss-nbc-") as d:
            r = run_case(CASES[name], d)
            w = run_case(CASES[name], d)
        row = {"case": name, "first_wall_s": r["first"][0], "first_cpu_s": r["first"][1],
               "cached_s": r["cached"][0], "warm_cache_s": w["first"][0]}
        rows.append(row)
        print(f"{name:24s} {row['first_wall_s']:10.2f} {row['first_cpu_s']:10.2f} "
              f"{row['cached_s']:8.3f} {row['warm_cache_s']:10.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
