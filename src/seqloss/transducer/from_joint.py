r"""Transducer losses straight from the joint network: the logits are never materialized.

``rnnt_loss_from_joint``, ``multiblank_rnnt_loss_from_joint`` and
``tdt_loss_from_joint`` take ``encoder_out (B, T, H_enc)``, ``predictor_out
(B, U+1, H_pred)`` and the joint (any callable mapping
``joint(encoder_out[b0:b1, t0:t1], predictor_out[b0:b1, u0:u1])`` to logits
``(b1-b0, t1-t0, u1-u0, W)``), and give the loss of ``joint(encoder_out,
predictor_out)`` with its gradients, holding at most ``chunk_elements`` logits at once.

Forward: the ``(b, t, u)`` rows are cut into tiles of whole class rows (at most
``chunk_elements`` logits each). Each tile's logits are computed without autograd,
and only what the lattice reads is kept, in float64: the log-softmax normalizer of
each row (and of the duration block, for TDT), the log-probabilities of the blank-like
classes and of the next target label, the duration log-probabilities. The tile is then
freed. The lattice (``transducer_lattice``'s kernels) turns those ``(B, T, U+1, arcs)``
scores into the per-sequence losses and the arc occupations. Extra memory:
O(B T U (arcs + D)) plus one tile. A tile shared by sequences of different lengths
never shows the joint their padding (``_Pad``): padding reaches no gradient.

Backward: each tile's logits are recomputed with autograd on, under the CPU and CUDA
RNG states saved before its forward call (``torch.utils.checkpoint``'s approach, so
dropout inside the joint draws the same masks) and the forward's autocast state. The
backend's joint epilogue on a tile (``joint_tile_grad``: the reference's in PyTorch,
Numba's through its row body ``grad_row``, Triton's kernel; ``table.py``) makes the
tile's logits gradient from the occupations, ``softmax * row occupation - arc
occupations on their classes``, then ``clamp``, then the reduction's factor and the
incoming gradient, written over the logits where the joint's backward does not read
them (``_overwritable``); it is pushed through the joint into ``encoder_out``,
``predictor_out`` and the joint's parameters, one tile at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .._core import checks
from .._core.compiler import eager_only
from .._core.dispatch import kernel_module, resolve_backend
from .._core.errors import InputError, InputTypeError
from .._core.logspace import sub_normalizer
from .._core.reduce import finish, weights
from .._core.torch_compat import functorch_transforms_active
from .._core.types import IntsLike, TransducerReduction
from .checks import resolve_token_blank, transducer_inputs, transducer_values
from .joint.table import (
    JointTable,
    delay_terms,
    epilogue_weights,
    multiblank_table,
    rnnt_table,
    tdt_table,
)
from .multiblank import multiblank_options
from .rnnt import rnnt_options
from .tdt import check_tdt_durations, tdt_options

DEFAULT_CHUNK_ELEMENTS = 2**20
"""The default ``chunk_elements`` on CPU: 1 Mi logits (4 MiB per float32 tile; the
backward's working set is about 16 bytes per logit, ~20 MiB). Measured at (B=8, T=150,
U=40, H=256, V=1024): 2**20 costs the same time as 2**22 and 2**24 (the joint's
matmuls dominate), with 20 MiB of peak against 71 and 191 MiB."""

DEFAULT_CHUNK_ELEMENTS_ROWS = 2**21
"""The default on CPU for the Numba backend's one softmax table without clamp (RNN-T,
multi-blank) on rows of at least ``numba_rows.MIN_ROW_WIDTH`` classes (where its row
passes also make the forward's normalizers): 2 Mi logits, ~25 MiB of peak at (B=8,
T=150, U=40, H=256, V=1024), 32 tiles against 2**20's 56. Each tile costs the joint's
~15 parallel regions and the row passes' pool, whose hand-offs to the other threads
dominate the tiles' cost on a loaded 2-core machine."""

DEFAULT_CHUNK_ELEMENTS_CUDA = 2**24
"""The default on CUDA: 16 Mi logits (64 MiB per float32 tile), large enough that a
tile's kernel launches are amortized."""

Tile = tuple[int, int, int, int, int, int]  # b0, b1, t0, t1, u0, u1


# --------------------------------------------------------------------------- tiling
def _plan_tiles(Tl: list[int], Ul: list[int], T: int, U1: int, rows: int) -> list[Tile]:
    """Rectangular ``(b, t, u)`` tiles of at most ``rows`` rows covering every row read.

    Consecutive sequences share a tile (their bounding box) while it fits; a longer
    sequence is cut into frame blocks, and a row of ``U_b + 1`` states too wide for
    one tile into ``u`` blocks. Sequences without frames are skipped (they read nothing).
    """
    tiles: list[Tile] = []
    B = len(Tl)
    Tb = [min(max(t, 0), T) for t in Tl]
    Ub1 = [min(max(u, 0) + 1, U1) for u in Ul]
    b = 0
    while b < B:
        if Tb[b] == 0:
            b += 1
            continue
        if Tb[b] * Ub1[b] <= rows:
            b1, mt, mu = b + 1, Tb[b], Ub1[b]
            while b1 < B:
                nt, nu = max(mt, Tb[b1]), max(mu, Ub1[b1])
                if (b1 + 1 - b) * nt * nu > rows:
                    break
                b1, mt, mu = b1 + 1, nt, nu
            tiles.append((b, b1, 0, mt, 0, mu))
            b = b1
            continue
        if Ub1[b] <= rows:
            step = rows // Ub1[b]
            for t0 in range(0, Tb[b], step):
                tiles.append((b, b + 1, t0, min(t0 + step, Tb[b]), 0, Ub1[b]))
        else:
            for t0 in range(Tb[b]):
                for u0 in range(0, Ub1[b], rows):
                    tiles.append((b, b + 1, t0, t0 + 1, u0, min(u0 + rows, Ub1[b])))
        b += 1
    return tiles


# --------------------------------------------------------------------------- RNG, autocast
def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _same_state(a: tuple[Tensor, Tensor | None], b: tuple[Tensor, Tensor | None]) -> bool:
    return torch.equal(a[0], b[0]) and (a[1] is None or torch.equal(a[1], b[1]))


