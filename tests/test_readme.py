"""The README's self-contained Python examples run as written (those starting with
``import torch, seqloss``); the others are fragments checked where their feature is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    if not README.exists():
        return []
    return [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
            if b.startswith("import torch, seqloss")]


@pytest.mark.skipif(not _blocks(), reason="README.md is not in this checkout")
@pytest.mark.parametrize("k", range(len(_blocks())))
def test_readme_example_runs(k):
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(_blocks()[k], f"README.md example {k}", "exec"), scope)
    # Every example ends in a backward: some leaf it made received a finite gradient.
    leaves = [v for v in scope.values() if isinstance(v, torch.Tensor) and v.requires_grad
              and v.is_leaf]
    assert leaves and all(v.grad is not None and bool(torch.isfinite(v.grad).all())
                          for v in leaves)
