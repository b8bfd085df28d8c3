r"""Compile seqloss's CUDA path (every Triton launch) for real GPUs, on a machine without one.

The Triton interpreter (``TRITON_INTERPRET=1``, what the tests run on CPU) executes the
kernels with numpy: it never lowers them, so it cannot see what fails only on a GPU. This
module runs the real dispatch code of every public function with ``backend="triton"``
on CPU tensors and intercepts each launch (``JITFunction.run``): instead of executing,
the launch is compiled through Triton's own launch path (``warmup``), under a small fake
driver that reports the chosen target (``sm_80``, ``sm_90``, ``sm_100``), so each
compiled kernel has exactly the specialization the dispatcher picks on that GPU (pointer
dtypes and alignment, integer arguments equal to 1 or divisible by 16, constexprs,
block sizes, ``num_warps``). Each compiled kernel is then checked:

* it compiles (``ptxas`` included);
* local memory (spills) is 0, unless :data:`SPILLS_ALLOWED` names the kernel with a reason;
* registers x threads fit a multiprocessor, shared memory fits the target;
* every grid of every launch satisfies CUDA's limits (``x <= 2**31 - 1``, ``y, z <= 65535``);
* no 32-bit integer arithmetic that can wrap feeds a pointer offset (:func:`i32_offsets`,
  read from the TTIR), unless :data:`OFFSETS_ALLOWED` names it with a reason.

Nothing executes, so every kernel output holds whatever ``torch.empty`` gave. The host
code between launches only reshapes, reduces and indexes those outputs, so each public
function still reaches all of its launches; a host error is reported as a failure of
its case (its launches up to there are recorded). Shapes too large to allocate on the
host run the backend launchers on ``meta`` tensors (``data_ptr()`` 0, so the same
alignment specialization as a fresh CUDA allocation): their launches are compiled and
their grids checked from the launchers' own grid arithmetic.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so this must run in
a process that never set it (the test suite runs it in a subprocess). Entry point:
``python -m seqloss.testing.triton_aot`` (or ``benchmarks/triton_aot.py``), see :func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import linecache
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535
REGS_PER_SM = 65536  # 32-bit registers per multiprocessor (sm_80 .. sm_120)
# Largest shared memory one block may use (opt-in), bytes: CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability".
SHARED_MAX = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024,
              100: 227 * 1024, 120: 99 * 1024}
DEFAULT_TARGETS = (80, 90, 100)

# Kernels allowed to use local memory, with the reason (none: every kernel must fit).
SPILLS_ALLOWED: dict[str, str] = {}
# (kernel, SSA name in the TTIR) -> why that 32-bit arithmetic cannot wrap.
OFFSETS_ALLOWED: dict[tuple[str, str], str] = {}

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rel(path: str) -> str:
    """A source path relative to the package's parent (no machine path in reports)."""
    path = os.path.abspath(path)
    if path.startswith(_PKG_ROOT):
        return os.path.relpath(path, _PKG_ROOT)
    return os.path.basename(path)


# --------------------------------------------------------------------------- availability
def _tool(name: str) -> str | None:
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.access(path, os.X_OK) else None


def unavailable() -> str | None:
    """Why the sweep cannot run here (``None`` when it can): Triton, its ptxas, its API."""
    try:
        import triton
        from triton.runtime.jit import JITFunction
    except ImportError:
        return "triton is not installed"
    if _tool("ptxas") is None or _tool("cuobjdump") is None:
        return "the triton wheel ships no ptxas/cuobjdump here"
    if "warmup" not in JITFunction.run.__code__.co_varnames:
        return f"triton {triton.__version__}: JITFunction.run has no warmup argument"
    return None


# --------------------------------------------------------------------------- the fake driver
def _driver_class():
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnlyDriver(DriverBase):
        """Reports a CUDA target and nothing else: enough for Triton to compile, never to launch.

        The device index is the target's arch, so Triton keeps one kernel cache per target.
        """

        def __init__(self) -> None:
            self.arch = 90

        @classmethod
        def is_active(cls) -> bool:
            return False  # never picked by Triton's own driver discovery

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self):
            return GPUTarget("cuda", self.arch, 32)

        def get_active_torch_device(self):
            import torch
            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("compile-only driver: nothing runs")

        def get_current_device(self) -> int:
            return self.arch

        def set_current_device(self, device: int) -> None:
            self.arch = device

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    return CompileOnlyDriver