def _autocast_state() -> list[tuple[str, torch.dtype]]:
    out = []
    for dev in ("cpu", "cuda"):
        if torch.is_autocast_enabled(dev):
            out.append((dev, torch.get_autocast_dtype(dev)))
    return out


class _Autocast:
    """Re-enter the forward's autocast state (the backward may run outside it)."""

    def __init__(self, state: list[tuple[str, torch.dtype]]) -> None:
        self.ctx = [torch.autocast(dev, dtype=dt) for dev, dt in state]

    def __enter__(self) -> None:
        for c in self.ctx:
            c.__enter__()

    def __exit__(self, *exc: object) -> None:
        for c in reversed(self.ctx):
            c.__exit__(*exc)


# --------------------------------------------------------------------------- the plan
@dataclass
class _Branch:
    """One table of the loss (TDT's ``omega`` mixes two) and its weight."""

    table: JointTable
    weight: float
    # filled by the forward: (B, T, U+1, 3 + len(blank_tokens) + D) in plan.acc, the
    # epilogue's per-row weights and occupations (the ``occ`` of joint_tile_grad:
    # the token block's and duration block's weights, the emission's, each distinct
    # blank-like class's, each duration logit's)
    occ: Tensor | None = None


@dataclass
class _Plan:
    joint: object
    branches: list[_Branch]
    V: int
    D: int
    blank_tokens: tuple[int, ...]  # distinct blank-like classes over every branch
    targets: Tensor  # (B, U+1) int64, column U and padding 0
    il: Tensor
    tl: Tensor
    Tl: list[int]
    Ul: list[int]
    T: int
    U1: int
    reduction: str
    zero_infinity: bool
    backend: str
    chunk_rows: int
    is_module: bool
    tiles: list[Tile] = field(default_factory=list)
    pads: list = field(default_factory=list)  # a _Pad or None per tile


@dataclass
class _Pad:
    """A tile spanning padding (sequences of different lengths share it).

    The joint never sees the padding: each padded frame is replaced by the sequence's
    last frame, each padded predictor row by its row ``U_b`` (a sequence without frames
    takes the tile's first sequence's rows). The logits there get a zero gradient, but
    the joint's backward multiplies that zero by its local derivatives, which padding
    (NaN, inf, or a value the joint maps to NaN) could make non-finite: ``0 * NaN`` would
    reach the joint's parameters and, through the tile's other rows, the gradients of
    other sequences. On copies of real rows those derivatives are the real rows' own,
    and what the copies receive is dropped (``keep_e``, ``keep_p``)."""

    src: Tensor  # (nb, 1) the sequence whose rows each of the tile's takes
    tix: Tensor  # (nb, nt) its frame for each of the tile's
    uix: Tensor  # (nb, nu) its predictor row for each of the tile's
    keep_e: Tensor  # (nb, nt, 1) the sequence's own real frames
    keep_p: Tensor  # (nb, nu, 1) its own real predictor rows (none without frames)

    @property
    def mask(self) -> Tensor:
        """``(nb, nt, nu)``: the lattice states read."""
        return self.keep_e[:, :, None, 0] & self.keep_p[:, None, :, 0]


