"""``seqloss warmup``: compile the CPU kernels ahead, into Numba's on-disk cache.

On a fresh install each public entry point's first call compiles the Numba kernels it
reaches, for its dtype (seconds each). ``seqloss warmup`` makes every such call once, on
a tiny batch, forward and backward, so that a container image built with it (or a
machine that ran it once) starts at full speed. The cache is where Numba puts it:
``NUMBA_CACHE_DIR`` when set, else ``__pycache__`` beside the installed sources (or a
user cache folder when those are read-only); a process later using the same sources
and cache folder loads the kernels instead of compiling them, on a CPU of the same model
(Numba keys the cache by CPU name and features; ``NUMBA_CPU_NAME=generic``, set both when
warming and when running, makes it portable).

:data:`CASES` lists the calls: one per entry point and input dtype, plus the call
variants that reach other kernels (a non-contiguous CTC input, unfused log-softmax, the
TDT pair layout). Half
precision inputs run in float32 kernels, so their cases mostly load those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

FLOAT = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)

# Tiny sizes: the kernels' specializations depend on dtypes and flags, not on sizes.
B, T, U, V, H = 2, 8, 3, 6, 4


@dataclass(frozen=True)
class Case:
    """One call: ``entry`` (the public name), ``variant`` (what else it sets, or ""),
    the dtypes it is compiled for, and ``run(dtype)`` making the call."""

    entry: str
    variant: str
    dtypes: tuple[torch.dtype, ...]
    run: Callable[[torch.dtype], None]

    @property
    def name(self) -> str:
        return f"{self.entry} ({self.variant})" if self.variant else self.entry


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _leaf(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).requires_grad_()


def _lengths() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Transducer ``targets (B, U)`` (ids below ``V - 1``, the blank), ``logit_lengths``,
    ``target_lengths``; the second sequence is shorter, so padding is in play."""
    tg = torch.randint(0, V - 1, (B, U), generator=_g())
    return tg, torch.tensor([T, T - 2]), torch.tensor([U, U - 1])


def _joint(width: int, dtype: torch.dtype) -> torch.Tensor:
    return _leaf(torch.randn(B, T, U + 1, width, generator=_g()), dtype)


def _backward(*outs: torch.Tensor) -> None:
    torch.stack([o.float().sum() for o in outs]).sum().backward()


def _ctc(dtype: torch.dtype, view: bool = False) -> None:
    import seqloss

    # view: a (T, B, C) transpose of batch-first storage, which takes the general path
    x = torch.randn(B, T, V, generator=_g()).log_softmax(-1).to(dtype)
    x = x.transpose(0, 1).requires_grad_() if view else _leaf(x.transpose(0, 1).contiguous(),
                                                                dtype)
    tg = torch.randint(1, V, (B, U), generator=_g())
    _backward(seqloss.ctc_loss(x, tg, torch.tensor([T, T - 2]), torch.tensor([U, U - 1])))


def _rnnt(dtype: torch.dtype, fused: bool = True) -> None:
    import seqloss

    tg, il, tl = _lengths()
    x = _joint(V, dtype)
    _backward(seqloss.rnnt_loss(x if fused else x.log_softmax(-1), tg, il, tl,
                                fused_log_softmax=fused))


def _rnnt_packed(dtype: torch.dtype) -> None:
    import seqloss

    tg, il, tl = _lengths()
    rows = int((il * (tl + 1)).sum())
    x = _leaf(torch.randn(rows, V, generator=_g()), dtype)
    _backward(seqloss.rnnt_loss_packed(x, tg, il, tl))


def _multiblank(dtype: torch.dtype) -> None:
    import seqloss

    tg, il, tl = _lengths()
    # V - 2 is the big blank of duration 2, V - 1 the standard blank: labels below V - 2
    _backward(seqloss.multiblank_rnnt_loss(_joint(V, dtype), tg.clamp(max=V - 3), il, tl, [2]))


def _tdt(dtype: torch.dtype, pair: bool = False) -> None:
    import seqloss

    tg, il, tl = _lengths()
    durations = [0, 1, 2]
    x = (_joint(V, dtype), _joint(len(durations), dtype)) if pair else _joint(V + 3, dtype)
    _backward(seqloss.tdt_loss(x, tg, il, tl, durations, blank=V - 1))


