"""Multi-blank RNN-T forward+backward beside seqloss's rnnt_loss and NeMo's reference.

    python -m seqloss.bench.multiblank [--sizes tiny|small|paper|long] [--repeat N]
                                       [--json FILE] [--no-memory] [--threads N]
                                       [--impl NAME] [--with-slow]

Big blanks ``[2, 4, 8]`` (classes ``V - 2, V - 3, V - 4``, the standard blank
``V - 1``) on the RNN-T benchmark's ``(B, T, U+1, V)`` sizes, ``reduction="sum"``.
Implementations: ``seqloss multiblank``, ``seqloss rnnt_loss`` on the same logits
(the baseline: target ``multiblank / rnnt <= 1.5``), and NeMo's pure-PyTorch
``MultiblankRNNTLossPytorch`` with ``--with-slow`` when NeMo is importable. See
:mod:`seqloss.bench._variants` for the cases and the ratios.
"""

from __future__ import annotations

from ._variants import MULTIBLANK, cases

implementations = MULTIBLANK.implementations
run = MULTIBLANK.run
pair_rows = MULTIBLANK.pair_rows
notes = MULTIBLANK.notes
make_inputs = MULTIBLANK.make_inputs
IMPLS = MULTIBLANK.impls
MEM_CHILD = MULTIBLANK.mem_child

__all__ = ["IMPLS", "MEM_CHILD", "cases", "implementations", "make_inputs", "notes",
           "pair_rows", "run"]

if __name__ == "__main__":
    MULTIBLANK.main()