def _plan_pads(plan: _Plan, device: torch.device) -> list[_Pad | None]:
    def dev(x: list, dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.tensor(x, dtype=dtype).to(device, non_blocking=True)

    pads: list[_Pad | None] = []
    for b0, b1, t0, t1, u0, u1 in plan.tiles:
        Tb = [min(max(plan.Tl[b], 0), plan.T) for b in range(b0, b1)]
        Ub = [min(max(plan.Ul[b], 0), plan.U1 - 1) for b in range(b0, b1)]
        if all(tb >= t1 and ub + 1 >= u1 for tb, ub in zip(Tb, Ub, strict=True)):
            pads.append(None)
            continue
        src = [i if Tb[i] > 0 else 0 for i in range(b1 - b0)]  # tile-local; Tb[0] > 0
        tix = [[min(t, Tb[s] - 1) for t in range(t0, t1)] for s in src]
        uix = [[min(u, Ub[s]) for u in range(u0, u1)] for s in src]
        keep_e = [[t < tb for t in range(t0, t1)] for tb in Tb]
        keep_p = [[u <= ub and tb > 0 for u in range(u0, u1)]
                  for tb, ub in zip(Tb, Ub, strict=True)]
        pads.append(_Pad(dev([[b0 + i] for i in src]), dev(tix), dev(uix),
                         dev(keep_e, torch.bool)[..., None], dev(keep_p, torch.bool)[..., None]))
    return pads


def _tile_streams(pad: _Pad | None, enc: Tensor, pred: Tensor, tile: Tile) -> tuple[Tensor, Tensor]:
    """The tile's encoder frames and predictor rows, padding replaced (see ``_Pad``)."""
    b0, b1, t0, t1, u0, u1 = tile
    if pad is None:
        return enc[b0:b1, t0:t1], pred[b0:b1, u0:u1]
    return enc[pad.src, pad.tix], pred[pad.src, pad.uix]


def _call_joint(joint: object, enc: Tensor, pred: Tensor, tile: Tile) -> Tensor:
    """``joint`` on the tile ``enc[b0:b1, t0:t1]``, ``pred[b0:b1, u0:u1]``, its shape checked."""
    b0, b1, t0, t1, u0, u1 = tile
    out = joint(enc[b0:b1, t0:t1], pred[b0:b1, u0:u1])  # type: ignore[operator]
    want = (b1 - b0, t1 - t0, u1 - u0)
    if not isinstance(out, Tensor) or out.dim() != 4 or tuple(out.shape[:3]) != want:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise InputError(f"joint(encoder_out[b0:b1, t0:t1], predictor_out[b0:b1, u0:u1]) must "
                         f"return logits of shape (b1-b0, t1-t0, u1-u0, classes) = {want} + "
                         f"(classes,), got {got}")
    return out


def _lse(x: Tensor) -> Tensor:
    """The float64 log-normalizer of each row of ``x``; a row of -inf gives -inf, NaN
    gives NaN, +inf gives +inf.

    float32 rows: the sum of ``exp(x - max)`` in float32 (relative error ~1e-7, an
    absolute 1e-7 after the log), the max added in float64. Rounded to float32 instead,
    ``log Z`` and the arcs ``x - log Z`` carry an error of ``eps * |log Z|``, which the
    lattice sums over ``T + U`` steps (measured at T=1000, U=100, V=16: 3.8e-7 of
    relative gradient error, 9e-8 this way); a float64 copy of the tile would cost
    twice the float32 logsumexp's time for 5e-8."""
    if x.dtype == torch.float64:
        return torch.logsumexp(x, -1)
    m = x.amax(-1, keepdim=True)
    m = m.masked_fill(~torch.isfinite(m), 0.0)  # -inf, +inf and NaN rows: exp gives 0, inf, NaN
    e = torch.sub(x, m)
    s = e.exp_().sum(-1)
    del e
    return m[..., 0].to(torch.float64) + s.to(torch.float64).log_()


def _row_passes(plan: _Plan, x: Tensor) -> object | None:
    """The CPU backend's row prologue over a tile's token rows ``x (nb, nt, nu, V+D)`` in
    the forward (one read of the logits for the normalizers; HAT's at any width), or
    None where torch's ops run instead (CUDA, the reference, narrow rows)."""
    if plan.backend != "numba" or x.device.type != "cpu":
        return None
    from .joint.numba_rows import RowPasses, rows_ok

    hb = _hat_blank(plan)
    if not rows_ok(plan.V, x, min_width=None if hb is None else 2):
        return None
    nb, nt, nu = x.shape[:3]
    row_max = torch.empty((nb, nt, nu), dtype=x.dtype)
    row_sum = torch.empty((nb, nt, nu), dtype=x.dtype)
    return RowPasses(x[..., :plan.V], [nt] * nb, [nu - 1] * nb, [0] * nb, plan.V, row_max,
                     row_sum, hat_blank=-1 if hb is None else hb)


def _tile_lse(plan: _Plan, x: Tensor) -> Tensor:
    """The float64 log-normalizers of the tile's token rows (see ``_lse``)."""
    rp = _row_passes(plan, x)
    if rp is None:
        return _lse(x[..., :plan.V])
    rp.prologue()  # type: ignore[attr-defined]
    # As _lse: the max exact, the float32 sum's log in float64; a row of -inf has
    # shift 0 and sum 0, so log Z = -inf; NaN or +inf in a row gives NaN.
    return rp.row_max.to(torch.float64) + rp.row_sum.to(torch.float64).log_()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- forward
def _forward(plan: _Plan, enc: Tensor, pred: Tensor, states: list) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence losses ``(B,)`` (float64), ``bad (B,)`` and the output dtype probe.

    The normalizers and arcs are float64 whatever the logits' dtype (see ``_lse``), and
    so are the lattice's arcs; the occupations and the backward's tile math are in
    ``plan.acc``: float32 (float64 for float64 logits)."""
    lb, ly, ld, bad, logit_dtype = _tile_log_probs(plan, enc, pred, states)
    kern = kernel_module("lattice", plan.backend)
    losses = [_branch_loss(plan, br, kern, lb, ly, ld) for br in plan.branches]
    if len(losses) == 1:
        loss = losses[0]
    else:
        loss = sum(br.weight * lo for br, lo in zip(plan.branches, losses, strict=True))
    loss = torch.where(bad, float("nan"), loss)
    return loss, bad, torch.empty(0, dtype=logit_dtype or plan_dtype(plan))


def _tile_log_probs(plan: _Plan, enc: Tensor, pred: Tensor, states: list) -> tuple:
    """The joint on each tile, normalized: ``(lb (B, T, U+1, Nb), ly (B, T, U+1), ld
    (B, T, U+1, D) or None, bad (B,), the logits' dtype or None)`` in float64, the
    normalizers and ``acc`` left on ``plan``, each tile's RNG state appended to ``states``."""
    device = enc.device
    B, T, U1, V, D = len(plan.Tl), plan.T, plan.U1, plan.V, plan.D
    f64 = torch.float64
    acc = None
    lz = torch.zeros((B, T, U1), dtype=f64, device=device)
    lb = torch.zeros((B, T, U1, len(plan.blank_tokens)), dtype=f64, device=device)
    ly = torch.zeros((B, T, U1), dtype=f64, device=device)
    lzd = torch.zeros((B, T, U1), dtype=f64, device=device) if D else None
    ld = torch.zeros((B, T, U1, D), dtype=f64, device=device) if D else None
    bad = torch.zeros(B, dtype=torch.bool, device=device)
    tok_idx = torch.tensor(plan.blank_tokens, device=device)
    hb = _hat_blank(plan)
    prev = None
    logit_dtype = None
    for tile, pad in zip(plan.tiles, plan.pads, strict=True):
        b0, b1, t0, t1, u0, u1 = tile
        st = _rng_state(device)
        if prev is not None and _same_state(st, prev):
            st = prev  # the joint draws no random numbers: share the state
        states.append(st)
        prev = st
        e_t, p_u = _tile_streams(pad, enc, pred, tile)
        logits = _call_joint(plan.joint, e_t, p_u, (0, b1 - b0, 0, t1 - t0, 0, u1 - u0))
        del e_t, p_u
        if logits.shape[-1] != V + D:
            raise InputError(f"joint returned {logits.shape[-1]} classes for tile {tile}, "
                             f"{V + D} for the first")
        if acc is None:
            logit_dtype = logits.dtype
            acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        x = logits.to(acc)
        del logits
        xt = x[..., :V]
        sl = (slice(b0, b1), slice(t0, t1), slice(u0, u1))
        idx = plan.targets[b0:b1, None, u0:u1, None].expand(b1 - b0, t1 - t0, u1 - u0, 1)
        if hb is None:
            z = _tile_lse(plan, x)
            # A row of -inf logits (z = -inf) has no arc out of it: -inf, not NaN.
            lb[sl] = sub_normalizer(xt.index_select(-1, tok_idx).to(f64), z[..., None])
            ly[sl] = sub_normalizer(xt.gather(-1, idx)[..., 0].to(f64), z)
            rowbad = ~(z < float("inf"))
        else:  # HAT: the labels' normalizer (the blank's class out), the blank's sigmoid
            rp = _row_passes(plan, x)
            zb = xt[..., hb].to(f64)
            if rp is None:
                z = _lse(xt.index_fill(-1, tok_idx, float("-inf")))
            else:  # as _tile_lse, over the labels
                rp.prologue()  # type: ignore[attr-defined]
                z = rp.row_max.to(f64) + rp.row_sum.to(f64).log_()  # type: ignore[attr-defined]
            lb[sl] = F.logsigmoid(zb)[..., None]
            # labels all -inf (z = -inf): no label leaves the row, its blank still may
            ly[sl] = sub_normalizer(xt.gather(-1, idx)[..., 0].to(f64), z) + F.logsigmoid(-zb)
            rowbad = ~(z < float("inf")) | ~(zb < float("inf"))
        lz[sl] = z
        if D:
            zd = _lse(x[..., V:])
            lzd[sl] = zd
            ld[sl] = sub_normalizer(x[..., V:].to(f64), zd[..., None])
            rowbad |= ~(zd < float("inf"))
        del x, xt
        if pad is not None:
            rowbad &= pad.mask
        bad[b0:b1] |= rowbad.flatten(1).any(1)
    if acc is None:  # no tile: every sequence has zero frames (or B = 0)
        acc = torch.float64 if plan_dtype(plan) == torch.float64 else torch.float32
    plan.lz, plan.lzd, plan.acc = lz, lzd, acc  # type: ignore[attr-defined]
    return lb, ly, ld, bad, logit_dtype


def _branch_loss(plan: _Plan, br: _Branch, kern, lb: Tensor, ly: Tensor,
                 ld: Tensor | None) -> Tensor:
    """One branch's ``(B,)`` float64 loss from the tiles' log-probabilities, its lattice
    occupations left on ``br`` (``br.occ``, the epilogue's per-row weights) for the
    backward."""
    T, D, acc = plan.T, plan.D, plan.acc
    tb = br.table
    sig = tb.sigma

    def with_dur(base: Tensor, dl: int | None) -> Tensor:
        return base if dl is None else base + ld[..., dl]  # type: ignore[index]

    ab = torch.stack([with_dur(lb[..., plan.blank_tokens.index(a.token)] - sig,
                               a.duration_logit) for a in tb.blank_arcs], -1)
    ly_b = ly - sig
    if tb.delay_penalty:
        ly_b = ly_b + delay_terms(tb.delay_penalty, plan.il, T)[..., None]
    ae = torch.stack([with_dur(ly_b, a.duration_logit) for a in tb.emit_arcs], -1)
    del ly_b
    ll, ob, oe = kern.transducer_lattice(ab, ae, plan.il, plan.tl, tb.blank_durations,
                                         tb.emit_durations, True, tb.emit_can_end)
    del ab, ae
    ob, oe = ob.to(acc), oe.to(acc)
    scale = 1.0 + tb.fastemit_lambda
    oe = oe * scale
    br.occ = epilogue_weights(tb, ob, oe, plan.blank_tokens, D)
    return -ll.to(torch.float64) * scale


def _hat_blank(plan: _Plan) -> int | None:
    """HAT's blank class (its table's ``"hat"`` normalizer), or None (a softmax table)."""
    tb = plan.branches[0].table
    return tb.blank_tokens[0] if tb.hat else None


def plan_dtype(plan: _Plan) -> torch.dtype:
    return plan.probe_dtype  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- backward
def _parts(plan: _Plan, m: Tensor, dead: Tensor | None) -> tuple[Tensor, tuple[float, ...], Tensor]:
    """``(occ (K, B, T, U+1, C), clamp, gscale (K, B))`` float64, the backward's input to
    the backend's ``joint_tile_grad`` (per tile, slices of these).

    The epilogue is linear in the occupations, so without a clamp the branches (TDT's
    ``omega`` mixes two) and each sequence's factor (the reduction's, the incoming
    gradient, the branch's weight; 0 for a sequence infeasible in a branch) are folded
    into one part. A clamp applies to each branch's gradient before its factor: one
    part per branch."""
    f64 = torch.float64
    mb = m.to(f64)
    if dead is not None:
        mb = torch.where(dead, 0.0, mb)
    factors = [mb * br.weight for br in plan.branches]
    if all(br.table.clamp <= 0 for br in plan.branches):
        occ = None
        for br, f in zip(plan.branches, factors, strict=True):
            ok = br.occ.to(f64) * f[:, None, None, None]  # type: ignore[union-attr]
            occ = ok if occ is None else occ.add_(ok)
        return occ[None], (0.0,), torch.ones((1, len(mb)), dtype=f64, device=m.device)  # type: ignore[index]
    occ = torch.stack([br.occ for br in plan.branches]).to(f64)  # type: ignore[misc]
    return occ, tuple(br.table.clamp for br in plan.branches), torch.stack(factors)


def _tile_epilogue(backend: str):
    """The backend's ``joint_tile_grad``."""
    return kernel_module("joint", backend).joint_tile_grad


def _tile_grad(plan: _Plan, tile: Tile, pad: _Pad | None, logits: Tensor, parts: tuple,
               bad: Tensor, bad_host: list[bool]) -> Tensor:
    """The joint epilogue on one tile (the backend's ``joint_tile_grad``): the gradient of
    the weighted loss w.r.t. its logits, written over them where ``_overwritable``."""
    b0, b1, t0, t1, u0, u1 = tile
    acc = plan.acc  # type: ignore[attr-defined]
    sl = (slice(b0, b1), slice(t0, t1), slice(u0, u1))
    x = logits.detach()
    if x.dtype != acc:
        x = x.to(acc)
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()  # the backends read rows of unit stride
    occ, clamp, gscale = parts
    out = x if _overwritable(x, logits) else torch.empty(x.shape, dtype=acc, device=x.device)
    hb = _hat_blank(plan)
    lzd = plan.lzd[sl] if plan.D else None  # type: ignore[attr-defined]
    g = _tile_epilogue(plan.backend)(
        x, plan.lz[sl], lzd, occ[(slice(None), *sl)], plan.blank_tokens,  # type: ignore[attr-defined]
        plan.targets[b0:b1, u0:u1], -1 if hb is None else hb, clamp, gscale[:, b0:b1], out)
    return _tile_masks(g, tile, pad, bad, bad_host)


def _tile_masks(g: Tensor, tile: Tile, pad: _Pad | None, bad: Tensor,
                bad_host: list[bool]) -> Tensor:
    """Zero on the copies standing in for padding, NaN on a NaN sequence's rows."""
    b0, b1 = tile[0], tile[1]
    mask = None if pad is None else pad.mask
    if mask is not None:
        g.masked_fill_(~mask[..., None], 0.0)
    if any(bad_host[b0:b1]):
        badm = bad[b0:b1, None, None] if mask is None else bad[b0:b1, None, None] & mask
        g.masked_fill_(badm[..., None], float("nan"))
    return g


# The joint's last nodes whose backward does not read their output: a gradient may be
# written over the logits (views of that output pass through).
_OUT_UNSAVED = frozenset({"AddmmBackward0", "MmBackward0", "BmmBackward0", "BaddbmmBackward0",
                          "AddBackward0", "CatBackward0"})
_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"})


def _overwritable(x: Tensor, logits: Tensor) -> bool:
    """Whether the tile's gradient may be written over ``x`` (the logits in the
    accumulation dtype): a copy of ours, or the logits themselves where the joint's
    backward will not read them (its last op is a matmul, a sum, a concatenation, seen
    through views; a joint ending in ``exp`` or ``log_softmax`` saves its output). Saves
    a tile-sized buffer: 4 of the backward's ~12 bytes per logit."""
    if not x.is_contiguous():
        return False
    if x.data_ptr() != logits.data_ptr():
        return True  # a cast copy (the logits in float16/bfloat16)
    fn = logits.grad_fn
    while fn is not None and type(fn).__name__ in _VIEWS:
        fn = fn.next_functions[0][0]
    return fn is not None and type(fn).__name__ in _OUT_UNSAVED


def _keep(grad: Tensor, keep: Tensor | None) -> Tensor:
    # masked_fill, not a product: a NaN sequence's copies hold NaN. Out of place: the
    # joint's backward may hand back an expanded (stride-0) gradient.
    return grad if keep is None else grad.masked_fill(~keep, 0.0)


def _accumulate(acc: Tensor, g: Tensor) -> Tensor:
    """``acc += g``; on CPU through numpy, on the calling thread: a parameter's gradient
    (a weight of ~10**5-10**6 entries) is one parallel region per tile for torch, whose
    hand-off to the OpenMP workers costs more than the sum on a loaded machine."""
    if (acc.device.type == "cpu" and acc.dtype in (torch.float32, torch.float64)
            and g.dtype == acc.dtype and g.shape == acc.shape and acc.is_contiguous()
            and g.is_contiguous()):
        a = acc.detach().numpy()
        np.add(a, g.detach().numpy(), out=a)
        return acc
    return acc.add_(g)


def push_tile(is_module: bool, logits: Tensor, g: Tensor, e_t: Tensor, p_u: Tensor,
              tile: Tile, pad: _Pad | None, params: list[Tensor], want: list[int],
              ge: Tensor | None, gp: Tensor | None, gparams: list[Tensor | None]) -> None:
    """A tile's logits gradient ``g`` pushed through the joint (``logits`` recomputed from
    the tile's streams ``e_t``, ``p_u``, which require grad where wanted), accumulated into
    ``ge``, ``gp`` (``None``: not wanted) and ``gparams`` (the parameters at ``want``)."""
    b0, b1, t0, t1, u0, u1 = tile
    # what the copies standing in for padding receive goes to no one (_Pad)
    keep_e, keep_p = (None, None) if pad is None else (pad.keep_e, pad.keep_p)
    if is_module:
        inputs = ([e_t] if ge is not None else []) + ([p_u] if gp is not None else []) + \
            [params[i] for i in want]
        if not inputs:
            return
        grads = torch.autograd.grad(logits, inputs, g, allow_unused=True)
        k = 0
        if ge is not None:
            if grads[0] is not None:
                ge[b0:b1, t0:t1] += _keep(grads[0], keep_e)
            k += 1
        if gp is not None:
            if grads[k] is not None:
                gp[b0:b1, u0:u1] += _keep(grads[k], keep_p)
            k += 1
        for i, gi in zip(want, grads[k:], strict=True):
            if gi is not None:
                gparams[i] = gi if gparams[i] is None else _accumulate(gparams[i], gi)
    else:
        # Any callable: whatever it closes over gets .grad as in
        # torch.utils.checkpoint's reentrant mode.
        torch.autograd.backward(logits, g)
        if ge is not None and e_t.grad is not None:
            ge[b0:b1, t0:t1] += _keep(e_t.grad, keep_e)
        if gp is not None and p_u.grad is not None:
            gp[b0:b1, u0:u1] += _keep(p_u.grad, keep_p)


def zero_unreached(params: list[Tensor], want: list[int], gparams: list[Tensor | None]) -> None:
    """A parameter no tile reached (an empty batch, no frame anywhere) gets a zero
    gradient, not None: a data-parallel rank without data must still reduce every
    parameter's gradient with the others."""
    for i in want:
        if gparams[i] is None:
            gparams[i] = torch.zeros_like(params[i])


class _FromJoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, encoder_out, predictor_out, *params):
        states: list = []
        ctx.autocast = _autocast_state()
        loss, bad, probe = _forward(plan, encoder_out, predictor_out, states)
        # A sequence infeasible in one branch of a mixture is infeasible: zero gradient.
        ctx.dead = (loss == float("inf")) if len(plan.branches) > 1 else None
        dtype = probe.dtype if probe.dtype in (torch.float32, torch.float64) else torch.float32
        if plan.zero_infinity and dtype != loss.dtype:
            # The lattice is float64: a feasible path through finfo(float32).min scores
            # has a finite float64 loss that is +inf in the output dtype, and +inf is what
            # zero_infinity zeroes (the loss and the sequence's whole gradient).
            loss = loss.masked_fill(loss.to(dtype) == float("inf"), float("inf"))
        B = loss.shape[0]
        # w: d out / d loss_b, the factor of sequence b's gradient (0 where zeroed)
        out, w = finish(loss, loss.new_ones((B,)), plan.reduction, plan.zero_infinity,
                        weights=weights(plan.reduction, plan.tl, loss), batch_dim=0)
        ctx.plan, ctx.states, ctx.bad, ctx.w = plan, states, bad, w
        ctx.bad_host = [bool(v) for v in bad.tolist()]
        ctx.logit_dtype = probe.dtype
        ctx.n_params = len(params)
        ctx.save_for_backward(encoder_out, predictor_out, *params)
        return out.to(dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        plan: _Plan = ctx.plan
        enc, pred, *params = ctx.saved_tensors
        device = enc.device
        acc = plan.acc  # type: ignore[attr-defined]
        B = len(plan.Tl)
        m = grad_loss.to(acc).expand(B) * ctx.w.to(acc)
        need_e, need_p = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        want = [i for i, p in enumerate(params) if ctx.needs_input_grad[3 + i]]
        ge = torch.zeros_like(enc) if need_e else None
        gp = torch.zeros_like(pred) if need_p else None
        gparams: list[Tensor | None] = [None] * len(params)
        parts = _parts(plan, m, ctx.dead)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            for tile, pad, st in zip(plan.tiles, plan.pads, ctx.states, strict=True):
                b0, b1, t0, t1, u0, u1 = tile
                e_t, p_u = _tile_streams(pad, enc, pred, tile)
                e_t = e_t.detach().requires_grad_(need_e)
                p_u = p_u.detach().requires_grad_(need_p)
                _set_rng_state(st, device)
                with _Autocast(ctx.autocast):
                    logits = _call_joint(plan.joint, e_t, p_u, (0, b1 - b0, 0, t1 - t0, 0, u1 - u0))
                with torch.no_grad():
                    g = _tile_grad(plan, tile, pad, logits, parts, ctx.bad, ctx.bad_host)
                    g = g.to(logits.dtype)
                if logits.requires_grad:
                    push_tile(plan.is_module, logits, g, e_t, p_u, tile, pad, params, want, ge,
                              gp, gparams)
                del logits, g
        zero_unreached(params, want, gparams)
        return (None, ge, gp, *gparams)


# --------------------------------------------------------------------------- entry
def _setup(encoder_out: object, predictor_out: object, joint: object,
           chunk_elements: object) -> tuple[Tensor, int | None, bool, list[Tensor]]:
    """Checks of the two streams and the joint; the probe ``(1, 1, 1, W)`` logits."""
    checks.check_float_tensor(encoder_out, "encoder_out")
    checks.check_float_tensor(predictor_out, "predictor_out")
    checks.check_ndim(encoder_out, "encoder_out", (3,), "(B, T, H_enc)")
    checks.check_ndim(predictor_out, "predictor_out", (3,), "(B, U+1, H_pred)")
    if predictor_out.shape[0] != encoder_out.shape[0]:
        raise InputError(f"predictor_out has batch size {predictor_out.shape[0]}, encoder_out "
                         f"{encoder_out.shape[0]}: expected the same B")
    if predictor_out.device != encoder_out.device:
        raise InputError(f"predictor_out is on {predictor_out.device}, encoder_out on "
                         f"{encoder_out.device}")
    if not callable(joint):
        raise InputTypeError(f"joint must be callable (an nn.Module), got {type(joint).__name__}")
    if chunk_elements is None:
        chunk = None  # _default_chunk, once the table is known
    else:
        if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int):
            raise InputTypeError(f"chunk_elements must be an int or None, got "
                                 f"{type(chunk_elements).__name__}")
        if chunk_elements < 1:
            raise InputError(f"chunk_elements = {chunk_elements} is invalid: expected >= 1")
        chunk = int(chunk_elements)
    B, T, _ = encoder_out.shape
    U1 = predictor_out.shape[1]
    if U1 == 0:
        raise InputError("predictor_out must have U+1 >= 1 rows (the start state)")
    # The probe: one row (or the empty joint), under the caller's RNG left untouched.
    devices = [encoder_out.device] if encoder_out.device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        tile = (0, 1, 0, 1, 0, 1) if B and T else (0, B, 0, T, 0, U1)
        probe = _call_joint(joint, encoder_out, predictor_out, tile)
    checks.check_float_tensor(probe, "joint's output")
    is_module = isinstance(joint, torch.nn.Module)
    params = list(joint.parameters()) if is_module else []  # type: ignore[union-attr]
    return probe, chunk, is_module, params


def _default_chunk(device: torch.device, backend: str, branches: list[_Branch], V: int,
                   D: int) -> int:
    """``chunk_elements=None``: see ``DEFAULT_CHUNK_ELEMENTS`` and its siblings."""
    if device.type == "cuda":
        return DEFAULT_CHUNK_ELEMENTS_CUDA
    tb = branches[0].table
    if (backend == "numba" and len(branches) == 1 and tb.clamp <= 0 and not D
            and tb.num_durations == 0 and not tb.hat):
        from .joint.numba_rows import MIN_ROW_WIDTH

        if V >= MIN_ROW_WIDTH:
            return DEFAULT_CHUNK_ELEMENTS_ROWS
    return DEFAULT_CHUNK_ELEMENTS


def _run(encoder_out: Tensor, predictor_out: Tensor, joint: object, probe: Tensor,
         chunk: int | None,
         is_module: bool, params: list[Tensor], fake: Tensor, tg: Tensor, il: Tensor,
         tl: Tensor, branches: list[_Branch], V: int, D: int, reduction: str,
         zero_infinity: bool, backend: str, validate: bool) -> Tensor:
    if chunk is None:
        chunk = _default_chunk(encoder_out.device, backend, branches, V, D)
    blank_tokens = tuple(dict.fromkeys(t for br in branches for t in br.table.blank_tokens))
    padded = transducer_values(fake, tg, il, tl, blank_tokens, validate=validate, num_tokens=V)
    B, T, U1 = fake.shape[:3]
    device = encoder_out.device
    tg1 = torch.zeros((B, U1), dtype=torch.int64, device=device)
    w = min(padded.shape[1], U1 - 1)
    if w > 0:
        tg1[:, :w] = padded[:, :w].to(device)
    Tl = [int(v) for v in il.tolist()]
    Ul = [int(v) for v in tl.tolist()]
    plan = _Plan(joint=joint, branches=branches, V=V, D=D, blank_tokens=blank_tokens,
                 targets=tg1, il=il.to(device), tl=tl.to(device), Tl=Tl, Ul=Ul, T=T, U1=U1,
                 reduction=reduction, zero_infinity=zero_infinity, backend=backend,
                 chunk_rows=max(1, chunk // max(V + D, 1)), is_module=is_module)
    plan.probe_dtype = probe.dtype  # type: ignore[attr-defined]
    plan.tiles = _plan_tiles(Tl, Ul, T, U1, plan.chunk_rows)
    plan.pads = _plan_pads(plan, device)
    if functorch_transforms_active():
        raise NotImplementedError(
            "seqloss: the *_loss_from_joint losses do not support torch.func transforms "
            "(their backward runs the joint network again under autograd); use "
            "torch.autograd.grad, or the loss on the joint's logits")
    return _FromJoint.apply(plan, encoder_out, predictor_out, *params)


def _fake_logits(probe: Tensor, B: int, T: int, U1: int) -> Tensor:
    """A stride-0 stand-in of the joint's full logits: shape and dtype for the checks."""
    return probe.new_empty((1, 1, 1, 1)).expand(B, T, U1, probe.shape[-1])


def rnnt_loss_from_joint(
    encoder_out: Tensor,
    predictor_out: Tensor,
    joint: object,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    *,
    fastemit_lambda: float = 0.0,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    chunk_elements: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate = rnnt_options(
        clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity, validate)
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    tg, il, tl, blank = transducer_inputs(fake, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    name = resolve_backend(backend, encoder_out.device)
    V = probe.shape[-1]
    table = rnnt_table(V, blank, clamp, fastemit_lambda, delay_penalty=delay_penalty)
    return _run(encoder_out, predictor_out, joint, probe, chunk, is_module, params, fake, tg, il,
                tl, [_Branch(table, 1.0)], V, 0, reduction, zero_infinity, name, validate)


def multiblank_rnnt_loss_from_joint(
    encoder_out: Tensor,
    predictor_out: Tensor,
    joint: object,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    big_blank_durations: list[int] | tuple[int, ...],
    blank: int = -1,
    sigma: float = 0.0,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    fastemit_lambda: float = 0.0,
    *,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    chunk_elements: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    tg, il, tl, blank = transducer_inputs(fake, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
    (durs, sigma, clamp, reduction, fastemit_lambda, delay_penalty, zero_infinity,
     validate) = multiblank_options(big_blank_durations, blank, probe.shape[-1], sigma, clamp,
                                    reduction, fastemit_lambda, delay_penalty, zero_infinity,
                                    validate)
    name = resolve_backend(backend, encoder_out.device)
    V = probe.shape[-1]
    table = multiblank_table(V, blank, durs, sigma, clamp, fastemit_lambda,
                             delay_penalty=delay_penalty)
    return _run(encoder_out, predictor_out, joint, probe, chunk, is_module, params, fake, tg, il,
                tl, [_Branch(table, 1.0)], V, 0, reduction, zero_infinity, name, validate)


def _pair_as_joint(out: object, D: int) -> object:
    """A joint's ``(token_logits, duration_logits)`` pair (transformers' Parakeet TDT head
    returns it) as the concatenated ``(..., V + D)`` logits; anything else as it is."""
    if not isinstance(out, (tuple, list)):
        return out
    what = "joint(encoder_out[b0:b1, t0:t1], predictor_out[b0:b1, u0:u1])"
    if len(out) != 2 or not all(isinstance(x, Tensor) for x in out):
        raise InputError(f"{what} returned a {type(out).__name__} of {len(out)}: a pair must be "
                         f"(token_logits, duration_logits), two tensors")
    tok, dur = out
    if tok.dim() != 4 or dur.dim() != 4 or tok.shape[:3] != dur.shape[:3]:
        raise InputError(f"{what} returned token_logits {tuple(tok.shape)} and duration_logits "
                         f"{tuple(dur.shape)}: expected (b1-b0, t1-t0, u1-u0, V) and "
                         f"(b1-b0, t1-t0, u1-u0, D), the first three sizes the same")
    if dur.shape[-1] != D:
        raise InputError(f"{what} returned duration_logits with {dur.shape[-1]} classes: "
                         f"expected len(durations) = {D}")
    if tok.dtype != dur.dtype:
        raise InputTypeError(f"{what} returned a pair of dtypes token_logits {tok.dtype}, "
                             f"duration_logits {dur.dtype}: expected one dtype")
    if tok.device != dur.device:
        raise InputError(f"{what} returned token_logits on {tok.device}, duration_logits on "
                         f"{dur.device}")
    # One tile-sized copy; autograd splits the gradient back to the two outputs.
    return torch.cat((tok, dur), dim=-1)


class _PairJoint(torch.nn.Module):
    """An ``nn.Module`` joint that may return the pair: the same parameters, concatenated."""

    def __init__(self, joint: torch.nn.Module, D: int) -> None:
        super().__init__()
        self.joint, self.D = joint, D

    def forward(self, enc: Tensor, pred: Tensor) -> object:
        return _pair_as_joint(self.joint(enc, pred), self.D)


def _accept_pair(joint: object, D: int) -> object:
    """``joint`` taking the pair too, as a module when it is one (its parameters then
    come back through autograd) and as a plain callable otherwise."""
    if isinstance(joint, torch.nn.Module):
        return _PairJoint(joint, D)
    if callable(joint):
        return lambda enc, pred: _pair_as_joint(joint(enc, pred), D)  # type: ignore[operator]
    return joint  # _setup names the type


def tdt_loss_from_joint(
    encoder_out: Tensor,
    predictor_out: Tensor,
    joint: object,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    durations: list[int] | tuple[int, ...],
    blank: int = -1,
    sigma: float = 0.0,
    omega: float = 0.0,
    clamp: float = -1,
    reduction: TransducerReduction = "mean",
    *,
    delay_penalty: float = 0.0,
    zero_infinity: bool = False,
    chunk_elements: int | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    sigma, omega, clamp, reduction, delay_penalty, zero_infinity, validate = tdt_options(
        sigma, omega, clamp, reduction, delay_penalty, zero_infinity, validate)
    durs = check_tdt_durations(durations)
    joint = _accept_pair(joint, len(durs))
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    D = len(durs)
    W = probe.shape[-1]
    if W <= D:
        raise InputError(f"the joint's output size {W} must be V + D: V >= 1 token logits then "
                         f"D = len(durations) = {D} duration logits")
    V = W - D
    blank = resolve_token_blank(blank, V)
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    tg, il, tl, _ = transducer_inputs(fake[..., :V], targets, logit_lengths, target_lengths,
                                      blank, packed=False)
    name = resolve_backend(backend, encoder_out.device)
    branches = []
    if omega < 1.0:
        branches.append(_Branch(tdt_table(V, blank, durs, sigma, clamp,
                                          delay_penalty=delay_penalty), 1.0 - omega))
    if omega > 0.0:
        branches.append(_Branch(rnnt_table(V, blank, clamp, delay_penalty=delay_penalty), omega))
    return _run(encoder_out, predictor_out, joint, probe, chunk, is_module, params, fake, tg, il,
                tl, branches, V, D, reduction, zero_infinity, name, validate)


_DOC = r"""

    Args:
        encoder_out: ``(B, T, H_enc)`` float tensor; frames past ``logit_lengths`` are padding.
        predictor_out: ``(B, U+1, H_pred)``; rows past ``target_lengths + 1`` are padding.
        joint: a callable, usually an ``nn.Module``, mapping
            ``joint(encoder_out[b0:b1, t0:t1], predictor_out[b0:b1, u0:u1])`` to
            logits ``(b1-b0, t1-t0, u1-u0, classes)``. It is called once per tile in
            the forward pass (without autograd) and again in the backward (with
            autograd), plus once on a single row to learn the class count. When it is
            an ``nn.Module``, its ``parameters()`` are inputs of the autograd node: their
            gradients come back through autograd as for any layer (DDP's hooks see
            them). Any other callable gets the gradients of what it closes over
            accumulated into ``.grad`` by an inner ``torch.autograd.backward`` (as
            ``torch.utils.checkpoint``'s reentrant mode does).
        chunk_elements: the most logits materialized at once (tiles hold whole class
            rows, so at least one row). ``None``: ``2**20`` on CPU (4 MiB of float32
            logits; ``seqloss.transducer.from_joint.DEFAULT_CHUNK_ELEMENTS``),
            ``2**21`` for the Numba backend's RNN-T and multi-blank without clamp on
            rows of 512 classes and more (``DEFAULT_CHUNK_ELEMENTS_ROWS``),
            ``2**24`` on CUDA (``DEFAULT_CHUNK_ELEMENTS_CUDA``). A tile costs about
            four times its logits in the backward pass (the logits, their float32
            softmax/gradient, the joint's own temporaries), so choose it from the
            memory to spare, ``chunk_elements ~ spare_bytes / 16``, and large
            enough that one joint call per tile is cheap next to its matmuls
            (on CPU anything from ~2**18 up costs the same; on CUDA ~2**22 up).
        backend: the backend of the lattice and of each tile's gradient (``"auto"``,
            ``"reference"``, ``"numba"``, ``"triton"``); the tiles' normalizers are
            PyTorch's ops on the inputs' device (Numba's row prologue on wide rows).
        validate: check lengths and ids. The tiling reads the lengths on the host
            either way (one sync on CUDA).

    The other arguments, the value, the gradients and the errors are those of the
    full-joint loss on ``joint(encoder_out, predictor_out)`` (to float rounding).
    Works with the joint in float32, float64, or float16/bfloat16 under autocast
    (the forward's autocast state is re-entered for the recomputation; the
    normalizers and the lattice are float64, the logits' gradient float32). Padding
    (frames past a sequence's length, predictor rows past its ``U_b + 1``) is never
    passed to the joint, whatever it holds: it reaches no gradient, neither its own
    nor the joint's parameters' nor another sequence's. Memory beyond the
    inputs' own gradients: O(B T (U+1) (arcs + D)) small tensors and one tile,
    never O(B T U V). ``retain_graph=True`` allows a second backward; double backward
    raises. Under ``torch.compile`` it runs eagerly, as a graph break (the joint is
    called again from inside the backward of an ``autograd.Function``, which the
    compiler cannot trace); with ``fullgraph=True`` the compiler says so.
"""

rnnt_loss_from_joint.__doc__ = r"""RNN-T loss from the joint network, never materialized.

    Equals :func:`seqloss.rnnt_loss` on the materialized joint (``blank``, ``clamp``,
    ``reduction`` with ``"mean"`` torchaudio's ``"mean_batch"``, ``fastemit_lambda``,
    ``delay_penalty``, ``zero_infinity`` as there) with the gradients w.r.t. ``encoder_out``,
    ``predictor_out`` and the joint's parameters.""" + _DOC

multiblank_rnnt_loss_from_joint.__doc__ = r"""Multi-blank RNN-T loss from the joint network.

    Equals :func:`seqloss.multiblank_rnnt_loss` on the materialized joint
    (``big_blank_durations``, ``blank``, ``sigma``, ``clamp``, ``reduction`` with
    ``"mean"`` NeMo's ``"mean_target"``, ``fastemit_lambda``, ``delay_penalty``,
    ``zero_infinity`` as there).""" + _DOC

tdt_loss_from_joint.__doc__ = r"""TDT loss from the joint network, never materialized.

    The joint returns ``(b, t, u, V + D)`` logits: ``V`` tokens then ``D =
    len(durations)`` duration logits; or the pair ``(token_logits (b, t, u, V),
    duration_logits (b, t, u, D))``, as transformers' Parakeet TDT head does (each
    tile's pair is concatenated; the same value and gradients). Equals
    :func:`seqloss.tdt_loss` on the
    materialized joint (``durations``, ``blank``, ``sigma``, ``omega``, ``clamp``,
    ``reduction`` with ``"mean"`` NeMo's and transformers' ``"mean_target"``,
    ``delay_penalty``, ``zero_infinity`` as there).""" + _DOC

_EAGER = ("seqloss's losses from the joint network run eagerly: the joint is re-run inside "
          "their backward pass, which torch.compile cannot trace (compile without "
          "fullgraph=True for a graph break here)")
rnnt_loss_from_joint = eager_only(rnnt_loss_from_joint, _EAGER)
multiblank_rnnt_loss_from_joint = eager_only(multiblank_rnnt_loss_from_joint, _EAGER)
tdt_loss_from_joint = eager_only(tdt_loss_from_joint, _EAGER)

__all__ = ["DEFAULT_CHUNK_ELEMENTS", "DEFAULT_CHUNK_ELEMENTS_CUDA", "DEFAULT_CHUNK_ELEMENTS_ROWS",
           "multiblank_rnnt_loss_from_joint", "rnnt_loss_from_joint", "tdt_loss_from_joint"]
