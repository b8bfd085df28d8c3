r"""Per-state arc log-probabilities of a transducer, computed by chunks of rows.

``transducer_arc_logprobs`` gives, at every lattice state ``(b, t, u)``, the
log-probability of the blank and of the next label (and, for TDT, of each duration),
differentiably, without a logits-sized intermediate; ``transducer_arc_logprobs_from_joint``
does the same from the joint network, which is never materialized.

Both run on the row driver below: a row function
``fn(xs, labels)`` (``xs`` a tuple of ``(R, W_i)`` rows in the accumulation dtype,
``labels (R,)`` int64, written with differentiable torch ops, row-wise) returns a
tuple of ``(R,)`` or ``(R, k)`` scores. The driver evaluates it over the ``(b, t, u)``
rows read (``t < T_b``, ``u <= U_b``) in tiles of at most ``chunk_elements`` logits,
without autograd. Its backward recomputes each tile with autograd on (the tile a
detached leaf), takes the tile's vector-Jacobian product and writes it into one
preallocated gradient, the only logits-sized allocation (from the joint: pushes it
through the joint, tile by tile, as ``from_joint.py`` does). Rows no sequence reads
give ``-inf`` and get exactly zero gradient, whatever they hold: the function is
row-wise, so a NaN there reaches no other row, and its gradient is overwritten by 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import Tensor

from .._core import checks
from .._core.compiler import eager_only
from .._core.errors import InputError, InputTypeError
from .._core.logspace import log_normalizer, log_softmax, sub_normalizer
from .._core.torch_compat import functorch_transforms_active
from .._core.types import IntsLike
from .checks import resolve_token_blank, transducer_inputs, transducer_values
from .from_joint import (
    DEFAULT_CHUNK_ELEMENTS,
    DEFAULT_CHUNK_ELEMENTS_CUDA,
    _accept_pair,
    _Autocast,
    _autocast_state,
    _call_joint,
    _fake_logits,
    _plan_pads,
    _plan_tiles,
    _rng_state,
    _same_state,
    _set_rng_state,
    _setup,
    _tile_streams,
    push_tile,
    zero_unreached,
)

RowFn = Callable[[tuple[Tensor, ...], Tensor], tuple[Tensor, ...]]
"""``fn(xs, labels)``: ``xs`` a tuple of ``(R, W_i)`` rows, ``labels (R,)``; returns a
tuple of ``(R,)`` or ``(R, k)`` scores, each row's from that row alone."""

Post = Callable[[Tensor, tuple[int, ...], int], Tensor]
"""``post(grad_tile, tile, i)``: a hook on input ``i``'s tile gradient ``(nb, nt, nu, W_i)``
(padding rows already zero), e.g. a clamp and a per-sequence factor."""


@dataclass
class RowSpec:
    """What the driver needs: the row function, the labels, the lengths and the tiles."""

    fn: RowFn
    labels: Tensor  # (B, U+1) int64; column U_b and padding hold a valid id (0)
    Tl: list[int]
    Ul: list[int]
    T: int
    U1: int
    acc: torch.dtype  # the dtype the row function sees (float32 for half inputs)
    chunk_rows: int
    tiles: list = field(default_factory=list)
    masks: list = field(default_factory=list)  # (nb, nt, nu) rows read per tile, or None
    # from the joint
    joint: object = None
    is_module: bool = False
    pads: list = field(default_factory=list)
    width: int = 0
    # Optional closed-form vector-Jacobian product of ``fn``: ``vjp(rows, labels,
    # grad_outs) -> row gradients``; without it the backward differentiates ``fn`` by
    # autograd (which a torch.library op's implementation cannot use).
    vjp: Callable | None = None


