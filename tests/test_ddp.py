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

# A global batch of 5: shards of 3 and 2 (distributed_mean weighs them right).
ARGS = ["--steps", "4", "--batch", "5", "--seed", "3", "--lr", "0.5"]


def _start(cmd: list[str], tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp, start_new_session=True)


def _wait(p: subprocess.Popen) -> None:
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
    ranks = _start([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--local-addr", "127.0.0.1", "--nproc_per_node=2", str(SCRIPT), *ARGS,
                    "--save", str(tmp_path / "ddp.pt")], tmp_path)
    try:
        # The single-process run, in this process (no WORLD_SIZE here: no process group),
        # while the ranks start up (most of their time is imports).
        spec = importlib.util.spec_from_file_location("ddp_ctc", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert "WORLD_SIZE" not in os.environ
        state, losses = mod.train(steps=4, global_batch=5, seed=3, lr=0.5, backend="auto")
    finally:
        _wait(ranks)
    ddp = torch.load(tmp_path / "ddp.pt")
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


DDP_LOSSES = r'''
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import seqloss

B, T, U, V, H = 4, 6, 3, 9, 5
g = torch.Generator().manual_seed(0)
FEAT = torch.randn(B, T, H, generator=g)
TG = torch.tensor([[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2]])
IL, TL = torch.tensor([6, 5, 4, 6]), torch.tensor([3, 2, 3, 1])


def joint(x):  # (b, T, V) -> (b, T, U+1, V)
    return x[:, :, None, :] + x[:, : U + 1, None, :].transpose(1, 2) * 0.5


CASES = {
    "ctc": lambda x, s: seqloss.ctc_loss(x.log_softmax(-1).transpose(0, 1), TG[s], IL[s], TL[s],
                                         reduction="sum"),
    "rnnt": lambda x, s: seqloss.rnnt_loss(joint(x), TG[s], IL[s], TL[s], reduction="sum"),
    "multiblank": lambda x, s: seqloss.multiblank_rnnt_loss(joint(x), TG[s], IL[s], TL[s], [2],
                                                            reduction="sum"),
    "tdt": lambda x, s: seqloss.tdt_loss(joint(x), TG[s], IL[s], TL[s], [0, 1, 2], blank=5,
                                         reduction="sum"),
    "lattice": lambda x, s: -seqloss.transducer_lattice(
        joint(x).log_softmax(-1)[..., :1], joint(x).log_softmax(-1)[..., 1:2], IL[s], TL[s]).sum(),
    "simple": lambda x, s: seqloss.rnnt_loss_simple(x[:, : U + 1] * 0.5, x, TG[s], 0,
                                                    reduction="sum"),
    "hat": lambda x, s: seqloss.hat_loss(joint(x), TG[s], IL[s], TL[s], reduction="sum"),
    "from_joint": lambda x, s: seqloss.rnnt_loss_from_joint(
        x, x[:, : U + 1] * 0.5, lambda e, p: e[:, :, None] + p[:, None], TG[s], IL[s], TL[s],
        reduction="sum"),
}


def grads(model, name, s):
    model.zero_grad()
    CASES[name](model(FEAT[s]), s).backward()
    return [p.grad.clone() for p in model.parameters()]


def main(out):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(1)
    model = torch.nn.Linear(H, V)
    if world == 1:
        torch.save({n: grads(model, n, slice(0, B)) for n in CASES}, out)
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ddp = DDP(model)
    res = {}
    # Rank 0 takes the first half (all of it when one rank has no data), rank 1 the rest.
    for split, cut in (("halves", B // 2), ("one_rank_without_data", B)):
        s = slice(0, cut) if rank == 0 else slice(cut, B)
        res[split] = {n: [g * world for g in grads(ddp, n, s)] for n in CASES}  # DDP averages
    if rank == 0:
        torch.save(res, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
'''


def test_ddp_every_loss_family(tmp_path):
    """Two gloo ranks, each a shard of one batch (or one rank without any data): the
    all-reduced gradient of every loss family equals one process's on the whole batch.
    Both splits run in one launch of the ranks."""
    script = tmp_path / "ddp_losses.py"
    script.write_text(DDP_LOSSES)
    # The ranks and the single process at once: most of each one's time is imports.
    ranks = _start([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--local-addr", "127.0.0.1", "--nproc_per_node=2", str(script),
                    str(tmp_path / "ddp.pt")], tmp_path)
    one = _start([sys.executable, str(script), str(tmp_path / "one.pt")], tmp_path)
    try:
        _wait(ranks)
    finally:
        _wait(one)
    splits, one = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "one.pt")
    assert sorted(splits) == ["halves", "one_rank_without_data"]
    for split, ddp in splits.items():
        assert ddp.keys() == one.keys()
        for name in one:
            for a, b in zip(ddp[name], one[name], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{split} {name}")
            assert any(bool(b.abs().max() > 0) for b in one[name]), name
