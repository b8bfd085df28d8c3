#!/usr/bin/env bash
# One GPU check in a single run (CONTRIBUTING.md): the compile-only report of every Triton
# launch for this GPU's architecture (registers, spills, shared memory, grids, 32-bit
# offsets: benchmarks/triton_aot.py), the CUDA tests of the Triton kernels, then the CUDA
# benchmark; everything it prints goes under $OUT. Needs CUDA torch, Triton, Numba, pytest
# and hypothesis; runs from the source tree (no install, no network):
#   OUT=/some/dir bash benchmarks/gpu_check.sh      (about 12 minutes at most)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv | tee "$OUT/gpu.txt"
# The AOT report first: what the compiler says about every launch, before anything runs
# (it also fills Triton's cache with the kernels the tests then load).
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
timeout 180 python benchmarks/triton_aot.py --targets "${arch:-90}" --shapes small -q \
  --json "$OUT/triton_aot.json" --markdown "$OUT/triton_aot.md" 2>&1 | tee "$OUT/triton_aot.txt" | tail -25
python -c "import rich" 2>/dev/null || echo "rich missing: CLI tests will fail (not run here)"
timeout 300 python -m pytest -q -x -p no:cacheprovider \
  tests/test_ctc.py tests/test_ctc_kernels.py tests/test_rnnt.py tests/test_transducer_kernels.py \
  tests/test_align.py tests/test_lattice.py tests/test_joint_table.py \
  tests/test_transducer_align.py tests/test_precision.py \
  -k "triton and not hypothesis" 2>&1 | tee "$OUT/tests.txt" | tail -30
# validate=False on CUDA: no host read in seqloss's code and, in torch's sync debug mode, no
# synchronizing CUDA call at all.
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_no_sync.py 2>&1 \
  | tee "$OUT/no_sync.txt" | tail -10
timeout 200 python benchmarks/bench_cuda.py --repeat 10 --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench.txt"
