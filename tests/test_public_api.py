"""The public names are the contract (API.md): pin them."""

from __future__ import annotations

import inspect

import seqloss

PUBLIC = {
    "CTCLoss", "InputError", "RNNTLoss", "ctc_align", "ctc_loss", "diagnose", "grad_clamp",
    "rnnt_align", "rnnt_loss", "rnnt_loss_packed", "transducer_lattice",
    "MultiBlankRNNTLoss", "TDTLoss", "multiblank_rnnt_loss", "tdt_loss",
    "multiblank_rnnt_align", "tdt_align",
    "logmmexp",
    "rnnt_loss_simple", "rnnt_loss_smoothed", "rnnt_loss_pruned", "get_rnnt_prune_ranges",
    "do_rnnt_pruning",
    "rnnt_loss_from_joint", "multiblank_rnnt_loss_from_joint", "tdt_loss_from_joint",
    "HATLoss", "hat_loss", "hat_loss_from_joint",
    "transducer_arc_logprobs", "transducer_arc_logprobs_from_joint",
    "distributed_mean",
}


def test_all_is_pinned():
    assert set(seqloss.__all__) == PUBLIC
    assert len(seqloss.__all__) == len(set(seqloss.__all__))
    for name in seqloss.__all__:
        assert getattr(seqloss, name) is not None


def test_argument_order_of_the_drop_ins():
    def params(fn):
        return list(inspect.signature(fn).parameters)

    assert params(seqloss.ctc_loss)[:7] == [
        "log_probs", "targets", "input_lengths", "target_lengths", "blank", "reduction",
        "zero_infinity"]
    assert params(seqloss.rnnt_loss)[:8] == [
        "logits", "targets", "logit_lengths", "target_lengths", "blank", "clamp", "reduction",
        "fused_log_softmax"]
    assert params(seqloss.hat_loss)[:7] == [
        "logits", "targets", "logit_lengths", "target_lengths", "blank", "clamp", "reduction"]
    assert params(seqloss.transducer_arc_logprobs)[:5] == [
        "logits", "targets", "logit_lengths", "target_lengths", "blank"]
    # k2's order: use_hat_loss is the ninth positional argument.
    assert params(seqloss.rnnt_loss_pruned)[:9] == [
        "logits", "symbols", "ranges", "termination_symbol", "boundary", "rnnt_type",
        "delay_penalty", "reduction", "use_hat_loss"]
    assert params(seqloss.distributed_mean) == ["losses", "weights", "group"]
    assert params(seqloss.transducer_lattice)[:6] == [
        "arc_blank", "arc_emit", "logit_lengths", "target_lengths", "blank_durations",
        "emit_durations"]
    for fn in (seqloss.ctc_loss, seqloss.rnnt_loss, seqloss.transducer_lattice):
        sig = inspect.signature(fn)
        assert sig.parameters["backend"].kind is inspect.Parameter.KEYWORD_ONLY
        assert sig.parameters["validate"].kind is inspect.Parameter.KEYWORD_ONLY
