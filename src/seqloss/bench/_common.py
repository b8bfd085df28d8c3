"""Timing and peak-memory machinery shared by the loss benchmarks.

A benchmark module defines its cases (plain dicts, JSON-serializable) and its
implementations (name -> factory ``make(case) -> fn``, where ``fn()`` runs one
forward+backward and returns what the call produced). This module runs them:

- ``interleaved_times``: every implementation once per round, rounds repeated,
  median per implementation, so that a noisy shared machine slows all of them
  alike and the ratios stay meaningful.
- ``peak_memory_subprocess``: extra peak resident memory of one call, measured
  in a fresh process per (implementation, case) as CONTRIBUTING.md ("Benchmarks")
  defines it: after one warm-up call, ``echo 5 > /proc/self/clear_refs``, read
  ``VmRSS``, run one call (its result, e.g. the gradient, counts), read
  ``VmHWM``; report the difference. ``MALLOC_MMAP_THRESHOLD_=65536`` makes freed
  large blocks go back to the system so that they do not hide in the allocator, and
  ``SEQLOSS_REUSE_BUFFERS=0`` keeps seqloss's reused gradient memory out of it likewise.
  The child is the benchmark module (``python -m seqloss.bench.ctc``) or script
  itself, run with ``--mem-child`` (see ``mem_child_main``).

Shipped inside the package so that ``seqloss bench`` works from an installed
wheel; ``benchmarks/_common.py`` re-exports it.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

Factory = Callable[[dict], Callable[[], object]]


# --------------------------------------------------------------------------- timing
def interleaved_times(
    fns: dict[str, Callable[[], object]], repeat: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each function, ``repeat`` interleaved rounds after ``warmup``.

    Round ``i`` starts at function ``i mod n`` (rotated order): the call after a peer that
    churns gigabytes (transformers' ``tdt_loss``) runs on cold caches and freshly faulted
    memory, and a fixed order charged that to the same function every round (TDT at
    B8-T150-U40-V1024: 55-65 ms right after transformers, 32-35 ms isolated).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    # The long-lived objects (torch, jax, dynamo modules) go to the permanent
    # generation: the collection before each call then only visits what the
    # calls left behind (a full collection of the whole heap takes ~0.3 s).
    gc.collect()
    gc.freeze()
    try:
        names = list(fns)
        for i in range(repeat):
            k = i % len(names) if names else 0
            for name in names[k:] + names[:k]:
                fn = fns[name]
                gc.collect()
                t0 = time.perf_counter()
                res = fn()
                out[name].append(time.perf_counter() - t0)
                del res
    finally:
        gc.unfreeze()
    return out


def median_ms(times: Sequence[float]) -> float:
    return 1e3 * statistics.median(times)


# --------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_of_call(fn: Callable[[], object]) -> float:
    """Extra peak RSS (MiB) of one call of ``fn`` in this process (warm it up first)."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss0 = _status_kib("VmRSS")
    res = fn()
    hwm = _status_kib("VmHWM")
    del res
    return (hwm - rss0) / 1024.0


def peak_memory_subprocess(
    script: str | Sequence[str], impl: str, case: dict, timeout: float = 600.0
) -> float | None:
    """Run ``script --mem-child IMPL CASE_JSON`` in a fresh process; its peak in MiB.

    ``script`` is a script path, or a command prefix such as
    ``[sys.executable, "-m", "seqloss.bench.ctc"]``.

    Returns ``None`` when the child fails (e.g. the implementation's library is missing).
    """
    # No reuse of gradient memory between calls (seqloss._core.buffers): the warm-up
    # call's buffer would be resident before the measured call and hide its gradient.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", SEQLOSS_REUSE_BUFFERS="0")
    prefix = [sys.executable, script] if isinstance(script, str) else list(script)
    cmd = [*prefix, "--mem-child", impl, json.dumps(case)]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        sys.stderr.write(f"[mem] {impl} {case.get('name')}: child failed\n{r.stderr[-2000:]}\n")
        return None
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("PEAK_MIB "):
            return float(line.split()[1])
    return None


def mem_child_main(impls: dict[str, Factory], argv: Sequence[str],
                   threads: int | None = None) -> None:
    """Child side of ``peak_memory_subprocess``: ``argv = [impl, case_json]``."""
    impl, case = argv[0], json.loads(argv[1])
    if threads:
        import torch

        torch.set_num_threads(threads)
    fn = impls[impl](case)
    fn()  # warm-up: JIT compilation and caches out of the way
    print(f"PEAK_MIB {peak_of_call(fn):.3f}", flush=True)


# --------------------------------------------------------------------------- reporting
def faster(ratio: float) -> str:
    """``other time / our time`` in words: ``"3.1x faster"``, or ``"2.5x slower"`` below 1
    (a ratio of 0.4 is not "0.4x faster")."""
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def less_memory(ratio: float) -> str:
    """``other peak / our peak`` in words: ``"5.2x less"``, or ``"1.3x more"`` below 1."""
    return f"{ratio:.1f}x less" if ratio >= 1 else f"{1 / ratio:.1f}x more"


def machine_info() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(),
            # torch's OpenMP workers spin after each op unless "passive": on a loaded
            # machine that alone swings a same-run ratio several-fold.
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}
    try:
        with open("/proc/cpuinfo") as f:
            txt = f.read()
        for line in txt.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["avx512"] = " avx512f " in txt
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        import numba

        info["numba"] = numba.__version__
    except ImportError:
        pass
    info["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return info


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Markdown table; ``columns`` = (key, header, format spec)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            v = r.get(key)
            cells.append("—" if v is None else format(v, fmt) if fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_cases(
    case_list: list[dict],
    available: dict[str, Factory],
    names: list[str],
    shape_keys: Sequence[str],
    mem_child: list[str],
    repeat: int,
    memory: bool,
    log: Callable[[str], object] | None,
) -> list[dict]:
    """Time (interleaved, median) and optionally measure ``names`` on every case.

    One row per (case, implementation): the case's ``shape_keys``, ``case, impl, ms,
    times_ms, peak_mib`` (``None`` unless ``memory``).
    """
    rows = []
    for case in case_list:
        fns = {n: available[n](case) for n in names}
        times = interleaved_times(fns, repeat)
        del fns
        for n in names:
            row = {k: case[k] for k in shape_keys}
            row.update(case=case["name"], impl=n, ms=median_ms(times[n]),
                       times_ms=[1e3 * t for t in times[n]], peak_mib=None)
            if memory:
                row["peak_mib"] = peak_memory_subprocess(mem_child, n, case)
            rows.append(row)
            if log:
                mem = "" if row["peak_mib"] is None else f"  {row['peak_mib']:8.1f} MiB"
                log(f"  {case['name']:24s} {n:26s} {row['ms']:9.2f} ms{mem}")
    return rows
