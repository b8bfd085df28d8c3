"""Every private or version-dependent torch interface seqloss uses, in one place.

seqloss supports torch from the floor in pyproject.toml to the newest release. The
names below moved or changed between releases, or are private (``torch._C``); each
is taken here, behind a version guard or a public fallback, and
``tests/test_torch_compat.py`` fails loudly when one of them moves. Nothing else in
seqloss reaches into ``torch._C`` or ``torch._subclasses``.

- ``custom_op`` / ``infer_schema``: torch 2.4's schema inference refuses the string
  annotations that ``from __future__ import annotations`` makes, and has no public
  ``torch.library.infer_schema``; 2.5's takes ``typing.List[int]`` but not
  ``list[int]`` (2.7 takes both). Below 2.7 the annotations are evaluated here and
  rewritten to the typing forms every release accepts.
- ``compiler_disable``: ``torch.compiler.disable(fn, reason=...)`` takes ``reason``
  from torch 2.8 on; before, the reason is dropped (the graph break still happens).
- ``mark_disabled``: the attributes dynamo reads on a disabled function.
- ``functorch_values``: the values of an index tensor wrapped by a ``torch.func``
  transform (private ``torch._C._functorch``).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


TORCH_VERSION = _version(torch.__version__)

# ----------------------------------------------------------------------------- tracing state
# Private, but stable since torch 2.0 (tests/test_torch_compat.py checks each).
is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
functorch_transforms_active = torch._C._are_functorch_transforms_active
is_functional_tensor = torch._is_functional_tensor
TRACED_TENSORS = (FakeTensor, FunctionalTensor)

# Whether the running backward keeps its graph (``retain_graph=True``); where torch does
# not say, assume it does (the safe answer: callers then make a fresh product).
graph_task_keeps_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph",
                                 lambda: True)


def c_apply(cls: type[torch.autograd.Function]):
    """``cls``'s C++ ``apply`` without ``Function.apply``'s Python wrapper; ``cls.apply``
    where torch has no such C++ method (the public fallback)."""
    base = getattr(torch._C, "_FunctionBase", None)
    raw = getattr(base, "__dict__", {}).get("apply")
    if raw is None:
        return cls.apply
    return raw.__get__(None, cls)


def functorch_values(x: torch.Tensor) -> list:
    """The values of ``x`` (a tensor wrapped by a running ``torch.func`` transform) as a list.

    ``.numpy()`` refuses a wrapped tensor, so unwrap it; and on older releases (2.4.1,
    2.7.1, 2.8.0 measured) even the innermost tensor's ``.tolist()`` goes through the
    transform's dispatch, which fails ("Cannot access data pointer of Tensor that
    doesn't have storage"): read it with functorch's dispatch turned off.
    """
    while is_functorch_wrapped(x):
        x = torch._C._functorch.get_unwrapped(x)
    off = getattr(torch._C, "_DisableFuncTorch", None)
    if off is None:  # the public route, right where functorch no longer intercepts it
        return x.tolist()
    with off():
        return x.tolist()


# ----------------------------------------------------------------------------- custom ops
_OLD_SCHEMA = TORCH_VERSION < (2, 7)
_TYPING = {list: typing.List, tuple: typing.Tuple}  # noqa: UP006 (what torch < 2.7 reads)


def _old_form(tp):
    """``tp`` in the spelling torch < 2.7's schema inference accepts."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        parts = tuple(_old_form(a) for a in args)
        return typing.Union[parts]  # noqa: UP007
    if origin in _TYPING and args:
        inner = tuple(_old_form(a) for a in args)
        return _TYPING[origin][inner if len(inner) > 1 else inner[0]]
    return tp


def _evaluated(fn: Callable) -> Callable:
    """``fn`` as the schema inference sees it: its signature with evaluated annotations
    (strings, from ``from __future__ import annotations``, are resolved in ``fn``'s
    module), in torch < 2.7's spelling there."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    conv = _old_form if _OLD_SCHEMA else (lambda t: t)
    params = [p.replace(annotation=conv(hints[p.name])) if p.name in hints else p
              for p in sig.parameters.values()]
    ret = conv(hints["return"]) if "return" in hints else sig.return_annotation

    def same(*args, **kwargs):
        return fn(*args, **kwargs)

    same.__name__, same.__qualname__ = fn.__name__, fn.__qualname__
    same.__module__, same.__doc__ = fn.__module__, fn.__doc__
    same.__signature__ = sig.replace(parameters=params, return_annotation=ret)
    return same


def infer_schema(fn: Callable, mutates_args=()) -> str:
    """``torch.library.infer_schema(fn, mutates_args=...)`` on every supported torch."""
    if hasattr(torch.library, "infer_schema"):  # public from torch 2.5
        return torch.library.infer_schema(_evaluated(fn), mutates_args=mutates_args)
    from torch._library.infer_schema import infer_schema as private  # torch 2.4
    return private(_evaluated(fn), mutates_args)


def custom_op(name: str, fn: Callable, *, mutates_args=(), schema: str | None = None):
    """``torch.library.custom_op(name, fn, mutates_args=..., schema=...)``, whatever the
    annotations' spelling on this torch."""
    if schema is None and _OLD_SCHEMA:
        schema = infer_schema(fn, mutates_args)
    return torch.library.custom_op(name, fn, mutates_args=mutates_args, schema=schema)


# ----------------------------------------------------------------------------- compiler
_DISABLE_TAKES_REASON = TORCH_VERSION >= (2, 8)


def compiler_disable(fn: Callable, reason: str) -> Callable:
    """``torch.compiler.disable(fn, reason=reason)``; torch < 2.8 takes no ``reason``."""
    if _DISABLE_TAKES_REASON:
        return torch.compiler.disable(fn, reason=reason)
    return torch.compiler.disable(fn)


def mark_disabled(fn: Callable, reason: str) -> None:
    """Mark ``fn`` as ``torch.compiler.disable`` marks its own wrapper, without importing
    ``torch._dynamo``: dynamo (private attributes read in ``torch/_dynamo``) then refuses
    to inline it and breaks the graph, naming ``reason`` where it can."""
    fn._torchdynamo_disable = True
    fn._torchdynamo_disable_msg = reason
