"""distributed_mean: gloo ranks under DDP end with one process's value and gradients on
the concatenated batch (sum of losses / sum of weights), empty ranks included."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from seqloss import InputError
from seqloss._core.distributed import distributed_mean

# The ranks' script: run as `python script.py OUT`, it spawns 3 gloo ranks with
# torch.multiprocessing. Each rank runs every case twice: in the world (3 ranks) and, on
# ranks 0 and 1, in a group of 2 (DDP and distributed_mean given that group; one launch
# for both sizes, since each rank's DDP import costs seconds). Each saves
# {(world, case...): (value, grads)} to OUT.<rank>. The test imports the same file for
# the data, the model and the cases of its single-process oracle.
SCRIPT = r"""
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import seqloss
from seqloss._core.distributed import distributed_mean

B, T, U, V, H = 7, 6, 3, 5, 4
f64 = torch.float64
g = torch.Generator().manual_seed(0)
FEAT = torch.randn(B, T, H, generator=g, dtype=f64)
# No repeated neighbours, so CTC needs only U_b frames: every sequence is feasible.
TG = torch.tensor([[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2], [2, 1, 3], [3, 2, 1], [1, 2, 1]])
IL = torch.tensor([6, 5, 4, 6, 3, 6, 5])
TL = torch.tensor([3, 2, 0, 1, 3, 2, 1])  # unequal token counts, one empty target


def joint(x):  # (b, T, V) -> (b, T, U+1, V)
    return x[:, :, None, :] + x[:, : U + 1, None, :].transpose(1, 2) * 0.5


# The loss family only feeds per-sequence losses: the reference backend keeps every rank
# off Numba's first-call compile.
LOSSES = {
    "ctc": lambda x, s: seqloss.ctc_loss(x.log_softmax(-1).transpose(0, 1), TG[s], IL[s], TL[s],
                                         reduction="none", backend="reference"),
    "rnnt": lambda x, s: seqloss.rnnt_loss(joint(x), TG[s], IL[s], TL[s], reduction="none",
                                           backend="reference"),
}
WEIGHTS = {"ones": lambda s: None, "lengths": lambda s: TL[s],
           "zeros": lambda s: torch.zeros_like(TL[s])}  # global weight 0: divisor 1
SPLITS = {2: {"unequal": [5, 2], "empty_rank": [0, 7]},
          3: {"unequal": [1, 4, 2], "empty_rank": [3, 0, 4]}}


def model():
    torch.manual_seed(1)
    return torch.nn.Linear(H, V, dtype=f64)


def cases(world):
    for split, sizes in SPLITS[world].items():
        for loss in LOSSES:
            for w in WEIGHTS:
                yield (world, split, loss, w), sizes


def shard(sizes, rank):
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def run(rank, world, group, res):
    net = DDP(model(), process_group=group)
    for key, sizes in cases(world):
        s = shard(sizes, rank)
        net.zero_grad()
        m = distributed_mean(LOSSES[key[2]](net(FEAT[s]), s), WEIGHTS[key[3]](s), group=group)
        m.backward()
        res[key] = (m.detach(), [p.grad.clone() for p in net.parameters()])


def worker(rank, out):
    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=3)
    pair = dist.new_group([0, 1])  # every rank takes part in making it
    res = {}
    if rank < 2:
        run(rank, 2, pair, res)
    run(rank, 3, None, res)
    # A non-finite loss on one rank: every rank gets it and returns (one collective each).
    for bad in ("nan", "inf"):
        x = torch.tensor([float(bad), 1.0], dtype=f64) if rank == 1 else torch.ones(rank, dtype=f64)
        res[bad] = distributed_mean(x)
    torch.save(res, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=3, join=True)
