"""Per-sequence diagnostics of a loss call: why is this batch's loss inf or NaN?

``diagnose("ctc", log_probs, targets, input_lengths, target_lengths, ...)`` runs
the loss exactly as the caller would (same arguments, same validation: a bad
argument raises the loss's own :class:`~seqloss.InputError`), with
``reduction="none"`` and a gradient, and reports for each sequence:

- feasibility: the frames an alignment needs against the frames given. CTC
  needs ``L + r`` frames for ``L`` labels with ``r`` adjacent repeats (a blank
  must separate two equal labels); a transducer needs ``T_b >= 1``;
- the loss (``+inf`` for an impossible alignment, NaN for non-finite input);
- the first non-finite input value the sequence reads (NaN or ``+inf`` in a
  frame before its length; ``-inf`` is a valid, masked log-probability), with
  its frame (and lattice row ``u`` for a transducer) and class, and how many;
- the gradient's largest magnitude over the sequence;
- the smallest finite log-probability read (how far below zero the inputs
  reach: a scale problem shows up here), and whether the inputs look like
  normalized log-probabilities when they are taken as such;
- a one-line verdict.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from ._core import checks, registry
from ._core.errors import InputError
from .ctc.checks import ctc_values

KINDS = registry.NAMES

# The largest |logsumexp over classes| of a frame still taken as normalized:
# log_softmax itself rounds to about this in each dtype.
_NORM_TOL = {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-3, torch.float64: 1e-6}


@dataclass
class NonFinite:
    """The first non-finite value a sequence reads (in frame, then row, then class order)."""

    value: str  # "nan" or "+inf"
    frame: int
    cls: int
    u: int | None = None  # lattice row (transducers only)
    count: int = 1  # non-finite values read by this sequence, in all
    block: str | None = None  # "duration": ``cls`` indexes TDT's duration logits

    def where(self) -> str:
        row = "" if self.u is None else f", u {self.u}"
        more = f" ({self.count} non-finite values in all)" if self.count > 1 else ""
        name = "NaN" if self.value == "nan" else "+inf"
        what = "class" if self.block is None else f"{self.block} class"
        return f"{name} at frame {self.frame}{row}, {what} {self.cls}{more}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value, "frame": self.frame, "class": self.cls}
        if self.u is not None:
            d["u"] = self.u
        if self.block is not None:
            d["block"] = self.block
        d["count"] = self.count
        return d


@dataclass
class SequenceDiagnosis:
    """What :func:`diagnose` found for one sequence of the batch."""

    index: int
    frames: int  # T_b: frames given
    frames_needed: int  # the fewest frames an alignment needs
    target_length: int
    repeats: int | None  # adjacent equal labels (CTC only)
    feasible: bool
    loss: float
    nonfinite: NonFinite | None
    grad_max: float  # max |d loss_b / d input| over the sequence (NaN if any is NaN)
    min_log_prob: float | None  # smallest finite log-probability read; None if none read
    max_norm_error: float | None  # max |logsumexp over classes| of a read frame (if not fused)
    status: str  # "ok", "warning", "infeasible" or "nonfinite"
    verdict: str

    @property
    def ok(self) -> bool:
        # A warning is fine unless the loss itself is not finite (+inf although the
        # lengths allow a path: every path masked): that is what the doctor is for.
        return self.status in ("ok", "warning") and math.isfinite(self.loss)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nonfinite"] = None if self.nonfinite is None else self.nonfinite.to_dict()
        for k in ("loss", "grad_max", "min_log_prob", "max_norm_error"):
            d[k] = _json_float(d[k])
        return d


@dataclass
class Diagnosis:
    """The report of :func:`diagnose`: the call's setting and one entry per sequence."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    backend: str
    blank: int
    fused_log_softmax: bool
    zero_infinity: bool
    sequences: list[SequenceDiagnosis] = field(default_factory=list)
    # The variant's own setting (multi-blank: big blanks; TDT: durations, omega, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No sequence is infeasible or reads non-finite input."""
        return all(s.ok for s in self.sequences)

    @property
    def infeasible(self) -> list[int]:
        return [s.index for s in self.sequences if s.status == "infeasible"]

    @property
    def nonfinite(self) -> list[int]:
        return [s.index for s in self.sequences if s.status == "nonfinite"]

    @property
    def warnings(self) -> list[int]:
        return [s.index for s in self.sequences if s.status == "warning"]

    def summary(self) -> str:
        n = len(self.sequences)
        parts = []
        if self.nonfinite:
            parts.append(f"{len(self.nonfinite)} with non-finite input {self.nonfinite}")
        if self.infeasible:
            parts.append(f"{len(self.infeasible)} infeasible {self.infeasible}")
        if self.warnings:
            parts.append(f"{len(self.warnings)} with warnings {self.warnings}")
        if not parts:
            return f"all {n} sequences ok"
        return f"{n} sequences: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (non-finite floats as the strings "inf", "-inf", "nan")."""
        return {
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "backend": self.backend,
            "blank": self.blank,
            "fused_log_softmax": self.fused_log_softmax,
            "zero_infinity": self.zero_infinity,
            **self.extra,
            "ok": self.ok,
            "summary": self.summary(),
            "sequences": [s.to_dict() for s in self.sequences],
        }

    def __str__(self) -> str:
        head = (
            f"seqloss.diagnose: {self.kind}, input {tuple(self.shape)} {self.dtype} on "
            f"{self.device}, backend {self.backend}, blank {self.blank}"
            + (", fused log-softmax" if self.fused_log_softmax else "")
            + (", zero_infinity" if self.zero_infinity else "")
            + "".join(f", {k.replace('_', ' ')} {v}" for k, v in self.extra.items())
        )
        cols = ["#", "frames", "needed", "labels", "loss", "max|grad|", "min logp", "verdict"]
        rows = []
        for s in self.sequences:
            rows.append([
                str(s.index),
                str(s.frames),
                str(s.frames_needed),
                str(s.target_length),
                _fmt(s.loss),
                _fmt(s.grad_max),
                "-" if s.min_log_prob is None else _fmt(s.min_log_prob),
                s.verdict,
            ])
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(cols)]
        right = set(range(len(cols) - 1))

        def line(cells: list[str]) -> str:
            out = [c.rjust(w) if i in right else c
                   for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
            return "  ".join(out).rstrip()

        body = [line(cols)] + [line(r) for r in rows]
        return "\n".join([head, *body, self.summary()])


def _json_float(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4f}"


# --------------------------------------------------------------------------- analysis
def _first_nonfinite(bad: Tensor, values: Tensor, with_u: bool) -> NonFinite | None:
    """``bad``: one sequence's mask over its read region, ``(T, C)`` or ``(T, U+1, V)``."""
    count = int(bad.sum())
    if count == 0:
        return None
    idx = [int(i) for i in bad.nonzero()[0]]
    v = values[tuple(idx)]
    kind = "nan" if bool(torch.isnan(v)) else "+inf"
    if with_u:
        return NonFinite(kind, frame=idx[0], u=idx[1], cls=idx[2], count=count)
    return NonFinite(kind, frame=idx[0], cls=idx[1], count=count)


def _scan(lp: Tensor, read: Tensor, check_norm: bool) -> tuple[float | None, float | None]:
    """Smallest finite value read, and max |logsumexp over classes| of read frames."""
    finite = torch.isfinite(lp) & read[..., None]
    mn = float(lp[finite].min()) if bool(finite.any()) else None
    err = None
    if check_norm:
        frames_ok = read & ~torch.isnan(lp).any(-1) & ~(lp == float("inf")).any(-1)
        if bool(frames_ok.any()):
            lse = torch.logsumexp(lp[frames_ok].double(), dim=-1)
            lse = lse[torch.isfinite(lse)]
            err = float(lse.abs().max()) if lse.numel() else None
    return mn, err


def _verdict(
    s_feasible: bool, needed: int, given: int, L: int, repeats: int | None, loss: float,
    nonfinite: NonFinite | None, norm_err: float | None, norm_tol: float, zero_infinity: bool,
    kind: str, fused: bool,
) -> tuple[str, str]:
    if nonfinite is not None:
        return "nonfinite", f"non-finite input: {nonfinite.where()} -> NaN loss and gradient"
    if not s_feasible:
        if kind == "ctc":
            why = (f"{L} labels + {repeats} repeat{'s' * (repeats > 1)}" if repeats
                   else f"{L} labels")
            msg = f"infeasible: needs {needed} frames ({why}), has {given}"
        else:
            msg = "infeasible: zero frames (a transducer needs at least one)"
        tail = (" -> loss 0 (zero_infinity), zero gradient" if zero_infinity
                else " -> +inf loss, zero gradient")
        return "infeasible", msg + tail
    if math.isnan(loss):
        return "nonfinite", ("NaN loss without non-finite input "
                             "(please report this as a seqloss bug)")
    if math.isinf(loss):
        return "warning", (
            "warning: +inf loss though feasible: every alignment crosses a -inf log-probability "
            "(a masked class on the path)"
        )
    if norm_err is not None and norm_err > norm_tol:
        what = "log_probs" if kind == "ctc" else "logits"
        hint = (
            "pass fused_log_softmax=True for logits" if kind == "ctc"
            else "drop fused_log_softmax=False for logits"
        )
        return "warning", (
            f"warning: {what} are not normalized (|logsumexp over classes| up to {norm_err:.3g}): "
            f"take log_softmax first, or {hint}"
        )
    return "ok", "ok"


def diagnose(kind: str, *loss_args: Any, **loss_kwargs: Any) -> Diagnosis:
    """Run a loss on a batch and report, per sequence, what may be wrong with it.

    Args:
        kind: ``"ctc"`` (arguments of :func:`seqloss.ctc_loss`), ``"rnnt"``
            (:func:`seqloss.rnnt_loss`), ``"hat"`` (:func:`seqloss.hat_loss`), ``"multiblank"``
            (:func:`seqloss.multiblank_rnnt_loss`, with its ``big_blank_durations``)
            or ``"tdt"`` (:func:`seqloss.tdt_loss`, with its ``durations``; the
            logits concatenated or as the pair ``(token_logits, duration_logits)``).
        *loss_args, **loss_kwargs: the loss's arguments, as they would be passed
            to it. ``reduction`` is ignored (the per-sequence losses are
            reported); everything else (``blank``, ``zero_infinity``,
            ``fused_log_softmax``, ``backend``, ...) applies.

    Returns:
        A :class:`Diagnosis`: ``str()`` gives a readable table, ``to_dict()`` a
        JSON-serializable dict, ``.ok`` is False when a sequence is infeasible
        or reads NaN/``+inf``.

    Raises:
        InputError, TypeError: the loss's own validation errors, unchanged.

    Example::

        >>> report = seqloss.diagnose("ctc", log_probs, targets, input_lengths, target_lengths)
        >>> print(report)
    """
    if kind not in KINDS:
        raise InputError(f"kind must be one of {KINDS}, got {kind!r}")
    fam = registry.family(kind)
    fn = fam.loss_fn()
    sig = inspect.signature(fn)
    unknown = [k for k in loss_kwargs if k not in sig.parameters]
    if unknown:
        k = unknown[0]
        close = difflib.get_close_matches(k, list(sig.parameters), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(
            f"unknown argument {k!r} for the {kind} loss{hint}; it takes "
            + ", ".join(sig.parameters)
        )
    try:
        bound = sig.bind(*loss_args, **loss_kwargs)
    except TypeError as e:
        raise InputError(f"the {kind} loss's arguments do not fit its signature: {e}") from None
    bound.apply_defaults()
    a = bound.arguments
    a["reduction"] = "none"
    if "inplace_grad" in a:
        a["inplace_grad"] = False  # the report reads the inputs after the loss ran
    x_name = fam.input_name
    x_in = a[x_name]
    # Under torch.inference_mode the inputs are inference tensors, which autograd cannot
    # save: the report works on ordinary copies, with autograd on.
    with torch.inference_mode(False), torch.enable_grad():
        pair = fam.transducer is not None and fam.transducer.pair_input
        if pair and isinstance(x_in, (tuple, list)):
            # TDT's (token_logits, duration_logits) pair: a gradient for each part.
            xs = tuple(checks.check_float_tensor(p, f"{x_name}[{i}]").detach().clone()
                       .requires_grad_(True) for i, p in enumerate(x_in))
            a[x_name] = type(x_in)(xs)
        else:
            xs = (checks.check_float_tensor(x_in, x_name).detach().clone().requires_grad_(True),)
            a[x_name] = xs[0]
        for k, v in a.items():  # lengths and targets made under inference mode
            if isinstance(v, torch.Tensor) and v.is_inference():
                a[k] = v.clone()
        loss = fn(*bound.args, **bound.kwargs)
        grads = torch.autograd.grad(loss, xs, grad_outputs=torch.ones_like(loss))
    x_out = tuple(x.detach() for x in xs)
    g_out = tuple(g.detach() for g in grads)
    if a[x_name] is xs[0]:
        return fam.diagnose_fn()(a, x_out[0], loss.detach(), g_out[0])
    return fam.diagnose_fn()(a, x_out, loss.detach(), g_out)


def _diagnose_ctc(a: dict, x: Tensor, loss: Tensor, grad: Tensor) -> Diagnosis:
    device = x.device
    blank = int(a["blank"])
    fused = checks.flag(a.get("fused_log_softmax", False), "fused_log_softmax")
    zero_inf = checks.flag(a.get("zero_infinity", False), "zero_infinity")
    tg = checks.as_targets_tensor(a["targets"], device)
    il = checks.as_index_tensor(a["input_lengths"], "input_lengths", device, allow_scalar=True)
    tl = checks.as_index_tensor(a["target_lengths"], "target_lengths", device, allow_scalar=True)
    if x.dim() == 2:  # unbatched (T, C)
        x, grad, loss = x.unsqueeze(1), grad.unsqueeze(1), loss.reshape(1)
        tg, il, tl = tg.reshape(1, -1), il.reshape(1), tl.reshape(1)
    T, B, C = x.shape
    # (B,) as the loss took them: a 0-D or (1, 1) length for one sequence, a (B, 1) column
    il = checks.check_batch(il, "input_lengths", B)
    tl = checks.check_batch(tl, "target_lengths", B)
    padded = ctc_values(tg, il, tl, T, C, blank, validate=False).cpu()
    il, tl = il.cpu(), tl.cpu()
    lp = torch.log_softmax(x.double(), dim=-1) if fused else x
    tol = _NORM_TOL[x.dtype]
    seqs = []
    for b in range(B):
        Tb, L = int(il[b]), int(tl[b])
        lab = padded[b, :L]
        repeats = int((lab[1:] == lab[:-1]).sum()) if L > 1 else 0
        needed = L + repeats
        feasible = Tb >= needed
        xb = x[:Tb, b]  # the frames this sequence reads (every class)
        bad = torch.isnan(xb) | (xb == float("inf"))
        nf = _first_nonfinite(bad, xb, with_u=False)
        read = torch.ones(Tb, dtype=torch.bool, device=device)
        mn, err = _scan(lp[:Tb, b], read, check_norm=not fused)
        g = grad[:Tb, b]
        gmax = float(g.abs().float().amax()) if g.numel() else 0.0
        lb = float(loss[b])
        status, verdict = _verdict(feasible, needed, Tb, L, repeats, lb, nf, err, tol, zero_inf,
                                   "ctc", fused)
        seqs.append(SequenceDiagnosis(
            index=b, frames=Tb, frames_needed=needed, target_length=L, repeats=repeats,
            feasible=feasible, loss=lb, nonfinite=nf, grad_max=gmax, min_log_prob=mn,
            max_norm_error=err, status=status, verdict=verdict,
        ))
    return Diagnosis(
        kind="ctc", shape=tuple(a["log_probs"].shape), dtype=str(x.dtype).replace("torch.", ""),
        device=str(device), backend=_backend_name(a, device), blank=blank,
        fused_log_softmax=fused, zero_infinity=zero_inf, sequences=seqs,
    )


def diagnose_transducer(fam: registry.Family, a: dict, x: Tensor | tuple[Tensor, Tensor],
                        loss: Tensor, grad: Tensor | tuple[Tensor, Tensor]) -> Diagnosis:
    """The report of a transducer family on the full joint, from its registry entry
    (``fam.transducer``) and its joint table: the duration block, the normalization and
    the extra fields are read there, not written per variant. ``x``, ``grad``: the
    logits and their gradient, ``(B, T, U+1, C)``, or TDT's pair of blocks."""
    spec = fam.transducer
    assert spec is not None
    if isinstance(x, tuple):  # TDT's (token_logits, duration_logits) pair
        parts, grads = list(x), list(grad)
    else:
        parts, grads = [x], [grad]
    V = parts[0].shape[-1]
    table = _table(spec, a, V)
    if table is not None and table.num_durations and len(parts) == 1:
        # concatenated: the V token logits, then the D duration logits
        V -= table.num_durations
        table = _table(spec, a, V)
        parts = [x[..., :V], x[..., V:]]
        grads = [grad[..., :V], grad[..., V:]]
    blank = int(a.get("blank", -1))
    blank = blank + V if blank < 0 else blank
    fused = checks.flag(a.get("fused_log_softmax", True), "fused_log_softmax")
    log_probs = None
    if spec.log_probs is not None:
        log_probs = [registry.resolve(spec.log_probs)(parts[0].double(), blank)]
    extra: dict[str, Any] = {}
    for k in spec.report:
        if k == "big_blank_classes":  # NeMo's layout: big blank i at blank - 1 - i
            extra[k] = [int(arc.token) for arc in table.blank_arcs[1:]]
        elif k == "logits_layout":
            extra[k] = "pair" if isinstance(x, tuple) else "concatenated"
        elif isinstance(a.get(k), (list, tuple, Tensor)):
            extra[k] = _int_list(a[k])
        else:
            _nonzero(extra, a, k)
    return _diagnose_joint(fam.name, a, parts, loss, grads, blank, fused, extra, log_probs)


def _table(spec: registry.Transducer, a: dict, V: int) -> Any:
    """The family's joint table for ``V`` token classes and the call's arguments."""
    if spec.table is None:
        return None
    build = registry.resolve(spec.table)
    params = inspect.signature(build).parameters
    return build(V, **{k: v for k, v in a.items() if k in params and k != "V"})


def _int_list(v: Any) -> list[int]:
    if isinstance(v, Tensor):
        v = v.tolist()
    return [int(d) for d in v]


def _nonzero(extra: dict[str, Any], a: dict, *names: str) -> None:
    for k in names:
        v = a.get(k, 0.0)
        if isinstance(v, (int, float)) and v:
            extra[k] = float(v)


def _diagnose_joint(kind: str, a: dict, parts: list[Tensor], loss: Tensor, grads: list[Tensor],
                    blank: int, fused: bool, extra: dict[str, Any] | None = None,
                    log_probs: list[Tensor] | None = None) -> Diagnosis:
    """A transducer on the full joint: ``parts`` are its class blocks (``(B, T, U+1, C_i)``
    each: the logits, or TDT's token and duration logits), ``grads`` their gradients;
    ``log_probs`` the blocks' normalized log-probabilities (default: log-softmax)."""
    x = parts[0]
    device = x.device
    B = x.shape[0]
    zero_inf = checks.flag(a.get("zero_infinity", False), "zero_infinity")
    tl_ = checks.as_index_tensor(a["logit_lengths"], "logit_lengths", device).cpu().reshape(-1)
    ul_ = checks.as_index_tensor(a["target_lengths"], "target_lengths", device).cpu().reshape(-1)
    lps = log_probs or [torch.log_softmax(p.double(), dim=-1) if fused else p for p in parts]
    widths = [p.shape[-1] for p in parts]
    tol = _NORM_TOL[x.dtype]
    seqs = []
    for b in range(B):
        Tb, Ub = int(tl_[b]), int(ul_[b])
        feasible = Tb >= 1
        xb = torch.cat([p[b, :Tb, : Ub + 1] for p in parts], dim=-1) if len(parts) > 1 \
            else x[b, :Tb, : Ub + 1]
        bad = torch.isnan(xb) | (xb == float("inf"))
        nf = _first_nonfinite(bad, xb, with_u=True)
        if nf is not None and nf.cls >= widths[0]:  # TDT: a duration logit
            nf.cls -= widths[0]
            nf.block = "duration"
        read = torch.ones(xb.shape[:-1], dtype=torch.bool, device=device)
        mn, err = None, None
        for lp in lps:
            m, e = _scan(lp[b, :Tb, : Ub + 1], read, check_norm=not fused)
            mn = m if mn is None or (m is not None and m < mn) else mn
            err = e if err is None or (e is not None and e > err) else err
        gmax = max((float(g[b].abs().float().amax()) if g[b].numel() else 0.0 for g in grads),
                   default=0.0)
        if any(bool(torch.isnan(g[b]).any()) for g in grads):
            gmax = float("nan")
        lb = float(loss[b])
        status, verdict = _verdict(feasible, 1, Tb, Ub, None, lb, nf, err, tol, zero_inf,
                                   kind, fused)
        seqs.append(SequenceDiagnosis(
            index=b, frames=Tb, frames_needed=1, target_length=Ub, repeats=None,
            feasible=feasible, loss=lb, nonfinite=nf, grad_max=gmax, min_log_prob=mn,
            max_norm_error=err, status=status, verdict=verdict,
        ))
    shape = (*x.shape[:-1], sum(widths))
    return Diagnosis(
        kind=kind, shape=tuple(shape), dtype=str(x.dtype).replace("torch.", ""),
        device=str(device), backend=_backend_name(a, device), blank=blank,
        fused_log_softmax=fused, zero_infinity=zero_inf, sequences=seqs, extra=extra or {},
    )


def _backend_name(a: dict, device: torch.device) -> str:
    from ._core.dispatch import resolve_backend

    try:
        return resolve_backend(a.get("backend", "auto"), device)
    except Exception:  # noqa: BLE001 -- the loss already ran; the name is informative only
        return str(a.get("backend", "auto"))
