"""Input checks shared by every loss.

Shape and dtype checks run in the public functions (they only read metadata, so
they also run while tracing). Checks that read values (lengths, ids) run inside
the op implementations, eagerly, so ``torch.compile`` never graph-breaks on them.
Every message names the argument, the batch index where there is one, and what
was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ._errors import InputError, InputTypeError
from ._types import REDUCTIONS, TRANSDUCER_REDUCTIONS

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_float_tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise InputTypeError(
            f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}"
        )
    return x


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def as_index_tensor(
    x: object, name: str, device: torch.device, *, allow_scalar: bool = False
) -> torch.Tensor:
    """``x`` as an int64 tensor on ``device``.

    Accepts int32/int64 tensors (any shape; the batch check reshapes), numpy integer
    arrays, Python sequences of ints (numpy integer scalars and 0-D integer tensors
    included) and, with ``allow_scalar``, a single int.
    """
    if isinstance(x, torch.Tensor):
        if x.dtype not in INDEX_DTYPES:
            raise InputTypeError(f"{name} must be an int32 or int64 tensor, got {x.dtype}")
        t = x
    elif isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu" or x.dtype.itemsize > 8 or x.dtype == np.uint64:
            raise InputTypeError(f"{name} must be an integer array, got a numpy {x.dtype} array")
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
    elif isinstance(x, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be an integer tensor or a sequence of ints, got bool")
    elif _is_int(x) and allow_scalar:
        t = torch.tensor(int(x), dtype=torch.int64)
    elif isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        for i, v in enumerate(x):
            if not _is_int(v):
                if isinstance(v, torch.Tensor) and v.dtype in INDEX_DTYPES and v.dim() == 0:
                    continue
                raise InputTypeError(f"{name}[{i}] must be an int, got {type(v).__name__}")
        t = torch.tensor([int(v) for v in x], dtype=torch.int64)
    else:
        raise InputTypeError(
            f"{name} must be an int32/int64 tensor, a numpy integer array or a sequence "
            f"of ints, got {type(x).__name__}"
        )
    if t.dtype != torch.int64 or t.device != device:
        t = t.to(device=device, dtype=torch.int64)
    return t


def check_ndim(x: torch.Tensor, name: str, ndims: Sequence[int], what: str) -> None:
    if x.dim() not in ndims:
        raise InputError(f"{name} must be {what}, got a {x.dim()}-D tensor of shape {tuple(x.shape)}")


def check_batch(x: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    """``x`` as ``(batch,)``; a 0-D or ``(1, 1)`` tensor is accepted for a batch of one."""
    if x.dim() == 1 and x.shape[0] == batch:
        return x
    if batch == 1 and x.numel() == 1 and x.dim() in (0, 2):
        return x.reshape(1)
    raise InputError(
        f"{name} must have shape ({batch},) (one entry per batch item), got {tuple(x.shape)}"
    )


def check_reduction(reduction: object, *, transducer: bool = False) -> None:
    allowed = TRANSDUCER_REDUCTIONS if transducer else REDUCTIONS
    if not isinstance(reduction, str) or reduction not in allowed:
        raise InputError(f"reduction must be one of {allowed}, got {reduction!r}")


def _host(x: torch.Tensor) -> np.ndarray:
    """An int64 numpy view (CPU) or copy (other devices: a device-to-host sync) of ``x``."""
    return x.detach().cpu().numpy()


def check_lengths(lengths: torch.Tensor | np.ndarray, name: str, upper: int,
                  upper_what: str) -> np.ndarray:
    """Value check: ``0 <= lengths[b] <= upper``. Returns the lengths on the host (numpy)."""
    host = _host(lengths) if isinstance(lengths, torch.Tensor) else lengths
    bad = (host < 0) | (host > upper)
    if bad.any():
        b = int(np.argmax(bad))
        v = int(host[b])
        why = "is negative" if v < 0 else f"exceeds {upper_what} = {upper}"
        raise InputError(f"{name}[{b}] = {v} {why}")
    return host


def check_ids(
    ids: torch.Tensor | np.ndarray,
    lengths: np.ndarray,
    name: str,
    num_classes: int,
    blank: int,
    *,
    offsets: np.ndarray | None = None,
) -> None:
    """Value check on target ids read by each sequence (padding is never read).

    ``ids`` is ``(B, S)`` padded, or 1-D concatenated with per-item ``offsets``;
    ``lengths`` is on the host. Ids must lie in ``[0, num_classes)`` and differ
    from ``blank``.
    """
    if lengths.size == 0:
        return
    host = _host(ids) if isinstance(ids, torch.Tensor) else ids
    if host.size == 0:
        return
    bad = (host < 0) | (host >= num_classes) | (host == blank)
    if offsets is None:
        bad &= np.arange(host.shape[1])[None, :] < lengths[:, None]
    if not bad.any():
        return
    if offsets is None:
        b, s = (int(v) for v in np.unravel_index(int(np.argmax(bad)), bad.shape))
        v = int(host[b, s])
        where = f"{name}[{b}, {s}]"
    else:
        i = int(np.argmax(bad))
        b = int(np.searchsorted(offsets + lengths, i, side="right"))
        s = i - int(offsets[b])
        v = int(host[i])
        where = f"{name}[{i}] (batch item {b}, position {s})"
    if v == blank:
        raise InputError(f"{where} = {v} equals blank = {blank}; targets may not contain blank")
    raise InputError(f"{where} = {v} is out of range: expected 0 <= id < {num_classes}")


def ctc_values(
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    T: int,
    C: int,
    blank: int,
    *,
    validate: bool,
) -> torch.Tensor:
    """Value checks for CTC; returns the targets as padded ``(B, S)`` int64.

    Padding entries (past a target length) are replaced by 0, so no kernel ever
    reads an unchecked id. The checks run on host (numpy) copies of the lengths
    and ids: on CPU they are views, so the per-call cost stays a few microseconds.
    """
    device = targets.device
    cpu = device.type == "cpu"
    tl_host = None
    if validate:
        check_lengths(input_lengths, "input_lengths", T, "log_probs.size(0) (T)")
        if targets.dim() == 2:
            tl_host = check_lengths(target_lengths, "target_lengths", targets.shape[1],
                                    "targets.size(1)")
        else:
            tl_host = check_lengths(target_lengths, "target_lengths", targets.shape[0],
                                    "targets.numel()")
            total = int(tl_host.sum())
            if total != targets.shape[0]:
                raise InputError(
                    f"target_lengths sum to {total} but the concatenated 1-D targets hold "
                    f"{targets.shape[0]} ids"
                )
        offsets = None if targets.dim() == 2 else np.cumsum(tl_host) - tl_host
        check_ids(targets, tl_host, "targets", C, blank, offsets=offsets)
    if cpu:
        tl_host = _host(target_lengths) if tl_host is None else tl_host
        tg = _host(targets)
        if targets.dim() == 2:
            read = np.arange(tg.shape[1])[None, :] < tl_host[:, None]
            return torch.from_numpy(np.where(read, tg, 0))
        S = int(tl_host.max()) if tl_host.size else 0
        offsets = np.cumsum(tl_host) - tl_host
        read = np.arange(S)[None, :] < tl_host[:, None]
        if tg.size == 0:
            return torch.zeros((tl_host.shape[0], S), dtype=torch.int64)
        pos = np.minimum(offsets[:, None] + np.arange(S)[None, :], tg.size - 1)
        return torch.from_numpy(np.where(read, tg[pos], 0))
    if targets.dim() == 2:
        S = targets.shape[1]
        read = torch.arange(S, device=device)[None, :] < target_lengths[:, None]
        return torch.where(read, targets, torch.zeros_like(targets)).contiguous()
    # Concatenated targets on a device: the padded width is a value (a sync).
    S = int(tl_host.max()) if tl_host is not None and tl_host.size else (
        int(target_lengths.max()) if target_lengths.numel() else 0)
    lengths = target_lengths.to(device)
    offsets = torch.cumsum(lengths, 0) - lengths
    pos = offsets[:, None] + torch.arange(S, device=device)[None, :]
    read = torch.arange(S, device=device)[None, :] < lengths[:, None]
    if targets.numel() == 0:
        return torch.zeros((lengths.shape[0], S), dtype=torch.int64, device=device)
    gathered = targets[pos.clamp(max=targets.numel() - 1)]
    return torch.where(read, gathered, torch.zeros_like(gathered)).contiguous()


def as_targets_tensor(targets: object, device: torch.device) -> torch.Tensor:
    """``targets`` (int32/int64 tensor or a (nested) sequence of ints) as int64 on ``device``."""
    if isinstance(targets, torch.Tensor):
        if targets.dtype not in INDEX_DTYPES:
            raise InputTypeError(f"targets must be an int32 or int64 tensor, got {targets.dtype}")
        return targets.to(device=device, dtype=torch.int64)
    if isinstance(targets, Sequence) and not isinstance(targets, (str, bytes)):
        try:
            t = torch.tensor(targets) if len(targets) else torch.zeros(0, dtype=torch.int64)
        except (ValueError, TypeError) as e:
            lens = [len(r) if isinstance(r, Sequence) else None for r in targets]
            if all(n is not None for n in lens) and len(set(lens)) > 1:
                b = next(i for i, n in enumerate(lens) if n != lens[0])
                raise InputError(
                    f"targets is a ragged nested sequence: row 0 has {lens[0]} ids, row {b} "
                    f"has {lens[b]}; pass padded (B, S) targets (pad with any id) or the "
                    f"concatenated 1-D ids"
                ) from None
            raise InputTypeError(f"targets must hold ints: {e}") from None
        if t.dtype not in INDEX_DTYPES:
            raise InputTypeError(f"targets must hold ints, got {t.dtype}")
        return t.to(device=device, dtype=torch.int64)
    raise InputTypeError(f"targets must be an int tensor or a sequence of ints, got {type(targets).__name__}")


def ctc_inputs(
    log_probs: torch.Tensor,
    targets: object,
    input_lengths: object,
    target_lengths: object,
    blank: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """Shape and dtype checks shared by every CTC entry point (metadata only).

    Accepts ``(T, B, C)`` log-probs with padded ``(B, S)`` or concatenated 1-D
    targets, or unbatched ``(T, C)`` with ``(S,)`` targets and scalar lengths.

    Returns:
        ``(log_probs (T, B, C), targets int64, input_lengths (B,) int64,
        target_lengths (B,) int64, unbatched)``; unbatched input gets ``B = 1``.
    """
    check_float_tensor(log_probs, "log_probs")
    device = log_probs.device
    unbatched = log_probs.dim() == 2
    if unbatched:
        tg = as_targets_tensor(targets, device)
        if tg.dim() != 1:
            raise InputError(f"targets must be 1-D (S,) for unbatched (T, C) log_probs, got {tuple(tg.shape)}")
        log_probs, tg = log_probs.unsqueeze(1), tg.unsqueeze(0)
        il = as_index_tensor(input_lengths, "input_lengths", device, allow_scalar=True).reshape(-1)
        tl = as_index_tensor(target_lengths, "target_lengths", device, allow_scalar=True).reshape(-1)
    else:
        check_ndim(log_probs, "log_probs", (3,), "(T, B, C) or (T, C)")
        tg = as_targets_tensor(targets, device)
        check_ndim(tg, "targets", (1, 2), "padded (B, S) or concatenated 1-D")
        il = as_index_tensor(input_lengths, "input_lengths", device)
        tl = as_index_tensor(target_lengths, "target_lengths", device)
    T, B, C = log_probs.shape
    il = check_batch(il, "input_lengths", B)
    tl = check_batch(tl, "target_lengths", B)
    if tg.dim() == 2 and tg.shape[0] != B:
        raise InputError(f"targets must have shape (B={B}, S), got {tuple(tg.shape)}")
    if isinstance(blank, bool) or not isinstance(blank, int):
        raise InputTypeError(f"blank must be an int, got {type(blank).__name__}")
    if C == 0:
        raise InputError("log_probs must have at least one class (C >= 1)")
    if not 0 <= blank < C:
        raise InputError(f"blank = {blank} is out of range: expected 0 <= blank < C = {C}")
    return log_probs, tg, il, tl, unbatched


# --------------------------------------------------------------------------- transducers
def transducer_inputs(
    logits: torch.Tensor,
    targets: object,
    logit_lengths: object,
    target_lengths: object,
    blank: object,
    *,
    packed: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Shape and dtype checks shared by the transducer entry points (metadata only).

    Padded: ``logits (B, T, U+1, V)``, ``targets (B, S)``. Packed: ``logits (N, V)``,
    ``targets`` padded ``(B, S)`` or concatenated 1-D. ``blank < 0`` counts from
    the end (``-1``: ``V - 1``).

    Returns:
        ``(targets int64, logit_lengths (B,) int64, target_lengths (B,) int64, blank)``.
    """
    check_float_tensor(logits, "logits")
    device = logits.device
    if packed:
        check_ndim(logits, "logits", (2,), "packed (sum_b T_b * (U_b + 1), V)")
    else:
        check_ndim(logits, "logits", (4,), "(B, T, U+1, V)")
    tg = as_targets_tensor(targets, device)
    il = as_index_tensor(logit_lengths, "logit_lengths", device)
    tl = as_index_tensor(target_lengths, "target_lengths", device)
    if packed:
        if il.dim() > 1 and il.numel() == 1:
            il = il.reshape(1)
        check_ndim(il, "logit_lengths", (1,), "(B,)")
    B = logits.shape[0] if not packed else il.shape[0]
    il = check_batch(il, "logit_lengths", B)
    tl = check_batch(tl, "target_lengths", B)
    if packed:
        check_ndim(tg, "targets", (1, 2), "padded (B, S) or concatenated 1-D")
    else:
        check_ndim(tg, "targets", (2,), "(B, U)")
    if tg.dim() == 2 and tg.shape[0] != B:
        raise InputError(f"targets must have shape (B={B}, U), got {tuple(tg.shape)}")
    if isinstance(blank, bool) or not isinstance(blank, int):
        raise InputTypeError(f"blank must be an int, got {type(blank).__name__}")
    V = logits.shape[-1]
    if V == 0:
        raise InputError("logits must have at least one class (V >= 1)")
    if not -V <= blank < V:
        raise InputError(f"blank = {blank} is out of range: expected -V <= blank < V = {V}")
    return tg, il, tl, blank % V