# --------------------------------------------------------------------------- TTIR: 32-bit offsets
_CONST, _RUNTIME, _WIDE = 0, 1, 2
_SHAPE_OPS = {"arith.extsi", "arith.extui", "tt.splat", "tt.broadcast", "tt.expand_dims",
              "tt.reshape", "ttg.convert_layout", "tt.trans", "arith.bitcast", "arith.index_cast",
              "tt.join", "tt.split", "arith.sitofp"}
_LEAF_OPS = {"tt.load", "tt.get_program_id", "tt.get_num_programs", "tt.reduce", "tt.scan",
             "tt.atomic_rmw", "tt.atomic_cas", "tt.histogram", "tt.elementwise_inline_asm"}
_VALUE = re.compile(r"%[\w.$-]+(?:#\d+)?")
_NARROW = re.compile(r"(?<![\w])(?:tensor<(?:\d+x)*)?i(8|16|32)>?\s*$")


@dataclasses.dataclass
class _Op:
    name: str
    results: list[str]
    operands: list[str]
    types: str
    loc: str | None
    line: str


def _parse_ttir(text: str) -> tuple[dict[str, _Op], dict[str, list[str]], list[_Op]]:
    """The TTIR's ops by result, the links of loop-carried values, and every op."""
    locs: dict[str, str] = {}
    for m in re.finditer(r'^(#loc\d*) = loc\("([^"]+)":(\d+):\d+\)', text, re.M):
        locs[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
    for m in re.finditer(r'^(#loc\d*) = loc\("[^"]*"\((#loc\d*)\)\)', text, re.M):
        if m.group(2) in locs:
            locs[m.group(1)] = locs[m.group(2)]
    defs: dict[str, _Op] = {}
    links: dict[str, list[str]] = {}  # block argument / region result -> values flowing in
    ops: list[_Op] = []
    stack: list[tuple[_Op, list[str], list[str]]] = []  # (region op, its carried args, results)
    for raw in text.splitlines():
        loc_m = re.search(r"loc\((#loc\d*)\)\s*\{?\s*$", raw)
        line = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", raw).strip()
        if not line or line.startswith("#"):
            continue
        loc = locs.get(loc_m.group(1)) if loc_m else None
        if line.startswith("tt.func"):
            continue
        m = re.match(r"^((?:%[\w.$-]+(?::\d+)?)(?:,\s*%[\w.$-]+)*)\s*=\s*\"?([\w.]+)\"?(.*)$", line)
        if m:
            res_txt, name, rest = m.groups()
            results = []
            for r in res_txt.split(","):
                r = r.strip()
                if ":" in r:
                    base, n = r.split(":")
                    results += [f"{base}#{i}" for i in range(int(n))]
                else:
                    results.append(r)
        else:
            name, rest, results = line.split(" ")[0].strip('"'), line[len(line.split(" ")[0]):], []
        body, _, types = rest.rpartition(" : ") if " : " in rest else (rest, "", "")
        op = _Op(name, results, _VALUE.findall(body), types.strip(), loc, line)
        for r in results:
            defs[r] = op
        ops.append(op)
        if name == "scf.for":
            # scf.for %iv = %lb to %ub step %s iter_args(%a = %x, ...) -> (...)
            iv = re.match(r".*?scf\.for\s+(%[\w.$-]+)", line)
            carried = []
            if "iter_args" in line:
                carried = re.findall(r"(%[\w.$-]+)\s*=\s*(%[\w.$-]+(?:#\d+)?)",
                                     line.split("iter_args", 1)[1])
            if iv:
                defs[iv.group(1)] = _Op("block_arg", [iv.group(1)], [], "", loc, line)
            for arg, init in carried:
                defs[arg] = _Op("block_arg", [arg], [], "", loc, line)
                links.setdefault(arg, []).append(init)
            for r, (_, init) in zip(results, carried, strict=False):
                links.setdefault(r, []).append(init)
            stack.append((op, [a for a, _ in carried], results))
        elif line.endswith("{"):
            for arg in re.findall(r"\^bb\d+\(([^)]*)\)", line):
                for a in _VALUE.findall(arg):
                    defs[a] = _Op("block_arg", [a], [], "", loc, line)
            stack.append((op, [], results))
        elif line.startswith("^bb"):
            for a in _VALUE.findall(line):
                defs[a] = _Op("block_arg", [a], [], "", loc, line)
        if name == "scf.yield" and stack:
            _, carried, res = stack[-1]
            for i, v in enumerate(op.operands):
                for target in (carried[i:i + 1] + res[i:i + 1]):
                    links.setdefault(target, []).append(v)
        if line.startswith("}"):
            # "} else {" closes one region of the same op and opens the next.
            if stack and not line.endswith("{"):
                stack.pop()
    return defs, links, ops


def _const_value(op: _Op) -> int | None:
    m = re.search(r"(?:dense<|constant\s)(-?\d+)(?:>|\s|$)", op.line)
    return int(m.group(1)) if m else None


def _op_class(op: _Op, defs: dict, sub: Callable[[int], int]) -> int:
    """The class of ``op``'s result from its operands' (``sub(i)``: operand ``i``'s)."""
    name, ops = op.name, op.operands
    if name in ("arith.constant", "tt.make_range"):
        return _CONST
    if name in _LEAF_OPS or name == "block_arg" or name.startswith("scf."):
        return _RUNTIME
    if name in _SHAPE_OPS or name == "arith.trunci":
        return sub(0)
    if name == "arith.select":
        return max(sub(1), sub(2))
    a, b = sub(0), sub(1)
    if _WIDE in (a, b):
        return _WIDE
    if name == "arith.muli":
        if a == b == _CONST:
            return _CONST
        if a == _CONST or b == _CONST:
            c = _const_value(defs[ops[0] if a == _CONST else ops[1]])
            if c is not None and abs(c) <= 1:
                return _RUNTIME
        return _WIDE
    if name in ("arith.addi", "arith.subi", "arith.ori", "arith.xori", "arith.maxsi",
                "arith.maxui"):
        if a == b == _RUNTIME and name in ("arith.addi", "arith.subi"):
            return _WIDE
        return max(a, b)
    if name == "arith.shli":
        return _CONST if a == b == _CONST else _WIDE
    if name in ("arith.remsi", "arith.remui", "arith.andi", "arith.minsi", "arith.minui"):
        return min(a, b)
    if name in ("arith.divsi", "arith.divui", "arith.floordivsi", "arith.ceildivsi",
                "arith.shrsi", "arith.shrui"):
        return a
    return max(a, b)


def _classifier(defs: dict) -> Callable[[str], int]:
    """``klass(v)``: value ``v``'s class, memoized; a function argument is runtime."""
    cls: dict[str, int] = {}

    def klass(v: str, depth: int = 0) -> int:
        if v in cls:
            return cls[v]
        op = defs.get(v)
        if op is None or depth > 400:
            return _RUNTIME  # a function argument
        cls[v] = _RUNTIME  # cycle guard (loop-carried values)
        ops = op.operands
        k = _op_class(op, defs, lambda i: klass(ops[i], depth + 1) if i < len(ops) else _CONST)
        cls[v] = k
        return k

    return klass


def _finding(op: _Op, v: str) -> dict[str, Any]:
    """The report of the wide operation ``op`` defining ``v``, with its source line."""
    var = re.sub(r"_\d+$", "", v.lstrip("%"))
    src = ""
    if op.loc:
        path, _, ln = op.loc.rpartition(":")
        src = linecache.getline(path, int(ln)).strip()
        where = f"{_rel(path)}:{ln}"
    else:
        where = "?"
    return {"op": op.name, "type": op.types.split(" to ")[0], "value": var, "where": where,
            "source": src}


def i32_offsets(ttir: str) -> list[dict[str, Any]]:
    """32-bit integer arithmetic that can exceed ``2**31`` on an address path.

    Follows every ``tt.addptr`` offset, every integer compared (masks, bounds) and every
    loop bound back through its integer arithmetic (loop-carried values included). A
    value is *constant* (literals, ``tl.arange`` and what only they make), *runtime* (an
    argument, a program id, a loaded value, a loop variable) or *wide*: a product of a
    runtime value with anything but 0 or +-1, a sum of two runtime values, a shift of one.
    A wide value computed in 32 bits (or narrower) can wrap once the tensor passes
    ``2**31`` elements, so each operation that forms one is reported with its source
    line; the same operation in 64 bits (``.to(tl.int64)`` on a program id, a length or
    a stride first) is not. Also reported: a wide 64-bit value truncated to 32 bits.
    """
    defs, links, all_ops = _parse_ttir(ttir)
    klass = _classifier(defs)
    found: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    # Pointer offsets, and the integers a mask or a loop bound compares (a bound that
    # wrapped lets a masked access through).
    todo = []
    for op in all_ops:
        if op.name == "tt.addptr" and len(op.operands) > 1:
            todo.append(op.operands[1])
        elif op.name in ("arith.cmpi", "scf.for"):
            todo += op.operands
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        todo += links.get(v, [])
        op = defs.get(v)
        if op is None or op.name in _LEAF_OPS or op.name in ("block_arg", "arith.constant"):
            continue
        if op.name.startswith("scf."):
            continue  # region results: their yields came in through links
        narrow = bool(_NARROW.search(op.types.split(" to ")[0].split("->")[0]))
        k = klass(v)
        # Reported where a wide value is formed, not at each use of it.
        bad = (op.name in ("arith.muli", "arith.addi", "arith.subi", "arith.shli") and k == _WIDE
               and narrow and all(klass(o) != _WIDE for o in op.operands))
        # A wide 64-bit value cut to 32 bits wraps the same way.
        bad = bad or (op.name == "arith.trunci" and k == _WIDE and klass(op.operands[0]) == _WIDE
                      and bool(_NARROW.search(op.types.split(" to ")[-1])))
        if bad:
            f = _finding(op, v)
            found.setdefault(f"{f['where']}:{op.name}:{f['value']}", f)
        operands = op.operands[1:] if op.name == "arith.select" else op.operands
        todo += operands
    return sorted(found.values(), key=lambda f: f["where"])


# --------------------------------------------------------------------------- resources
def resources(cubin: bytes) -> dict[str, int]:
    """``REG``, ``STACK``, ``SHARED`` (static), ``LOCAL`` of a cubin (``cuobjdump -res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True,
                             text=True, check=True).stdout
    finally:
        os.unlink(path)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump -res-usage: unexpected output {out!r}")
    keys = ("registers", "stack", "shared_static", "local")
    return dict(zip(keys, map(int, m.groups()), strict=True))


# --------------------------------------------------------------------------- the recorder
def _grid3(grid: Any, bound: dict[str, Any]) -> tuple[int, int, int]:
    if callable(grid):
        grid = grid(bound)
    g = [int(x) for x in grid] + [1, 1]
    return g[0], g[1], g[2]


def _spec(fn: Any, bound: dict[str, Any], specialization: list, options: Any) -> dict[str, Any]:
    """The specialization as data: each argument's type (``/16``: divisible by 16) or value."""
    out: dict[str, Any] = {}
    for p, (ty, attr) in zip(fn.params, specialization, strict=True):
        if ty == "constexpr":
            v = bound[p.name]
            out[p.name] = v if isinstance(v, (bool, int, float, str)) or v is None else str(v)
        else:
            out[p.name] = ty + ("/16" if attr == "D" else "")
    return {"args": out, "num_warps": options.num_warps, "num_stages": options.num_stages}


class Recorder:
    """Patches Triton's launch path so that each launch is compiled for ``targets`` and recorded."""

    def __init__(self, targets: tuple[int, ...]) -> None:
        self.targets = tuple(targets)
        self.case = "?"
        self.kernels: dict[tuple, dict[str, Any]] = {}
        self.launches: list[dict[str, Any]] = []
        self._by_hash: dict[str, dict[str, Any]] = {}

    def _launch(self, orig: Callable, fn: Any, args: tuple, grid: Any, kwargs: dict) -> None:
        from triton.runtime import driver

        name = fn.fn.__name__
        for arch in self.targets:
            driver.active.set_current_device(arch)
            _, _, _, backend, binder = fn.device_caches[arch]
            bound, specialization, options = binder(*args, **kwargs)
            spec = _spec(fn, bound, specialization, backend.parse_options(options))
            key = (name, arch, json.dumps(spec, sort_keys=True))
            rec = self.kernels.get(key)
            if rec is None:
                rec = self.kernels[key] = {
                    "kernel": name, "module": fn.fn.__module__, "target": f"sm_{arch}",
                    "spec": spec, "num_warps": spec["num_warps"], "cases": [], "grids": []}
                t0 = time.perf_counter()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        kernel = orig(fn, *args, grid=grid, warmup=True, **kwargs)
                    rec["compile_s"] = round(time.perf_counter() - t0, 3)
                    rec.update(self._inspect(kernel))
                except Exception as e:  # noqa: BLE001 -- every compile error is a finding
                    rec["error"] = f"{type(e).__name__}: {e}"[-4000:]
            grid3 = _grid3(grid, bound)
            if self.case not in rec["cases"]:
                rec["cases"].append(self.case)
            entry = {"case": self.case, "grid": list(grid3)}
            if entry not in rec["grids"]:
                rec["grids"].append(entry)
            if arch == self.targets[0]:
                self.launches.append({"case": self.case, "kernel": name, "grid": list(grid3)})

    def _inspect(self, kernel: Any) -> dict[str, Any]:
        md = kernel.metadata
        cached = self._by_hash.get(md.hash)
        if cached is None:
            res = resources(kernel.asm["cubin"])
            cached = self._by_hash[md.hash] = {
                **res, "shared": max(int(md.shared), res["shared_static"]),
                "i32_offsets": i32_offsets(kernel.asm["ttir"])}
        return dict(cached)

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        import triton
        from triton.runtime.jit import JITFunction

        from .._core import checks, dispatch
        from ..ctc import triton_cuda
        from ..transducer import from_joint

        if not isinstance(triton_cuda.ctc_alpha_kernel, JITFunction):
            raise RuntimeError("the Triton kernels were decorated for the interpreter "
                               "(TRITON_INTERPRET=1 when they were imported): compile in a "
                               "process that never set it")
        drv = _driver_class()()
        orig_run = JITFunction.run
        prev_driver = triton.runtime.driver._active
        saved = (dispatch._triton_runs_on, checks.host_side, from_joint.DEFAULT_CHUNK_ELEMENTS)

        def run(fn, *args, grid, warmup, **kwargs):
            if warmup:
                return orig_run(fn, *args, grid=grid, warmup=True, **kwargs)
            self._launch(orig_run, fn, args, grid, kwargs)
            return None

        triton.runtime.driver.set_active(drv)
        JITFunction.run = run
        # What a CUDA device changes on the host side: Triton runs on it, tensors are
        # device tensors (no free host reads), the CUDA tile size of the from-joint losses.
        dispatch._triton_runs_on = lambda device: True
        checks.host_side = lambda t: False
        from_joint.DEFAULT_CHUNK_ELEMENTS = from_joint.DEFAULT_CHUNK_ELEMENTS_CUDA
        try:
            yield self
        finally:
            JITFunction.run = orig_run
            triton.runtime.driver._active = prev_driver
            dispatch._triton_runs_on, checks.host_side, from_joint.DEFAULT_CHUNK_ELEMENTS = saved


# --------------------------------------------------------------------------- checks
def check(report: dict[str, Any]) -> list[str]:
    """Every failure of a report, one line each (empty: all good)."""
    fails: list[str] = []
    for c in report["cases"]:
        if c.get("error"):
            fails.append(f"case {c['case']}: host error {c['error'].splitlines()[-1]}")
    for r in report["records"]:
        what = f"{r['kernel']} {r['target']} {r['spec_id']}"
        if r.get("error"):
            fails.append(f"{what}: compile error: {r['error'].splitlines()[0][:300]}")
            continue
        arch = int(r["target"][3:])
        if r["local"] and r["kernel"] not in SPILLS_ALLOWED:
            fails.append(f"{what}: {r['local']} bytes of local memory (spills)")
        if r["shared"] > SHARED_MAX.get(arch, 48 * 1024):
            fails.append(f"{what}: {r['shared']} bytes of shared memory > {SHARED_MAX[arch]}")
        if r["registers"] * r["num_warps"] * 32 > REGS_PER_SM:
            fails.append(f"{what}: {r['registers']} registers x {r['num_warps'] * 32} threads "
                         f"> {REGS_PER_SM}")
        for f in r["i32_offsets"]:
            if (r["kernel"], f["value"]) not in OFFSETS_ALLOWED:
                fails.append(f"{what}: 32-bit offset arithmetic {f['op']} {f['value']} at "
                             f"{f['where']}: {f['source']}")
        for g in r["grids"]:
            x, y, z = g["grid"]
            if x > GRID_X_MAX or y > GRID_YZ_MAX or z > GRID_YZ_MAX:
                fails.append(f"{what}: grid {tuple(g['grid'])} beyond CUDA's limits in {g['case']}")
    for name in report.get("never_launched", []):
        fails.append(f"{name}: no case launches it")
    # One line per distinct failure (an offset repeats over targets and specializations).
    return list(dict.fromkeys(fails))


def _kernels_defined() -> list[str]:
    """Every ``*_kernel`` of seqloss's Triton modules (``triton_*.py``)."""
    import importlib

    from triton.runtime.jit import JITFunction

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = []
    for root, _, files in os.walk(pkg):
        for f in sorted(files):
            if not (f.startswith("triton_") and f.endswith(".py")) or f == "triton_compat.py":
                continue
            mod_name = os.path.relpath(os.path.join(root, f[:-3]), os.path.dirname(pkg))
            mod_name = mod_name.replace(os.sep, ".")
            if mod_name.startswith("seqloss.testing."):
                continue
            mod = importlib.import_module(mod_name)
            names += [k for k, v in vars(mod).items() if isinstance(v, JITFunction)
                      and k.endswith("_kernel") and v.fn.__module__ == mod.__name__]
    return sorted(set(names))


def sweep(targets: tuple[int, ...] = DEFAULT_TARGETS, shapes: str = "small",
          cases: list | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the cases under the compile-only launcher; the report (see :func:`main`)."""
    from . import triton_aot_cases

    rec = Recorder(targets)
    case_rows = []
    todo = triton_aot_cases.cases(shapes) if cases is None else cases
    t_start = time.perf_counter()
    with rec.active():
        for case in todo:
            rec.case = case.name
            n0 = len(rec.launches)
            t0 = time.perf_counter()
            err = None
            try:
                case.run()
            except Exception:  # noqa: BLE001 -- a host error fails its case, not the sweep
                err = traceback.format_exc(limit=8)[-3000:]
            row = {"case": case.name, "function": case.function, "launches": len(rec.launches) - n0,
                   "seconds": round(time.perf_counter() - t0, 2)}
            if err:
                row["error"] = err
            elif row["launches"] == 0 and case.launches:
                row["error"] = "no launch reached"
            case_rows.append(row)
            if log:
                log(f"{case.name}: {row['launches']} launches, {row['seconds']} s"
                    + (" ERROR" if err else ""))
    records = []
    for _, r in sorted(rec.kernels.items()):
        r = dict(r)
        r["spec_id"] = _spec_id(r["spec"])
        records.append(r)
    launched = {r["kernel"] for r in records}
    import triton
    report = {
        "triton": triton.__version__, "targets": [f"sm_{t}" for t in targets], "shapes": shapes,
        "seconds": round(time.perf_counter() - t_start, 1),
        "cases": case_rows, "records": records,
        "never_launched": ([k for k in _kernels_defined() if k not in launched]
                           if cases is None else []),
    }
    report["failures"] = check(report)
    return report


def _spec_id(spec: dict[str, Any]) -> str:
    """A short label: the constexprs, the first pointer's dtype, the warps."""
    args = spec["args"]
    ptr = next((v for v in args.values() if isinstance(v, str) and v.startswith("*")), "")
    const = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in args.items()
                     if not isinstance(v, str))
    wide = ",".join(k for k, v in args.items() if isinstance(v, str) and v.startswith("i64"))
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:6]
    return (f"{ptr.split('/')[0][1:]}[{const}]w{spec['num_warps']}"
            + (f" i64:{wide}" if wide else "") + f" #{digest}")


