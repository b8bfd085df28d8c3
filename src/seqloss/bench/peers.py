"""Other libraries' transducer losses, as the benchmark times them beside seqloss.

Each is ``f(inputs) -> (logits -> loss)``, named by a :class:`~seqloss._core.registry.Peer`
of a family's registry entry. ``inputs`` is the benchmark's dict
(:meth:`seqloss.bench.transducer.Variant.make_inputs`): ``logits``, ``targets``,
``logit_lengths``, ``target_lengths``, ``blank``, ``num_tokens`` and the variant's own
arguments (``big_blank_durations``, ``durations``); ``reduction="sum"``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LossOf = Callable[[torch.Tensor], torch.Tensor]


def _int32(d: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(d[k].to(torch.int32) for k in ("targets", "logit_lengths", "target_lengths"))


def torchaudio_rnnt(d: dict) -> LossOf:
    import torchaudio.functional as AF

    tg, il, tl = _int32(d)
    return lambda x: AF.rnnt_loss(x, tg, il, tl, blank=d["blank"], reduction="sum")


def fast_rnnt(d: dict) -> LossOf:
    import fast_rnnt

    B = d["logits"].shape[0]
    boundary = torch.zeros(B, 4, dtype=torch.int64)
    boundary[:, 2] = d["target_lengths"]
    boundary[:, 3] = d["logit_lengths"]
    return lambda x: fast_rnnt.rnnt_loss(logits=x, symbols=d["targets"],
                                         termination_symbol=d["blank"], boundary=boundary,
                                         reduction="sum")


def warprnnt_numba(d: dict) -> LossOf:
    import warprnnt_numba

    tg, il, tl = _int32(d)
    return lambda x: warprnnt_numba.rnnt_loss(x, tg, il, tl, blank=d["blank"], reduction="sum")


def nemo_multiblank(d: dict) -> LossOf:
    from ..testing import nemo_rnnt_pytorch

    loss = nemo_rnnt_pytorch().MultiblankRNNTLossPytorch(
        d["blank"], list(d["big_blank_durations"]), reduction="sum")
    tg, il, tl = (d[k] for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: loss(acts=x, labels=tg, act_lens=il, label_lens=tl)


def transformers_tdt(d: dict) -> LossOf:
    from transformers.loss.loss_tdt import tdt_loss

    vt, durs = d["num_tokens"], list(d["durations"])
    tg, il, tl = _int32(d)
    # Its (token_logits, duration_logits) pair: views of the one tensor, no copy.
    return lambda x: tdt_loss(x[..., :vt], x[..., vt:], tg, il, tl, blank_token_id=d["blank"],
                              durations=durs, reduction="sum")


def nemo_tdt(d: dict) -> LossOf:
    from ..testing import nemo_rnnt_pytorch

    loss = nemo_rnnt_pytorch().TDTLossPytorch(d["blank"], list(d["durations"]), reduction="sum")
    # It allocates its alphas with .cuda(): its inputs go there (the copies are timed).
    tg, il, tl = (d[k].cuda() for k in ("targets", "logit_lengths", "target_lengths"))
    return lambda x: loss(acts=x.cuda(), labels=tg, act_lens=il, label_lens=tl)
