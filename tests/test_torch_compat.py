"""The private and version-dependent torch interfaces (``seqloss/_core/torch_compat.py``):
each still exists and does what seqloss relies on, on the running torch. A failure here
names the interface that moved, before the losses fail in less readable ways."""

from __future__ import annotations

import typing

import pytest
import torch
from torch import Tensor

from seqloss._core import torch_compat as tc
from seqloss._core.compiler import eager_only


def test_version_parse():
    assert tc._version("2.4.1+cu121") == (2, 4)
    assert tc._version("2.10.0a0+git1234") == (2, 10)
    assert tc._version("2.15.0") == (2, 15)
    assert tc.TORCH_VERSION >= (2, 4)


def test_private_names_exist():
    for name in ("is_functorch_wrapped_tensor", "get_unwrapped"):
        assert callable(getattr(torch._C._functorch, name, None)), f"torch._C._functorch.{name}"
    assert callable(getattr(torch._C, "_are_functorch_transforms_active", None))
    assert callable(getattr(torch, "_is_functional_tensor", None))
    assert getattr(torch._C, "_DisableFuncTorch", None) is not None, "torch._C._DisableFuncTorch"
    # The C++ apply (a shortcut; Function.apply is the fallback).
    assert "apply" in torch._C._FunctionBase.__dict__, "torch._C._FunctionBase.apply moved"
    if tc.TORCH_VERSION >= (2, 13):  # older releases lack it: the safe fallback answers True
        assert tc.graph_task_keeps_graph is torch._C._autograd._get_current_graph_task_keep_graph


def test_c_apply_is_function_apply():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    x = torch.ones(3, requires_grad=True)
    y = tc.c_apply(Double)(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(y, 2 * x.detach()) and torch.equal(g, torch.full((3,), 2.0))


def test_tracing_predicates():
    x = torch.ones(2)
    assert not tc.is_functorch_wrapped(x) and not tc.is_functional_tensor(x)
    assert not tc.functorch_transforms_active()
    seen = []

    def f(y):
        seen.append((tc.is_functorch_wrapped(y), tc.functorch_transforms_active(),
                     tc.functorch_values(torch.arange(3) + y.detach().long()[:1])))
        return y.sum()

    torch.func.grad(f)(x)
    assert seen == [(True, True, [1, 2, 3])]


def _annotated(a: Tensor, b: Tensor | None, sizes: list[int], scale: float, name: str,
               flag: bool) -> tuple[Tensor, Tensor]:
    return a, a


def test_schema_from_string_annotations():
    # This module has ``from __future__ import annotations``: the annotations are strings.
    assert isinstance(_annotated.__annotations__["a"], str)
    schema = tc.infer_schema(_annotated, mutates_args=())
    assert schema == ("(Tensor a, Tensor? b, SymInt[] sizes, float scale, str name, "
                      "bool flag) -> (Tensor, Tensor)"), schema


def test_old_spelling():
    assert tc._old_form(list[int]) == typing.List[int]  # noqa: UP006
    assert tc._old_form(Tensor | None) == typing.Optional[Tensor]  # noqa: UP045
    assert tc._old_form(tuple[Tensor, Tensor]) == typing.Tuple[Tensor, Tensor]  # noqa: UP006


def _double(x: Tensor, k: int) -> Tensor:
    return x * k


def test_custom_op_from_string_annotations():
    op = tc.custom_op("seqloss_test::double", _double, mutates_args=())
    assert torch.equal(op(torch.ones(2), 3), torch.full((2,), 3.0))


def test_compiler_disable_breaks_the_graph():
    import torch._dynamo  # eager_only wraps once dynamo is loaded

    calls = []

    def side(x):
        calls.append(1)
        return x + 1

    f = eager_only(side, "seqloss test: must run eagerly")
    assert getattr(f, "_torchdynamo_disable", False)
    plain = tc.compiler_disable(side, "seqloss test")
    assert torch.equal(plain(torch.zeros(1)), torch.ones(1))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)skip|disable|graph break|unsupported"):
        torch.compile(lambda x: f(x) * 2, fullgraph=True, backend="eager")(torch.zeros(1))
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda x: f(x) * 2, backend="eager")(torch.zeros(1)),
                       torch.full((1,), 2.0))
    torch._dynamo.reset()