# --------------------------------------------------------------------------- the table
def table(report: dict[str, Any]) -> str:
    """Markdown, one row per kernel: per target, specializations, registers, shared memory."""
    targets = report["targets"]
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in report["records"]:
        by.setdefault(r["kernel"], {}).setdefault(r["target"], []).append(r)
    head = ["kernel", "specializations"] + [f"registers {t}" for t in targets] + [
        "local bytes", "shared bytes (max)", "warps", "largest grid"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    n_spec = {t: 0 for t in targets}
    n_fail = n_spill = 0
    for k in sorted(by):
        rs_all = [r for rs in by[k].values() for r in rs]
        ok = [r for r in rs_all if not r.get("error")]
        n_fail += len(rs_all) - len(ok)
        n_spill += sum(1 for r in ok if r["local"])
        regs = []
        for t in targets:
            rr = [r["registers"] for r in by[k].get(t, []) if not r.get("error")]
            n_spec[t] += len(by[k].get(t, []))
            regs.append(f"{min(rr)}-{max(rr)}" if rr else "-")
        grid = max((tuple(g["grid"]) for r in rs_all for g in r["grids"]),
                   key=lambda g: (g[0] * g[1] * g[2], g))
        specs = "/".join(str(len(by[k].get(t, []))) for t in targets)
        lines.append("| " + " | ".join([
            k, specs, *regs, str(max((r["local"] for r in ok), default=0)),
            str(max((r["shared"] for r in ok), default=0)),
            ",".join(map(str, sorted({r["num_warps"] for r in rs_all}))),
            str(grid)]) + " |")
    n_off = len({f["where"] + f["value"] for r in report["records"] if not r.get("error")
                 for f in r["i32_offsets"]})
    n_grid = sum(1 for f in report["failures"] if "beyond CUDA's limits" in f)
    lines.append(f"| **total** | {'/'.join(str(n_spec[t]) for t in targets)} "
                 f"({sum(n_spec.values())}) | " + " | ".join("" for _ in targets)
                 + f" | {n_spill} spilling | {n_fail} failed to compile | | "
                 f"{n_grid} over limits, {n_off} 32-bit offsets |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``--json FILE [--targets 80 90 100] [--shapes small|all]``: sweep, report, exit 1 if bad.

    The JSON holds one record per kernel x target x specialization (``kernel``, ``target``,
    ``spec`` and ``spec_id``, ``num_warps``, ``registers``, ``local`` (bytes of local memory:
    spills), ``stack``, ``shared`` (bytes), ``i32_offsets``, ``grids``: one per case that
    launched it, ``error`` if it did not compile), the cases (launches, host errors),
    and ``failures``.
    """
    p = argparse.ArgumentParser(prog="triton_aot", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the report here")
    p.add_argument("--markdown", help="write the per-kernel table here")
    p.add_argument("--targets", type=int, nargs="+", default=None,
                   help="compute capabilities, e.g. 80 90 100 (default: those ptxas supports)")
    p.add_argument("--shapes", choices=("small", "all"), default="small")
    p.add_argument("--only", default=None, help="run only the cases whose name contains this")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    if "seqloss.ctc.triton_cuda" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)  # read when the kernels are decorated
    why = unavailable()
    if why:
        print(f"triton_aot: cannot run: {why}", file=sys.stderr)
        return 2
    targets = tuple(a.targets) if a.targets else DEFAULT_TARGETS
    from . import triton_aot_cases

    todo = [c for c in triton_aot_cases.cases(a.shapes) if a.only is None or a.only in c.name]
    log = None if a.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    report = sweep(targets, a.shapes, todo if a.only else None, log=log)
    md = table(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md + "\n")
    print(md)
    n = len(report["records"])
    print(f"\n{len(report['cases'])} cases, {n} compiled kernels (kernel x target x "
          f"specialization), {report['seconds']} s; {len(report['failures'])} failures")
    for line in report["failures"]:
        print("FAIL", line)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
