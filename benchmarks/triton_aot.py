"""Compile every Triton launch of every public function for real GPUs, without a GPU.

    python benchmarks/triton_aot.py --json FILE [--markdown FILE] [--targets 80 90 100]
                                    [--shapes small|all] [--only SUBSTRING]

Runs the dispatch code of every public function with ``backend="triton"`` on CPU
tensors; each launch is compiled (Triton's own launch path, the shipped ``ptxas``) for
each target with the specialization the dispatcher picks, instead of executed
(``seqloss.testing.triton_aot``). Prints the per-kernel table (registers, local memory,
shared memory per target) and writes one JSON record per kernel x target x
specialization, with the grid of every launch. Exit status 1 on any compile error,
spill, shared memory or registers over the target's limits, grid beyond CUDA's limits,
or 32-bit offset arithmetic that can wrap; 2 when it cannot run (no triton or ptxas).

``--shapes small``: every function, dtype and variant at small sizes (what CI runs, for
sm_90); ``all`` adds the extremes (CTC S=1000, C=50,000; transducer V=20,000; T=20,000;
B=1 and B=1024) and sizes past 2**31 elements, the latter on ``meta`` tensors. Targets
default to sm_80, sm_90 and sm_100 (the triton wheel's ``ptxas-blackwell``).
"""

from __future__ import annotations

import os
import sys

# Read when @triton.jit decorates the kernels: compiling needs it unset.
os.environ.pop("TRITON_INTERPRET", None)
from seqloss.testing import triton_aot

if __name__ == "__main__":
    sys.exit(triton_aot.main())
