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

from .errors import InputError, InputTypeError
from .torch_compat import functorch_values, is_functorch_wrapped
from .types import REDUCTIONS

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
# Lengths and targets: any integer dtype torch's ctc_loss takes (int64 holds them all).
LENGTH_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                 torch.uint16, torch.uint32)


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


def int_arg(x: object, name: str) -> int:
    """An integral scalar argument (``blank``): a Python or numpy int, or a 0-D integer
    tensor (as torch accepts), as an ``int``."""
    if isinstance(x, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be an int, got bool")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if (isinstance(x, torch.Tensor) and x.dim() == 0 and not x.dtype.is_floating_point
            and not x.dtype.is_complex and x.dtype != torch.bool):
        return int(x.item())
    raise InputTypeError(f"{name} must be an int, got {type(x).__name__}")


def flag(x: object, name: str) -> bool:
    """A boolean argument (``zero_infinity``, ``validate``, ...) as a ``bool``.

    Takes what ``bool()`` reads unambiguously: ``True``/``False``, a numpy bool, the
    ints 0 and 1, or a 0-D bool or integer tensor holding 0 or 1 (read on the host: a
    sync for a device tensor). Anything else is a ``TypeError`` naming the argument:
    a tensor of several values is ambiguous, and a string, ``None`` or another number
    there is usually an argument in the wrong place (``bool("False")`` is ``True``).
    """
    if x is True or x is False:
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    if _is_int(x) and x in (0, 1):
        return bool(x)
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and not x.dtype.is_floating_point and not x.dtype.is_complex:
            v = x.item()
            if v in (0, 1):
                return bool(v)
            raise InputTypeError(f"{name} must be a bool, got a 0-D {x.dtype} tensor "
                                 f"holding {v}")
        raise InputTypeError(f"{name} must be a bool, got a {x.dtype} tensor of shape "
                             f"{tuple(x.shape)}")
    what = f"{type(x).__name__} {x!r}" if isinstance(x, (int, float, str, np.number)) else (
        type(x).__name__)
    raise InputTypeError(f"{name} must be a bool, got {what}")


def as_index_tensor(
    x: object, name: str, device: torch.device, *, allow_scalar: bool = False
) -> torch.Tensor:
    """``x`` as an int64 tensor on ``device``.

    Accepts integer tensors (int32/int64, and the narrower ones torch takes; any
    shape: the batch check reshapes), numpy integer arrays, Python sequences of ints
    (numpy integer scalars and 0-D integer tensors included) and, with
    ``allow_scalar``, a single int.
    """
    if isinstance(x, torch.Tensor):
        if x.dtype not in LENGTH_DTYPES:
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
                if isinstance(v, torch.Tensor) and v.dtype in LENGTH_DTYPES and v.dim() == 0:
                    continue
                raise InputTypeError(f"{name}[{i}] must be an int, got {type(v).__name__}")
        vals = [int(v) for v in x]
        for i, v in enumerate(vals):
            if not -(2**63) <= v < 2**63:
                raise InputError(f"{name}[{i}] = {v} does not fit in int64")
        t = torch.tensor(vals, dtype=torch.int64)
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
        raise InputError(f"{name} must be {what}, got a {x.dim()}-D tensor of shape "
                         f"{tuple(x.shape)}")


