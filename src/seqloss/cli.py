"""The ``seqloss`` command: ``demo``, ``doctor FILE``, ``bench`` and ``warmup``.

Exit status: 0 on success; 1 when ``doctor`` finds a problem (a non-finite or
infeasible sequence, or arguments the loss rejects); 2 for bad usage or an
unreadable file. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _fail(prog: str, message: str, status: int = EXIT_USAGE) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status


def _console():  # -> a rich Console (rich imported on first use)
    from rich.console import Console

    c = Console()
    if not c.is_terminal:  # piped: don't squeeze tables into 80 columns
        c = Console(width=max(c.width, 120))
    return c


# --------------------------------------------------------------------------- demo
def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(steps=args.steps, out=args.out, seed=args.seed, backend=args.backend,
                    console=_console())


# --------------------------------------------------------------------------- doctor
def _numpy_globals() -> list:
    """numpy's array and scalar reconstructors and integer dtypes, for ``weights_only``."""
    import numpy as np

    core = getattr(np, "_core", None)
    if core is None or not hasattr(core, "multiarray"):
        core = np.core  # numpy < 2
    ints = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
            np.bool_)
    return [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype,
            *ints, *(type(np.dtype(t)) for t in ints)]


def _load_args(path: str) -> dict | str:
    """The saved dict, or a one-line reason it cannot be used."""
    # A path that cannot be a file fails before torch.load is reached.
    if not os.path.exists(path):
        return f"cannot read {path}: no such file"
    if os.path.isdir(path):
        return f"cannot read {path}: it is a directory"
    import torch

    try:
        # weights_only: a file from elsewhere cannot run code; numpy arrays and scalars
        # (lengths may be numpy arrays) are allowed as plain data.
        with torch.serialization.safe_globals(_numpy_globals()):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return f"cannot read {path}: no such file"
    except IsADirectoryError:
        return f"cannot read {path}: it is a directory"
    except Exception as e:  # noqa: BLE001 -- any load failure is "unreadable"
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # torch's message has colours
        first = text.splitlines()[0] if text else type(e).__name__
        return f"cannot read {path} as a torch.save'd file ({first})"
    if not isinstance(obj, dict):
        return (f"{path} holds a {type(obj).__name__}, "
                "expected a dict of loss arguments with a 'kind'")
    kind = obj.get("kind")
    from ._core.registry import NAMES

    if kind not in NAMES:
        return f"{path}: 'kind' must be one of {', '.join(map(repr, NAMES))}, got {kind!r}"
    return obj


def _cmd_doctor(args: argparse.Namespace) -> int:
    prog = "seqloss doctor"
    loaded = _load_args(args.file)  # a bad file fails before the loss's modules load
    if isinstance(loaded, str):
        return _fail(prog, loaded)
    from ._core.errors import InputError
    from .diagnose import diagnose

    kwargs = dict(loaded)
    kind = kwargs.pop("kind")
    kwargs.pop("reduction", None)
    kwargs.pop("validate", None)  # the doctor checks the values: bad ones are its finding
    if args.backend:
        kwargs["backend"] = args.backend
    try:
        report = diagnose(kind, **kwargs)
    except NotImplementedError as e:
        return _fail(prog, str(e))
    except (InputError, TypeError, ValueError) as e:
        # The saved arguments fail the loss's own validation: that is the diagnosis.
        msg = f"{type(e).__name__}: {e}"
        if args.json:
            print(json.dumps({"kind": kind, "ok": False,
                              "error": {"type": type(e).__name__, "message": str(e)}}))
        else:
            print(f"{kind} arguments in {args.file} are invalid: {msg}")
        return EXIT_PROBLEM
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    else:
        print(report)
    return EXIT_OK if report.ok else EXIT_PROBLEM


