"""``seqloss demo``: tiny CTC and RNN-T models trained on an embedded synthetic task."""

from .run import run_demo

__all__ = ["run_demo"]
