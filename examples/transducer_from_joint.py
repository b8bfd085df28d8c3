"""Train a tiny transducer with ``seqloss.rnnt_loss_from_joint``: the joint's logits are never
materialized. Prints the loss and the peak memory of one training step against the same step
with the materialized joint and ``seqloss.rnnt_loss``.

    python examples/transducer_from_joint.py
"""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

import seqloss

B, T, U, V, H = 4, 150, 40, 1024, 64  # materialized joint: B*T*(U+1)*V*4 B = 101 MB (+ its grad)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, H), nn.ReLU(), nn.Linear(H, H))
        self.embed = nn.Embedding(V, H)
        self.predictor = nn.Linear(H, H)  # stateless predictor (tiny on purpose)
        self.joint_out = nn.Linear(H, V)  # the joint: Linear(tanh(enc + pred))

    def joint(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.joint_out(torch.tanh(enc[:, :, None] + pred[:, None]))

    def streams(self, feats: torch.Tensor, targets: torch.Tensor):
        enc = self.encoder(feats)
        start = torch.full((targets.shape[0], 1), V - 1, dtype=torch.long)  # blank as <sos>
        pred = self.predictor(self.embed(torch.cat([start, targets], 1)))
        return enc, pred


class JointOf(nn.Module):
    """The model's joint as a module, so its parameters are the autograd node's inputs."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model.joint_out
        self.fn = model.joint

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.fn(enc, pred)


def data(seed: int):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, 16, generator=g)
    targets = torch.randint(0, V - 1, (B, U), generator=g)
    return feats, targets, torch.full((B,), T), torch.full((B,), U)


def step(model: Model, opt: torch.optim.Optimizer, materialized: bool, seed: int) -> float:
    feats, targets, Tl, tl = data(seed)
    enc, pred = model.streams(feats, targets)
    if materialized:
        loss = seqloss.rnnt_loss(model.joint(enc, pred), targets, Tl, tl)
    else:
        loss = seqloss.rnnt_loss_from_joint(enc, pred, JointOf(model), targets, Tl, tl,
                                            chunk_elements=2**20)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(materialized: bool) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # warm-up on a tiny batch (Numba compiles the lattice once: ~100 MiB, not the loss's)
    x = torch.randn(1, 2, 2, 3, requires_grad=True)
    seqloss.rnnt_loss(x, torch.tensor([[0]]), [2], [1]).backward()
    j = nn.Linear(3, 3)
    seqloss.rnnt_loss_from_joint(torch.randn(1, 2, 3, requires_grad=True), torch.randn(1, 2, 3),
                                 lambda e, p: j(e[:, :, None] + p[:, None]), torch.tensor([[0]]),
                                 [2], [1]).backward()
    base = peak_mib()
    losses = [step(model, opt, materialized, s) for s in range(3)]
    print(f"{'materialized' if materialized else 'from_joint':>12}: losses "
          f"{', '.join(f'{x:.2f}' for x in losses)}; peak memory +{peak_mib() - base:.0f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1] == "materialized")
    else:
        print(f"B={B} T={T} U={U} V={V}: the joint's logits take "
              f"{B * T * (U + 1) * V * 4 / 2**20:.0f} MiB (and as much again for their gradient)")
        for mode in ("from_joint", "materialized"):  # a fresh process each: honest peaks
            subprocess.run([sys.executable, __file__, mode], check=True)