def default_chunk(device: torch.device, chunk_elements: object) -> int:
    """``chunk_elements`` checked, or the from-joint losses' default for the device."""
    if chunk_elements is None:
        return DEFAULT_CHUNK_ELEMENTS_CUDA if device.type == "cuda" else DEFAULT_CHUNK_ELEMENTS
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int):
        raise InputTypeError(f"chunk_elements must be an int or None, got "
                        f"{type(chunk_elements).__name__}")
    if chunk_elements < 1:
        raise InputError(f"chunk_elements = {chunk_elements} is invalid: expected >= 1")
    return int(chunk_elements)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def make_spec(fn: RowFn, labels: Tensor, il: Tensor, tl: Tensor, T: int, U1: int,
              acc: torch.dtype, width: int, chunk: int) -> RowSpec:
    """The tiles (``from_joint``'s plan: whole class rows, sequences sharing a tile while
    it fits) and, per tile, the mask of the rows read (``None`` when all are)."""
    Tl = [int(v) for v in il.tolist()]
    Ul = [int(v) for v in tl.tolist()]
    spec = RowSpec(fn=fn, labels=labels, Tl=Tl, Ul=Ul, T=T, U1=U1, acc=acc,
                   chunk_rows=max(1, chunk // max(width, 1)), width=width)
    spec.tiles = _plan_tiles(Tl, Ul, T, U1, spec.chunk_rows)
    device = labels.device
    for b0, b1, t0, t1, u0, u1 in spec.tiles:
        Tb = [min(max(Tl[b], 0), T) for b in range(b0, b1)]
        Ub = [min(max(Ul[b], 0), U1 - 1) for b in range(b0, b1)]
        if all(tb >= t1 and ub + 1 >= u1 for tb, ub in zip(Tb, Ub, strict=True)):
            spec.masks.append(None)
            continue
        tb = torch.tensor(Tb)[:, None, None]
        ub = torch.tensor(Ub)[:, None, None]
        tt = torch.arange(t0, t1)[None, :, None]
        uu = torch.arange(u0, u1)[None, None, :]
        spec.masks.append(((tt < tb) & (uu <= ub)).to(device))
    return spec


def _slices(tile: tuple[int, ...]) -> tuple[slice, slice, slice]:
    b0, b1, t0, t1, u0, u1 = tile
    return slice(b0, b1), slice(t0, t1), slice(u0, u1)


def _eval(spec: RowSpec, xs: tuple[Tensor, ...], tile: tuple[int, ...]) -> list[Tensor]:
    """The row function on a tile's ``(nb, nt, nu, W_i)`` inputs, outputs ``(nb, nt, nu[, k])``."""
    b0, b1, t0, t1, u0, u1 = tile
    nb, nt, nu = xs[0].shape[:3]
    lab = spec.labels[b0:b1, None, u0:u1].expand(nb, nt, nu).reshape(-1)
    rows = tuple(x.reshape(nb * nt * nu, x.shape[-1]) for x in xs)
    outs = spec.fn(rows, lab)
    return [o.reshape((nb, nt, nu, *o.shape[1:])) for o in outs]


def _masked(o: Tensor, mask: Tensor | None, value: float) -> Tensor:
    if mask is None:
        return o
    return o.masked_fill(~mask.reshape(mask.shape + (1,) * (o.dim() - 3)), value)


def _outputs(spec: RowSpec, B: int, widths: list[int], device: torch.device) -> list[Tensor]:
    """``-inf``-filled outputs, their trailing shapes learned from the row function on no rows."""
    empty = tuple(torch.zeros((0, w), dtype=spec.acc, device=device) for w in widths)
    with torch.no_grad():
        probe = spec.fn(empty, spec.labels.new_zeros(0))
    return [torch.full((B, spec.T, spec.U1, *o.shape[1:]), float("-inf"), dtype=spec.acc,
                       device=device) for o in probe]


def rows_forward(spec: RowSpec, xs_full: tuple[Tensor, ...]) -> list[Tensor]:
    """The row function over every row read of the ``(B, T, U+1, W_i)`` inputs (no autograd)."""
    x0 = xs_full[0]
    outs = _outputs(spec, x0.shape[0], [x.shape[-1] for x in xs_full], x0.device)
    with torch.no_grad():
        for tile, mask in zip(spec.tiles, spec.masks, strict=True):
            sl = _slices(tile)
            o = _eval(spec, tuple(x[sl].to(spec.acc) for x in xs_full), tile)
            for out, oi in zip(outs, o, strict=True):
                out[sl] = _masked(oi, mask, float("-inf"))
    return outs


def _tile_vjp(spec: RowSpec, xs: tuple[Tensor, ...], tile: tuple[int, ...],
              grad_outs: list[Tensor | None], mask: Tensor | None,
              post: Post | None) -> tuple[Tensor | None, ...]:
    """The tile's gradient with respect to ``xs`` (acc dtype leaves), padding rows zeroed."""
    sl = _slices(tile)
    if spec.vjp is not None:
        return _tile_vjp_closed(spec, xs, tile, grad_outs, mask, post)
    with torch.enable_grad():
        o = _eval(spec, xs, tile)
        pairs = [(oi, g[sl]) for oi, g in zip(o, grad_outs, strict=True)
                 if g is not None and oi.requires_grad]
        if not pairs:
            return (None,) * len(xs)
        gx = torch.autograd.grad([p[0] for p in pairs], xs, [p[1] for p in pairs],
                                 allow_unused=True)
    out = []
    for i, g in enumerate(gx):
        if g is not None:
            g = _masked(g, mask, 0.0)
            if post is not None:
                g = post(g, tile, i)
        out.append(g)
    return tuple(out)


def _tile_vjp_closed(spec: RowSpec, xs: tuple[Tensor, ...], tile: tuple[int, ...],
                     grad_outs: list[Tensor | None], mask: Tensor | None,
                     post: Post | None) -> tuple[Tensor | None, ...]:
    """``_tile_vjp`` by the spec's own ``vjp`` (no autograd)."""
    b0, b1, t0, t1, u0, u1 = tile
    sl = _slices(tile)
    nb, nt, nu = xs[0].shape[:3]
    lab = spec.labels[b0:b1, None, u0:u1].expand(nb, nt, nu).reshape(-1)
    rows = tuple(x.detach().reshape(nb * nt * nu, x.shape[-1]) for x in xs)
    gos = [None if g is None else g[sl].reshape(nb * nt * nu, *g.shape[4:]) for g in grad_outs]
    out = []
    for i, g in enumerate(spec.vjp(rows, lab, gos)):
        if g is not None:
            g = _masked(g.reshape(nb, nt, nu, -1), mask, 0.0)
            if post is not None:
                g = post(g, tile, i)
        out.append(g)
    return tuple(out)


def rows_backward(spec: RowSpec, xs_full: tuple[Tensor, ...], grad_outs: list[Tensor | None],
                  needs: tuple[bool, ...], post: Post | None = None) -> list[Tensor | None]:
    """The vector-Jacobian product of :func:`rows_forward` with ``grad_outs``, one tile at
    a time, written into one zero-filled gradient per input (zero on every row not read)."""
    grads = [torch.zeros_like(x) if n else None for x, n in zip(xs_full, needs, strict=True)]
    if not any(needs) or all(g is None for g in grad_outs):
        return grads
    for tile, mask in zip(spec.tiles, spec.masks, strict=True):
        sl = _slices(tile)
        xs = tuple(x[sl].detach().to(spec.acc).requires_grad_(n)
                   for x, n in zip(xs_full, needs, strict=True))
        gx = _tile_vjp(spec, xs, tile, grad_outs, mask, post)
        for g, gi in zip(grads, gx, strict=True):
            if g is not None and gi is not None:
                g[sl] = gi
    return grads


class _Rows(torch.autograd.Function):
    """The row driver on materialized inputs: outputs of ``spec.fn``, by tiles."""

    @staticmethod
    def forward(ctx, spec, *xs):
        outs = rows_forward(spec, xs)
        ctx.spec = spec
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*xs)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outs):
        xs = ctx.saved_tensors
        grads = rows_backward(ctx.spec, xs, list(grad_outs), ctx.needs_input_grad[1:])
        return (None, *grads)


