"""examples/ddp_ctc.py: two gloo ranks end with the parameters of one process on the same
batches."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "ddp_ctc.py"

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="torch.distributed with the gloo backend is not available"),
    pytest.mark.skipif(not SCRIPT.exists(), reason="examples/ddp_ctc.py is not in this checkout"),
]

ARGS = ["--steps", "4", "--batch", "6", "--seed", "3", "--lr", "0.5"]


def _run(cmd: list[str], tmp: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=tmp, start_new_session=True)
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)  # the launcher and both ranks
        out, err = p.communicate()
        pytest.fail(f"torchrun did not finish in 300 s\n{out[-2000:]}\n{err[-4000:]}")
    assert p.returncode == 0, (out[-2000:], err[-4000:])


def test_ddp_two_ranks_match_single_process(tmp_path):
    # Loopback throughout: where the machine's hostname does not resolve (containers,
    # sandboxes), torchrun's default address makes the ranks retry forever.
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
          "--local-addr", "127.0.0.1", "--nproc_per_node=2", str(SCRIPT), *ARGS,
          "--save", str(tmp_path / "ddp.pt")], tmp_path)
    ddp = torch.load(tmp_path / "ddp.pt")
    # The single-process run, in this process (no WORLD_SIZE here: no process group).
    spec = importlib.util.spec_from_file_location("ddp_ctc", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "WORLD_SIZE" not in os.environ
    state, losses = mod.train(steps=4, global_batch=6, seed=3, lr=0.5, backend="auto")
    single = {"state": state, "losses": losses}
    torch.manual_seed(3)
    from seqloss.demo.data import TinyCTC

    init = TinyCTC().state_dict()
    assert ddp["state"].keys() == single["state"].keys()
    moved = 0.0
    for k, v in single["state"].items():
        torch.testing.assert_close(ddp["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
        moved = max(moved, float((v - init[k]).abs().max()))
    assert moved > 1e-2  # the runs trained: equality is not trivial
    torch.testing.assert_close(torch.tensor(ddp["losses"]), torch.tensor(single["losses"]),
                               rtol=1e-5, atol=1e-6)
