"""``seqloss::transducer_lattice``: the lattice recursion as a differentiable torch.library op.

The forward pass runs the backend's recursion (alpha, beta and the arc occupations
in one call: function merging, as for the losses); the backward scales the saved
occupations by the incoming per-sequence gradient (``d ll_b / d arc = occupation``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.dispatch import kernel_module
from ..._core.opdecl import OpDecl
from .fast import lattice_fast, poison


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lattice_impl(
    arc_blank: Tensor,
    arc_emit: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank_durations: list[int],
    emit_durations: list[int],
    emit_can_end: bool,
    backend: str,
    compute_grad: bool,
    validate: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(log_likelihood (B,), occ_blank, occ_emit)``; occupations empty unless ``compute_grad``.

    Arcs of any float dtype; the recursion runs in float32 (float64 for float64
    arcs). Arguments were checked by the caller.
    """
    if validate:  # value checks inside the op: eager even under torch.compile
        T, U1 = arc_blank.shape[1], arc_blank.shape[2]
        _validate.check_lengths(logit_lengths, "logit_lengths", T, "arc_blank.size(1) (T)")
        _validate.check_lengths(target_lengths, "target_lengths", U1 - 1,
                                "arc_blank.size(2) - 1 (U)")
    acc = _acc(arc_blank.dtype)
    ab = arc_blank.detach().to(acc)
    ae = arc_emit.detach().to(acc)
    kern = kernel_module("lattice", backend)
    ll, ob, oe = kern.transducer_lattice(
        ab, ae, logit_lengths, target_lengths, tuple(blank_durations), tuple(emit_durations),
        compute_grad, emit_can_end,
    )
    ll, ob, oe = poison(ll, ob if compute_grad else None, oe if compute_grad else None,
                         logit_lengths, target_lengths, blank_durations, emit_durations,
                         emit_can_end)
    if compute_grad:
        # NaN in entries no path reads must not leak into the occupations (they are
        # exactly 0 there by the kernels' contract); the dtype is the input's.
        ob = ob.to(arc_blank.dtype)
        oe = oe.to(arc_emit.dtype)
    else:
        ob, oe = arc_blank.new_empty(0), arc_emit.new_empty(0)
    return ll.to(acc), ob, oe


def _fake(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations, emit_durations,
          emit_can_end, backend, compute_grad, validate):
    B = arc_blank.shape[0]
    ll = arc_blank.new_empty((B,), dtype=_acc(arc_blank.dtype))
    if compute_grad:
        return ll, torch.empty_like(arc_blank), torch.empty_like(arc_emit)
    return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)


# The gradient of each log-likelihood with respect to an arc is its occupation.
lattice_decl = OpDecl("seqloss::transducer_lattice", lattice_impl, _fake, n_diff=2,
                 fast=lattice_fast)
lattice_op = lattice_decl.op
