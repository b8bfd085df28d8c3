"""The README's Python blocks run as written: all of them in order in one namespace (a
fragment uses the names an earlier block defined, as a reader does), and each
self-contained example (starting with ``import torch, seqloss``) on its own too.

The one kind of block not run is one that needs the network (a model download), marked
by the line ``<!-- readme-test: skip (why) -->`` just before it; it is still compiled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP = "<!-- readme-test: skip"
_BLOCK = re.compile(r"^(<!--[^\n]*-->\n)?```python\n(.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[int, str, bool]]:
    """``(line, code, skipped)`` of each ```python block, in order."""
    if not README.exists():
        return []
    text = README.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2),
             bool(m.group(1)) and m.group(1).startswith(SKIP))
            for m in _BLOCK.finditer(text)]


def _run(code: str, line: int, scope: dict) -> None:
    # Compiled with its README line numbers, so a traceback points into README.md.
    exec(compile("\n" * (line - 1) + code, str(README.name), "exec"), scope)


pytestmark = pytest.mark.skipif(not _blocks(), reason="README.md is not in this checkout")


def test_every_block_runs_in_order():
    blocks = _blocks()
    text = README.read_text()
    # Every skip marker belongs to a block, and a skip says it needs the network.
    assert text.count(SKIP) == sum(s for _, _, s in blocks)
    assert all("download" in line for line in text.splitlines() if line.startswith(SKIP))
    torch.manual_seed(0)
    scope: dict = {}
    for line, code, skipped in blocks:
        if skipped:
            compile(code, f"README.md:{line}", "exec")
            continue
        _run(code, line, scope)
    losses = [v for v in scope.values()
              if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() == 0]
    assert losses and all(bool(torch.isfinite(v)) for v in losses)


_STANDALONE = [(line, code) for line, code, skipped in _blocks()
               if not skipped and code.startswith("import torch, seqloss")]


@pytest.mark.parametrize(("line", "code"), _STANDALONE, ids=[f"line{n}" for n, _ in _STANDALONE])
def test_self_contained_example_runs_alone(line, code):
    torch.manual_seed(0)
    scope: dict = {}
    _run(code, line, scope)
    if ".backward()" in code:
        # The example's backward reached every leaf it made, with finite values.
        leaves = [v for v in scope.values() if isinstance(v, torch.Tensor) and v.requires_grad
                  and v.is_leaf]
        assert leaves and all(v.grad is not None and bool(torch.isfinite(v.grad).all())
                              for v in leaves)


def test_ci_runs_the_readme_test_command():
    """The README's test command (in its first block) is the quick tier, and .ci/run runs it."""
    ci = README.parent / ".ci" / "run"
    if not ci.exists():
        pytest.skip(".ci/run is not in this checkout")
    first = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    command = next(line for line in first if "pytest" in line).rsplit("&&", 1)[-1].strip()
    assert command == "python -m pytest -q -m quick"
    assert any(line.strip().startswith(f"time {command} ") or line.strip() == command
               for line in ci.read_text().splitlines())
