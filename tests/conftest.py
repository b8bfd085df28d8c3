"""Shared fixtures: backends, dtypes, and NaN-poisoned ``torch.empty``."""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch

# The Triton interpreter is chosen when @triton.jit runs: set it before any kernel import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.pop("SEQLOSS_BACKEND", None)

import pytest
from hypothesis import settings

from seqloss._core import registry
from seqloss._core.registry import NAMES

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _poison(fn):
    """Fill fresh float tensors with NaN so a kernel reading unwritten memory shows up."""

    def wrapped(*args, **kwargs):
        t = fn(*args, **kwargs)
        if t.is_floating_point():
            with torch.no_grad():  # a leaf made with requires_grad=True (inductor's own)
                t.fill_(float("nan"))
        return t

    return wrapped


torch.empty = _poison(torch.empty)
torch.empty_like = _poison(torch.empty_like)


def _kernel_available(backend: str, family: str) -> str | None:
    if backend == "numba" and importlib.util.find_spec("numba") is None:
        return "numba is not installed"
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


BACKENDS = ["reference", "numba", "triton"]


def backend_params(family: str):
    out = []
    for b in BACKENDS:
        why = _kernel_available(b, family)
        marks = [pytest.mark.skip(reason=why)] if why else []
        out.append(pytest.param(b, id=b, marks=marks))
    return out


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "reference_oracle: the oracle is the reference backend, so the test's "
        "reference parametrization (which would test the reference against itself) is not run")


def pytest_collection_modifyitems(config, items) -> None:
    kept, dropped = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        params = params.params if params else {}
        self_oracle = item.get_closest_marker("reference_oracle") and any(
            (k == "backend" or k.endswith("_backend")) and v == "reference"
            for k, v in params.items())
        (dropped if self_oracle else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def other_backend(backend: str) -> str:
    """A backend other than ``backend``, for a float64 oracle that is not the code under
    test: the reference, or for the reference itself the Numba kernels."""
    if backend != "reference":
        return "reference"
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed: no oracle other than the reference itself")
    return "numba"


def device_for(backend: str) -> torch.device:
    """Triton runs on CUDA when present, else on CPU under TRITON_INTERPRET=1."""
    if backend == "triton" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def _backend_fixture(name: str):
    @pytest.fixture(params=backend_params(name), name=f"{name}_backend")
    def fixture(request) -> str:
        return request.param

    return fixture


# One `<family>_backend` fixture per registered loss family (ctc_backend, rnnt_backend, ...),
# plus the lattice and the alignments.
for _name in (*NAMES, "lattice", "align"):
    globals()[f"_{_name}_backend"] = _backend_fixture(_name)


@pytest.fixture(params=[pytest.param(n, id=n) for n in NAMES])
def family(request):
    """Each registered loss family."""
    return registry.family(request.param)


DEVICES = [pytest.param("cpu", id="cpu")] + [
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    )
]


@pytest.fixture(params=["torch_ops", "row_passes"])
def tile_ops(request, monkeypatch):
    """The CPU tiles' forward normalizers: torch's ops, or the Numba backend's row passes
    (taken by default for rows of at least ``MIN_ROW_WIDTH`` classes), forced at these
    widths. The backward's epilogue is the backend's ``joint_tile_grad`` either way."""
    if request.param == "row_passes":
        rows = pytest.importorskip("seqloss.transducer.joint.numba_rows")
        monkeypatch.setattr(rows, "MIN_ROW_WIDTH", 1)
    return request.param


# Small float64 batches for the cross-cutting tests: sequence 0 takes the full lengths,
# the others one frame and one label fewer.
def ctc_batch(T=7, B=3, C=5, S=3, seed=0, layout="tbc"):
    """``(log_probs (T, B, C) or (B, T, C) when layout="btc", targets, input_lengths,
    target_lengths)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64) if layout == "btc" else \
        torch.randn(T, B, C, generator=g, dtype=torch.float64)
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([S] + [S - 1] * (B - 1))
    return x, tg, il, tl


def rnnt_batch(B=2, T=3, U=2, V=4, seed=0):
    """``(logits (B, T, U+1, V), targets, logit_lengths, target_lengths)``; blank V - 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 1, (B, U), generator=g)  # blank is V - 1
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([U] + [U - 1] * (B - 1))
    return x, tg, il, tl
