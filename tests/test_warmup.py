"""``seqloss warmup``: it fills Numba's cache for the public entry points.

The end-to-end check compiles from scratch (minutes of CPU), so CI does not run it:
``SEQLOSS_SLOW_TESTS=1`` does, as for ``tests/test_first_call.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import seqloss
from seqloss import cli
from seqloss import warmup as W

slow = pytest.mark.skipif(os.environ.get("SEQLOSS_SLOW_TESTS") != "1",
                          reason="compiles from scratch; set SEQLOSS_SLOW_TESTS=1")


def test_every_public_function_that_computes_has_a_case():
    # Every function of the public API whose first call compiles kernels; the rest
    # (diagnose, grad_clamp, distributed_mean, the pruning helpers, the Module classes)
    # call these.
    helpers = {"diagnose", "grad_clamp", "distributed_mean", "get_rnnt_prune_ranges",
               "do_rnnt_pruning", "InputError"}
    public = {n for n in seqloss.__all__ if n not in helpers and not n[0].isupper()}
    assert public == set(W.ENTRIES)


def test_cases_select_entries_and_dtypes():
    import torch

    got = W.cases(["ctc_loss"], [torch.float64])
    assert [(c.name, dt) for c, dt in got] == [("ctc_loss", torch.float64),
                                              ("ctc_loss (a transposed view)", torch.float64)]
    assert {dt for _, dt in W.cases(["tdt_loss"])} == {torch.float32, torch.float64,
                                                       torch.float16, torch.bfloat16}
    with pytest.raises(ValueError, match="frobnicate"):
        W.cases(["frobnicate"])


def test_warmup_prints_each_call(capsys):
    assert cli.main(["warmup", "logmmexp", "--dtypes", "float32,float64"]) == 0
    out = capsys.readouterr().out
    assert "Numba cache" in out
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("  ")]
    assert [ln[:2] for ln in lines] == [["logmmexp", "float32"], ["logmmexp", "float64"]]
    assert all(ln[-1] == "s" and float(ln[-2]) >= 0 for ln in lines)
    assert "2 calls of 1 entry points" in out


@pytest.mark.parametrize("argv", [["warmup", "frobnicate"], ["warmup", "--dtypes", "int8"]])
def test_warmup_bad_arguments_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqloss warmup: error:") and len(err.strip().splitlines()) == 1


def test_warmup_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["warmup", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: seqloss warmup" in out and "NUMBA_CACHE_DIR" in out


# The first call of each of the three main losses, forward and backward, in CPU seconds
# (steadier than wall time on a shared machine).
_FIRST = """
import time, torch, seqloss
B, T, U, V = 2, 8, 3, 6
il, tl = torch.full((B,), T), torch.full((B,), U)
tg = torch.randint(0, V - 2, (B, U))
x = torch.randn(30, 3, 6).log_softmax(-1).requires_grad_()
r = torch.randn(B, T, U + 1, V).requires_grad_()
d = torch.randn(B, T, U + 1, V + 3).requires_grad_()
c0 = time.process_time()
seqloss.ctc_loss(x, torch.randint(1, 6, (3, 5)), torch.full((3,), 30),
                 torch.full((3,), 5)).backward()
seqloss.rnnt_loss(r, tg, il, tl).backward()
seqloss.tdt_loss(d, tg, il, tl, [0, 1, 2], blank=V - 1).backward()
print(time.process_time() - c0)
"""


def _first_call_cpu(cache) -> float:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", _FIRST], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.split()[-1])


@slow
def test_warmup_fills_the_cache_for_the_first_call(tmp_path):
    cold = _first_call_cpu(tmp_path / "cold")
    warm = tmp_path / "warm"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(warm))
    r = subprocess.run([sys.executable, "-m", "seqloss", "warmup", "--dtypes", "float32"],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    listed = {ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert listed == set(W.ENTRIES)
    after = _first_call_cpu(warm)
    # cold: 20-40 CPU s on a 2-core machine; from the cache: about a second (loading)
    assert after < 0.25 * cold, (after, cold)
