"""``torch.compiler.disable`` without importing ``torch._dynamo`` at import time.

``torch.compiler.disable(fn)`` imports ``torch._dynamo`` (1.5-2 s, with sympy and
triton) when it is applied, so decorating at module level made ``import seqloss``
pay it. ``eager_only`` defers it to the first call made once ``torch._dynamo`` is
loaded (before that no compiler can be running: ``torch.compile`` loads it), and
marks the wrapper as ``torch.compiler.disable`` marks its own: a compiled caller
then graph-breaks at the call, naming ``reason`` (``fullgraph=True`` raises it),
even before any eager call.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

from .torch_compat import compiler_disable, mark_disabled

F = TypeVar("F", bound=Callable)


def eager_only(fn: F, reason: str) -> F:
    """``fn`` that never runs under the compiler (``torch.compiler.disable(fn, reason=reason)``)."""
    disabled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:  # eager only: nothing to disable
                return fn(*args, **kwargs)
            disabled = compiler_disable(fn, reason)
        return disabled(*args, **kwargs)

    mark_disabled(wrapper, reason)
    return wrapper  # type: ignore[return-value]
