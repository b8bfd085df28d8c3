"""The single dispatch point: (family, device, backend) -> kernel.

``"auto"`` picks Triton on CUDA, Numba on CPU when it is installed, and the
pure-PyTorch reference otherwise. An explicitly requested backend that is not
available raises; nothing ever falls back silently. The environment variable
``SEQLOSS_BACKEND`` sets the default for ``backend="auto"``.

Every backend module of a family (``seqloss.<family>.reference``, ``.numba_cpu``,
``.triton_cuda``) exposes the same functions with the same signatures, so the
callers never branch on the backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

import torch

from .errors import InputError, InputTypeError
from .types import BACKENDS

# The backend-selection variable, kept in step with the environment by an audit hook:
# every change through os.environ (setting, deleting, clearing, pytest's monkeypatch)
# calls os.putenv or os.unsetenv, which raise the documented "os.putenv" / "os.unsetenv"
# audit events (with the new value) just before os.environ stores it (os.putenv called
# directly, which os.environ does not see either, is seen here). os.environ.get
# costs 0.6-1.7 us (a raised and caught KeyError when unset), ~2-5% of a small CTC
# forward+backward; the cached read ~0.05 us.
# Also what resolve_backend reads: a list item is traceable by every torch.compile, where
# torch 2.4's cannot trace os.environ.get of an unset variable (a caught KeyError).
ENV_VAR = "SEQLOSS_BACKEND"
_env = [os.environ.get(ENV_VAR)]
# Without os.putenv/os.unsetenv, os.environ changes nothing it would report: read it.
_WATCHED = hasattr(os, "putenv") and hasattr(os, "unsetenv")


def _on_audit(event: str, args: tuple) -> None:
    if event == "os.putenv" or event == "os.unsetenv":
        if os.fsdecode(args[0]) == ENV_VAR:
            _env[0] = None if event == "os.unsetenv" else os.fsdecode(args[1])


if _WATCHED:
    sys.addaudithook(_on_audit)


_BACKEND_MODULES = {"reference": "reference", "numba": "numba_cpu", "triton": "triton_cuda"}

# family -> backend -> module. Each backend module of a family exposes the same
# functions with the same signatures (the family's reference documents them).
_MODULES = {
    family: {b: f"{package}.{module}" for b, module in _BACKEND_MODULES.items()}
    for family, package in {
        "ctc": "seqloss.ctc",
        "lattice": "seqloss.transducer.lattice",
        "joint": "seqloss.transducer.joint",
        "align": "seqloss.align",
        "logmm": "seqloss.logmm",
    }.items()
}


# Looked up once at import (find_spec does not import the package); a plain dict
# keeps resolve_backend traceable by torch.compile.
_AVAILABLE = {
    "reference": True,
    "numba": importlib.util.find_spec("numba") is not None,
    "triton": importlib.util.find_spec("triton") is not None,
}


def _available(backend: str) -> bool:
    return _AVAILABLE[backend]


def _triton_runs_on(device: torch.device) -> bool:
    # The interpreter (TRITON_INTERPRET=1) runs Triton kernels on CPU tensors.
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(backend: str, device: torch.device) -> str:
    """Turn ``backend`` ("auto" or a name) into a concrete backend for ``device``.

    Raises:
        InputError: unknown name, or a backend that cannot run on ``device``.
        ImportError: the backend's package (numba, triton) is not installed.
    """
    if not isinstance(backend, str):
        raise InputTypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend == "auto":
        backend = (_env[0] if _WATCHED else os.environ.get(ENV_VAR)) or "auto"
        if backend == "auto":
            if device.type == "cuda" and _available("triton"):
                return "triton"
            if device.type == "cpu" and _available("numba"):
                return "numba"
            return "reference"
        where = f"SEQLOSS_BACKEND={backend!r}"
    else:
        where = f"backend={backend!r}"
    if backend not in BACKENDS:
        raise InputError(f"{where}: expected one of 'auto', {', '.join(map(repr, BACKENDS))}")
    if not _available(backend):
        raise ImportError(
            f"{where} was requested but the '{backend}' package is not installed "
            f"(pip install {backend}); use backend='reference' or 'auto'"
        )
    if backend == "numba" and device.type != "cpu":
        raise InputError(f"{where}: the Numba kernels run on CPU tensors, got {device.type}")
    if backend == "triton" and not _triton_runs_on(device):
        raise InputError(
            f"{where}: the Triton kernels run on CUDA tensors (or on CPU with "
            f"TRITON_INTERPRET=1), got {device.type}"
        )
    return backend


_LOADED: dict[tuple[str, str], ModuleType] = {}


def kernel_module(family: str, backend: str) -> ModuleType:
    """The module implementing ``family`` ("ctc", "transducer", ...) on ``backend``."""
    mod = _LOADED.get((family, backend))
    if mod is None:  # import_module costs ~4 us a call even for a loaded module
        mod = _LOADED[(family, backend)] = importlib.import_module(_MODULES[family][backend])
    return mod
