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

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _poison(fn):
    """Fill fresh float tensors with NaN so a kernel reading unwritten memory shows up."""

    def wrapped(*args, **kwargs):
        t = fn(*args, **kwargs)
        if t.is_floating_point():
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


def device_for(backend: str) -> torch.device:
    """Triton runs on CUDA when present, else on CPU under TRITON_INTERPRET=1."""
    if backend == "triton" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


@pytest.fixture(params=backend_params("ctc"))
def ctc_backend(request) -> str:
    return request.param


@pytest.fixture(params=backend_params("transducer"))
def rnnt_backend(request) -> str:
    return request.param


@pytest.fixture(params=backend_params("transducer"))
def lattice_backend(request) -> str:
    return request.param


DEVICES = [pytest.param("cpu", id="cpu")] + [
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    )
]
