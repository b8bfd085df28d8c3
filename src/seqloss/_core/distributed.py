"""``distributed_mean``: the global batch mean of per-sequence losses sharded over ranks.

DDP and FSDP average the gradients of the ranks' losses. A rank's own mean
(``reduction="mean_volume"`` on its shard) weights each shard equally, whatever its
number of sequences or tokens, so the averaged gradient is not that of the mean over
the global batch unless every shard holds the same total weight. Dividing the local sum
by the global weight ``W`` and multiplying by the world size ``N`` fixes that: the
average over ranks of ``N / W * d(local sum)`` is ``d(global sum) / W``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from .checks import check_float_tensor
from .compiler import eager_only
from .errors import InputError, InputTypeError


class _GlobalMean(torch.autograd.Function):
    """Value ``G / W`` (the all-reduced sums, the same number on every rank); gradient
    ``N / W`` for every local loss."""

    @staticmethod
    def forward(ctx, losses: torch.Tensor, stats: torch.Tensor, world: int) -> torch.Tensor:
        total, weight = stats[0], stats[1]
        # "mean_volume"'s rule: a zero total weight divides by 1 (every loss is then 0
        # times a weight of 0, or a plain sum of sequences that carry no weight).
        weight = torch.where(weight > 0, weight, torch.ones_like(weight))
        ctx.scale = world / weight  # float64: N / W can be subnormal in float16
        ctx.shape = losses.shape
        return (total / weight).to(losses.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        g = (grad.to(torch.float64) * ctx.scale).to(grad.dtype)
        return g.expand(ctx.shape), None, None


def _check_weights(weights: object, losses: torch.Tensor) -> torch.Tensor | None:
    """``weights`` as a detached 1-D tensor of ``losses``' length (``None`` stays
    ``None``), every value non-negative and finite (read on the host: a sync for a
    device tensor)."""
    if weights is None:
        return None
    if not isinstance(weights, torch.Tensor):
        if (not isinstance(weights, (Sequence, np.ndarray))
                or isinstance(weights, (str, bytes))):
            raise InputTypeError(
                f"weights must be a torch.Tensor, an array or a sequence of numbers, got "
                f"{type(weights).__name__}")
        try:
            weights = torch.as_tensor(weights, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputTypeError(f"weights must hold numbers: {e}") from None
    if weights.dtype == torch.bool or weights.dtype.is_complex:
        raise InputTypeError(f"weights must be an integer or floating tensor, got {weights.dtype}")
    if weights.dim() != 1 or weights.shape[0] != losses.shape[0]:
        raise InputError(
            f"weights must have shape ({losses.shape[0]},), one per loss, got "
            f"{tuple(weights.shape)}")
    weights = weights.detach()
    w = weights.to(torch.float64) if weights.is_floating_point() else weights
    bad = ~torch.isfinite(w) | (w < 0) if w.is_floating_point() else w < 0
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise InputError(
            f"weights must be non-negative and finite, got {weights[b].item()} at batch "
            f"index {b}")
    return weights


def _check_group(group: object) -> None:
    """``group`` is None or a ``torch.distributed.ProcessGroup`` (what DDP and
    ``dist.new_group`` take and give), whether or not a process group is initialized."""
    if group is None:
        return
    pg = getattr(dist, "ProcessGroup", None) if dist.is_available() else None
    if pg is None or not isinstance(group, pg):
        raise InputTypeError(
            f"group must be None or a torch.distributed.ProcessGroup, got "
            f"{type(group).__name__}")


def _world_size(group: object) -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    n = dist.get_world_size(group)
    if n < 1:  # torch's answer on a rank outside the group
        raise InputError("group: this rank is not a member of the process group")
    return n


def distributed_mean(
    losses: torch.Tensor,
    weights: torch.Tensor | np.ndarray | Sequence[float] | None = None,
    *,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    r"""The weighted mean of per-sequence losses over a whole data-parallel group.

    Each rank passes its own shard's losses (a loss's ``reduction="none"``) and weights.
    The value, the same on every rank, is

    .. math:: \frac{\sum_r \sum_b \ell_{r,b}}{\sum_r \sum_b w_{r,b}}

    (divisor 1 where the weights sum to 0), and the gradient of each local loss is
    ``N / W`` (``N``: the group's size, ``W``: the denominator), so that after DDP's or
    FSDP's gradient averaging every rank's parameters hold the gradient of this mean as
    one process would compute it on the concatenated global batch. Weights 1 (the
    default) give the global batch mean; target lengths give the global
    ``"mean_volume"``.

    Every rank runs exactly one ``all_reduce`` (SUM, float64, on ``losses``' device) of
    its ``[sum of losses, sum of weights]``, including a rank with no sequences
    (``B_r = 0``: it contributes 0 and its output stays connected to ``losses``, so its
    backward still runs DDP's hooks). A NaN or infinite loss on any rank makes the value
    NaN or infinite on every rank; nothing raises or waits on it. Bad input raises
    before the collective, on the ranks that got it. Without an initialized process
    group, or in a group of one, it is ``losses.sum() / weights.sum()``.

    Args:
        losses: ``(B_r,)`` float per-sequence losses of this rank.
        weights: ``(B_r,)`` non-negative finite weights: a tensor (any integer or float
            dtype, any device; not differentiated), an array or a sequence of numbers;
            ``None`` for 1 each.
        group: the process group to reduce over (default: the world); the one the
            model's DDP or FSDP averages over. Anything but ``None`` or a
            ``torch.distributed.ProcessGroup`` raises a ``TypeError``, with or without
            an initialized process group.

    Returns:
        A 0-D tensor in ``losses``' dtype and device.

    Properties: autograd; eager only (a compiled caller graph-breaks at the call).
    """
    _check_group(group)  # before anything else: a wrong group is not silently ignored
    losses = check_float_tensor(losses, "losses")
    if losses.dim() != 1:
        raise InputError(
            f"losses must be 1-D per-sequence losses (B,) (a loss's reduction=\"none\"), got "
            f"shape {tuple(losses.shape)}")
    w = _check_weights(weights, losses)
    world = _world_size(group)
    dev = losses.device
    f64 = torch.float64
    local_weight = (w.sum(dtype=f64).to(dev) if w is not None
                    else torch.tensor(float(losses.shape[0]), dtype=f64, device=dev))
    if world == 1:
        weight = torch.where(local_weight > 0, local_weight, torch.ones_like(local_weight))
        return (losses.sum(dtype=f64) / weight).to(losses.dtype)
    stats = torch.stack([losses.detach().sum(dtype=f64), local_weight])
    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    return _GlobalMean.apply(losses, stats, world)


distributed_mean = eager_only(
    distributed_mean, "seqloss.distributed_mean: a collective and a host-side check of the "
    "weights")
