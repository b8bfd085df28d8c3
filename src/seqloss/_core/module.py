"""The base of the ``nn.Module`` wrappers (``CTCLoss``, ``RNNTLoss``, ...)."""

from __future__ import annotations

import torch

from . import checks


def _differs(value: object, default: object) -> bool:
    # Durations may be a numpy array or a tensor: their != is elementwise.
    try:
        return bool(value != default)
    except (ValueError, RuntimeError, TypeError):
        return True


class LossModule(torch.nn.Module):
    """Holds a loss's keyword arguments; ``repr`` shows the ones that differ from the defaults.

    Subclasses set ``_defaults`` (name -> default, in signature order) and call
    ``super().__init__(**kwargs)`` with every argument.
    """

    _defaults: dict[str, object] = {}

    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        for k, v in kwargs.items():
            if isinstance(self._defaults.get(k), bool):  # a flag: its error here, not at forward
                v = checks.flag(v, k)
            setattr(self, k, v)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={getattr(self, k)!r}" for k, d in self._defaults.items()
                         if _differs(getattr(self, k), d))

    def __prepare_scriptable__(self) -> torch.nn.Module:
        # torch.jit.script calls this first: say why instead of failing on an annotation.
        raise NotImplementedError(
            f"seqloss.{type(self).__name__} does not support TorchScript (torch.jit.script); "
            f"use it in eager mode or under torch.compile, which it supports without graph breaks"
        )