def check_batch(x: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    """``x`` as ``(batch,)``; a 0-D or ``(1, 1)`` tensor is accepted for a batch of one,
    and a ``(batch, 1)`` column for any batch (torch's ``ctc_loss`` takes both)."""
    if x.dim() == 1 and x.shape[0] == batch:
        return x
    if batch == 1 and x.numel() == 1 and x.dim() in (0, 2):
        return x.reshape(1)
    if x.dim() == 2 and tuple(x.shape) == (batch, 1):
        return x.reshape(batch)
    raise InputError(
        f"{name} must have shape ({batch},) (one entry per batch item), got {tuple(x.shape)}"
    )


def check_padded_targets(tg: torch.Tensor, batch: int) -> torch.Tensor:
    """``tg`` checked as padded ``(batch, U)``; ``[]`` (1-D, empty) for an empty batch."""
    if batch == 0 and tg.dim() == 1 and tg.numel() == 0:
        tg = tg.reshape(0, 0)
    check_ndim(tg, "targets", (2,), "padded (B, U)")
    if tg.shape[0] != batch:
        raise InputError(f"targets must have shape (B={batch}, U), got {tuple(tg.shape)}")
    return tg


def check_reduction(reduction: object, mean: str) -> str:
    """``reduction`` checked, with ``"mean"`` resolved to ``mean``, the explicit name of
    what ``"mean"`` means in the library the calling loss replaces."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise InputError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return mean if reduction == "mean" else reduction


def host_side(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read on the host without a device sync (CPU tensors).

    Every "read it on the host when that is free" branch asks this one function, so a
    test can declare every tensor a device tensor and check that ``validate=False``
    then reads nothing (``tests/test_no_sync.py``).
    """
    return t.device.type == "cpu"


def to_host(x: torch.Tensor) -> np.ndarray:
    """An int64 numpy view (CPU) or copy (other devices: a device-to-host sync) of ``x``.

    Under ``torch.func`` even a tensor made inside the transform (a default boundary, a
    length tensor) is wrapped; the values of these index tensors are the wrapped ones."""
    x = x.detach()
    if not is_functorch_wrapped(x):
        return x.cpu().numpy()
    return np.asarray(functorch_values(x))  # .numpy() refuses it while the transform runs


def check_lengths(lengths: torch.Tensor | np.ndarray, name: str, upper: int,
                  upper_what: str) -> np.ndarray:
    """Value check: ``0 <= lengths[b] <= upper``. Returns the lengths on the host (numpy)."""
    host = to_host(lengths) if isinstance(lengths, torch.Tensor) else lengths
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
    blank: int | tuple[int, ...],
    *,
    offsets: np.ndarray | None = None,
    classes_what: str | None = None,
) -> None:
    """Value check on target ids read by each sequence (padding is never read).

    ``ids`` is ``(B, S)`` padded, or 1-D concatenated with per-item ``offsets``;
    ``lengths`` is on the host. Ids must lie in ``[0, num_classes)`` and differ
    from ``blank`` (from each blank-like class, when a tuple). ``classes_what``: how
    ``num_classes`` was derived, for the message (e.g. a joint's token block).
    """
    # One class may stand for several arcs (TDT's blank, once per duration): name it once.
    blanks = (blank,) if isinstance(blank, int) else tuple(dict.fromkeys(blank))
    if lengths.size == 0:
        return
    host = to_host(ids) if isinstance(ids, torch.Tensor) else ids
    if host.size == 0:
        return
    bad = (host < 0) | (host >= num_classes)
    for c in blanks:
        bad |= host == c
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
    if v in blanks:
        what = (f"blank = {v}" if len(blanks) == 1
                else f"the blank-like class {v} (blanks: {blanks})")
        raise InputError(f"{where} = {v} equals {what}; targets may not contain blank")
    how = "" if classes_what is None else f" ({classes_what})"
    raise InputError(f"{where} = {v} is out of range: expected 0 <= id < {num_classes}{how}")


def as_targets_tensor(targets: object, device: torch.device) -> torch.Tensor:
    """``targets`` (an integer tensor or a (nested) sequence of ints) as int64 on ``device``."""
    if isinstance(targets, torch.Tensor):
        if targets.dtype not in LENGTH_DTYPES:
            raise InputTypeError(f"targets must be an int32 or int64 tensor, got {targets.dtype}")
        if targets.dtype == torch.int64 and targets.device == device:
            return targets
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
        if t.numel() == 0 and t.dtype.is_floating_point:  # [[], []]: no id, no dtype
            t = t.to(torch.int64)
        if t.dtype not in INDEX_DTYPES:
            raise InputTypeError(f"targets must hold ints, got {t.dtype}")
        return t.to(device=device, dtype=torch.int64)
    raise InputTypeError("targets must be an int tensor or a sequence of ints, "
                         f"got {type(targets).__name__}")


def check_float_arg(x: object, name: str, *, low: float | None = None) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise InputTypeError(f"{name} must be a float, got {type(x).__name__}")
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")) or (low is not None and x < low):
        raise InputError(f"{name} = {x} is invalid: expected a finite value" +
                         (f" >= {low}" if low is not None else ""))
    return x


def pad_targets(targets: torch.Tensor, target_lengths: torch.Tensor,
                tl_host: np.ndarray | None = None) -> torch.Tensor:
    """Padded ``(B, S)`` or concatenated 1-D targets as padded ``(B, S)`` int64, padding 0.

    Entries past a target length become 0, so no kernel ever reads an unchecked id.
    ``tl_host``: the lengths already on the host (from validation), if any.
    """
    device = targets.device
    if host_side(targets):
        tl_host = to_host(target_lengths) if tl_host is None else tl_host
        tg = to_host(targets)
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
    # Concatenated targets on a device: the padded width is the longest target when
    # validation read the lengths, else the bound the shape gives (reading the lengths
    # would be a device sync, which validate=False promises not to do).
    if tl_host is not None:
        S = int(tl_host.max()) if tl_host.size else 0
    else:
        S = targets.shape[0]
    lengths = target_lengths.to(device)
    offsets = torch.cumsum(lengths, 0) - lengths
    pos = offsets[:, None] + torch.arange(S, device=device)[None, :]
    read = torch.arange(S, device=device)[None, :] < lengths[:, None]
    if targets.numel() == 0:
        return torch.zeros((lengths.shape[0], S), dtype=torch.int64, device=device)
    gathered = targets[pos.clamp(max=targets.numel() - 1)]
    return torch.where(read, gathered, torch.zeros_like(gathered)).contiguous()
