"""Data-parallel CTC training on CPU: the tiny model of ``seqloss demo`` under DDP (gloo).

    torchrun --nproc_per_node=2 examples/ddp_ctc.py --steps 100
    python examples/ddp_ctc.py --steps 100        # one process, the same global batches

(Where the machine's hostname does not resolve, as in some containers, add
``--local-addr 127.0.0.1`` to torchrun: otherwise the ranks wait forever.)

Every rank draws the same global batch from the seed and trains on its shard
(items ``rank, rank + world, ...``). DDP *averages* the ranks' gradients, so
the loss must be scaled to make that average the gradient of the global loss:
each rank returns

    world_size / global_batch * sum over its items of loss_b / max(L_b, 1)

whose average over ranks is ``1 / global_batch * sum over all items``, i.e.
``seqloss.ctc_loss(..., reduction="mean")`` on the whole batch. (Taking
``reduction="mean"`` per rank gives the same only when shards are equal.)
With the same seed, the parameters after N steps match a single-process run
up to float32 rounding of the gradient all-reduce.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import seqloss
from seqloss.demo import data as D


def shard_loss(model: torch.nn.Module, batch: D.Batch, world: int, global_batch: int,
               backend: str) -> torch.Tensor:
    per_seq = seqloss.ctc_loss(model(batch.x), batch.targets, batch.input_lengths,
                               batch.target_lengths, blank=D.BLANK, reduction="none",
                               backend=backend)
    per_label = per_seq / batch.target_lengths.clamp(min=1).to(per_seq.dtype)
    return per_label.sum() * (world / global_batch)


def train(steps: int, global_batch: int, seed: int, lr: float,
          backend: str) -> tuple[dict, list[float]]:
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    if global_batch % world:
        raise SystemExit(f"--batch {global_batch} must be a multiple of the world size {world}")
    torch.manual_seed(seed)
    model = D.TinyCTC()
    ddp = DistributedDataParallel(model) if distributed else model
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)  # the same global batches on every rank
    losses = []
    for _ in range(steps):
        batch = D.make_batch(global_batch, g).shard(rank, world)
        loss = shard_loss(ddp, batch, world, global_batch, backend)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        total = loss.detach().clone()
        if distributed:
            dist.all_reduce(total)
            total /= world
        losses.append(float(total))
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
