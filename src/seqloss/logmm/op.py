"""``seqloss::logmmexp`` and ``seqloss::logmmexp_backward``: the torch.library ops.

Unlike the losses, the gradient cannot be computed in the forward pass (it depends
on the incoming ``(..., M, N)`` gradient), so the backward is an op of its own: the
two softmax-weighted matmuls of the backend. Both ops take and return 3-D tensors;
the public function broadcasts the leading dimensions and reshapes around them.
The forward returns the accumulation dtype (float32 for half inputs) so that the
backward's weights ``exp(a + b - out)`` use an unrounded ``out``; the public
function casts the result to the input dtype. In eager mode the same
implementations run behind a plain ``autograd.Function`` (the library's Python
dispatch costs ~30 us a call, see ``_core.ops``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._core.dispatch import kernel_module
from .._core.ops import _acc_dtype, _functorch_wrapped, _is_traced, conform_layout


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


logmmexp_op = torch.library.custom_op("seqloss::logmmexp", logmmexp_impl, mutates_args=())
logmmexp_backward_op = torch.library.custom_op(
    "seqloss::logmmexp_backward", logmmexp_backward_impl, mutates_args=()
)


@logmmexp_op.register_fake
def _(a, b, backend, compute_grad):
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


def _setup(ctx, inputs, output):
    a, b, backend, compute_grad = inputs
    ctx.backend = backend
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, b, *output)


def _backward(ctx, grads):
    g = grads[0]  # a list output's gradients arrive as one list; only out's matters
    a, b, out, *saved = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if g is None:
        return None, None, None, None
    ga, gb = logmmexp_backward_op(g, a, b, out, saved, ctx.backend, need_a, need_b)
    return (ga if need_a else None), (gb if need_b else None), None, None


logmmexp_op.register_autograd(_backward, setup_context=_setup)


class _Once(torch.autograd.Function):
    """``x``, attached to the graph of ``a`` and ``b`` with a backward that raises: the
    gradient of a backward run with ``create_graph=True``."""

    @staticmethod
    def forward(x, a, b):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass  # the setup_context form: torch.func's backward reaches it too

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("seqloss: double backward of logmmexp is not supported")


class _EagerLogmm(torch.autograd.Function):
    """The op's implementation behind a plain ``autograd.Function`` (eager mode only)."""

    @staticmethod
    def forward(ctx, a, b, backend):
        out, *saved = logmmexp_impl(a, b, backend, True)
        ctx.backend = backend
        ctx.save_for_backward(a, b, out, *saved)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out, *saved = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.no_grad():
            ga, gb = logmmexp_backward_impl(g, a, b, out, saved, ctx.backend, need_a, need_b)
        if torch.is_grad_enabled():  # create_graph=True: a second backward must raise
            ga = _Once.apply(ga, a, b) if need_a else ga
            gb = _Once.apply(gb, a, b) if need_b else gb
        return (ga if need_a else None), (gb if need_b else None), None


class _FuncLogmm(torch.autograd.Function):
    """``_EagerLogmm`` for ``torch.func`` transforms (grad, vjp), which need
    ``setup_context``: the saved intermediates are extra, non-differentiable outputs."""

    @staticmethod
    def forward(a, b, backend):
        out, *saved = logmmexp_impl(a, b, backend, True)
        return (out, *saved)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.backend = inputs[2]
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(inputs[0], inputs[1], *output)

    @staticmethod
    def backward(ctx, g, *_):
        return _EagerLogmm.backward(ctx, g)


def call_logmmexp(a: Tensor, b: Tensor, backend: str) -> Tensor:
    """The registered op while tracing, a ``setup_context`` Function under ``torch.func``,
    the eager ``autograd.Function`` otherwise."""
    compute_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if not torch.compiler.is_compiling() and (_functorch_wrapped(a) or _functorch_wrapped(b)):
        return _FuncLogmm.apply(a, b, backend)[0]
    if _is_traced(a) or _is_traced(b):
        return logmmexp_op(a, b, backend, compute_grad)[0]
    if not compute_grad:
        return logmmexp_impl(a, b, backend, False)[0]
    return _EagerLogmm.apply(a, b, backend)
