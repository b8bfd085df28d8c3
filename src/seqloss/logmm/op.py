"""``seqloss::logmmexp`` and ``seqloss::logmmexp_backward``: the torch.library ops.

Unlike the losses, the gradient cannot be computed in the forward pass (it depends
on the incoming ``(..., M, N)`` gradient), so the backward is an op of its own: the
two softmax-weighted matmuls of the backend. Both ops take and return 3-D tensors;
the public function broadcasts the leading dimensions and reshapes around them.
The forward returns the accumulation dtype (float32 for half inputs) so that the
backward's weights ``exp(a + b - out)`` use an unrounded ``out``; the public
function casts the result to the input dtype. The forward op is a ``vjp``
declaration (``_core.opdecl``): eagerly, the same implementations run behind the
declaration's plain ``autograd.Function``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core.dispatch import kernel_module
from .._core.opdecl import OpDecl
from .._core.ops import _acc_dtype, conform_layout
from .._core.torch_compat import custom_op


def logmmexp_impl(a: Tensor, b: Tensor, backend: str, compute_grad: bool) -> list[Tensor]:
    """``[out (B, M, N), *saved]``, ``out`` in the accumulation dtype; ``a (B, M, K)``,
    ``b (B, K, N)`` checked. ``saved``: what the backend's backward reuses (empty
    unless ``compute_grad``)."""
    acc = _acc_dtype(a.dtype)
    kern = kernel_module("logmm", backend)
    # Contiguous operands: the saved factors then have the strides the fake kernel
    # promises (a transposed b, as the simple loss passes, gave permuted ones). Autocast
    # off: it would run the kernels' matmuls in bfloat16/float16.
    with torch.autocast(a.device.type, enabled=False):
        out, saved = kern.logmmexp_forward(a.detach().to(acc).contiguous(),
                                           b.detach().to(acc).contiguous(), compute_grad)
    return [out, *saved]


def logmmexp_backward_impl(
    g: Tensor, a: Tensor, b: Tensor, out: Tensor, saved: list[Tensor], backend: str,
    need_a: bool, need_b: bool,
) -> tuple[Tensor, Tensor]:
    """``(grad_a, grad_b)`` in the inputs' dtypes; one not needed is returned empty."""
    acc = _acc_dtype(a.dtype)
    kern = kernel_module("logmm", backend)
    with torch.autocast(a.device.type, enabled=False):
        ga, gb = kern.logmmexp_backward(
            g.detach().to(acc), a.detach().to(acc), b.detach().to(acc), out.detach(),
            [x.detach() for x in saved], need_a, need_b,
        )
    # The layout the fake kernel promises (``empty_like`` of the operand).
    ga = conform_layout(ga.to(a.dtype), a) if need_a else a.new_empty(0)
    gb = conform_layout(gb.to(b.dtype), b) if need_b else b.new_empty(0)
    return ga, gb


logmmexp_backward_op = custom_op(
    "seqloss::logmmexp_backward", logmmexp_backward_impl, mutates_args=()
)


def _fake(a, b, backend, compute_grad):
    acc = _acc_dtype(a.dtype)
    out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]), dtype=acc)
    saved = kernel_module("logmm", backend).saved_like(a.to(acc), b.to(acc)) if compute_grad else []
    return [out, *saved]


@logmmexp_backward_op.register_fake
def _(g, a, b, out, saved, backend, need_a, need_b):
    ga = torch.empty_like(a) if need_a else a.new_empty(0)
    gb = torch.empty_like(b) if need_b else b.new_empty(0)
    return ga, gb


def _no_double_backward(ctx, *grads):
    raise RuntimeError("seqloss: double backward of logmmexp is not supported")


logmmexp_backward_op.register_autograd(_no_double_backward)


def _vjp(g, xs, outs, rest, needs, traced):
    a, b = xs
    out, *saved = outs
    need_a, need_b = needs
    backward = logmmexp_backward_op if traced else logmmexp_backward_impl
    ga, gb = backward(g, a, b, out, saved, rest[0], need_a, need_b)
    return (ga if need_a else None), (gb if need_b else None)


logmmexp_decl = OpDecl("seqloss::logmmexp", logmmexp_impl, _fake, n_diff=2, vjp=_vjp)
logmmexp_op = logmmexp_decl.op


def call_logmmexp(a: Tensor, b: Tensor, backend: str) -> Tensor:
    """The declaration's call ladder (the registered op while tracing)."""
    compute_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    return logmmexp_decl.value(a, b, backend, compute_grad)