"""

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DDP/gloo chatter


def _script(tmp: Path):
    path = tmp / "ranks.py"
    path.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("ranks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def _launch(path: Path, out: Path) -> None:
    # As tests/test_ddp.py: loopback for gloo, one thread a rank, and the whole process
    # group killed on a timeout so a hang fails instead of blocking the suite.
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    p = subprocess.Popen([sys.executable, str(path), str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=out.parent,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        stdout, stderr = p.communicate()
        pytest.fail(f"the ranks did not finish in 300 s\n{stdout[-2000:]}\n{stderr[-4000:]}")
    assert p.returncode == 0, (stdout[-2000:], stderr[-4000:])


def _single(mod, loss: str, w: str):
    """The oracle: one process, the whole batch, sum(losses) / sum(weights) written out."""
    net = mod.model()
    s = slice(0, mod.B)
    losses = mod.LOSSES[loss](net(mod.FEAT), s)
    weights = mod.WEIGHTS[w](s)
    total = float(mod.B) if weights is None else float(weights.sum())
    m = losses.sum() / (total if total > 0 else 1.0)
    m.backward()
    return m.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The script module and the 3 ranks' results (one launch for both group sizes)."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    tmp = tmp_path_factory.mktemp("ranks")
    path, mod = _script(tmp)
    _launch(path, tmp / "res")
    return mod, [torch.load(tmp / f"res.{r}") for r in range(3)]


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_match_single_process(ranks, world):
    mod, res = ranks
    res = res[:world]
    for key, _ in mod.cases(world):
        value, grads = _single(mod, key[2], key[3])
        assert any(bool(g.abs().max() > 0) for g in grads), key
        for r in range(world):
            v, gr = res[r][key]
            # The all-reduced sums are the same bits everywhere: so is the value.
            assert torch.equal(v, res[0][key][0]), (key, r)
            torch.testing.assert_close(v, value, rtol=1e-6, atol=1e-9, msg=f"{key} rank {r}")
            for a, b in zip(gr, grads, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9, msg=f"{key} rank {r}")


def test_nonfinite_loss_reaches_every_rank(ranks):
    _, res = ranks
    for r in range(3):
        assert torch.isnan(res[r]["nan"]), r
        assert res[r]["inf"] == float("inf"), r


def test_rank_means_would_differ(tmp_path):
    """The premise of the DDP test: averaging each shard's own mean_volume (what DDP does
    with reduction="mean_volume") is not the global mean's gradient on these shards."""
    _, mod = _script(tmp_path)
    _, want = _single(mod, "ctc", "lengths")
    sizes = mod.SPLITS[3]["unequal"]
    net = mod.model()
    for r in range(3):
        s = mod.shard(sizes, r)
        (mod.LOSSES["ctc"](net(mod.FEAT[s]), s).sum() / mod.TL[s].sum() / 3).backward()
    err = max(float((p.grad - g).abs().max()) for p, g in zip(net.parameters(), want,
                                                                strict=True))
    assert err > 1e-2


F64 = torch.float64


@pytest.mark.parametrize("weights", ["none", "lengths", "list", "numpy", "zeros", "float32"])
def test_single_process_is_sum_over_sum(weights):
    g = torch.Generator().manual_seed(0)
    losses = torch.rand(5, generator=g, dtype=F64, requires_grad=True)
    lengths = torch.tensor([3, 0, 2, 7, 1])
    w, total = {
        "none": (None, 5.0),
        "lengths": (lengths, 13.0),
        "list": ([3, 0, 2, 7, 1], 13.0),
        "numpy": (lengths.numpy(), 13.0),
        "zeros": (torch.zeros(5, dtype=torch.int32), 1.0),  # "mean_volume"'s divisor 1
        "float32": (lengths.float().requires_grad_(), 13.0),  # weights: not differentiated
    }[weights]
    assert not dist.is_initialized()
    m = distributed_mean(losses, w)
    assert m.dtype == F64 and m.dim() == 0
    torch.testing.assert_close(m, losses.detach().sum() / total, rtol=1e-15, atol=0)
    m.backward()
    torch.testing.assert_close(losses.grad, torch.full((5,), 1 / total, dtype=F64),
                               rtol=1e-15, atol=0)
    if weights == "float32":
        assert w.grad is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_single_process_keeps_dtype(dtype):
    # 70000 exceeds float16's range: the weights' sum must not be taken in it.
    losses = torch.full((4,), 7.0, dtype=dtype, requires_grad=True)
    m = distributed_mean(losses, torch.full((4,), 17500))
    assert m.dtype == dtype
    assert float(m) == pytest.approx(28 / 70000, rel=1e-2)
    m.backward()
    assert losses.grad.dtype == dtype
    assert float(losses.grad[0]) == pytest.approx(1 / 70000, rel=1e-2)


