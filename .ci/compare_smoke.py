"""Compare two smoke-test result files (tests/test_smoke.py, SEQLOSS_SMOKE_JSON).

Usage: python .ci/compare_smoke.py MAIN.json OTHER.json

Every case the main run recorded must be in the other run, with each loss and gradient
norm within float tolerance (float64 cases 1e-9 relative, the rest 1e-4: float32
kernels may round differently under another torch's ops). Prints the largest
differences and one summary line; exits 1 on any mismatch or missing case.
"""

from __future__ import annotations

import json
import math
import sys


def main(main_path: str, other_path: str) -> int:
    with open(main_path) as f:
        main_run = json.load(f)
    with open(other_path) as f:
        other = json.load(f)
    a, b = main_run["cases"], other["cases"]
    missing = sorted(set(a) - set(b))
    worst_abs = worst_rel = 0.0
    bad = []
    for key in sorted(set(a) & set(b)):
        tol = 1e-9 if "float64" in key else 1e-4
        for field, va in a[key].items():
            vb = b[key].get(field)
            if vb is None or math.isfinite(va) != math.isfinite(vb):
                bad.append(f"{key} {field}: {va} vs {vb}")
                continue
            if not math.isfinite(va):
                if va != vb:
                    bad.append(f"{key} {field}: {va} vs {vb}")
                continue
            d = abs(va - vb)
            worst_abs = max(worst_abs, d)
            worst_rel = max(worst_rel, d / max(abs(va), 1e-30))
            if d > tol * max(abs(va), 1.0):
                bad.append(f"{key} {field}: {va!r} vs {vb!r} (|diff| {d:.3g})")
    for line in bad[:20]:
        print("  mismatch:", line)
    for key in missing[:20]:
        print("  missing:", key)
    ok = not bad and not missing
    print(f"smoke vs main (torch {main_run['torch']} -> {other['torch']}): "
          f"{len(set(a) & set(b))} cases compared, max abs diff {worst_abs:.3g}, "
          f"max rel diff {worst_rel:.3g}, {len(bad)} mismatches, {len(missing)} missing: "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