# --------------------------------------------------------------------------- from the joint
def make_joint_spec(fn: RowFn, joint: object, labels: Tensor, il: Tensor, tl: Tensor, T: int,
                    U1: int, acc: torch.dtype, width: int, chunk: int,
                    is_module: bool) -> RowSpec:
    """A :class:`RowSpec` on the joint's tiles, padding replaced (``from_joint._Pad``)."""
    spec = make_spec(fn, labels, il, tl, T, U1, acc, width, chunk)
    spec.joint, spec.is_module = joint, is_module
    spec.pads = _plan_pads(SimpleNamespace(tiles=spec.tiles, Tl=spec.Tl, Ul=spec.Ul, T=T, U1=U1),
                           labels.device)
    spec.masks = [None if p is None else p.mask for p in spec.pads]
    return spec


def _joint_tile(spec: RowSpec, e_t: Tensor, p_u: Tensor, tile: tuple[int, ...]) -> Tensor:
    b0, b1, t0, t1, u0, u1 = tile
    logits = _call_joint(spec.joint, e_t, p_u, (0, b1 - b0, 0, t1 - t0, 0, u1 - u0))
    if logits.shape[-1] != spec.width:
        raise InputError(f"joint returned {logits.shape[-1]} classes for tile {tile}, "
                         f"{spec.width} for the first")
    return logits


