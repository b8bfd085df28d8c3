"""CTC forward+backward: seqloss against torch and optax, time and peak memory.

    python benchmarks/bench_ctc.py [--sizes small|paper] [--repeat N] [--json FILE]
                                   [--no-memory] [--threads N] [--impl NAME]

The cases, implementations and runner live in ``seqloss.bench.ctc`` (shipped with
the package, so ``seqloss bench --loss ctc`` runs the same code from an installed
wheel); see its docstring for the pairings and the measurement method.
"""

from seqloss.bench.ctc import (
    PAIRINGS,
    SIZES,
    cases,
    implementations,
    main,
    make_inputs,
    pair_rows,
    run,
)

__all__ = [
    "PAIRINGS",
    "SIZES",
    "cases",
    "implementations",
    "main",
    "make_inputs",
    "pair_rows",
    "run",
]

if __name__ == "__main__":
    main()
