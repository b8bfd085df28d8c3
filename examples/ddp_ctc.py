"""Data-parallel CTC training on CPU: the tiny model of ``seqloss demo`` under DDP (gloo).

    torchrun --nproc_per_node=2 examples/ddp_ctc.py --steps 100
    python examples/ddp_ctc.py --steps 100        # one process, the same global batches

(Where the machine's hostname does not resolve, as in some containers, add
``--local-addr 127.0.0.1`` to torchrun: otherwise the ranks wait forever.)

Every rank draws the same global batch from the seed and trains on its shard
(items ``rank, rank + world, ...``; shards may differ in size, and a rank may get
none). DDP *averages* the ranks' gradients, so a per-rank mean is not the global
mean unless the shards are equal. ``seqloss.distributed_mean`` returns the global
``sum(per-sequence losses) / sum(weights)`` on every rank, scaled so that DDP's
average is the gradient of that global value: here the per-label loss
``loss_b / max(L_b, 1)`` with weight 1 each, i.e. ``seqloss.ctc_loss(...,
reduction="mean")`` on the whole batch (``weights=target_lengths`` on the raw
losses would give the global ``"mean_volume"`` instead). With the same seed, the
parameters after N steps match a single-process run up to float32 rounding of
the gradient all-reduce.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import seqloss
from seqloss.demo import data as D


def shard_loss(model: torch.nn.Module, batch: D.Batch, backend: str) -> torch.Tensor:
    per_seq = seqloss.ctc_loss(model(batch.x), batch.targets, batch.input_lengths,
                               batch.target_lengths, blank=D.BLANK, reduction="none",
                               backend=backend)
    per_label = per_seq / batch.target_lengths.clamp(min=1).to(per_seq.dtype)
    return seqloss.distributed_mean(per_label)  # the global batch's mean, on every rank


def train(steps: int, global_batch: int, seed: int, lr: float,
          backend: str) -> tuple[dict, list[float]]:
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    torch.manual_seed(seed)
    model = D.TinyCTC()
    ddp = DistributedDataParallel(model) if distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)  # the same global batches on every rank
    losses = []
    for _ in range(steps):
        batch = D.make_batch(global_batch, g).shard(rank, world)
        loss = shard_loss(ddp, batch, backend)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        losses.append(float(loss))  # already the global value
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return state, losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16, help="global batch size (default 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--save", default=None, help="rank 0 saves the final parameters here")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one thread per rank: ranks share the cores
    state, losses = train(args.steps, args.batch, args.seed, args.lr, args.backend)
    if int(os.environ.get("RANK", "0")) == 0:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        every = max(1, len(losses) // 10)
        for i in range(0, len(losses), every):
            print(f"step {i + 1:4d}  loss {losses[i]:.4f}")
        print(f"final loss {losses[-1]:.4f} (world size {world}, global batch {args.batch})")
        if args.save:
            torch.save({"state": state, "losses": losses}, args.save)


if __name__ == "__main__":
    main()
