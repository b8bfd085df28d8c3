"""One runner: interleaved timing of seqloss and its peers, ratio table, JSON with a header.

Timings are noisy on shared machines, so the libraries are timed in turn within each
repetition (seqloss, peer 1, peer 2, seqloss, ...) and each reports its median; the
table gives each peer's median over seqloss's from the same run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .cases import Case, make_inputs
from .peers import SEQLOSS, Peer, available_peers


@dataclass
class Timing:
    library: str
    times_s: list[float] = field(default_factory=list)
    loss: float | None = None
    error: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None


@dataclass
class CaseResult:
    case: str
    shape: dict[str, int]
    dtype: str
    device: str
    timings: dict[str, Timing]

    def ratio(self, peer: str) -> float | None:
        """Peer median over seqloss median (> 1: seqloss is faster)."""
        s, p = self.timings.get("seqloss"), self.timings.get(peer)
        if not s or not p or s.median_s is None or p.median_s is None or s.median_s == 0:
            return None
        return p.median_s / s.median_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name, t in self.timings.items():
            d["timings"][name]["median_s"] = t.median_s
            if name != "seqloss":
                d["timings"][name]["ratio_vs_seqloss"] = self.ratio(name)
        return d


def header(device: str) -> dict[str, Any]:
    import seqloss

    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "seqloss": getattr(seqloss, "__version__", "?"),
        "device": device,
        "torch_threads": torch.get_num_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def _time(run: Callable[[], float]) -> tuple[float, float]:
    t0 = time.perf_counter()
    v = run()
    return time.perf_counter() - t0, v


def run_cases(
    cases: list[Case],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    peers: list[Peer] | None = None,
    slow_s: float = 2.0,
    on_step: Callable[[str], None] | None = None,
) -> list[CaseResult]:
    """Time seqloss and ``peers`` (default: every importable peer) on each case.

    Each library gets one warm-up call (JIT compilation, caches), then ``repeats``
    timed calls interleaved with the others'. A library whose warm-up takes more
    than ``slow_s`` seconds is timed once. A library that raises is recorded with
    its error and skipped for the rest of the case. ``on_step(label)`` is called
    after each call (progress bars).
    """
    results = []
    for case in cases:
        libs = [SEQLOSS[case.loss]] + (peers if peers is not None else available_peers(case.loss)[0])
        libs = [p for p in libs if p.loss == case.loss]
        inp = make_inputs(case, device, dtype)
        timings = {p.name: Timing(p.name) for p in libs}
        runners: dict[str, Callable[[], float]] = {}
        reps: dict[str, int] = {}
        for p in libs:
            try:
                runners[p.name] = p.setup(inp)
                dt, v = _time(runners[p.name])  # warm-up
                timings[p.name].loss = v
                reps[p.name] = 1 if dt > slow_s else repeats
            except Exception as e:  # noqa: BLE001 - a peer's failure is a result, not a crash
                timings[p.name].error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                runners.pop(p.name, None)
            if on_step:
                on_step(f"{case.name}: {p.name} warm-up")
        for r in range(repeats):
            for p in libs:
                if p.name not in runners or r >= reps[p.name]:
                    continue
                try:
                    dt, _ = _time(runners[p.name])
                    timings[p.name].times_s.append(dt)
                except Exception as e:  # noqa: BLE001
                    timings[p.name].error = f"{type(e).__name__}: {e}"
                    runners.pop(p.name)
                if on_step:
                    on_step(f"{case.name}: {p.name} {r + 1}/{reps[p.name]}")
        shape = {"B": case.B, "T": case.T, ("C" if case.loss == "ctc" else "V"): case.C,
                 ("L" if case.loss == "ctc" else "U"): case.U}
        results.append(CaseResult(case.name, shape, str(dtype).replace("torch.", ""), device, timings))
    return results


def steps_for(cases: list[Case], n_libs: int, repeats: int) -> int:
    """How many ``on_step`` calls :func:`run_cases` makes at most (for a progress bar)."""
    return len(cases) * n_libs * (repeats + 1)


def write_json(path: str, results: list[CaseResult], device: str) -> None:
    with open(path, "w") as f:
        json.dump({"header": header(device), "results": [r.to_dict() for r in results]}, f, indent=2)


def results_table(results: list[CaseResult], title: str = ""):  # noqa: ANN201 - rich Table
    """A rich table: seqloss's median, each peer's median and its ratio over seqloss."""
    from rich.table import Table

    peers: list[str] = []
    for r in results:
        for name in r.timings:
            if name != "seqloss" and name not in peers:
                peers.append(name)
    table = Table(title=title or None, caption="ratio = peer time / seqloss time (> 1: seqloss faster); "
                  "forward + backward, median")
    table.add_column("case")
    table.add_column("seqloss ms", justify="right")
    for p in peers:
        table.add_column(f"{p} ms", justify="right")
        table.add_column(f"{p} ratio", justify="right")
    for r in results:
        s = r.timings.get("seqloss")
        row = [r.case, _ms(s)]
        for p in peers:
            t = r.timings.get(p)
            row.append(_ms(t))
            q = r.ratio(p)
            row.append("-" if q is None else f"{q:.2f}x")
        table.add_row(*row)
    return table


def _ms(t: Timing | None) -> str:
    if t is None:
        return "-"
    if t.error:
        return "error"
    m = t.median_s
    return "-" if m is None else f"{m * 1e3:.2f}"