def check_float_arg(x: object, name: str, *, low: float | None = None) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InputTypeError(f"{name} must be a float, got {type(x).__name__}")
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")) or (low is not None and x < low):
        raise InputError(f"{name} = {x} is invalid: expected a finite value" +
                         (f" >= {low}" if low is not None else ""))
    return x


def transducer_values(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    *,
    validate: bool,
) -> torch.Tensor:
    """Value checks for transducers; returns the targets as padded ``(B, S)`` int64.

    Padded logits ``(B, T, U+1, V)``: ``logit_lengths[b] <= T``, ``target_lengths[b]
    <= min(targets.size(1), U)``. Packed ``(N, V)``: the rows add up to ``N``.
    Target ids read (``< target_lengths[b]``) must lie in ``[0, V)`` and differ
    from ``blank``. Entries past a target length are replaced by 0, so no kernel
    reads an unchecked id.
    """
    V = logits.shape[-1]
    packed = logits.dim() == 2
    if validate:
        if packed:
            il = check_lengths(logit_lengths, "logit_lengths", 2**62, "the int64 range")
        else:
            il = check_lengths(logit_lengths, "logit_lengths", logits.shape[1], "logits.size(1) (T)")
        if targets.dim() == 2:
            tl = check_lengths(target_lengths, "target_lengths", targets.shape[1], "targets.size(1)")
        else:
            tl = check_lengths(target_lengths, "target_lengths", targets.shape[0], "targets.numel()")
        if not packed:
            check_lengths(target_lengths, "target_lengths", logits.shape[2] - 1, "logits.size(2) - 1 (U)")
        if targets.dim() == 1 and int(tl.sum()) != targets.shape[0]:
            raise InputError(
                f"target_lengths sum to {int(tl.sum())} but the concatenated 1-D targets hold "
                f"{targets.shape[0]} ids"
            )
        if packed:
            rows = int((il * (tl + 1)).sum())
            if rows != logits.shape[0]:
                raise InputError(
                    f"logits.size(0) = {logits.shape[0]} but the packed layout needs "
                    f"sum_b logit_lengths[b] * (target_lengths[b] + 1) = {rows} rows"
                )
        offsets = None if targets.dim() == 2 else np.cumsum(tl) - tl
        check_ids(targets, tl, "targets", V, blank, offsets=offsets)
    return ctc_values(targets, logit_lengths, target_lengths, 2**62, V, blank, validate=False)