def test_empty_batch_is_zero_and_connected():
    x = torch.randn(0, 3, dtype=F64, requires_grad=True)
    m = distributed_mean(x.sum(1), torch.zeros(0, dtype=torch.long))
    assert float(m) == 0.0
    m.backward()
    assert x.grad is not None and x.grad.shape == (0, 3)


def test_group_of_one_is_sum_over_sum(tmp_path, monkeypatch):
    if Path("/sys/class/net/lo").exists():
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        losses = torch.tensor([1.0, 2.0, 4.0], dtype=F64, requires_grad=True)
        m = distributed_mean(losses, torch.tensor([1, 2, 1]), group=dist.group.WORLD)
        assert float(m) == 7.0 / 4.0
        m.backward()
        torch.testing.assert_close(losses.grad, torch.full((3,), 0.25, dtype=F64))
    finally:
        dist.destroy_process_group()


def test_under_torch_compile():
    # The collective and the weights' check run eagerly: the compiled caller breaks there.
    def step(x, w):
        return distributed_mean((x * 2).sum(1), w) * 3

    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    w = torch.tensor([1, 2, 3, 4])
    m = torch.compile(step, backend="eager")(x, w)
    torch.testing.assert_close(m, (x.detach() * 2).sum() / 10 * 3)
    m.backward()
    torch.testing.assert_close(x.grad, torch.full((4, 3), 0.6, dtype=F64))


@pytest.mark.parametrize("losses, weights, err, match", [
    ([1.0, 2.0], None, TypeError, "losses must be a torch.Tensor"),
    (torch.ones(2, dtype=torch.long), None, TypeError, "losses must be float"),
    (torch.ones(2, 3), None, InputError, r"losses must be 1-D .*\(2, 3\)"),
    (torch.ones(()), None, InputError, "losses must be 1-D"),
    (torch.ones(3), torch.ones(2), InputError, r"weights must have shape \(3,\)"),
    (torch.ones(3), torch.ones(3, 1), InputError, r"weights must have shape \(3,\)"),
    (torch.ones(3), torch.tensor([1.0, 2.0, -1.0]), InputError, "weights.*batch index 2"),
    (torch.ones(3), torch.tensor([1, -4, 1]), InputError, "weights.*-4 at batch index 1"),
    (torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]), InputError, "weights.*index 1"),
    (torch.ones(3), torch.tensor([float("inf"), 1.0, 1.0]), InputError, "weights.*index 0"),
    (torch.ones(3), torch.ones(3, dtype=torch.bool), TypeError, "weights must be an integer"),
    (torch.ones(3), "abc", TypeError, "weights must be a torch.Tensor"),
    (torch.ones(3), [1, "a", 2], TypeError, "weights must hold numbers"),
])
def test_input_errors(losses, weights, err, match):
    with pytest.raises(err, match=match):
        distributed_mean(losses, weights)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 6), kind=st.sampled_from(["none", "int", "float", "list", "zeros"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_property_single_process_is_sum_over_sum(n, kind, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    losses = (torch.rand(n, generator=g, dtype=torch.float64) * 10).to(dtype).requires_grad_()
    w = {"none": None,
         "int": torch.randint(0, 5, (n,), generator=g),
         "float": torch.rand(n, generator=g, dtype=torch.float64) * 3,
         "list": [float(v) for v in torch.randint(0, 4, (n,), generator=g)],
         "zeros": torch.zeros(n, dtype=torch.int64)}[kind]
    W = float(n) if w is None else float(torch.as_tensor(w, dtype=torch.float64).sum())
    W = W if W > 0 else 1.0  # "mean_volume"'s rule: no weight divides by 1
    got = distributed_mean(losses, w)
    assert got.dtype == dtype and got.dim() == 0
    want = losses.detach().double().sum() / W
    torch.testing.assert_close(got.double(), want, rtol=1e-6 if dtype == torch.float32 else 1e-12,
                               atol=1e-7)
    if n:
        (gl,) = torch.autograd.grad(got, losses)
        torch.testing.assert_close(gl.double(), torch.full((n,), 1 / W, dtype=torch.float64),
                                   rtol=1e-6, atol=0)
