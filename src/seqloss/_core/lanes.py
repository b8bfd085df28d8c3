"""What the eager CPU fast lanes share (``ctc/fast.py``, ``transducer/lattice/fast.py``).

A lane recognises the common eager call with exact-type tests and runs its kernel behind
a lean ``autograd.Function`` with one output, the saved gradients kept on ``ctx``. These
are the pieces such a Function needs to keep the general path's autograd semantics.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from .ops import _no_double_backward, batch_product, grads_to_hand_on

grad_enabled = torch.is_grad_enabled
compiling = torch.compiler.is_compiling
transforms_active = torch._C._are_functorch_transforms_active
is_functional = torch._is_functional_tensor
wrapped = torch._C._functorch.is_functorch_wrapped_tensor

# os.environ.get costs ~0.6 us; its backing dict (kept in step by os.environ's setters)
# ~0.05 us. A lane only runs where SEQLOSS_BACKEND leaves the default: unset, "" or
# "auto" (or "numba").
_ENV = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("SEQLOSS_BACKEND") if _ENV is not None else None
_ENV_OK = ({None, *(os.environ.encodevalue(v) for v in ("", "auto", "numba"))}
           if _ENV is not None else ())


def numba_chosen(backend: object) -> bool:
    """Whether ``backend`` resolves to Numba for a CPU tensor, read cheaply."""
    if backend == "numba":
        return True
    return backend == "auto" and _ENV is not None and _ENV.get(_ENV_KEY) in _ENV_OK


def freed_graph() -> RuntimeError:
    """torch's error for a backward through a graph already freed (what unpacking a freed
    saved tensor raises; a lane keeps its gradients on ``ctx``, so it says it itself)."""
    return RuntimeError(
        "Trying to backward through the graph a second time (or directly access saved "
        "tensors after they have already been freed). Specify retain_graph=True if you "
        "need to backward a second time.")


class _NoDoubleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        return g.clone()

    @staticmethod
    def backward(ctx, _g):
        _no_double_backward(ctx, _g)


def attach(x: Tensor, g: Tensor) -> Tensor:
    """``g`` (a gradient for ``x``, under ``create_graph``) attached to ``x``: a double
    backward through it meets the clear error instead of a silent zero."""
    return _NoDoubleBackward.apply(x, g)


def scaled_grads(grads: tuple[Tensor, ...], inputs: tuple[Tensor, ...], g: Tensor,
                 batch_dim: int, validate: bool) -> tuple[Tensor, ...]:
    """A lane's backward outside its common case: the general path's rule
    (``grads_to_hand_on``; the plain product under a functorch transform), each result
    attached to its input under ``create_graph``."""
    if wrapped(g):
        out = tuple(batch_product(x, g, batch_dim) for x in grads)
    else:
        out = grads_to_hand_on(grads, g, batch_dim, validate)
    if grad_enabled():  # create_graph: the gradients themselves are not differentiable
        out = tuple(attach(x, o) for x, o in zip(inputs, out, strict=True))
    return out
