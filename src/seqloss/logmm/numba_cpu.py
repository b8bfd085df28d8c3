"""CPU backend of ``logmmexp`` (for now the blocked exact reference; the fast path follows)."""

from __future__ import annotations

from .reference import logmmexp_backward, logmmexp_forward

__all__ = ["logmmexp_backward", "logmmexp_forward"]
