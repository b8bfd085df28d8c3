"""Peer reference implementations, loaded for comparison tests and benchmarks only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch


def nemo_rnnt_pytorch() -> SimpleNamespace | None:
    """NeMo's pure-PyTorch transducer references (``RNNTLossPytorch``,
    ``MultiblankRNNTLossPytorch``, ``TDTLossPytorch``), or ``None`` without nemo-toolkit.

    The file ``nemo/collections/asr/losses/rnnt_pytorch.py`` of the installed package is
    run with its two framework imports stood in: ``nemo.core``'s ``Loss`` base class by
    ``torch.nn.Module`` and the neural-type annotations by placeholders. Importing
    ``nemo.core`` pulls in lightning, hydra and NVIDIA's telemetry packages (which fail
    to import in many environments), none of which the loss code uses.
    """
    spec = importlib.util.find_spec("nemo")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "collections" / "asr" / "losses" / "rnnt_pytorch.py"
    if not path.is_file():
        return None
    src = "\n".join("" if line.startswith("from nemo.") else line
                    for line in path.read_text().splitlines())
    ns: dict = {"__name__": "nemo_rnnt_pytorch", "Loss": torch.nn.Module}
    for name in ("NeuralType", "LabelsType", "LengthsType", "LogprobsType", "LossType"):
        ns[name] = lambda *a, **k: None
    exec(compile(src, str(path), "exec"), ns)
    return SimpleNamespace(**ns)
