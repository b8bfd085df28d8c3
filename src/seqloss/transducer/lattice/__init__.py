"""The transducer lattice: the one recursion under every transducer loss, as a public op."""

from .api import transducer_lattice

__all__ = ["transducer_lattice"]
