"""``seqloss::transducer_lattice``: the lattice recursion as a differentiable torch.library op.

The forward pass runs the backend's recursion (alpha, beta and the arc occupations
in one call: function merging, as for the losses); the backward scales the saved
occupations by the incoming per-sequence gradient (``d ll_b / d arc = occupation``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.dispatch import kernel_module
from ..._core.ops import _functorch_wrapped, _is_traced, batch_product, c_apply, grads_to_hand_on


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
    ll, ob, oe = _poison(ll, ob if compute_grad else None, oe if compute_grad else None,
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


def _poison(ll: Tensor, ob: Tensor | None, oe: Tensor | None, il: Tensor, tl: Tensor,
            bd: list[int], ed: list[int], can: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """A sequence that reads NaN or ``+inf``: NaN log-likelihood and NaN occupations on
    every arc a path may take (the reference's result; the kernels may give ``+inf`` or
    zero occupations there). On CPU only when some sequence is such; on CUDA always
    (a few small elementwise ops, no device-to-host sync)."""
    if _validate.host_side(ll):
        # On the host, one numpy pass (~1 us; the torch ops below cost ~20 us a call).
        v = ll.numpy()
        if not (np.isnan(v).any() or np.isposinf(v).any()):
            return ll, ob, oe
    bad = ~(ll < float("inf")) & (ll != float("-inf"))
    ll = torch.where(bad, float("nan"), ll)
    if ob is None:
        return ll, ob, oe
    T, U1 = ob.shape[1], ob.shape[2]
    tt = torch.arange(T, device=ll.device)[None, :, None]
    uu = torch.arange(U1, device=ll.device)[None, None, :]
    Tb, Ub = il.to(ll.device)[:, None, None], tl.to(ll.device)[:, None, None]
    seq = bad[:, None, None] & (tt < Tb)
    # In place: the occupations are the kernel's own fresh tensors.
    for i, d in enumerate(bd):
        ob[..., i].masked_fill_(seq & (tt + d <= Tb) & (uu <= Ub), float("nan"))
    for j, e in enumerate(ed):
        lands = (tt + e <= Tb) if can else (tt + e < Tb)
        oe[..., j].masked_fill_(seq & lands & (uu < Ub), float("nan"))
    return ll, ob, oe


lattice_op = torch.library.custom_op("seqloss::transducer_lattice", lattice_impl, mutates_args=())


@lattice_op.register_fake
def _(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations, emit_durations,
      emit_can_end, backend, compute_grad, validate):
    B = arc_blank.shape[0]
    ll = arc_blank.new_empty((B,), dtype=_acc(arc_blank.dtype))
    if compute_grad:
        return ll, torch.empty_like(arc_blank), torch.empty_like(arc_emit)
    return ll, arc_blank.new_empty(0), arc_emit.new_empty(0)


def _setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.compute_grad, ctx.validate = inputs[-2], inputs[-1]
    ctx.save_for_backward(output[1], output[2])


def _backward(ctx, grad_ll, _g1, _g2):
    nones = (None,) * 8
    if grad_ll is None:
        return (None, None, *nones)
    if not ctx.compute_grad:
        raise RuntimeError("seqloss: transducer_lattice was called with compute_grad=False")
    ob, oe = ctx.saved_tensors
    v = ctx.validate  # False: no value read (no device sync), the product is out of place
    return (*grads_to_hand_on((ob, oe), grad_ll, 0, v), *nones)


lattice_op.register_autograd(_backward, setup_context=_setup)


class _EagerLattice(torch.autograd.Function):
    """``lattice_op`` in eager mode: the same implementation and backward behind a plain
    ``autograd.Function`` (the library's Python dispatch cost ~0.2 ms a call here, 10% of
    a B=4, T=200, U=50 lattice), as ``seqloss._core.ops.call_loss_op`` does for the
    losses. The occupations stay differentiable outputs, saved and unpacked, so a double
    backward meets ``scale_grad``'s clear error."""

    @staticmethod
    def forward(ctx, rest, ab, ae):
        out = lattice_impl(ab, ae, *rest)
        ctx.set_materialize_grads(False)
        ctx.compute_grad, ctx.validate = rest[-2], rest[-1]
        ctx.save_for_backward(out[1], out[2])
        return out

    @staticmethod
    def backward(ctx, grad_ll, _g1, _g2):
        gb, ge = _backward(ctx, grad_ll, _g1, _g2)[:2]
        return None, gb, ge


class _FuncLattice(torch.autograd.Function):
    """``_EagerLattice`` for ``torch.func`` transforms (grad, vjp), which need
    ``setup_context``; ``vmap`` and ``jvp`` are not supported."""

    @staticmethod
    def forward(rest, ab, ae):
        return lattice_impl(ab, ae, *rest)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _setup(ctx, (*inputs[1:], *inputs[0]), output)

    @staticmethod
    def backward(ctx, grad_ll, _g1, _g2):
        if grad_ll is not None and _functorch_wrapped(grad_ll):
            ob, oe = ctx.saved_tensors
            return None, batch_product(ob, grad_ll, 0), batch_product(oe, grad_ll, 0)
        gb, ge = _backward(ctx, grad_ll, _g1, _g2)[:2]
        return None, gb, ge


def call_lattice(ab: Tensor, ae: Tensor, *rest) -> tuple[Tensor, Tensor, Tensor]:
    """The registered op while tracing (compile, fake/functional tensors), a
    ``setup_context`` Function under ``torch.func``, the eager ``autograd.Function``
    otherwise. ``rest``: the op's arguments after the arcs."""
    if torch.compiler.is_compiling():
        return lattice_op(ab, ae, *rest)
    if _functorch_wrapped(ab) or _functorch_wrapped(ae):
        return _FuncLattice.apply(rest, ab, ae)
    if _is_traced(ab) or _is_traced(ae):
        return lattice_op(ab, ae, *rest)
    if not rest[-2]:  # no gradient wanted
        return lattice_impl(ab, ae, *rest)
    return _lattice_apply(rest, ab, ae)


_lattice_apply = c_apply(_EagerLattice)
