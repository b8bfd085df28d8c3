"""``transducer_lattice``'s eager CPU fast lane, the op declaration's ``fast`` hook.

After the Numba recursion has streamed its arcs, alpha, beta and occupations through
the caches (~2-3 MB at B=4, T=200, U=50), every Python line and torch call that follows
runs cold: the same ``autograd.grad`` that takes 22 us after a small forward takes
~80 us after the kernel. The general path's three-output ``autograd.Function`` and its
backward's generic hand-off cost ~0.3 ms around a 1.6 ms kernel there. This lane takes
the call a training loop makes -- float32/float64 CPU arcs of one dtype, the Numba
backend (as dispatch resolved it), a gradient wanted -- with the op's own (checked)
arguments, and runs the backend's public recursion; the declaration hands its results
on through its lanes' one-output ``autograd.Function``, with the general path's
semantics (``tests/test_fast_lanes.py``).
Any other call returns ``None`` and takes the general path, which also raises every
value error.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..._core import checks as _validate
from ..._core.dispatch import kernel_module

_F32, _F64 = torch.float32, torch.float64


def poison(ll: Tensor, ob: Tensor | None, oe: Tensor | None, il: Tensor, tl: Tensor,
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



def lattice_fast(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations,
                 emit_durations, emit_can_end, backend, compute_grad, validate):
    """``(log_likelihood, occ_blank, occ_emit)`` for the common eager CPU call, or ``None``.

    Called by the op declaration in eager mode only (no tracing, no functorch
    transform), with the op's arguments: checked, the backend resolved."""
    dt = arc_blank.dtype
    if (backend != "numba" or not compute_grad or (dt is not _F32 and dt is not _F64)
            or arc_emit.dtype is not dt or not arc_blank.is_cpu or arc_blank.shape[0] == 0):
        return None
    if validate:  # out-of-range lengths: the general path raises the error naming them
        T, U = arc_blank.shape[1], arc_blank.shape[2] - 1
        if arc_blank.shape[0] <= 64:  # small batches: lists (~1 us) beat 4 numpy reductions
            il, tl = logit_lengths.tolist(), target_lengths.tolist()
            bad = min(il) < 0 or max(il) > T or min(tl) < 0 or max(tl) > U
        else:
            il, tl = logit_lengths.numpy(), target_lengths.numpy()
            bad = il.min() < 0 or il.max() > T or tl.min() < 0 or tl.max() > U
        if bad:
            return None
    ll, ob, oe = kernel_module("lattice", "numba").transducer_lattice(
        arc_blank.detach(), arc_emit.detach(), logit_lengths, target_lengths,
        tuple(blank_durations), tuple(emit_durations), True, emit_can_end)
    s = ll.numpy().sum()  # NaN or +inf in any sequence: the general path's poisoning
    if s != s or s == np.inf:
        ll, ob, oe = poison(ll, ob, oe, logit_lengths, target_lengths, list(blank_durations),
                            list(emit_durations), emit_can_end)
    return ll, ob, oe
