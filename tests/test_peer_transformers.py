"""TDT against Hugging Face transformers' ``tdt_loss`` (optional: skipped when absent).

transformers ships a pure-PyTorch TDT loss (``transformers/loss/loss_tdt.py``, a port
of NeMo's ``TDTLossPytorch``) on the pair layout ``(token_logits, duration_logits)``,
float32, no clamp and no ``omega``. Where the two contracts meet they must agree:
per-sequence losses, their gradients (transformers' through autograd over its loop),
``sigma`` (both put it on every arc's token score), ``"sum"``, ``"mean_volume"`` and
``"mean"`` (each loss divided by its target length before the batch mean, in both).
"""

from __future__ import annotations

import importlib
from pathlib import Path

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


# --- the README's Parakeet swap, on tiny random models built from their configs -----------

def _readme_swap() -> dict:
    """The README's `parakeet-swap` code block, run as written."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("<!-- parakeet-swap:", 1)[1].split("```python\n", 1)[1]
    namespace: dict = {}
    exec(block.split("```", 1)[0], namespace)
    return namespace


_ENCODER = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "subsampling_factor": 4, "subsampling_conv_channels": 4,
            "num_mel_bins": 8, "conv_kernel_size": 3, "dropout": 0.0, "layerdrop": 0.0,
            "activation_dropout": 0.0, "attention_dropout": 0.0}
V, BLANK, PAD = 7, 6, 5  # transducers: blank is the last token, labels avoid the pad id


def _audio(B: int = 3, frames: int = 48):
    g = torch.Generator().manual_seed(3)
    features = torch.randn(B, frames, _ENCODER["num_mel_bins"], generator=g)
    mask = torch.ones(B, frames, dtype=torch.long)
    mask[1, 36:] = 0
    mask[2, 24:] = 0
    return {"input_features": features, "attention_mask": mask}


def _transducer_inputs(pad: int) -> dict:
    labels = torch.tensor([[1, 2, 3, 1], [4, 1, 0, pad], [2, pad, pad, pad]])
    decoder_input_ids = torch.cat([torch.full((3, 1), BLANK), labels], dim=1)
    return {**_audio(), "labels": labels, "decoder_input_ids": decoder_input_ids}


def _loss_and_grads(model, inputs: dict):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _assert_swap_matches(model, inputs: dict, swap) -> None:
    stock, stock_grads = _loss_and_grads(model, inputs)
    model.loss_function = swap
    ours, our_grads = _loss_and_grads(model, inputs)
    assert torch.isfinite(stock.loss) and stock.loss > 0
    torch.testing.assert_close(ours.loss, stock.loss, rtol=1e-5, atol=1e-5)
    assert our_grads.keys() == stock_grads.keys() and len(our_grads) > 10
    for name, grad in stock_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_readme_parakeet_ctc_swap() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ParakeetCTCConfig(vocab_size=V, pad_token_id=V - 1,
                                            encoder_config=_ENCODER)
    model = transformers.ParakeetForCTC(config).eval()
    labels = torch.tensor([[1, 2, 3, 1], [4, 1, 0, -100], [2, 2, -100, -100]])
    _assert_swap_matches(model, {**_audio(), "labels": labels}, _readme_swap()["seqloss_ctc"])


def test_readme_parakeet_tdt_swap() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = transformers.ParakeetTDTConfig(
        vocab_size=V, blank_token_id=BLANK, pad_token_id=PAD, durations=[0, 1, 2, 3],
        decoder_hidden_size=8, num_decoder_layers=1, encoder_config=_ENCODER)
    model = transformers.ParakeetForTDT(config).eval()
    _assert_swap_matches(model, _transducer_inputs(PAD), _readme_swap()["seqloss_tdt"])


def _rnnt_nll_float64(logits, labels, T: int, U: int):
    """-log P(labels | logits) by the textbook forward recursion, in float64."""
    lp = logits.double().log_softmax(-1)
    alpha = {(0, 0): lp.new_zeros(())}
    for t in range(T):
        for u in range(U + 1):
            terms = []
            if t > 0:
                terms.append(alpha[t - 1, u] + lp[t - 1, u, BLANK])
            if u > 0:
                terms.append(alpha[t, u - 1] + lp[t, u - 1, labels[u - 1]])
            if terms:
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
    return -(alpha[T - 1, U] + lp[T - 1, U, BLANK])


@pytest.mark.parametrize("reduction", ["mean_volume", "mean"])
def test_readme_parakeet_rnnt_swap(reduction: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    config = transformers.ParakeetRNNTConfig(
        vocab_size=V, blank_token_id=BLANK, pad_token_id=PAD, decoder_hidden_size=8,
        num_decoder_layers=1, encoder_config=_ENCODER)
    model = transformers.ParakeetForRNNT(config).eval()
    # transformers' RNN-T model counts the labels that are not blank: pad with blank
    inputs = _transducer_inputs(BLANK)
    swap = _readme_swap()["seqloss_rnnt"]
    try:
        importlib.import_module("torchaudio")
    except (ImportError, OSError):  # absent, or a build for another torch whose library won't load
        with pytest.raises((ImportError, OSError)):
            model(**inputs)
    else:
        _assert_swap_matches(model, inputs, swap)
    model.loss_function = lambda **kw: swap(**kw, reduction=reduction)
    ours, our_grads = _loss_and_grads(model, inputs)

    # the oracle on the model's own joint logits, through the same graph
    model.zero_grad()
    out = model(**{k: v for k, v in inputs.items() if k != "labels"})
    T_b = model.get_audio_features(**_audio()).attention_mask.sum(-1)
    U_b = (inputs["labels"] != BLANK).sum(-1)
    nll = torch.stack([_rnnt_nll_float64(out.logits[b], inputs["labels"][b], int(T_b[b]),
                                         int(U_b[b])) for b in range(len(U_b))])
    want = nll.sum() / U_b.sum() if reduction == "mean_volume" else (nll / U_b).mean()
    want.backward()
    torch.testing.assert_close(ours.loss.double(), want.detach(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(our_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
