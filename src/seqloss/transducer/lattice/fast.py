"""``transducer_lattice``'s eager CPU fast lane: the common call in a few dozen operations.

After the Numba recursion has streamed its arcs, alpha, beta and occupations through
the caches (~2-3 MB at B=4, T=200, U=50), every Python line and torch call that follows
runs cold: the same ``autograd.grad`` that takes 22 us after a small forward takes
~80 us after the kernel. The general path (argument conversion, dispatch, the
three-output ``autograd.Function``, the backward's generic hand-off) cost ~0.3 ms
around a 1.6 ms kernel there. This lane takes the call a training loop makes --
float32/float64 CPU arcs, int-sequence durations, int64 CPU length tensors, the Numba
backend, no tracing or functorch transform, a gradient wanted -- with exact-type tests,
and runs the same implementation behind a one-output ``autograd.Function`` with the
general path's semantics (``tests/test_lattice.py``). Any other call returns ``None``
and takes the general path, which also raises every error.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..._core.dispatch import _AVAILABLE, kernel_module
from ..._core.lanes import (
    compiling,
    freed_graph,
    grad_enabled,
    is_functional,
    numba_chosen,
    scaled_grads,
    transforms_active,
    wrapped,
)
from ..._core.ops import _all_ones, _keep_graph, c_apply
from .op import _poison

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
_kern = None  # seqloss.transducer.lattice.numba_cpu, imported on first use


def _durations(d: object, n: int, low: int) -> tuple[int, ...] | None:
    if type(d) is not tuple and type(d) is not list or len(d) != n:
        return None
    for x in d:
        if type(x) is not int or x < low:
            return None
    return tuple(d)


def _lengths(x: object, B: int) -> np.ndarray | None:
    if (type(x) is not Tensor or x.dtype is not _I64 or not x.is_cpu or x.dim() != 1
            or x.shape[0] != B):
        return None
    return x.numpy()


def lattice_fast(arc_blank, arc_emit, logit_lengths, target_lengths, blank_durations,
                 emit_durations, emit_can_end, backend, validate):
    """``transducer_lattice`` for the common eager CPU call, or ``None`` (the general path)."""
    global _kern
    dt = arc_blank.dtype if type(arc_blank) is Tensor else None
    if (dt is None or (dt is not _F32 and dt is not _F64) or type(arc_emit) is not Tensor
            or arc_emit.dtype is not dt or not arc_blank.is_cpu or not arc_emit.is_cpu
            or arc_blank.dim() != 4 or arc_emit.dim() != 4 or not numba_chosen(backend)
            or not (arc_blank.requires_grad or arc_emit.requires_grad) or not grad_enabled()):
        return None
    B, T, U1, nb = arc_blank.shape
    se = arc_emit.shape
    if B == 0 or se[0] != B or se[1] != T or se[2] != U1:
        return None
    if (compiling() or transforms_active() or is_functional(arc_blank)
            or is_functional(arc_emit) or not _AVAILABLE["numba"]):
        return None  # before any value read: tracing (fake tensors) has no values
    bd = _durations(blank_durations, nb, 1)
    ed = _durations(emit_durations, se[3], 0)
    il = _lengths(logit_lengths, B)
    tl = _lengths(target_lengths, B)
    if (bd is None or ed is None or il is None or tl is None or type(emit_can_end) is not bool
            or type(validate) is not bool):  # any other flag: the general path checks it
        return None
    # Out-of-range lengths: the general path raises the error naming them.
    if validate is not False and (il.min() < 0 or il.max() > T or tl.min() < 0
                                  or tl.max() > U1 - 1):
        return None
    k = _kern
    if k is None:
        k = _kern = kernel_module("lattice", "numba")
    spec = (k, logit_lengths, target_lengths, bd, ed, emit_can_end, validate is not False)
    return _apply(spec, arc_blank, arc_emit)


class _FastLattice(torch.autograd.Function):
    """``op._EagerLattice`` for the lane: the same implementation and backward rule
    (``grads_to_hand_on``), one output, the occupations kept on ``ctx``."""

    @staticmethod
    def forward(ctx, spec, ab, ae):
        k, il, tl, bd, ed, can, validate = spec
        ll, ob, oe = k.transducer_lattice(ab.detach(), ae.detach(), il, tl, bd, ed, True, can)
        v = ll.numpy()
        s = v.sum()  # NaN or +inf in any sequence: the general path's poisoning
        if s != s or s == np.inf:
            ll, ob, oe = _poison(ll, ob, oe, il, tl, list(bd), list(ed), can)
        ctx.ob, ctx.oe, ctx.ab, ctx.ae, ctx.validate = ob, oe, ab, ae, validate
        return ll

    @staticmethod
    def backward(ctx, g):
        ob, oe = ctx.ob, ctx.oe
        if ob is None:
            raise freed_graph()
        keep = _keep_graph()
        if (not keep and type(g) is Tensor and not grad_enabled() and ctx.validate
                and not compiling() and not wrapped(g) and _all_ones(g)):
            ctx.ob = ctx.oe = ctx.ab = ctx.ae = None
            return None, ob, oe
        gb, ge = scaled_grads((ob, oe), (ctx.ab, ctx.ae), g, 0, ctx.validate)
        if not keep:
            ctx.ob = ctx.oe = ctx.ab = ctx.ae = None
        return None, gb, ge


_apply = c_apply(_FastLattice)
