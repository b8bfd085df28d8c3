"""Smoke test: every public function, forward and backward, on each CPU backend.

CI runs this file on the main torch and again on the declared floor and on the newest
torch (``.ci/run``): it is small (tiny shapes, one call each) and touches every op
declaration, the eager fast lanes, ``torch.compile`` and the torch interfaces that
moved between releases (``seqloss/_core/torch_compat.py``). Each case checks its value
and gradients against an oracle (torch's own loss, plain torch formulas, the
materialized joint, or the reference backend in float64) and, when ``SEQLOSS_SMOKE_JSON``
names a file, records its loss and gradient norms there so that runs on different
torch releases can be compared (``.ci/compare_smoke.py``).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import backend_params

import seqloss

RESULTS: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _record():
    yield
    path = os.environ.get("SEQLOSS_SMOKE_JSON")
    if path and RESULTS:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "cases": RESULTS}, f, indent=1,
                      sort_keys=True)


def _note(key: str, loss: torch.Tensor, grads) -> None:
    RESULTS[key] = {"loss": float(loss.detach().double().sum()),
                    **{f"grad{i}": float(g.detach().double().norm())
                       for i, g in enumerate(grads) if g is not None}}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(got.detach().double(), want.detach().double(), rtol=tol,
                               atol=tol, msg=lambda m: f"{what}: {m}")


# ----------------------------------------------------------------------------- inputs
B, T, U, V = 2, 6, 3, 5
TL = [6, 4]
UL = [3, 2]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(*shape, seed=0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _targets(vocab: int, seed=1) -> torch.Tensor:
    """Labels in ``[0, vocab - 1)``: the last class is the (default) blank."""
    return torch.randint(0, vocab - 1, (B, U), generator=_gen(seed))


class Joint(torch.nn.Module):
    def __init__(self, W: int, dtype: torch.dtype) -> None:
        super().__init__()
        g = _gen(7)
        self.e = torch.nn.Parameter(torch.randn(4, 6, generator=g, dtype=torch.float64).to(dtype))
        self.p = torch.nn.Parameter(torch.randn(3, 6, generator=g, dtype=torch.float64).to(dtype))
        self.out = torch.nn.Parameter(torch.randn(6, W, generator=g, dtype=torch.float64).to(dtype))

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        h = torch.tanh((enc @ self.e)[:, :, None] + (pred @ self.p)[:, None])
        return h @ self.out


# ----------------------------------------------------------------------------- cases
# Each case: (dtype, backend) -> (loss, inputs whose gradients are checked). Called once
# with the backend under test in float32, and once with the reference in float64 (the
# oracle), unless it has its own oracle.
def _ctc(dtype, backend, fused=False):
    x = _logits(T, B, V, dtype=dtype).requires_grad_()
    lp = x if fused else x.log_softmax(-1)
    loss = seqloss.ctc_loss(lp, _targets(V), TL, UL, blank=V - 1, reduction="sum",
                            fused_log_softmax=fused, backend=backend)
    return loss, [x]


def _ctc_module(dtype, backend):
    x = _logits(T, B, V, dtype=dtype).requires_grad_()
    m = seqloss.CTCLoss(blank=V - 1, reduction="mean", backend=backend)
    return m(x.log_softmax(-1), _targets(V), TL, UL), [x]


def _rnnt(dtype, backend, **kw):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    return seqloss.rnnt_loss(x, _targets(V), TL, UL, reduction="sum", backend=backend, **kw), [x]


def _rnnt_inplace(dtype, backend):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    y = x * 1.0  # in place: the caller's logits (not a leaf) become the gradient
    loss = seqloss.rnnt_loss(y, _targets(V), TL, UL, reduction="sum", backend=backend,
                             inplace_grad=True)
    return loss, [x]


def _rnnt_module(dtype, backend):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    return seqloss.RNNTLoss(reduction="mean_volume", backend=backend)(
        x, _targets(V), TL, UL), [x]


def _rnnt_packed(dtype, backend):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    rows = torch.cat([x[b, :TL[b], :UL[b] + 1].reshape(-1, V) for b in range(B)])
    return seqloss.rnnt_loss_packed(rows, _targets(V), TL, UL, reduction="sum",
                                    backend=backend), [x]


def _multiblank(dtype, backend):
    x = _logits(B, T, U + 1, V + 2, dtype=dtype).requires_grad_()
    loss = seqloss.multiblank_rnnt_loss(x, _targets(V), TL, UL, [2, 3], reduction="sum",
                                        backend=backend)
    return loss, [x]


def _multiblank_module(dtype, backend):
    x = _logits(B, T, U + 1, V + 2, dtype=dtype).requires_grad_()
    return seqloss.MultiBlankRNNTLoss([2, 3], backend=backend)(x, _targets(V), TL, UL), [x]


def _tdt(dtype, backend):
    x = _logits(B, T, U + 1, V + 3, dtype=dtype).requires_grad_()
    loss = seqloss.tdt_loss(x, _targets(V), TL, UL, [0, 1, 2], sigma=0.05, omega=0.1,
                            reduction="sum", backend=backend)
    return loss, [x]


def _tdt_module(dtype, backend):
    x = _logits(B, T, U + 1, V + 3, dtype=dtype).requires_grad_()
    return seqloss.TDTLoss([0, 1, 2], backend=backend)(x, _targets(V), TL, UL), [x]


def _hat(dtype, backend):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    return seqloss.hat_loss(x, _targets(V), TL, UL, reduction="sum", backend=backend), [x]


def _hat_module(dtype, backend):
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    return seqloss.HATLoss(backend=backend)(x, _targets(V), TL, UL), [x]


def _from_joint(kind):
    def case(dtype, backend, materialized=False):
        W = {"rnnt": V, "hat": V, "mb": V + 2, "tdt": V + 3}[kind]
        joint = Joint(W, dtype)
        enc = _logits(B, T, 4, seed=3, dtype=dtype).requires_grad_()
        pred = _logits(B, U + 1, 3, seed=4, dtype=dtype).requires_grad_()
        tg = _targets(V)
        common = dict(reduction="sum", backend=backend)
        if materialized:  # the oracle: the same loss on the materialized joint
            x = joint(enc, pred)
            loss = {"rnnt": lambda: seqloss.rnnt_loss(x, tg, TL, UL, **common),
                    "hat": lambda: seqloss.hat_loss(x, tg, TL, UL, **common),
                    "mb": lambda: seqloss.multiblank_rnnt_loss(x, tg, TL, UL, [2, 3], **common),
                    "tdt": lambda: seqloss.tdt_loss(x, tg, TL, UL, [0, 1, 2], **common)}[kind]()
        else:
            fn = {"rnnt": seqloss.rnnt_loss_from_joint, "hat": seqloss.hat_loss_from_joint,
                  "mb": seqloss.multiblank_rnnt_loss_from_joint,
                  "tdt": seqloss.tdt_loss_from_joint}[kind]
            extra = {"mb": ([2, 3],), "tdt": ([0, 1, 2],)}.get(kind, ())
            loss = fn(enc, pred, joint, tg, TL, UL, *extra, chunk_elements=24, **common)
        return loss, [enc, pred, *joint.parameters()]

    case.oracle = "materialized"
    return case


def _arcs_lattice(dtype, backend):
    """Arc log-probs fed to the lattice: the RNN-T log-likelihood (oracle: ``rnnt_loss``)."""
    x = _logits(B, T, U + 1, V, dtype=dtype).requires_grad_()
    blank, emit = seqloss.transducer_arc_logprobs(x, _targets(V), TL, UL)
    ll = seqloss.transducer_lattice(blank[..., None], emit[..., None], TL, UL, backend=backend)
    return -ll.sum(), [x]


_arcs_lattice.oracle = "rnnt"


def _arcs_from_joint(dtype, backend):
    joint = Joint(V, dtype)
    enc = _logits(B, T, 4, seed=3, dtype=dtype).requires_grad_()
    pred = _logits(B, U + 1, 3, seed=4, dtype=dtype).requires_grad_()
    blank, emit = seqloss.transducer_arc_logprobs_from_joint(enc, pred, joint, _targets(V), TL, UL)
    ll = seqloss.transducer_lattice(blank[..., None], emit[..., None], TL, UL, backend=backend)
    return -ll.sum(), [enc, pred]


def _logmmexp(dtype, backend):
    a = _logits(2, 3, 4, seed=5, dtype=dtype).requires_grad_()
    b = _logits(2, 4, 5, seed=6, dtype=dtype).requires_grad_()
    out = seqloss.logmmexp(a, b, backend=backend)
    return (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).view_as(out)).sum(), [a, b]


def _simple(smoothed):
    def case(dtype, backend):
        am = _logits(B, T, V, seed=8, dtype=dtype).requires_grad_()
        lm = _logits(B, U + 1, V, seed=9, dtype=dtype).requires_grad_()
        boundary = torch.tensor([[0, 0, UL[b], TL[b]] for b in range(B)])
        sym = _targets(V)
        if smoothed:
            loss = seqloss.rnnt_loss_smoothed(lm, am, sym, V - 1, boundary=boundary,
                                              reduction="sum", backend=backend)
        else:
            loss = seqloss.rnnt_loss_simple(lm, am, sym, V - 1, boundary=boundary,
                                            reduction="sum", backend=backend)
        return loss, [am, lm]

    return case


def _pruned(dtype, backend, rnnt_type="regular"):
    am = _logits(B, T, V, seed=8, dtype=dtype).requires_grad_()
    lm = _logits(B, U + 1, V, seed=9, dtype=dtype).requires_grad_()
    boundary = torch.tensor([[0, 0, UL[b], TL[b]] for b in range(B)])
    sym = _targets(V)
    _, (px, py) = seqloss.rnnt_loss_simple(lm.detach().double(), am.detach().double(), sym,
                                           V - 1, boundary=boundary, rnnt_type=rnnt_type,
                                           return_grad=True, backend="reference")
    ranges = seqloss.get_rnnt_prune_ranges(px, py, boundary, 2)
    am_p, lm_p = seqloss.do_rnnt_pruning(am, lm, ranges)
    loss = seqloss.rnnt_loss_pruned(am_p + lm_p, sym, ranges, V - 1, boundary=boundary,
                                    rnnt_type=rnnt_type, reduction="sum", backend=backend)
    return loss, [am, lm]


def _lattice_tdt(dtype, backend):
    ab = _logits(B, T, U + 1, 2, seed=10, dtype=dtype).log_softmax(-1).requires_grad_()
    ae = _logits(B, T, U + 1, 3, seed=11, dtype=dtype).log_softmax(-1).requires_grad_()
    ll = seqloss.transducer_lattice(ab, ae, TL, UL, blank_durations=(1, 2),
                                    emit_durations=(0, 1, 2), backend=backend)
    return -ll.sum(), [ab, ae]


CASES = {
    "ctc_loss": _ctc,
    "ctc_loss_fused": lambda d, b: _ctc(d, b, fused=True),
    "CTCLoss": _ctc_module,
    "rnnt_loss": _rnnt,
    "rnnt_loss_unfused_clamp": lambda d, b: _rnnt(d, b, fused_log_softmax=False, clamp=0.5),
    "rnnt_loss_inplace": _rnnt_inplace,
    "RNNTLoss": _rnnt_module,
    "rnnt_loss_packed": _rnnt_packed,
    "multiblank_rnnt_loss": _multiblank,
    "MultiBlankRNNTLoss": _multiblank_module,
    "tdt_loss": _tdt,
    "TDTLoss": _tdt_module,
    "hat_loss": _hat,
    "HATLoss": _hat_module,
    "rnnt_loss_from_joint": _from_joint("rnnt"),
    "hat_loss_from_joint": _from_joint("hat"),
    "multiblank_rnnt_loss_from_joint": _from_joint("mb"),
    "tdt_loss_from_joint": _from_joint("tdt"),
    "arc_logprobs_lattice": _arcs_lattice,
    "arc_logprobs_from_joint_lattice": _arcs_from_joint,
    "transducer_lattice_tdt": _lattice_tdt,
    "logmmexp": _logmmexp,
    "rnnt_loss_simple": _simple(False),
    "rnnt_loss_smoothed": _simple(True),
    "rnnt_loss_pruned": _pruned,
    "rnnt_loss_pruned_modified": lambda d, b: _pruned(d, b, "modified"),
}


def _run(name: str, backend: str, dtype: torch.dtype):
    fn = CASES[name]
    loss, xs = fn(dtype, backend)
    grads = torch.autograd.grad(loss, xs, allow_unused=True)
    return loss, grads


def _oracle(name: str):
    fn = CASES[name]
    kind = getattr(fn, "oracle", None)
    if kind == "materialized":
        loss, xs = fn(torch.float64, "reference", materialized=True)
    elif kind == "rnnt":
        loss, xs = _rnnt(torch.float64, "reference")
    else:
        loss, xs = fn(torch.float64, "reference")
    return loss, torch.autograd.grad(loss, xs, allow_unused=True)


def _check(name, backend, dtype, loss, grads, key):
    want, wgrads = _oracle(name)
    assert torch.isfinite(loss).all(), f"{name}: loss {loss}"
    _close(loss, want, dtype, f"{name} loss")
    for i, (g, w) in enumerate(zip(grads, wgrads, strict=True)):
        assert (g is None) == (w is None), f"{name}: gradient {i}"
        if g is not None:
            _close(g, w, dtype, f"{name} grad {i}")
    _note(key, loss, grads)


@pytest.mark.parametrize("backend", backend_params("smoke"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_loss(name, dtype, backend):
    loss, grads = _run(name, backend, dtype)
    _check(name, backend, dtype, loss, grads, f"{name}/{backend}/{dtype}".replace("torch.", ""))


# ----------------------------------------------------------------------------- own oracles
def test_ctc_matches_torch():
    x = _logits(T, B, V).requires_grad_()
    tg = _targets(V)
    got = seqloss.ctc_loss(x.log_softmax(-1), tg, TL, UL, blank=V - 1, reduction="sum")
    want = F.ctc_loss(x.log_softmax(-1), tg, TL, UL, blank=V - 1, reduction="sum")
    _close(got, want, torch.float64, "ctc vs torch")
    _close(*(torch.autograd.grad(v, x)[0] for v in (got, want)), torch.float64, "ctc grad")


def test_logmmexp_matches_logsumexp():
    a, b = _logits(2, 3, 4, seed=5), _logits(2, 4, 5, seed=6)
    _close(seqloss.logmmexp(a, b), torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], -2),
           torch.float64, "logmmexp")


@pytest.mark.parametrize("backend", backend_params("smoke"))
def test_alignments(backend):
    lp = _logits(T, B, V).log_softmax(-1)
    tg = _targets(V)
    labels, scores = seqloss.ctc_align(lp, tg, TL, UL, blank=V - 1, backend=backend)
    # The best path's score is at most the total (log-sum over all paths).
    total = -seqloss.ctc_loss(lp, tg, TL, UL, blank=V - 1, reduction="none")
    assert (scores.sum(1) <= total + 1e-9).all()
    x = _logits(B, T, U + 1, V)
    outs = {"rnnt": seqloss.rnnt_align(x, tg, TL, UL, backend=backend),
            "mb": seqloss.multiblank_rnnt_align(_logits(B, T, U + 1, V + 2), tg, TL, UL, [2, 3],
                                                backend=backend),
            "tdt": seqloss.tdt_align(_logits(B, T, U + 1, V + 3), tg, TL, UL, [0, 1, 2],
                                     backend=backend)}
    rnnt_total = -seqloss.rnnt_loss(x, tg, TL, UL, reduction="none")
    assert (outs["rnnt"][-1] <= rnnt_total + 1e-9).all()
    for kind, out in outs.items():
        ref = {"rnnt": lambda: seqloss.rnnt_align(x, tg, TL, UL, backend="reference"),
               "mb": lambda: seqloss.multiblank_rnnt_align(
                   _logits(B, T, U + 1, V + 2), tg, TL, UL, [2, 3], backend="reference"),
               "tdt": lambda: seqloss.tdt_align(_logits(B, T, U + 1, V + 3), tg, TL, UL,
                                                [0, 1, 2], backend="reference")}[kind]()
        for a, b in zip(out, ref, strict=True):
            torch.testing.assert_close(a, b)
        _note(f"{kind}_align/{backend}", out[-1], [])
    _note(f"ctc_align/{backend}", scores, [])


def test_distributed_mean_and_grad_clamp():
    losses = _logits(4, seed=12).abs().requires_grad_()
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    m = seqloss.distributed_mean(losses, w)
    _close(m, losses.sum() / w.sum(), torch.float64, "distributed_mean")
    (g,) = torch.autograd.grad(m, losses)
    _close(g, torch.full_like(g, 1 / w.sum().item()), torch.float64, "distributed_mean grad")
    x = _logits(6, seed=13).requires_grad_()
    (g,) = torch.autograd.grad((seqloss.grad_clamp(x, 0.5) * 3.0).sum(), x)
    _close(g, torch.full_like(g, 0.5), torch.float64, "grad_clamp")
    _note("distributed_mean", m, [])


def test_diagnose():
    x = _logits(T, B, V).log_softmax(-1)
    d = seqloss.diagnose("ctc", x, _targets(V), [6, 1], UL, blank=V - 1)
    assert d.infeasible == [1]  # two labels in one frame
    assert d.nonfinite == []


def test_func_grad_of_factored_losses():
    """``torch.func.grad`` reads the boundary's values inside the transform (``torch_compat``)."""
    am = _logits(B, T, V, seed=8)
    lm = _logits(B, U + 1, V, seed=9)
    boundary = torch.tensor([[0, 0, UL[b], TL[b]] for b in range(B)])
    sym = _targets(V)

    def f(a):
        return seqloss.rnnt_loss_simple(lm, a, sym, V - 1, boundary=boundary, reduction="sum")

    g = torch.func.grad(f)(am)
    am_ = am.clone().requires_grad_()
    (want,) = torch.autograd.grad(f(am_), am_)
    _close(g, want, torch.float64, "func.grad")


