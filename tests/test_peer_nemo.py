"""Multi-blank RNN-T and TDT against NeMo's pure-PyTorch references (optional).

``nemo.collections.asr.losses.rnnt_pytorch`` holds NeMo's readable references
``MultiblankRNNTLossPytorch`` and ``TDTLossPytorch`` (Python loops over every state;
tiny inputs only). Skipped when nemo-toolkit is not importable. Where they differ from
the contract on purpose, the comparison says so:

- both stand in ``-1000`` for ``log 0``: on inputs where every state is reachable
  that changes nothing at float32 precision;
- ``TDTLossPytorch`` allocates on CUDA unconditionally (``.cuda()``), so here
  ``Tensor.cuda`` is the identity while it runs;
- the reductions are NeMo's names and meanings (``"mean"``: each loss over its target
  length, then the batch mean; ``"mean_batch"``; ``"mean_volume"``).

NeMo's file is loaded by ``seqloss.testing.nemo_rnnt_pytorch`` (run without
``nemo.core``'s heavy imports, which the loss code does not use).
"""

from __future__ import annotations

import pytest
import torch

import seqloss
from seqloss.testing import nemo_rnnt_pytorch

rnnt_pytorch = nemo_rnnt_pytorch()
if rnnt_pytorch is None:
    pytest.skip("nemo-toolkit is not installed", allow_module_level=True)


def _case(seed: int, B: int = 2, T: int = 5, U: int = 3, W: int = 7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, W, generator=g, dtype=torch.float64)
    Tl = torch.tensor([T, T - 1][:B])
    Ul = torch.tensor([U, U - 1][:B])
    return x, Tl, Ul


@pytest.mark.parametrize("sigma", [0.0, 0.05])
@pytest.mark.parametrize("seed", [0, 1])
def test_multiblank_matches_nemo(seed: int, sigma: float) -> None:
    big = [2, 3]
    x, Tl, Ul = _case(seed, W=7)
    V = x.shape[-1]
    blank = V - 1  # standard blank last, big blank i at blank - 1 - i
    g = torch.Generator().manual_seed(seed + 100)
    tg = torch.randint(0, blank - len(big), (x.shape[0], x.shape[2] - 1), generator=g)

    a = x.clone().float().requires_grad_()
    ref = rnnt_pytorch.MultiblankRNNTLossPytorch(blank, big, reduction="none", sigma=sigma)
    want = ref(acts=a, labels=tg, act_lens=Tl, label_lens=Ul)
    want.sum().backward()

    b = x.clone().float().requires_grad_()
    got = seqloss.multiblank_rnnt_loss(b, tg, Tl, Ul, big, blank=blank, sigma=sigma,
                                       reduction="none")
    got.sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)

    for red in ("sum", "mean_volume", "mean", "mean_batch"):
        ref = rnnt_pytorch.MultiblankRNNTLossPytorch(blank, big, reduction=red, sigma=sigma)
        torch.testing.assert_close(
            seqloss.multiblank_rnnt_loss(x.float(), tg, Tl, Ul, big, blank=blank, sigma=sigma,
                                         reduction=red),
            ref(acts=x.float(), labels=tg, act_lens=Tl, label_lens=Ul), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_tdt_matches_nemo(monkeypatch: pytest.MonkeyPatch, sigma: float) -> None:
    durations = [0, 1, 2]
    V = 5  # token classes, blank last; then the duration logits
    x, Tl, Ul = _case(3, T=4, U=2, W=V + len(durations))
    g = torch.Generator().manual_seed(7)
    tg = torch.randint(0, V - 1, (x.shape[0], x.shape[2] - 1), generator=g)

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    a = x.clone().float().requires_grad_()
    ref = rnnt_pytorch.TDTLossPytorch(V - 1, durations, reduction="none", sigma=sigma)
    want = ref(acts=a, labels=tg, act_lens=Tl, label_lens=Ul)
    want.sum().backward()
    monkeypatch.undo()

    b = x.clone().float().requires_grad_()
    got = seqloss.tdt_loss(b, tg, Tl, Ul, durations, blank=V - 1, sigma=sigma, reduction="none")
    got.sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
