"""Gradient clamping through an identity, for composing with any loss."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .errors import InputError, InputTypeError


class _GradClamp(torch.autograd.Function):
    # setup_context (not forward(ctx, ...)) so torch.func transforms accept it too.
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, clamp: float) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.clamp = inputs[1]

    @staticmethod
    def backward(ctx, g: Tensor):
        # NaN gradients stay NaN: clamping must not hide a poisoned sequence.
        return g.clamp(-ctx.clamp, ctx.clamp), None


def grad_clamp(x: Tensor, clamp: float) -> Tensor:
    """Identity in the forward pass; the backward clamps the gradient to ``[-clamp, clamp]``.

    The behaviour of NeMo/ESPnet's ``LogSoftmaxGradModification``: place it between a
    joiner's log-softmax (or logits) and any loss to bound the gradient flowing back.

    Args:
        x: any floating tensor.
        clamp: ``>= 0``; ``0`` zeroes the gradient (as NeMo's does).

    Raises:
        InputError: ``clamp`` negative or NaN.
        TypeError: ``clamp`` not a real number, or ``x`` not a tensor.
    """
    if not isinstance(x, Tensor):
        raise InputTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(clamp, bool) or not isinstance(clamp, (int, float)):
        raise InputTypeError(f"clamp must be a real number, got {type(clamp).__name__}")
    if math.isnan(clamp) or clamp < 0:
        raise InputError(f"clamp must be >= 0, got {clamp}")
    return _GradClamp.apply(x, float(clamp))