# ----------------------------------------------------------------------------- compiler
def _ctc_call(x, tg):
    return seqloss.ctc_loss(x.log_softmax(-1), tg, TL, UL, blank=V - 1, reduction="sum")


def _rnnt_call(x, tg):
    return seqloss.rnnt_loss(x, tg, TL, UL, reduction="sum")


@pytest.mark.parametrize("call,shape", [(_ctc_call, (T, B, V)), (_rnnt_call, (B, T, U + 1, V))],
                         ids=["ctc", "rnnt"])
def test_compile(call, shape):
    import torch._dynamo

    torch._dynamo.reset()
    x = _logits(*shape, dtype=torch.float32).requires_grad_()
    tg = _targets(V)
    got = torch.compile(call, backend="inductor")(x, tg)
    (g,) = torch.autograd.grad(got, x)
    x2 = x.detach().clone().requires_grad_()
    want = call(x2, tg)
    (wg,) = torch.autograd.grad(want, x2)
    _close(got, want, torch.float32, "compiled loss")
    _close(g, wg, torch.float32, "compiled grad")
    _note(f"compile_{call.__name__}", got, [g])
    torch._dynamo.reset()


EAGER_ONLY = ["rnnt_loss_inplace", "rnnt_loss_from_joint", "hat_loss_from_joint",
              "multiblank_rnnt_loss_from_joint", "tdt_loss_from_joint", "arc_logprobs_lattice",
              "arc_logprobs_from_joint_lattice", "ctc_loss", "rnnt_loss"]


@pytest.mark.parametrize("name", EAGER_ONLY)
def test_after_dynamo_is_loaded(name):
    """An optimizer step imports ``torch._dynamo``: the eager-only functions then wrap
    themselves with ``torch.compiler.disable`` (``torch_compat.compiler_disable``)."""
    import torch._dynamo  # an optimizer step imports it

    loss, grads = _run(name, "numba", torch.float64)
    _check(name, "numba", torch.float64, loss, grads, f"dynamo/{name}")
    losses = _logits(4, seed=12).abs().requires_grad_()
    m = seqloss.distributed_mean(losses)
    _close(m, losses.mean(), torch.float64, "distributed_mean after dynamo")
    assert math.isfinite(m.item())
