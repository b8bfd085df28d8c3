"""The CUDA path compiled for a real GPU (sm_90) on every run, and what that catches.

The interpreter (``TRITON_INTERPRET=1``) never lowers a kernel; ``seqloss.testing.triton_aot``
compiles every launch of every public function for a real target instead of running it.
The sweep runs in a subprocess: ``TRITON_INTERPRET`` (which conftest sets for this process)
is read when the kernels are decorated, and must be unset where they are compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from seqloss.testing import triton_aot

pytestmark = pytest.mark.skipif(triton_aot.unavailable() is not None,
                                reason=str(triton_aot.unavailable()))

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _python(code_or_args: list[str], cwd: str, timeout: int,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra_env or {})
    return subprocess.run([sys.executable, *code_or_args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_every_launch_compiles_for_sm90(tmp_path):
    """Every public function, dtype and variant at small sizes: 0 failures for sm_90.

    Fails on a compile error, local memory (spills), shared memory or registers over the
    limits, a grid beyond CUDA's limits (the set includes ``logmmexp`` with a batch of
    70,000, on meta tensors: its grid once put the batch on CUDA's ``y`` axis, at most
    65,535), 32-bit offset arithmetic that can wrap, a host error before a launch, or a
    Triton kernel no case launches.
    """
    out = tmp_path / "aot.json"
    r = _python(["-m", "seqloss.testing.triton_aot", "--targets", "90", "--shapes", "small",
                 "--json", str(out), "-q"], str(tmp_path), timeout=900)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == [], "\n".join(report["failures"])
    assert r.returncode == 0, r.stdout[-2000:]
    # Every public function's CUDA path was reached, and every kernel compiled.
    reached = {c["function"] for c in report["cases"] if c["launches"]}
    public = {"ctc_loss", "ctc_align", "rnnt_loss", "rnnt_loss_packed", "multiblank_rnnt_loss",
              "tdt_loss", "transducer_lattice", "logmmexp", "rnnt_align", "multiblank_rnnt_align",
              "tdt_align", "rnnt_loss_simple",
              "rnnt_loss_smoothed", "rnnt_loss_pruned", "rnnt_loss_from_joint",
              "multiblank_rnnt_loss_from_joint", "tdt_loss_from_joint", "hat_loss"}
    assert public <= reached, public - reached
    assert report["never_launched"] == []
    dtypes = {r["spec"]["args"].get("x_ptr", "").split("/")[0] for r in report["records"]
              if r["kernel"] == "ctc_alpha_kernel"}
    assert dtypes == {"*fp16", "*bf16", "*fp32", "*fp64"}
    assert all(r["target"] == "sm_90" and not r.get("error") for r in report["records"])


TOY = '''
import torch
import triton
import triton.language as tl


@triton.jit
def toy_kernel(x_ptr, y_ptr, stride_t):
    """y[t, 0] = 2 x[t, 0], one program per frame, frames on the grid's y axis."""
    i_t = tl.program_id(1)
    off = i_t * stride_t  # 32-bit: wraps once T * stride_t passes 2**31
    tl.store(y_ptr + off, tl.load(x_ptr + off) * 2)


@triton.jit
def toy_fixed_kernel(x_ptr, y_ptr, stride_t):
    i_t = tl.program_id(0).to(tl.int64)
    off = i_t * stride_t
    tl.store(y_ptr + off, tl.load(x_ptr + off) * 2)


@triton.jit
def toy_loop_kernel(x_ptr, y_ptr, n, stride_t):
    off = 0
    for _ in range(n):
        tl.store(y_ptr + off, tl.load(x_ptr + off) * 2)
        off += stride_t  # 32-bit, carried by the loop


def launch_loop(x):
    y = torch.zeros_like(x)
    toy_loop_kernel[(1,)](x, y, x.shape[0], x.stride(0))
    return y


def launch(x, fixed=False):
    y = torch.zeros_like(x)
    if fixed:
        toy_fixed_kernel[(x.shape[0],)](x, y, x.stride(0))
    else:
        toy_kernel[(1, x.shape[0])](x, y, x.stride(0))
    return y
'''


def test_the_sweep_catches_what_the_interpreter_does_not(tmp_path):
    """A toy launcher with frames on the grid's ``y`` axis and a 32-bit frame offset.

    At T = 70,000 frames the interpreter runs it and gets the right answer; a GPU refuses
    the launch (``y`` is at most 65,535), and at ``T * stride >= 2**31`` the offset wraps.
    The sweep reports both, and nothing for the fixed kernel (frames on ``x``, 64-bit);
    it also follows a 32-bit offset summed across loop iterations.
    """
    (tmp_path / "toy_launch.py").write_text(TOY)
    T, W = 70_000, 2
    if os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available():
        sys.path.insert(0, str(tmp_path))
        try:
            import toy_launch
        finally:
            sys.path.remove(str(tmp_path))
        x = torch.arange(T * W, dtype=torch.float32).reshape(T, W)
        torch.testing.assert_close(toy_launch.launch(x)[:, 0], 2 * x[:, 0], rtol=0, atol=0)

    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from seqloss.testing import triton_aot
        from seqloss.testing.triton_aot_cases import Case
        import toy_launch
        x = torch.zeros({T}, {W})
        cases = [Case("toy[T={T}]", "toy", lambda: toy_launch.launch(x)),
                 Case("toy_fixed[T={T}]", "toy", lambda: toy_launch.launch(x, fixed=True)),
                 Case("toy_loop", "toy", lambda: toy_launch.launch_loop(x))]
        report = triton_aot.sweep((90,), cases=cases)
        print(json.dumps(report["failures"]))
    """)
    # A Triton cache of its own: a cached compile keeps the source locations of the run
    # that compiled it (an earlier run's deleted toy file: no source line to report).
    r = _python(["-c", script], str(tmp_path), timeout=300,
                extra_env={"TRITON_CACHE_DIR": str(tmp_path / "triton-cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    failures = json.loads(r.stdout.strip().splitlines()[-1])
    grid = [f for f in failures if "beyond CUDA's limits" in f]
    offsets = [f for f in failures if "32-bit offset arithmetic" in f]
    assert len(grid) == 1 and "toy_kernel" in grid[0] and f"(1, {T}, 1)" in grid[0], failures
    assert len(offsets) == 2, failures
    assert "toy_kernel" in offsets[0] and "off = i_t * stride_t" in offsets[0], failures
    # A loop-carried 32-bit sum is followed through the loop.
    assert "toy_loop_kernel" in offsets[1] and "off += stride_t" in offsets[1], failures
    assert not any("toy_fixed_kernel" in f for f in failures), failures
    assert len(failures) == 3, failures