def joint_forward(spec: RowSpec, enc: Tensor, pred: Tensor, states: list) -> list[Tensor]:
    """:func:`rows_forward` on the joint's tiles; ``states`` gets each tile's RNG state."""
    device = enc.device
    outs = _outputs(spec, enc.shape[0], [spec.width], device)
    prev = None
    with torch.no_grad():
        for tile, pad in zip(spec.tiles, spec.pads, strict=True):
            st = _rng_state(device)
            if prev is not None and _same_state(st, prev):
                st = prev  # the joint draws no random numbers: share the state
            states.append(st)
            prev = st
            e_t, p_u = _tile_streams(pad, enc, pred, tile)
            x = _joint_tile(spec, e_t, p_u, tile).to(spec.acc)
            o = _eval(spec, (x,), tile)
            del x
            mask = None if pad is None else pad.mask
            for out, oi in zip(outs, o, strict=True):
                out[_slices(tile)] = _masked(oi, mask, float("-inf"))
    return outs


def joint_backward(spec: RowSpec, enc: Tensor, pred: Tensor, params: list[Tensor],
                   needs: tuple[bool, ...], states: list, autocast: list,
                   grad_outs: list[Tensor | None], post: Post | None = None
                   ) -> tuple[Tensor | None, Tensor | None, list[Tensor | None]]:
    """Each tile's logits recomputed (RNG state and autocast restored), their gradient
    from :func:`_tile_vjp`, pushed through the joint: ``(grad_enc, grad_pred, grad_params)``."""
    device = enc.device
    need_e, need_p = needs[0], needs[1]
    want = [i for i in range(len(params)) if needs[2 + i]]
    ge = torch.zeros_like(enc) if need_e else None
    gp = torch.zeros_like(pred) if need_p else None
    gparams: list[Tensor | None] = [None] * len(params)
    devices = [device] if device.type == "cuda" else []
    if any(g is not None for g in grad_outs):
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            for tile, pad, mask, st in zip(spec.tiles, spec.pads, spec.masks, states,
                                           strict=True):
                e_t, p_u = _tile_streams(pad, enc, pred, tile)
                e_t = e_t.detach().requires_grad_(need_e)
                p_u = p_u.detach().requires_grad_(need_p)
                _set_rng_state(st, device)
                with _Autocast(autocast):
                    logits = _joint_tile(spec, e_t, p_u, tile)
                if not logits.requires_grad:
                    continue
                x = logits.detach().to(spec.acc).requires_grad_()
                g = _tile_vjp(spec, (x,), tile, grad_outs, mask, post)[0]
                del x
                if g is None:
                    continue
                push_tile(spec.is_module, logits, g.to(logits.dtype), e_t, p_u, tile, pad,
                          params, want, ge, gp, gparams)
                del logits, g
    zero_unreached(params, want, gparams)
    return ge, gp, gparams


class _JointRows(torch.autograd.Function):
    """The row driver on the joint's tiles: outputs of ``spec.fn``, the joint never whole."""

    @staticmethod
    def forward(ctx, spec, enc, pred, *params):
        states: list = []
        ctx.autocast = _autocast_state()
        outs = joint_forward(spec, enc, pred, states)
        ctx.spec, ctx.states = spec, states
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(enc, pred, *params)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outs):
        enc, pred, *params = ctx.saved_tensors
        ge, gp, gparams = joint_backward(ctx.spec, enc, pred, params, ctx.needs_input_grad[1:],
                                         ctx.states, ctx.autocast, list(grad_outs))
        return (None, ge, gp, *gparams)


def check_no_transforms(what: str, why: str = "runs the joint network again") -> None:
    if functorch_transforms_active():
        raise NotImplementedError(
            f"seqloss: {what} does not support torch.func transforms (its backward {why} "
            f"under autograd); use torch.autograd.grad")


