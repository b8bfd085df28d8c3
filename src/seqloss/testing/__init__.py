"""Test helpers shipped with seqloss: brute-force oracles, input factories, tolerances."""

from .oracles import brute_force_ctc, brute_force_lattice, brute_force_rnnt
from .peers import nemo_rnnt_pytorch
from .tolerance import assert_close_budget

__all__ = [
    "assert_close_budget",
    "brute_force_ctc",
    "brute_force_lattice",
    "brute_force_rnnt",
    "nemo_rnnt_pytorch",
]