def _hat(dtype: torch.dtype) -> None:
    import seqloss

    tg, il, tl = _lengths()
    _backward(seqloss.hat_loss(_joint(V, dtype), tg, il, tl))


class _Joint(torch.nn.Module):
    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.out = torch.nn.Linear(H, width).to(dtype)

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(enc[:, :, None] + pred[:, None]))


def _from_joint(entry: str, width: int, **kw) -> Callable[[torch.dtype], None]:
    def run(dtype: torch.dtype) -> None:
        import seqloss

        tg, il, tl = _lengths()
        enc = _leaf(torch.randn(B, T, H, generator=_g()), dtype)
        pred = _leaf(torch.randn(B, U + 1, H, generator=_g()), dtype)
        fn = getattr(seqloss, entry)
        out = fn(enc, pred, _Joint(width, dtype), tg.clamp(max=V - 3), il, tl, **kw)
        _backward(*(out if isinstance(out, tuple) else (out,)))

    return run


def _factored(entry: str) -> Callable[[torch.dtype], None]:
    def run(dtype: torch.dtype) -> None:
        import seqloss

        tg, _, _ = _lengths()
        am = _leaf(torch.randn(B, T, V, generator=_g()), dtype)
        lm = _leaf(torch.randn(B, U + 1, V, generator=_g()), dtype)
        bd = torch.tensor([[0, 0, U, T]] * B)
        if entry == "rnnt_loss_pruned":
            _, (px, py) = seqloss.rnnt_loss_simple(lm, am, tg, V - 1, bd, return_grad=True)
            ranges = seqloss.get_rnnt_prune_ranges(px, py, bd, 2)
            a, b = seqloss.do_rnnt_pruning(am, lm, ranges)
            _backward(seqloss.rnnt_loss_pruned(a + b, tg, ranges, V - 1, bd))
        else:
            _backward(getattr(seqloss, entry)(lm, am, tg, V - 1, boundary=bd))

    return run


def _lattice(dtype: torch.dtype) -> None:
    import seqloss

    _, il, tl = _lengths()
    lp = _joint(V, dtype).log_softmax(-1)
    _backward(seqloss.transducer_lattice(lp[..., -1:], lp[..., :1], il, tl))


def _arcs(dtype: torch.dtype, tdt: bool = False) -> None:
    import seqloss

    tg, il, tl = _lengths()
    if tdt:
        arcs = seqloss.transducer_arc_logprobs(_joint(V + 3, dtype), tg, il, tl,
                                               durations=[0, 1, 2])
    else:
        arcs = seqloss.transducer_arc_logprobs(_joint(V, dtype), tg, il, tl)
    _backward(*arcs)


def _align(entry: str) -> Callable[[torch.dtype], None]:
    def run(dtype: torch.dtype) -> None:
        import seqloss

        tg, il, tl = _lengths()
        with torch.no_grad():
            if entry == "ctc_align":
                x = torch.randn(T, B, V, generator=_g()).log_softmax(-1).to(dtype)
                seqloss.ctc_align(x, tg + 1, il, tl)
            elif entry == "rnnt_align":
                seqloss.rnnt_align(_joint(V, dtype).detach(), tg, il, tl)
            elif entry == "multiblank_rnnt_align":
                seqloss.multiblank_rnnt_align(_joint(V, dtype).detach(), tg.clamp(max=V - 3),
                                              il, tl, [2])
            else:
                seqloss.tdt_align(_joint(V + 3, dtype).detach(), tg, il, tl, [0, 1, 2],
                                  blank=V - 1)

    return run


def _logmmexp(dtype: torch.dtype) -> None:
    import seqloss

    a = _leaf(torch.randn(3, 4, generator=_g()), dtype)
    b = _leaf(torch.randn(4, 5, generator=_g()), dtype)
    _backward(seqloss.logmmexp(a, b))