# --------------------------------------------------------------------------- the public functions
def _token_rows(blank: int, V: int, D: int) -> RowFn:
    """Blank and next-label log-softmax scores (and the durations' log-softmax) of each row."""

    def fn(xs: tuple[Tensor, ...], y: Tensor) -> tuple[Tensor, ...]:
        if len(xs) == 2:
            tok, dur = xs
        else:
            tok, dur = xs[0][:, :V], xs[0][:, V:]
        # A row of -inf logits has no arc out of it: -inf and a zero gradient (logspace).
        z = log_normalizer(tok, -1)
        out = (sub_normalizer(tok[:, blank], z), sub_normalizer(tok.gather(1, y[:, None])[:, 0], z))
        if D:
            out = (*out, log_softmax(dur, -1))
        return out

    return fn


def _labels(padded: Tensor, B: int, U1: int, device: torch.device) -> Tensor:
    """``(B, U+1)`` labels: the targets, 0 in column ``U`` and past each target length."""
    lab = torch.zeros((B, U1), dtype=torch.int64, device=device)
    w = min(padded.shape[1], U1 - 1)
    if w > 0:
        lab[:, :w] = padded[:, :w].to(device)
    return lab


def _emit_mask(emit: Tensor, tl: Tensor) -> Tensor:
    """``-inf`` at ``u >= U_b``: no label follows the last (its gradient there is 0)."""
    uu = torch.arange(emit.shape[2], device=emit.device)
    return emit.masked_fill(uu[None, None, :] >= tl.to(emit.device)[:, None, None], float("-inf"))


def _durations_of(durations: object) -> tuple[int, ...]:
    from .tdt import check_tdt_durations

    return check_tdt_durations(durations)


def transducer_arc_logprobs(
    logits: Tensor | tuple[Tensor, Tensor],
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    *,
    durations: list[int] | tuple[int, ...] | None = None,
    chunk_elements: int | None = None,
    validate: bool = True,
) -> tuple[Tensor, ...]:
    from .tdt import _split

    validate = checks.flag(validate, "validate")
    if durations is None:
        checks.check_float_tensor(logits, "logits")
        tg, il, tl, blank = transducer_inputs(logits, targets, logit_lengths, target_lengths,
                                              blank, packed=False)
        V, D, xs, tok = logits.shape[-1], 0, (logits,), logits
    else:
        durs = _durations_of(durations)
        D = len(durs)
        whole, tok, dur = _split(logits, D)
        V = tok.shape[-1]
        blank = resolve_token_blank(blank, V)
        tg, il, tl, _ = transducer_inputs(tok, targets, logit_lengths, target_lengths, blank,
                                          packed=False)
        xs = (whole,) if whole is not None else (tok, dur)
    padded = transducer_values(xs[0], tg, il, tl, blank, validate=validate, num_tokens=V)
    B, T, U1 = tok.shape[:3]
    device = tok.device
    chunk = default_chunk(device, chunk_elements)
    spec = make_spec(_token_rows(blank, V, D), _labels(padded, B, U1, device), il, tl, T, U1,
                     acc_dtype(tok.dtype), sum(x.shape[-1] for x in xs), chunk)
    check_no_transforms("transducer_arc_logprobs", "recomputes each tile")
    outs = _Rows.apply(spec, *xs)
    return (outs[0], _emit_mask(outs[1], tl), *outs[2:])


transducer_arc_logprobs.__doc__ = r"""The log-probabilities of every arc of the transducer lattice.

    Args:
        logits: ``(B, T, U+1, V)`` joint output (float16, bfloat16, float32, float64; any
            layout); with ``durations`` (TDT), ``(B, T, U+1, V + D)`` (``V`` token
            logits then ``D = len(durations)`` duration logits) or the pair
            ``(token_logits (B, T, U+1, V), duration_logits (B, T, U+1, D))``.
        targets: ``(B, U)`` int32/int64 labels; entries past a target length are padding.
        logit_lengths: ``(B,)`` frames ``T_b <= T``.
        target_lengths: ``(B,)`` labels ``U_b <= U``.
        blank: blank index (of the token block); negatives count from the end.
        durations: TDT's durations (ascending, with 0 and 1), or ``None`` (RNN-T).
        chunk_elements: the most logits a tile holds (whole rows; ``None``: ``2**20`` on
            CPU, ``2**24`` on CUDA).
        validate: check lengths and ids (a device-to-host sync on CUDA).

    Returns:
        ``(blank_logprobs, emit_logprobs)``, each ``(B, T, U+1)``:
        ``log_softmax(logits[b, t, u])[blank]`` and ``[targets[b, u]]``; with
        ``durations`` also ``duration_logprobs (B, T, U+1, D)``, the log-softmax of the
        duration logits. ``-inf`` where undefined (``t >= T_b``, ``u > U_b``, and the
        emission at ``u = U_b``). float32 for half inputs, else the input dtype.

    Differentiable (the gradient of padding is exactly zero, whatever it holds). Memory:
    the outputs and one tile of at most ``chunk_elements`` logits; the backward
    recomputes each tile and allocates only the logits' gradient. For regularizers on
    the lattice's arcs (consistency between views, distillation). The two RNN-T outputs
    are :func:`seqloss.transducer_lattice`'s arcs as they are:
    ``transducer_lattice(*transducer_arc_logprobs(logits, targets, T, U), T, U)`` is minus
    ``rnnt_loss(logits, targets, T, U, reduction="none")``.
"""


