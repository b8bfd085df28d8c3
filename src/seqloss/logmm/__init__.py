"""``logmmexp``: ``log(exp(a) @ exp(b))``, exact at any scale: public function, op, kernels."""

from .api import logmmexp

__all__ = ["logmmexp"]
