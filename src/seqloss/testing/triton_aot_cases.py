r"""The calls the compile-only sweep (``triton_aot``) makes: every public function's CUDA path.

Each case calls a public function with ``backend="triton"`` (forward, and backward where
it is differentiable) the way a user would; the launches it reaches are what get
compiled. ``"small"`` shapes cover every dtype and every variant that changes a
kernel's specialization (fused or not, gradient or not, packed, clamp, the arc tables,
the lattice's topologies, a batch of one); ``"all"`` adds the extremes a user reaches
(CTC ``S = 1000``, ``C = 50,000``; transducer ``V = 20,000``; ``T = 20,000``; ``B = 1``
and ``B = 1024``), allocated on the host, and sizes past ``2**31`` elements (the
Parakeet-like ``B=16, T=500, U=100, V=4096`` joint is 3.3e9 logits), which run the
backend launchers on ``meta`` tensors: nothing is allocated, the grids come from the
launchers' own arithmetic and the kernels are compiled with those arguments (64-bit
integer arguments included where a stride passes ``2**31``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

import seqloss

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_SHORT = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16",
          torch.bfloat16: "bf16"}
TRITON = {"backend": "triton"}


@dataclasses.dataclass
class Case:
    name: str
    function: str
    run: Callable[[], None]
    launches: bool = True  # the call must reach at least one launch


def _x(shape, dtype, *, grad=True, scale=1.0, device="cpu", seed=0) -> torch.Tensor:
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    return x.requires_grad_() if grad else x


def _labels(B, S, C, low=1, seed=1, device="cpu") -> torch.Tensor:
    if device == "meta":
        return torch.empty((B, S), dtype=torch.int64, device="meta")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, max(C - 2, low + 1), (B, S), generator=g)


def _lengths(B, full, device="cpu") -> torch.Tensor:
    if device == "meta":
        return torch.empty((B,), dtype=torch.int64, device="meta")
    return torch.tensor([max(full - (b % 3), min(full, 1)) for b in range(B)], dtype=torch.int64)


def _backward(loss: torch.Tensor) -> None:
    if loss.requires_grad:
        loss.sum().backward()


# --------------------------------------------------------------------------- per function
def _ctc(T, B, C, S, dt, fused, grad, tag, dp=0.0) -> Case:
    def run() -> None:
        x = _x((T, B, C), dt, grad=grad)
        lp = x if fused else x.float().log_softmax(-1).to(dt).detach().requires_grad_(grad)
        loss = seqloss.ctc_loss(lp, _labels(B, S, C), _lengths(B, T), _lengths(B, S),
                                reduction="sum", fused_log_softmax=fused, delay_penalty=dp,
                                **TRITON)
        _backward(loss)

    v = ("fused" if fused else "logprobs") + ("" if grad else ",nograd") + (",dp" if dp else "")
    return Case(f"ctc_loss[{v},{_SHORT[dt]},{tag}]", "ctc_loss", run)


def _ctc_align(T, B, C, S, dt, tag) -> Case:
    def run() -> None:
        lp = _x((T, B, C), dt, grad=False).float().log_softmax(-1).to(dt)
        seqloss.ctc_align(lp, _labels(B, S, C), _lengths(B, T), _lengths(B, S), **TRITON)

    return Case(f"ctc_align[{_SHORT[dt]},{tag}]", "ctc_align", run)


def _rnnt(B, T, U, V, dt, tag, *, fused=True, grad=True, clamp=-1.0, packed=False,
          fastemit=0.0) -> Case:
    def run() -> None:
        x = _x((B, T, U + 1, V), dt, grad=grad)
        tg, il, tl = _labels(B, U, V, low=0), _lengths(B, T), _lengths(B, U)
        if not fused:
            x = x.float().log_softmax(-1).to(dt).detach().requires_grad_(grad)
        if packed:
            x = torch.cat([x.detach()[b, : il[b], : tl[b] + 1].reshape(-1, V) for b in range(B)])
            x.requires_grad_(grad)
            loss = seqloss.rnnt_loss_packed(x, tg, il, tl, clamp=clamp, reduction="sum",
                                            fused_log_softmax=fused, fastemit_lambda=fastemit,
                                            **TRITON)
        else:
            loss = seqloss.rnnt_loss(x, tg, il, tl, clamp=clamp, reduction="sum",
                                     fused_log_softmax=fused, fastemit_lambda=fastemit, **TRITON)
        _backward(loss)

    v = ",".join(n for n, on in (("packed", packed), ("logprobs", not fused), ("nograd", not grad),
                                  ("clamp", clamp > 0), ("fastemit", fastemit > 0)) if on)
    fn = "rnnt_loss_packed" if packed else "rnnt_loss"
    return Case(f"{fn}[{v + ',' if v else ''}{_SHORT[dt]},{tag}]", fn, run)


def _multiblank(B, T, U, V, dt, tag, grad=True, dp=0.0) -> Case:
    def run() -> None:
        x = _x((B, T, U + 1, V), dt, grad=grad)
        loss = seqloss.multiblank_rnnt_loss(x, _labels(B, U, V - 3, low=0), _lengths(B, T),
                                            _lengths(B, U), [2, 4], sigma=0.05, clamp=0.5,
                                            reduction="sum", delay_penalty=dp, **TRITON)
        _backward(loss)

    v = ("" if grad else "nograd,") + ("dp," if dp else "")
    return Case(f"multiblank_rnnt_loss[{v}{_SHORT[dt]},{tag}]",
                "multiblank_rnnt_loss", run)


def _hat(B, T, U, V, dt, tag, grad=True) -> Case:
    def run() -> None:
        x = _x((B, T, U + 1, V), dt, grad=grad)
        loss = seqloss.hat_loss(x, _labels(B, U, V - 1, low=0), _lengths(B, T), _lengths(B, U),
                                clamp=0.5, reduction="sum", delay_penalty=0.2, **TRITON)
        _backward(loss)

    return Case(f"hat_loss[{'' if grad else 'nograd,'}{_SHORT[dt]},{tag}]", "hat_loss", run)


def _tdt(B, T, U, V, dt, tag, *, pair=False, omega=0.0, grad=True) -> Case:
    durs = [0, 1, 2, 3]

    def run() -> None:
        tg, il, tl = _labels(B, U, V - 1, low=0), _lengths(B, T), _lengths(B, U)
        if pair:
            x = (_x((B, T, U + 1, V), dt, grad=grad), _x((B, T, U + 1, len(durs)), dt, grad=grad))
        else:
            x = _x((B, T, U + 1, V + len(durs)), dt, grad=grad)
        loss = seqloss.tdt_loss(x, tg, il, tl, durs, sigma=0.05, omega=omega, reduction="sum",
                                **TRITON)
        _backward(loss)

    v = ",".join(n for n, on in (("pair", pair), ("omega", omega > 0), ("nograd", not grad)) if on)
    return Case(f"tdt_loss[{v + ',' if v else ''}{_SHORT[dt]},{tag}]", "tdt_loss", run)


def _lattice(B, T, U, dt, tag, *, bd=(1,), ed=(0,), emit_can_end=False, grad=True) -> Case:
    def run() -> None:
        ab = _x((B, T, U + 1, len(bd)), dt, grad=grad, scale=0.5)
        ae = _x((B, T, U + 1, len(ed)), dt, grad=grad, scale=0.5, seed=1)
        ll = seqloss.transducer_lattice(ab, ae, _lengths(B, T), _lengths(B, U), bd, ed,
                                        emit_can_end=emit_can_end, **TRITON)
        _backward(ll)

    v = f"bd={'-'.join(map(str, bd))},ed={'-'.join(map(str, ed))}" + (
        ",emit_can_end" if emit_can_end else "") + ("" if grad else ",nograd")
    return Case(f"transducer_lattice[{v},{_SHORT[dt]},{tag}]", "transducer_lattice", run)


def _logmm(batch, M, K, N, dt, tag) -> Case:
    def run() -> None:
        a = _x((*batch, M, K), dt)
        b = _x((*batch, K, N), dt, seed=1)
        _backward(seqloss.logmmexp(a, b, **TRITON))

    shape = "x".join(map(str, batch)) or "2d"
    return Case(f"logmmexp[{shape},{_SHORT[dt]},{tag}]", "logmmexp", run)


def _transducer_align(B, T, U, V, dt, tag, *, kind="rnnt", fused=True, pair=False) -> Case:
    durs = [0, 1, 2]

    def run() -> None:
        tg, il, tl = _labels(B, U, V - 3, low=0), _lengths(B, T), _lengths(B, U)
        kw = dict(fused_log_softmax=fused, **TRITON)
        if kind == "rnnt":
            seqloss.rnnt_align(_x((B, T, U + 1, V), dt, grad=False), tg, il, tl, **kw)
        elif kind == "multiblank":
            seqloss.multiblank_rnnt_align(_x((B, T, U + 1, V), dt, grad=False), tg, il, tl, [2],
                                          **kw)
        else:
            if pair:
                x = (_x((B, T, U + 1, V), dt, grad=False),
                     _x((B, T, U + 1, len(durs)), dt, grad=False))
            else:
                x = _x((B, T, U + 1, V + len(durs)), dt, grad=False)
            seqloss.tdt_align(x, tg, il, tl, durs, **kw)

    fn = {"rnnt": "rnnt_align", "multiblank": "multiblank_rnnt_align", "tdt": "tdt_align"}[kind]
    v = ",".join(n for n, on in (("pair", pair), ("logprobs", not fused)) if on)
    return Case(f"{fn}[{v + ',' if v else ''}{_SHORT[dt]},{tag}]", fn, run)


def _factored(B, T, S, C, dt, tag, *, kind, rnnt_type="regular") -> Case:
    def run() -> None:
        lm = _x((B, S + 1, C), dt)
        am = _x((B, T, C), dt, seed=1)
        sym = _labels(B, S, C)
        bnd = torch.zeros((B, 4), dtype=torch.int64)
        bnd[:, 2], bnd[:, 3] = _lengths(B, S), _lengths(B, T)
        if kind == "simple":
            loss = seqloss.rnnt_loss_simple(lm, am, sym, 0, bnd, rnnt_type, reduction="sum",
                                            **TRITON)
        elif kind == "smoothed":
            loss = seqloss.rnnt_loss_smoothed(lm, am, sym, 0, 0.1, 0.1, bnd, rnnt_type,
                                              reduction="sum", **TRITON)
        else:
            # Ranges from the reference backend's simple loss: valid, as training gets them.
            _, (px, py) = seqloss.rnnt_loss_simple(lm.detach().double(), am.detach().double(), sym,
                                                   0, bnd, rnnt_type, return_grad=True,
                                                   backend="reference")
            s_range = min(3, S + 1)
            ranges = seqloss.get_rnnt_prune_ranges(px, py, bnd, s_range)
            am_p, lm_p = seqloss.do_rnnt_pruning(am, lm, ranges)
            loss = seqloss.rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, bnd, rnnt_type,
                                            reduction="sum", **TRITON)
        _backward(loss)

    fn = f"rnnt_loss_{kind}"
    return Case(f"{fn}[{rnnt_type},{_SHORT[dt]},{tag}]", fn, run)


class _Joint(nn.Module):
    def __init__(self, He: int, Hp: int, H: int, W: int, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Linear(He, H, dtype=dtype)
        self.pred = nn.Linear(Hp, H, dtype=dtype)
        self.out = nn.Linear(H, W, dtype=dtype)

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None]))


def _from_joint(B, T, U, V, dt, tag, *, kind, clamp=-1.0, omega=0.0) -> Case:
    """A loss from the joint: its backward's tile epilogue (``joint_tile_grad_kernel``)
    specializes on the table (blank classes, durations, HAT) and on ``clamp`` (with
    TDT's ``omega``: one part per clamped branch)."""
    durs = [0, 1, 2]

    def run() -> None:
        W = V + (len(durs) if kind == "tdt" else 0)
        joint = _Joint(5, 4, 8, W, dt)
        enc, pred = _x((B, T, 5), dt), _x((B, U + 1, 4), dt, seed=1)
        args = (enc, pred, joint, _labels(B, U, V - 3, low=0), _lengths(B, T), _lengths(B, U))
        kw = dict(clamp=clamp, reduction="sum", **TRITON)
        if kind == "rnnt":
            loss = seqloss.rnnt_loss_from_joint(*args, **kw)
        elif kind == "multiblank":
            loss = seqloss.multiblank_rnnt_loss_from_joint(*args, [2], **kw)
        elif kind == "hat":
            loss = seqloss.hat_loss_from_joint(*args, **kw)
        else:
            loss = seqloss.tdt_loss_from_joint(*args, durs, omega=omega, **kw)
        _backward(loss)

    fn = {"rnnt": "rnnt_loss_from_joint", "multiblank": "multiblank_rnnt_loss_from_joint",
          "tdt": "tdt_loss_from_joint", "hat": "hat_loss_from_joint"}[kind]
    v = ",".join(n for n, on in (("clamp", clamp > 0), ("omega", omega > 0)) if on)
    return Case(f"{fn}[{v + ',' if v else ''}{_SHORT[dt]},{tag}]", fn, run)


# --------------------------------------------------------------------------- huge: meta launchers
def _meta_ctc(T, B, C, S, dt, fused, tag) -> Case:
    def run() -> None:
        from ..ctc import triton_cuda as k

        k.ctc_loss_forward(_x((T, B, C), dt, device="meta"), _labels(B, S, C, device="meta"),
                           _lengths(B, T, "meta"), _lengths(B, S, "meta"), 0, fused, True)

    return Case(f"ctc_loss[{'fused' if fused else 'logprobs'},{_SHORT[dt]},{tag}]", "ctc_loss", run)


def _meta_joint(B, T, U, V, dt, tag, *, kind="rnnt", packed=False) -> Case:
    def run() -> None:
        from ..transducer.joint import table as tab
        from ..transducer.joint import triton_cuda as k

        if kind == "rnnt":
            table = tab.rnnt_table(V, V - 1, clamp=1.0)
        elif kind == "multiblank":
            table = tab.multiblank_table(V, V - 1, (2, 4))
        else:
            table = tab.tdt_table(V, V - 1, (0, 1, 2, 3, 4))
        W = V + table.num_durations
        if packed:
            # N rows as the padded joint holds (every sequence full length): same size.
            x = _x((B * T * (U + 1), W), dt, device="meta")
        else:
            x = _x((B, T, U + 1, W), dt, device="meta")
        k.joint_loss_forward(x, _labels(B, U, V, device="meta"), _lengths(B, T, "meta"),
                             _lengths(B, U, "meta"), table, True, True)

    fn = {"rnnt": "rnnt_loss_packed" if packed else "rnnt_loss",
          "multiblank": "multiblank_rnnt_loss", "tdt": "tdt_loss"}[kind]
    return Case(f"{fn}[{_SHORT[dt]},{tag}]", fn, run)


def _meta_lattice(B, T, U, dt, tag) -> Case:
    def run() -> None:
        from ..transducer.lattice import triton_cuda as k

        k.transducer_lattice(_x((B, T, U + 1, 1), dt, device="meta"),
                             _x((B, T, U + 1, 1), dt, device="meta"), _lengths(B, T, "meta"),
                             _lengths(B, U, "meta"), (1,), (0,), True)

    return Case(f"transducer_lattice[{_SHORT[dt]},{tag}]", "transducer_lattice", run)


def _meta_logmm(B, M, K, N, dt, tag) -> Case:
    def run() -> None:
        from ..logmm import triton_cuda as k

        a, b = _x((B, M, K), dt, device="meta"), _x((B, K, N), dt, device="meta")
        out, saved = k.logmmexp_forward(a, b, True)
        k.logmmexp_backward(torch.empty_like(out), a, b, out, saved, True, True)

    return Case(f"logmmexp[{_SHORT[dt]},{tag}]", "logmmexp", run)


def _meta_ctc_align(T, B, C, S, dt, tag) -> Case:
    def run() -> None:
        from ..align import triton_cuda as k

        k.ctc_align_forward(_x((T, B, C), dt, device="meta"), _labels(B, S, C, device="meta"),
                            _lengths(B, T, "meta"), _lengths(B, S, "meta"), 0)

    return Case(f"ctc_align[{_SHORT[dt]},{tag}]", "ctc_align", run)


def _meta_viterbi(B, T, U, dt, tag) -> Case:
    def run() -> None:
        from ..transducer.lattice import triton_viterbi as k

        k.transducer_viterbi(_x((B, T, U + 1, 1), dt, device="meta"),
                             _x((B, T, U + 1, 1), dt, device="meta"), _lengths(B, T, "meta"),
                             _lengths(B, U, "meta"), (1,), (0,))

    return Case(f"rnnt_align[{_SHORT[dt]},{tag}]", "rnnt_align", run)


# --------------------------------------------------------------------------- the lists
def small_cases() -> list[Case]:
    """Every public function, every dtype, every variant that changes a specialization."""
    out: list[Case] = []
    tag = "small"
    for dt in DTYPES:
        for fused in (False, True):
            out += [_ctc(12, 3, 7, 4, dt, fused, True, tag),
                    _ctc(12, 3, 7, 4, dt, fused, False, tag)]
        out.append(_ctc_align(12, 3, 7, 4, dt, tag))
        out += [_rnnt(3, 6, 3, 7, dt, tag), _rnnt(3, 6, 3, 7, dt, tag, fused=False),
                _rnnt(3, 6, 3, 7, dt, tag, grad=False), _rnnt(3, 6, 3, 7, dt, tag, clamp=0.5),
                _rnnt(3, 6, 3, 7, dt, tag, packed=True),
                _rnnt(3, 6, 3, 7, dt, tag, packed=True, fused=False, clamp=0.5)]
        out.append(_multiblank(3, 6, 3, 9, dt, tag))
        out.append(_hat(3, 6, 3, 7, dt, tag))
        out += [_tdt(3, 6, 3, 7, dt, tag), _tdt(3, 6, 3, 7, dt, tag, pair=True, omega=0.3),
                _tdt(3, 6, 3, 7, dt, tag, grad=False)]
        out += [_lattice(3, 6, 3, dt, tag), _lattice(3, 6, 3, dt, tag, grad=False),
                _lattice(3, 6, 3, dt, tag, bd=(1, 2), ed=(0, 1, 2)),
                _lattice(3, 6, 3, dt, tag, ed=(1,), emit_can_end=True)]
        out += [_logmm((2,), 5, 6, 4, dt, tag), _logmm((), 5, 6, 4, dt, tag)]
        out += [_transducer_align(3, 6, 3, 7, dt, tag),
                _transducer_align(3, 6, 3, 7, dt, tag, fused=False),
                _transducer_align(3, 6, 3, 9, dt, tag, kind="multiblank"),
                _transducer_align(3, 6, 3, 7, dt, tag, kind="tdt"),
                _transducer_align(3, 6, 3, 7, dt, tag, kind="tdt", pair=True)]
        for rt in ("regular", "modified", "constrained"):
            out.append(_factored(3, 6, 3, 7, dt, tag, kind="simple", rnnt_type=rt))
        out += [_factored(3, 6, 3, 7, dt, tag, kind="smoothed"),
                _factored(3, 6, 3, 7, dt, tag, kind="pruned")]
        for kind in ("rnnt", "multiblank", "tdt", "hat"):
            out.append(_from_joint(3, 6, 3, 7, dt, tag, kind=kind))
        out += [_from_joint(3, 6, 3, 7, dt, tag, kind="rnnt", clamp=0.5),
                _from_joint(3, 6, 3, 7, dt, tag, kind="tdt", clamp=0.5, omega=0.3)]
    # A batch of one: B = 1 is a constexpr argument, its own specialization.
    out += [_ctc(12, 1, 7, 4, torch.float32, True, True, "B=1"),
            _rnnt(1, 6, 3, 7, torch.float32, "B=1"), _lattice(1, 6, 3, torch.float32, "B=1")]
    # delay_penalty: CTC's DELAY specialization; the joint's penalty (a parameter entry).
    out += [_ctc(12, 2, 7, 4, torch.float32, fused, True, "dp", dp=0.3) for fused in (True, False)]
    out.append(_multiblank(2, 6, 3, 7, torch.float32, "dp", dp=-0.3))
    # A batch past CUDA's 65,535 on the grid's y axis (it was there once), on meta tensors.
    out.append(_meta_logmm(70_000, 8, 6, 8, torch.float32, "B=70000"))
    return out


def extreme_cases() -> list[Case]:
    """The extremes a user reaches, one dimension at a time, allocated on the host."""
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    out: list[Case] = []
    for dt in (f32, f16):
        out += [_ctc(2001, 2, 30, 1000, dt, True, True, "S=1000"),
                _ctc(2001, 2, 30, 1000, dt, False, True, "S=1000"),
                _ctc_align(2001, 2, 30, 1000, dt, "S=1000")]
    for dt in (f32, bf16):
        out += [_ctc(30, 2, 50_000, 10, dt, True, True, "C=50000"),
                _ctc(30, 2, 50_000, 10, dt, False, True, "C=50000")]
    out += [_ctc(20_000, 2, 8, 50, f32, True, True, "T=20000"),
            _ctc(20, 1024, 8, 5, f32, True, True, "B=1024"),
            _ctc_align(20_000, 2, 8, 50, f32, "T=20000")]
    for dt in DTYPES:
        out.append(_ctc(12, 1, 7, 4, dt, False, True, "B=1"))
        out.append(_rnnt(1, 6, 3, 7, dt, "B=1"))
    for dt in (f32, f16):
        out += [_rnnt(2, 6, 3, 20_000, dt, "V=20000"),
                _rnnt(2, 6, 3, 20_000, dt, "V=20000", packed=True),
                _tdt(2, 6, 3, 20_000, dt, "V=20000"),
                _multiblank(2, 6, 3, 20_000, dt, "V=20000")]
    out += [_rnnt(2, 20_000, 3, 5, f32, "T=20000"), _rnnt(1024, 3, 2, 5, f32, "B=1024"),
            _rnnt(1024, 3, 2, 5, f32, "B=1024", packed=True),
            _tdt(2, 20_000, 3, 7, f32, "T=20000"),
            _lattice(2, 20_000, 3, f32, "T=20000"), _lattice(1024, 3, 2, f32, "B=1024"),
            _lattice(2, 10, 1000, f32, "U=1000"), _lattice(2, 10, 1000, torch.float64, "U=1000"),
            _transducer_align(2, 20_000, 3, 5, f32, "T=20000"),
            _transducer_align(2, 10, 1000, 5, f32, "U=1000"),
            _transducer_align(2, 6, 3, 20_000, f32, "V=20000", kind="tdt"),
            _logmm((1024,), 8, 6, 8, f32, "B=1024"), _logmm((2,), 3000, 64, 3000, f32, "M=N=3000"),
            _factored(2, 20_000, 10, 8, f32, "T=20000", kind="simple"),
            _factored(2, 20_000, 10, 8, f32, "T=20000", kind="pruned"),
            _factored(1024, 6, 3, 7, f32, "B=1024", kind="simple"),
            _from_joint(2, 6, 3, 20_000, f32, "V=20000", kind="rnnt")]
    return out


def huge_cases() -> list[Case]:
    """Past ``2**31`` elements: the backend launchers on ``meta`` tensors.

    ``B=2, T=1100, U=100, V=20000``: the batch stride (2.2e9) passes ``2**31``, so Triton
    passes it as a 64-bit argument (a specialization of its own).
    """
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    out: list[Case] = []
    for dt in (f16, f32):
        out += [_meta_ctc(2000, 64, 50_000, 1000, dt, True, "T=2000,B=64,C=50000,S=1000"),
                _meta_ctc(2000, 64, 50_000, 1000, dt, False, "T=2000,B=64,C=50000,S=1000")]
    out.append(_meta_ctc(20_000, 1024, 128, 1000, f16, True, "T=20000,B=1024,C=128,S=1000"))
    for dt in (f16, bf16, f32):
        out += [_meta_joint(16, 500, 100, 4096, dt, "B=16,T=500,U=100,V=4096"),
                _meta_joint(16, 500, 100, 4096, dt, "B=16,T=500,U=100,V=4096,packed", packed=True)]
    out += [_meta_joint(16, 500, 100, 1025, f16, "B=16,T=500,U=100,V=1025", kind="multiblank"),
            _meta_joint(16, 500, 100, 1025, f16, "B=16,T=500,U=100,V=1025", kind="tdt"),
            _meta_joint(2, 1100, 100, 20_000, f16, "B=2,T=1100,U=100,V=20000"),
            _meta_joint(1024, 200, 20, 1025, f16, "B=1024,T=200,U=20,V=1025"),
            _meta_lattice(1024, 2000, 100, f32, "B=1024,T=2000,U=100"),
            _meta_lattice(64, 20_000, 1000, f32, "B=64,T=20000,U=1000"),
            _meta_logmm(1024, 2000, 1024, 1000, f32, "B=1024,M=2000,K=1024,N=1000"),
            _meta_logmm(1024, 2000, 1024, 1000, torch.float64, "B=1024,M=2000,K=1024,N=1000"),
            _meta_ctc_align(20_000, 64, 1000, 1000, f32, "T=20000,B=64,C=1000,S=1000"),
            _meta_viterbi(64, 20_000, 1000, f32, "B=64,T=20000,U=1000")]
    return out


def cases(shapes: str = "small") -> list[Case]:
    if shapes == "small":
        return small_cases()
    if shapes == "all":
        return small_cases() + extreme_cases() + huge_cases()
    raise ValueError(f"shapes must be 'small' or 'all', got {shapes!r}")
