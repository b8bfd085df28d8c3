"""``seqloss.diagnose(kind="pruned", ...)``: per-sequence report of ``rnnt_loss_pruned``."""

from __future__ import annotations

import importlib
import math

import torch
from torch import Tensor

from ..._core import checks as _checks
from .arcs import hat_log_probs

# the module (``seqloss.diagnose`` the attribute is the function)
_d = importlib.import_module("seqloss.diagnose")


def diagnose_pruned(a: dict, x: Tensor, loss: Tensor, grad: Tensor):
    """One entry per sequence: frames and symbols the boundary gives, the window's
    non-finite logits (frames ``begin_frame <= t < end_frame``), the pruned loss, and
    whether the windows hold the start and final states (else no path survives). The
    smallest log-probability is the HAT one with ``use_hat_loss``."""
    B, T, R, _ = x.shape
    S = a["symbols"].shape[1]
    rt = a.get("rnnt_type", "regular")
    zero_inf = _checks.flag(a.get("zero_infinity", False), "zero_infinity")
    hat = _checks.flag(a.get("use_hat_loss", False), "use_hat_loss")
    term = int(a["termination_symbol"])
    bnd = a.get("boundary")
    bnd = (torch.tensor([[0, 0, S, T]] * B) if bnd is None else bnd.detach().cpu()).tolist()
    r0 = a["ranges"][:, :, 0].detach().cpu()
    seqs = []
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in bnd[b])
        Tb, Ub = t1 - t0, s1 - s0
        needed = 1 if rt == "regular" else max(Ub, 1)
        covers = Tb >= 1 and int(r0[b, t0]) <= s0 < int(r0[b, t0]) + R and \
            int(r0[b, t1 - 1]) <= s1 < int(r0[b, t1 - 1]) + R + (rt != "regular")
        xb = x[b, t0:t1]
        bad = torch.isnan(xb) | (xb == float("inf"))
        nf = _d._first_nonfinite(bad, xb, with_u=True)
        if nf is not None:
            nf.frame += t0
        lb = float(loss[b])
        g = grad[b]
        gmax = float(g.abs().float().amax()) if g.numel() else 0.0
        lp = (hat_log_probs(xb.double(), term) if hat
              else torch.log_softmax(xb.double(), dim=-1))
        finite = lp[torch.isfinite(lp)]
        mn = float(finite.min()) if finite.numel() else None
        status, verdict = _d._verdict(Tb >= needed, needed, Tb, Ub, None, lb, nf, None, 0.0,
                                      zero_inf, "pruned", True)
        # A window that misses the start or final state leaves no path: +inf, which
        # zero_infinity turns into a 0 that would otherwise read as "ok".
        if status in ("ok", "warning") and not covers and (
                math.isinf(lb) or (zero_inf and lb == 0.0)):
            status = "warning"
            verdict = ("warning: the windows (ranges) miss the start or final state, so no path "
                       "survives pruning -> " + ("loss 0 (zero_infinity), zero gradient"
                                                 if zero_inf else "+inf loss"))
        seqs.append(_d.SequenceDiagnosis(
            index=b, frames=Tb, frames_needed=needed, target_length=Ub, repeats=None,
            feasible=Tb >= needed, loss=lb, nonfinite=nf, grad_max=gmax, min_log_prob=mn,
            max_norm_error=None, status=status, verdict=verdict,
        ))
    extra = {"rnnt_type": rt, "s_range": R}
    if hat:
        extra["use_hat_loss"] = True
    dp = a.get("delay_penalty", 0.0)
    if dp:
        extra["delay_penalty"] = float(dp)
    return _d.Diagnosis(
        kind="pruned", shape=tuple(x.shape), dtype=str(x.dtype).replace("torch.", ""),
        device=str(x.device), backend=_d._backend_name(a, x.device),
        blank=int(a["termination_symbol"]), fused_log_softmax=True, zero_infinity=zero_inf,
        sequences=seqs, extra=extra,
    )
