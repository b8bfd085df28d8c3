"""HAT (hybrid autoregressive transducer) forward+backward beside seqloss's rnnt_loss.

    python -m seqloss.bench.hat [--sizes tiny|small|paper|long] [--repeat N]
                                [--json FILE] [--no-memory] [--threads N] [--impl NAME]

``seqloss.hat_loss`` and ``seqloss.rnnt_loss`` on the same ``(B, T, U+1, V)`` logits
(blank ``V - 1``), the RNN-T benchmark's sizes, ``reduction="sum"``: target
``hat / rnnt <= 1.2``, and the extra peak memory within 1.1x of the logits. No peer
library has a full-joint HAT loss. See :mod:`seqloss.bench._variants`.
"""

from __future__ import annotations

from ._variants import HAT, cases

implementations = HAT.implementations
run = HAT.run
pair_rows = HAT.pair_rows
notes = HAT.notes
make_inputs = HAT.make_inputs
IMPLS = HAT.impls
MEM_CHILD = HAT.mem_child

__all__ = ["IMPLS", "MEM_CHILD", "cases", "implementations", "make_inputs", "notes",
           "pair_rows", "run"]

if __name__ == "__main__":
    HAT.main()
