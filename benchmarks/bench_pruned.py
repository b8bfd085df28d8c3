"""Simple -> prune -> pruned RNN-T beside the full-joint rnnt_loss and fast_rnnt.

    python benchmarks/bench_pruned.py [--sizes tiny|small|paper|long] [--repeat N]
                                      [--threads N] [--no-memory] [--json FILE] [--impl NAME]

At (B=8, T=300, S=60, C=500, s_range=5) by default ("paper"). The code is
:mod:`seqloss.bench.pruned` (also ``seqloss bench --loss pruned``); see its docstring
for the implementations and the targets.
"""

from __future__ import annotations

from seqloss.bench.pruned import main

if __name__ == "__main__":
    main()