def transducer_arc_logprobs_from_joint(
    encoder_out: Tensor,
    predictor_out: Tensor,
    joint: object,
    targets: Tensor,
    logit_lengths: IntsLike,
    target_lengths: IntsLike,
    blank: int = -1,
    *,
    durations: list[int] | tuple[int, ...] | None = None,
    chunk_elements: int | None = None,
    validate: bool = True,
) -> tuple[Tensor, ...]:
    validate = checks.flag(validate, "validate")
    D = 0
    if durations is not None:
        D = len(_durations_of(durations))
        joint = _accept_pair(joint, D)
    probe, chunk, is_module, params = _setup(encoder_out, predictor_out, joint, chunk_elements)
    W = probe.shape[-1]
    if W <= D:
        raise InputError(f"the joint's output size {W} must be V + D: V >= 1 token logits then "
                         f"D = len(durations) = {D} duration logits")
    V = W - D
    B, T = encoder_out.shape[:2]
    U1 = predictor_out.shape[1]
    fake = _fake_logits(probe, B, T, U1)
    blank = resolve_token_blank(blank, V)
    tg, il, tl, _ = transducer_inputs(fake[..., :V], targets, logit_lengths, target_lengths,
                                      blank, packed=False)
    padded = transducer_values(fake, tg, il, tl, blank, validate=validate, num_tokens=V)
    device = encoder_out.device
    # (_setup leaves the default to the caller: the losses' depends on their table)
    chunk = default_chunk(device, chunk)
    spec = make_joint_spec(_token_rows(blank, V, D), joint, _labels(padded, B, U1, device), il,
                           tl, T, U1, acc_dtype(probe.dtype), W, chunk, is_module)
    check_no_transforms("transducer_arc_logprobs_from_joint")
    outs = _JointRows.apply(spec, encoder_out, predictor_out, *params)
    return (outs[0], _emit_mask(outs[1], tl), *outs[2:])


transducer_arc_logprobs_from_joint.__doc__ = r"""``transducer_arc_logprobs`` of
    ``joint(encoder_out, predictor_out)``, the joint never materialized.

    ``encoder_out (B, T, H_enc)``, ``predictor_out (B, U+1, H_pred)`` and ``joint`` as in
    :func:`seqloss.rnnt_loss_from_joint` (with ``durations``, the joint returns ``V + D``
    logits or the pair); the other arguments and the outputs as in
    :func:`transducer_arc_logprobs`. The gradients with respect to ``encoder_out``,
    ``predictor_out`` and the joint's parameters equal those through the materialized
    joint (to float rounding). Each tile's logits are computed without autograd in the
    forward pass and recomputed in the backward under the forward's RNG state (dropout
    draws the same masks) and autocast state; padding is never passed to the joint.
    Runs eagerly (a graph break under ``torch.compile``); double backward raises.
"""

_EAGER = ("seqloss's transducer_arc_logprobs_from_joint runs eagerly: the joint is re-run inside "
          "its backward pass, which torch.compile cannot trace")
transducer_arc_logprobs_from_joint = eager_only(transducer_arc_logprobs_from_joint, _EAGER)
transducer_arc_logprobs = eager_only(
    transducer_arc_logprobs, "seqloss's transducer_arc_logprobs runs its chunked row function "
    "eagerly inside an autograd.Function")

__all__ = ["transducer_arc_logprobs", "transducer_arc_logprobs_from_joint"]
