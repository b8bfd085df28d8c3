"""Adapters: each library's forward + backward on a case's inputs, behind one interface.

Every adapter takes the same unnormalized logits and computes the summed loss and its
gradient with respect to those logits (through an upstream ``log_softmax`` where the
library takes log-probabilities), so the timed work is the same everywhere. Peers are
used only when importable; none is a dependency of seqloss.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cases import Inputs

Runner = Callable[[], float]  # one forward + backward; returns the summed loss


@dataclass(frozen=True)
class Peer:
    name: str
    loss: str  # "ctc" or "rnnt"
    modules: tuple[str, ...]  # importable modules it needs
    setup: Callable[[Inputs], Runner]

    def missing(self) -> str | None:
        """Why this peer cannot run here, or None."""
        for m in self.modules:
            if importlib.util.find_spec(m) is None:
                return f"{m} is not installed"
        return None


def _sync(x: torch.Tensor) -> None:
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)


def _torch_runner(inp: Inputs, loss_fn: Callable[..., torch.Tensor]) -> Runner:
    def run() -> float:
        x = inp.logits.detach().requires_grad_(True)
        loss = loss_fn(x)
        loss.backward()
        _sync(x)
        return float(loss)

    return run


# ------------------------------------------------------------------------ CTC
def _seqloss_ctc(inp: Inputs) -> Runner:
    import seqloss

    return _torch_runner(inp, lambda x: seqloss.ctc_loss(
        x.log_softmax(-1), inp.targets, inp.lengths, inp.target_lengths, inp.blank,
        reduction="sum"))


def _torch_ctc(inp: Inputs) -> Runner:
    import torch.nn.functional as F

    return _torch_runner(inp, lambda x: F.ctc_loss(
        x.log_softmax(-1), inp.targets, inp.lengths, inp.target_lengths, inp.blank,
        reduction="sum"))


def _optax_ctc(inp: Inputs) -> Runner:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    T, B, _ = inp.logits.shape
    S = inp.targets.shape[1]
    logits = jnp.asarray(inp.logits.detach().float().transpose(0, 1).cpu().numpy())
    lengths = inp.lengths.cpu().numpy()
    tl = inp.target_lengths.cpu().numpy()
    pad = (np.arange(T)[None, :] >= lengths[:, None]).astype(np.float32)
    lpad = (np.arange(S)[None, :] >= tl[:, None]).astype(np.float32)
    labels = jnp.asarray(inp.targets.cpu().numpy().astype(np.int32))

    @jax.jit
    def fwd_bwd(lg):  # noqa: ANN001, ANN202
        return jax.value_and_grad(
            lambda z: optax.ctc_loss(z, pad, labels, lpad, blank_id=inp.blank).sum()
        )(lg)

    def run() -> float:
        v, g = fwd_bwd(logits)
        g.block_until_ready()
        return float(v)

    return run


# ------------------------------------------------------------------------ RNN-T
def _seqloss_rnnt(inp: Inputs) -> Runner:
    import seqloss

    fn = getattr(seqloss, "rnnt_loss", None)
    if fn is None:
        raise RuntimeError("seqloss.rnnt_loss is not in this build")
    return _torch_runner(inp, lambda x: fn(
        x, inp.targets, inp.lengths, inp.target_lengths, blank=inp.blank, reduction="sum"))


def _torchaudio_rnnt(inp: Inputs) -> Runner:
    import torchaudio.functional as AF

    tg, il, tl = (t.to(torch.int32) for t in (inp.targets, inp.lengths, inp.target_lengths))
    return _torch_runner(inp, lambda x: AF.rnnt_loss(
        x, tg, il, tl, blank=inp.blank, reduction="sum"))


def _fast_rnnt(inp: Inputs) -> Runner:
    import fast_rnnt

    B = inp.logits.shape[0]
    boundary = torch.zeros(B, 4, dtype=torch.int64, device=inp.logits.device)
    boundary[:, 2] = inp.target_lengths
    boundary[:, 3] = inp.lengths
    return _torch_runner(inp, lambda x: fast_rnnt.rnnt_loss(
        logits=x.float(), symbols=inp.targets, termination_symbol=inp.blank, boundary=boundary,
        reduction="sum"))


def _warprnnt_numba(inp: Inputs) -> Runner:
    import warprnnt_numba

    tg, il, tl = (t.to(torch.int32) for t in (inp.targets, inp.lengths, inp.target_lengths))
    return _torch_runner(inp, lambda x: warprnnt_numba.rnnt_loss(
        x, tg, il, tl, blank=inp.blank, reduction="sum"))


SEQLOSS = {"ctc": Peer("seqloss", "ctc", ("seqloss",), _seqloss_ctc),
           "rnnt": Peer("seqloss", "rnnt", ("seqloss",), _seqloss_rnnt)}

PEERS: dict[str, list[Peer]] = {
    "ctc": [
        Peer("torch", "ctc", ("torch",), _torch_ctc),
        Peer("optax", "ctc", ("jax", "optax"), _optax_ctc),
    ],
    "rnnt": [
        Peer("torchaudio", "rnnt", ("torchaudio",), _torchaudio_rnnt),
        Peer("fast_rnnt", "rnnt", ("fast_rnnt",), _fast_rnnt),
        Peer("warprnnt_numba", "rnnt", ("warprnnt_numba",), _warprnnt_numba),
    ],
}


def available_peers(loss: str) -> tuple[list[Peer], dict[str, str]]:
    """The peers of ``loss`` importable here, and why each other one is not."""
    ok, missing = [], {}
    for p in PEERS[loss]:
        why = p.missing()
        if why is None:
            ok.append(p)
        else:
            missing[p.name] = why
    return ok, missing
