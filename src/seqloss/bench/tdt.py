"""TDT forward+backward beside seqloss's rnnt_loss, transformers' tdt_loss and NeMo's reference.

    python -m seqloss.bench.tdt [--sizes tiny|small|paper|long] [--repeat N]
                                [--json FILE] [--no-memory] [--threads N]
                                [--impl NAME] [--with-slow]

Durations ``[0, 1, 2, 3, 4]`` on the RNN-T benchmark's ``(B, T, U+1, V)`` sizes: the
last 5 classes are the duration logits, the ``V - 5`` before them the token logits
(blank last), ``reduction="sum"``. Implementations: ``seqloss tdt``, ``seqloss
rnnt_loss`` on the same logits (the baseline: target ``tdt / rnnt <= 1.5``),
transformers' ``tdt_loss`` on the two views of the tensor when transformers is
importable (target: seqloss ``>= 20x`` faster), and NeMo's pure-PyTorch
``TDTLossPytorch`` with ``--with-slow`` on CUDA machines (it allocates on CUDA). See
:mod:`seqloss.bench._variants` for the cases and the ratios.
"""

from __future__ import annotations

from ._variants import TDT, cases

implementations = TDT.implementations
run = TDT.run
pair_rows = TDT.pair_rows
notes = TDT.notes
make_inputs = TDT.make_inputs
IMPLS = TDT.impls
MEM_CHILD = TDT.mem_child

__all__ = ["IMPLS", "MEM_CHILD", "cases", "implementations", "make_inputs", "notes",
           "pair_rows", "run"]

if __name__ == "__main__":
    TDT.main()
