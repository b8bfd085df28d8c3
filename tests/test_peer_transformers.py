"""TDT against Hugging Face transformers' ``tdt_loss`` (optional: skipped when absent).

transformers ships a pure-PyTorch TDT loss (``transformers/loss/loss_tdt.py``, a port
of NeMo's ``TDTLossPytorch``) on the pair layout ``(token_logits, duration_logits)``,
float32, no clamp and no ``omega``. Where the two contracts meet they must agree:
per-sequence losses, their gradients (transformers' through autograd over its loop),
``sigma`` (both put it on every arc's token score), ``"sum"``, ``"mean_volume"`` and
``"mean"`` (each loss divided by its target length before the batch mean, in both).
"""

from __future__ import annotations

import pytest
import torch

import seqloss

loss_tdt = pytest.importorskip("transformers.loss.loss_tdt")


def _case(seed: int, B: int = 3, T: int = 7, U: int = 4, V: int = 6, D: int = 4):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randn(B, T, U + 1, V, generator=g) * 2
    dur = torch.randn(B, T, U + 1, D, generator=g)
    targets = torch.randint(0, V - 1, (B, U), generator=g)  # blank is V - 1
    Tl = torch.tensor([T, T - 2, 3][:B])
    Ul = torch.tensor([U, U - 1, 2][:B])
    return tok, dur, targets, Tl, Ul


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_tdt_matches_transformers(seed: int, sigma: float) -> None:
    durations = [0, 1, 2, 4]
    tok, dur, tg, Tl, Ul = _case(seed, D=len(durations))
    V = tok.shape[-1]

    a_tok, a_dur = tok.clone().requires_grad_(), dur.clone().requires_grad_()
    theirs = loss_tdt.tdt_loss(a_tok, a_dur, tg, Tl, Ul, blank_token_id=V - 1,
                               durations=durations, sigma=sigma, reduction="none")
    theirs.sum().backward()

    b_tok, b_dur = tok.clone().requires_grad_(), dur.clone().requires_grad_()
    ours = seqloss.tdt_loss((b_tok, b_dur), tg, Tl, Ul, durations, blank=V - 1, sigma=sigma,
                            reduction="none")
    ours.sum().backward()

    assert torch.isfinite(theirs).all()
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b_tok.grad, a_tok.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b_dur.grad, a_dur.grad, rtol=1e-4, atol=1e-5)


def test_tdt_reductions_match_transformers() -> None:
    durations = [0, 1, 2, 3]
    tok, dur, tg, Tl, Ul = _case(7, D=len(durations))
    V = tok.shape[-1]
    kw = {"blank_token_id": V - 1, "durations": durations}
    for red in ("sum", "mean_volume", "mean"):
        want = loss_tdt.tdt_loss(tok, dur, tg, Tl, Ul, reduction=red, **kw)
        got = seqloss.tdt_loss((tok, dur), tg, Tl, Ul, durations, blank=V - 1, reduction=red)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    per_seq = seqloss.tdt_loss((tok, dur), tg, Tl, Ul, durations, blank=V - 1, reduction="none")
    # and on the concatenated joint (NeMo's layout) the same values
    joint = torch.cat([tok, dur], dim=-1)
    got = seqloss.tdt_loss(joint, tg, Tl, Ul, durations, blank=V - 1, reduction="none")
    torch.testing.assert_close(got, per_seq, rtol=1e-6, atol=1e-5)
