"""CUDA forward+backward: seqloss (Triton) against torch's CUDA ctc_loss and torchaudio's
CUDA rnnt_loss (when importable), with peak GPU memory and a determinism check.

    python benchmarks/bench_cuda.py [--repeat N] [--json FILE]

Same cases as the CPU benchmarks (float32, reduction="sum", blank 0). Times are medians
of interleaved rounds measured with CUDA events; memory is
``torch.cuda.max_memory_allocated`` above the inputs, as a multiple of the logits.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import seqloss
from seqloss.bench import ctc as ctc_bench
from seqloss.bench import module

rnnt_bench = module("rnnt")  # seqloss.bench.transducer's RNN-T benchmark

# The same case lists as the CPU benchmarks (seqloss.bench: one list per family).
CTC_CASES = ctc_bench.SIZES["paper"]
RNNT_CASES = rnnt_bench.SIZES["paper"]


def _time(fn, repeat: int) -> tuple[float, float]:
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


def _ctc(repeat: int) -> list[dict]:
    rows = []
    for T, B, C, L in CTC_CASES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(T, B, C, generator=g).cuda()
        il = torch.randint(int(0.8 * T), T + 1, (B,), generator=g).cuda()
        tl = torch.randint(int(0.8 * L), L + 1, (B,), generator=g).cuda()
        tg = torch.randint(1, C, (B, L), generator=g).cuda()
        out = {}

        def run(kind):
            xx = x.detach().requires_grad_()
            if kind == "torch":
                loss = torch.nn.functional.ctc_loss(xx.log_softmax(-1), tg, il, tl, reduction="sum")
            elif kind == "seqloss":
                loss = seqloss.ctc_loss(xx.log_softmax(-1), tg, il, tl, reduction="sum")
            else:
                loss = seqloss.ctc_loss(xx, tg, il, tl, reduction="sum", fused_log_softmax=True)
            loss.backward()
            out[kind] = (loss.detach(), xx.grad)

        res = {k: _time(lambda k=k: run(k), repeat) for k in ("torch", "seqloss", "seqloss fused")}
        a, b = out["seqloss"], out["torch"]
        run("seqloss")
        det = torch.equal(a[1], out["seqloss"][1])
        run("torch")
        det_t = torch.equal(b[1], out["torch"][1])
        logits_mib = x.numel() * 4 / 2**20
        rows.append({
            "loss": "ctc", "case": f"T{T}-B{B}-C{C}-L{L}",
            **{f"{k} ms": v[0] for k, v in res.items()},
            **{f"{k} mem x": v[1] / logits_mib for k, v in res.items()},
            "torch/seqloss": res["torch"][0] / res["seqloss"][0],
            "torch/fused": res["torch"][0] / res["seqloss fused"][0],
            "max |loss diff| rel": float(((a[0] - b[0]).abs() / b[0].abs()).max()),
            "seqloss deterministic": det, "torch deterministic": det_t,
        })
        print(rows[-1], flush=True)
    return rows


def _rnnt(repeat: int) -> list[dict]:
    try:
        import torchaudio.functional as taf
    except Exception:  # noqa: BLE001 -- a mismatched torchaudio fails in many ways
        taf = None
    rows = []
    for B, T, U, V in RNNT_CASES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, T, U + 1, V, generator=g).cuda()
        tg = torch.randint(1, V, (B, U), generator=g).int().cuda()
        il = torch.full((B,), T, dtype=torch.int32).cuda()
        tl = torch.full((B,), U, dtype=torch.int32).cuda()

        def run(kind):
            xx = x.detach().requires_grad_()
            if kind == "torchaudio":
                loss = taf.rnnt_loss(xx, tg, il, tl, blank=0, reduction="sum")
            else:
                loss = seqloss.rnnt_loss(xx, tg, il, tl, blank=0, reduction="sum")
            loss.backward()

        kinds = ["seqloss"] + (["torchaudio"] if taf is not None else [])
        res = {k: _time(lambda k=k: run(k), repeat) for k in kinds}
        floor = _time(lambda: torch.logsumexp(x, -1), repeat)[0]
        logits_mib = x.numel() * 4 / 2**20
        row = {"loss": "rnnt", "case": f"B{B}-T{T}-U{U}-V{V}", "logsumexp ms": floor,
               **{f"{k} ms": v[0] for k, v in res.items()},
               **{f"{k} mem x": v[1] / logits_mib for k, v in res.items()},
               "seqloss / logsumexp": res["seqloss"][0] / floor}
        if taf is not None:
            row["torchaudio/seqloss"] = res["torchaudio"][0] / res["seqloss"][0]
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda.py needs a CUDA device")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = _ctc(a.repeat) + _rnnt(a.repeat)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