# --------------------------------------------------------------------------- bench
def _cmd_bench(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from . import bench

    prog = "seqloss bench"
    losses = [args.loss] if args.loss else list(bench.LOSSES)
    torch.set_num_threads(args.threads)
    console = _console()
    omp = os.environ.get("OMP_WAIT_POLICY", "default (active)")
    console.print(f"threads: {args.threads}, OMP_WAIT_POLICY: {omp}", markup=False)
    out: dict = {"machine": None}
    noisy_any = False
    for loss in losses:
        mod = bench.module(loss)
        impls = list(mod.implementations())
        libs = {bench.library(n) for n in impls} - {"seqloss"}
        if args.peers is not None:
            wanted = {x.strip() for x in args.peers.split(",") if x.strip()}
            known = {bench.library(n) for n in getattr(mod, "IMPLS", impls)} | libs
            if wanted - known:
                return _fail(prog, f"--peers: unknown {loss} peer(s) {sorted(wanted - known)}; "
                             f"expected some of {sorted(known - {'seqloss'})}")
            impls = [n for n in impls if bench.library(n) in wanted | {"seqloss"}]
            libs &= wanted
        console.print(f"{loss}: timing seqloss against {', '.join(sorted(libs)) or 'no peer'} "
                      "(peers that are not installed are skipped)", markup=False)
        cs = mod.cases(args.sizes)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task(f"{loss} ({args.sizes})", total=len(cs) * len(impls))
            rows = mod.run(cs, repeat=args.repeats, memory=args.memory, impls=impls,
                           log=lambda line, task=task: progress.update(task, advance=1,
                                                                       description=line.strip()))
        pairs = mod.pair_rows(rows)
        table = Table(title=f"{loss}: {args.sizes} sizes, float32, CPU, forward + backward",
                      caption="ratio = peer time / seqloss time (> 1: seqloss is faster); "
                      "medians of interleaved rounds, min - max in brackets; ? = a spread over "
                      f"{_NOISY:.0%} of the median")
        times = {(r["case"], r["impl"]): r.get("times_ms") or [r["ms"]] for r in rows}
        for col, justify in (("case", "left"), ("seqloss", "left"), ("peer", "left"),
                             ("seqloss ms", "right"), ("peer ms", "right"), ("ratio", "right")):
            table.add_column(col, justify=justify)
        if args.memory:
            table.add_column("seqloss MiB", justify="right")
            table.add_column("peer MiB", justify="right")
        for p in pairs:
            ts, tp = times.get((p["case"], p["seqloss"])), times.get((p["case"], p["peer"]))
            noisy = _spread(ts) > _NOISY or _spread(tp) > _NOISY
            noisy_any |= noisy
            row = [p["case"], p["seqloss"], p["peer"], _ms(p["seqloss_ms"], ts),
                   _ms(p["peer_ms"], tp), f"{p['ratio']:.2f}x" + ("?" if noisy else "")]
            if args.memory:
                row += [_mib(p["seqloss_mib"]), _mib(p["peer_mib"])]
            table.add_row(*row)
        if not pairs:
            for r in rows:
                table.add_row(r["case"], r["impl"], "-", f"{r['ms']:.2f}", "-", "-",
                              *(["-", "-"] if args.memory else []))
        console.print(table)
        for line in getattr(mod, "notes", lambda _: [])(pairs):  # the family's own targets
            console.print(line, markup=False)
        out[loss] = {"rows": rows, "pairs": pairs}
    if noisy_any:
        console.print(f"warning: a figure marked ? varied by more than {_NOISY:.0%} of its "
                      "median across rounds, so its ratio is noise: the machine is busy, or "
                      "torch's OpenMP workers spin against the other library's threads; rerun "
                      "with OMP_WAIT_POLICY=passive, --threads 1 or more --repeats",
                      markup=False)
    if args.json:
        from .bench._common import machine_info

        out["machine"] = machine_info()
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        console.print(f"results written to {args.json}", markup=False)
    return EXIT_OK


_NOISY = 0.5  # (max - min) / median above which a ratio says nothing


def _spread(ts: list[float] | None) -> float:
    if not ts or len(ts) < 2:
        return 0.0
    med = sorted(ts)[len(ts) // 2]
    return (max(ts) - min(ts)) / med if med > 0 else 0.0


def _ms(median: float, ts: list[float] | None) -> str:
    if not ts or len(ts) < 2:
        return f"{median:.2f}"
    return f"{median:.2f} [{min(ts):.2f} - {max(ts):.2f}]"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# --------------------------------------------------------------------------- warmup
_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _cmd_warmup(args: argparse.Namespace) -> int:
    import time

    import torch

    from . import warmup as W

    prog = "seqloss warmup"
    dtypes = None
    if args.dtypes is not None:
        names = [x.strip() for x in args.dtypes.split(",") if x.strip()]
        bad = [n for n in names if n not in _DTYPES]
        if bad or not names:
            return _fail(prog, f"--dtypes: expected some of {', '.join(_DTYPES)}, got "
                         f"{args.dtypes!r}")
        dtypes = [getattr(torch, n) for n in names]
    unknown = [e for e in args.entries if e not in W.ENTRIES]
    if unknown:
        return _fail(prog, f"unknown entry point(s) {', '.join(unknown)}; expected some of "
                     f"{', '.join(W.ENTRIES)}")
    import numba

    where = (f"NUMBA_CACHE_DIR={numba.config.CACHE_DIR}" if numba.config.CACHE_DIR else
             f"__pycache__ beside the sources in {os.path.dirname(os.path.abspath(__file__))} "
             "(Numba's user cache folder if those are read-only)")
    print(f"compiling seqloss's CPU kernels into the Numba cache: {where}", flush=True)
    width = max(len(c.name) for c, _ in W.cases(args.entries or None, dtypes)) + 1

    def log(case, dt, s):
        print(f"  {case.name:<{width}} {str(dt).replace('torch.', ''):<8} {s:6.1f} s",
              flush=True)

    t0 = time.perf_counter()
    done = W.warmup(args.entries or None, dtypes, log=log)
    print(f"{len(done)} calls of {len({n.split(' (')[0] for n, _, _ in done})} entry points "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    return EXIT_OK


# --------------------------------------------------------------------------- main
def _add_demo(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="train tiny CTC, RNN-T and TDT models on CPU in about a "
                       "minute",
                       description="Train tiny CTC, RNN-T and TDT models on an embedded synthetic "
                       "task (no download), count the decoding steps TDT saves, compare with "
                       "torch's ctc_loss, show half precision and an impossible sequence, and "
                       "write an alignment heatmap PNG.")
    d.add_argument("--steps", type=_positive_int, default=300,
                   help="training steps per model (default 300)")
    d.add_argument("--out", default="seqloss-demo", metavar="DIR",
                   help="folder for the alignment PNG (default ./seqloss-demo)")
    d.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    d.add_argument("--backend", default="auto", choices=["auto", "reference", "numba", "triton"],
                   help="seqloss backend (default auto)")
    d.set_defaults(func=_cmd_demo)


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser(
        "doctor", help="diagnose a saved batch: feasibility, non-finite inputs, loss, gradients",
        description="FILE is a torch.save'd dict of a loss's arguments, e.g. {'kind': 'ctc', "
        "'log_probs': ..., 'targets': ..., 'input_lengths': ..., 'target_lengths': ..., "
        "'blank': 0} (kind 'rnnt' or 'hat': logits, targets, logit_lengths, target_lengths, blank; "
        "kind 'multiblank': the same and big_blank_durations; kind 'tdt': the same and "
        "durations, logits concatenated or a (token_logits, duration_logits) pair; kind "
        "'pruned': logits, symbols, ranges, termination_symbol and optionally boundary, "
        "rnnt_type). "
        "Exit status: 0 all sequences fine; 1 a sequence is non-finite or infeasible, or the "
        "arguments fail validation; 2 the file cannot be read.")
    doc.add_argument("file", metavar="FILE", help="torch.save'd dict of loss arguments")
    doc.add_argument("--json", action="store_true", help="print machine-readable JSON")
    doc.add_argument("--backend", default=None, choices=["auto", "reference", "numba", "triton"],
                     help="seqloss backend (default: the file's, else auto)")
    doc.set_defaults(func=_cmd_doctor)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from ._core.registry import NAMES

    b = sub.add_parser("bench", help="time seqloss against the installed peers",
                       description="Time forward + backward of seqloss and every importable peer "
                       "(CTC: torch, optax; RNN-T: torchaudio, fast_rnnt; multiblank and tdt: "
                       "seqloss's own rnnt_loss on the same logits, transformers' tdt_loss) on "
                       "the registered cases, interleaved, and print each peer's time over "
                       "seqloss's. The same "
                       "code as benchmarks/bench_ctc.py (python -m seqloss.bench.ctc).")
    b.add_argument("--loss", choices=list(NAMES), default=None,
                   help="which loss (default: every loss in this build)")
    from .bench import SIZES

    b.add_argument("--sizes", choices=list(SIZES), default="small",
                   help="case grid: tiny (a call's overhead), small (seconds), paper "
                   "(minutes) or long (long utterances) (default small)")
    b.add_argument("--json", metavar="FILE", default=None, help="also write results as JSON")
    b.add_argument("--repeats", type=_positive_int, default=5,
                   help="interleaved timing rounds (default 5)")
    b.add_argument("--peers", default=None, metavar="LIST",
                   help="comma-separated peer libraries to time, e.g. torch,optax "
                   "(default: every installed one)")
    b.add_argument("--memory", action="store_true",
                   help="also measure peak memory (a fresh process per implementation and case)")
    b.add_argument("--threads", type=_positive_int, default=2,
                   help="torch.set_num_threads (default 2)")
    b.set_defaults(func=_cmd_bench)


def _add_warmup(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser(
        "warmup", help="compile every CPU kernel ahead, into Numba's cache (for container "
        "builds)",
        description="Call every public entry point once on a tiny batch (forward and "
        "backward), for each input dtype it takes (float32, float64 and, for the losses, "
        "float16 and bfloat16) and the call variants that reach other kernels, so that "
        "Numba compiles its kernels into its on-disk cache: NUMBA_CACHE_DIR when set, else "
        "__pycache__ beside the installed sources. A later process with the same install "
        "and cache folder then loads them instead of compiling on its first call. Run it "
        "in a Dockerfile after pip install, with NUMBA_CACHE_DIR set there and at run time "
        "to the same folder. Numba keys the cache by CPU model: an image run on other CPUs "
        "needs NUMBA_CPU_NAME=generic both here and at run time. Prints each call and how "
        "long it took.")
    w.add_argument("entries", nargs="*", metavar="ENTRY",
                   help="entry points to compile (default: all), e.g. ctc_loss rnnt_loss")
    w.add_argument("--dtypes", default=None, metavar="LIST",
                   help="comma-separated input dtypes (default: float32,float64,float16,"
                   "bfloat16, each where the entry point takes it)")
    w.set_defaults(func=_cmd_warmup)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="seqloss", description="seqloss: exact, fast alignment-free sequence losses "
                "(CTC, RNN-T, multi-blank RNN-T, TDT) for PyTorch.")
    from . import __version__

    p.add_argument("--version", action="version", version=f"seqloss {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{demo,doctor,bench,warmup}")

    _add_demo(sub)
    _add_doctor(sub)
    _add_bench(sub)
    _add_warmup(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("choose a command: demo, doctor, bench or warmup")
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("seqloss: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`seqloss doctor --json | head`): no traceback, and none at
        # exit either, when Python flushes the dead pipe (the documented recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
