#!/usr/bin/env bash
# One prepared device run (see DEVELOPERS.md): CUDA tests of the Triton kernels, then the
# CUDA benchmark; everything it prints goes under $OUT. The device image has CUDA torch,
# Triton, Numba, pytest and hypothesis but no network: run from the source tree.
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=540)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python -c "import rich" 2>/dev/null || echo "rich missing: CLI tests will fail (not run here)"
timeout 300 python -m pytest -q -x -p no:cacheprovider \
  tests/test_ctc.py tests/test_ctc_triton.py tests/test_rnnt.py tests/test_transducer_triton.py \
  tests/test_align.py -k "triton and not hypothesis" 2>&1 | tee "$OUT/tests.txt" | tail -30
timeout 200 python benchmarks/bench_cuda.py --repeat 10 --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench.txt"