ALL = FLOAT + HALF
CASES: tuple[Case, ...] = (
    Case("ctc_loss", "", ALL, _ctc),
    Case("ctc_loss", "a transposed view", FLOAT, lambda dt: _ctc(dt, view=True)),
    Case("rnnt_loss", "", ALL, _rnnt),
    Case("rnnt_loss", "fused_log_softmax=False", FLOAT, lambda dt: _rnnt(dt, fused=False)),
    Case("rnnt_loss_packed", "", FLOAT, _rnnt_packed),
    Case("multiblank_rnnt_loss", "", ALL, _multiblank),
    Case("tdt_loss", "", ALL, _tdt),
    Case("tdt_loss", "(token, duration) pair", FLOAT, lambda dt: _tdt(dt, pair=True)),
    Case("hat_loss", "", FLOAT, _hat),
    Case("rnnt_loss_from_joint", "", FLOAT, _from_joint("rnnt_loss_from_joint", V)),
    Case("multiblank_rnnt_loss_from_joint", "", FLOAT,
         _from_joint("multiblank_rnnt_loss_from_joint", V, big_blank_durations=[2])),
    Case("tdt_loss_from_joint", "", FLOAT,
         _from_joint("tdt_loss_from_joint", V + 3, durations=[0, 1, 2])),
    Case("hat_loss_from_joint", "", FLOAT, _from_joint("hat_loss_from_joint", V)),
    Case("rnnt_loss_simple", "", FLOAT, _factored("rnnt_loss_simple")),
    Case("rnnt_loss_smoothed", "", FLOAT, _factored("rnnt_loss_smoothed")),
    Case("rnnt_loss_pruned", "", FLOAT, _factored("rnnt_loss_pruned")),
    Case("transducer_lattice", "", FLOAT, _lattice),
    Case("transducer_arc_logprobs", "", FLOAT, _arcs),
    Case("transducer_arc_logprobs", "durations", FLOAT, lambda dt: _arcs(dt, tdt=True)),
    Case("transducer_arc_logprobs_from_joint", "", FLOAT,
         _from_joint("transducer_arc_logprobs_from_joint", V)),
    Case("ctc_align", "", FLOAT, _align("ctc_align")),
    Case("rnnt_align", "", FLOAT, _align("rnnt_align")),
    Case("multiblank_rnnt_align", "", FLOAT, _align("multiblank_rnnt_align")),
    Case("tdt_align", "", FLOAT, _align("tdt_align")),
    Case("logmmexp", "", FLOAT, _logmmexp),
)
ENTRIES = tuple(dict.fromkeys(c.entry for c in CASES))


def cases(entries: Iterable[str] | None = None,
          dtypes: Sequence[torch.dtype] | None = None) -> list[tuple[Case, torch.dtype]]:
    """The (case, dtype) pairs for ``entries`` (default: all) in ``dtypes`` (default: all)."""
    wanted = set(ENTRIES if entries is None else entries)
    unknown = wanted - set(ENTRIES)
    if unknown:
        raise ValueError(f"unknown entry point(s) {sorted(unknown)}; expected some of "
                         f"{', '.join(ENTRIES)}")
    return [(c, dt) for c in CASES if c.entry in wanted
            for dt in c.dtypes if dtypes is None or dt in dtypes]


def warmup(entries: Iterable[str] | None = None, dtypes: Sequence[torch.dtype] | None = None,
           log: Callable[[Case, torch.dtype, float], None] | None = None
           ) -> list[tuple[str, str, float]]:
    """Make each call of :func:`cases` once on the Numba backend.

    Returns ``(case name, dtype name, seconds)`` per call; ``log`` is told each as it ends.
    """
    from ._core.dispatch import resolve_backend

    if resolve_backend("numba", torch.device("cpu")) != "numba":
        raise RuntimeError("the Numba backend is not available: nothing to compile")
    import os

    # The backend every call takes, whatever SEQLOSS_BACKEND says (restored after).
    before = os.environ.get("SEQLOSS_BACKEND")
    os.environ["SEQLOSS_BACKEND"] = "numba"
    out = []
    try:
        for case, dt in cases(entries, dtypes):
            t0 = time.perf_counter()
            case.run(dt)
            s = time.perf_counter() - t0
            out.append((case.name, str(dt).replace("torch.", ""), s))
            if log is not None:
                log(case, dt, s)
    finally:
        if before is None:
            del os.environ["SEQLOSS_BACKEND"]
        else:
            os.environ["SEQLOSS_BACKEND"] = before
    return out
