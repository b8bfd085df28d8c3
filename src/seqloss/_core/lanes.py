"""What the eager CPU fast lanes share (``ctc/fast.py``, ``transducer/lattice/fast.py``).

A lane recognises the common eager call with exact-type tests and runs its kernel; the
declaration hands the results on through its one lean ``autograd.Function`` for every
lane (``opdecl._Lane``: one output, the gradients kept on ``ctx``). Here: the cheap
backend resolution, and the pieces that Function needs to keep the general path's
autograd semantics.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from . import torch_compat as tc
from .dispatch import _WATCHED, ENV_VAR, _env, resolve_backend
from .ops import DOUBLE_BACKWARD, batch_product, grads_to_hand_on

grad_enabled = torch.is_grad_enabled
compiling = torch.compiler.is_compiling
transforms_active = tc.functorch_transforms_active
is_functional = tc.is_functional_tensor
wrapped = tc.is_functorch_wrapped

_CPU = torch.device("cpu")


def _installed(backend: str) -> bool:
    try:
        resolve_backend(backend, _CPU)
    except ImportError:
        return False
    return True


_NUMBA = _installed("numba")
def cpu_backend(backend: object) -> str:
    """``dispatch.resolve_backend(backend, cpu)``: the common answers (Numba for ``"auto"``
    left to the default, or asked for by name) without its environment read; any other
    call is dispatch's own (and raises its errors)."""
    if _NUMBA and type(backend) is str:
        if backend == "auto":
            env = _env[0] if _WATCHED else os.environ.get(ENV_VAR)
            if env is None or env == "" or env == "auto" or env == "numba":
                return "numba"
        elif backend == "numba":
            return "numba"
    return resolve_backend(backend, _CPU)


def freed_graph() -> RuntimeError:
    """torch's error for a backward through a graph already freed (what unpacking a freed
    saved tensor raises; a lane keeps its gradients on ``ctx``, so it says it itself)."""
    return RuntimeError(
        "Trying to backward through the graph a second time (or directly access saved "
        "tensors after they have already been freed). Specify retain_graph=True if you "
        "need to backward a second time.")


class _Attached(torch.autograd.Function):
    """``g``, attached to the graph of ``x`` with a backward that raises ``message``. The
    ``setup_context`` form: a ``torch.func`` backward reaches it too (``opdecl``'s
    ``vjp`` ops)."""

    @staticmethod
    def forward(g, x, message):
        return g.clone()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.message = inputs[2]

    @staticmethod
    def backward(ctx, _g):
        raise RuntimeError(ctx.message)


def attach(x: Tensor, g: Tensor, message: str = DOUBLE_BACKWARD) -> Tensor:
    """``g`` (a gradient for ``x``, under ``create_graph``) attached to ``x``: a double
    backward through it meets the clear error instead of a silent zero."""
    return _Attached.apply(g, x, message)


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
