"""Float32 and half-precision gradient errors against float64, for every differentiable
public function at the sizes where float32 state values reach thousands of nats.

Shared by ``tests/test_precision.py`` (the bounds) and ``benchmarks/bench_precision.py``
(the table in ``benchmarks/RESULTS.md``). Each case is ``fn, inputs``: float64 inputs,
and ``fn(*inputs)`` a loss per sequence; :func:`gradient_error` rounds the inputs to a
dtype, runs ``fn`` in that dtype and in float64 on the same rounded values, and returns
the relative Frobenius error of the gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import seqloss

F32_TOL = 2e-6
# Unit roundoff: a gradient rounded to the dtype is at most this far, element by element.
HALF_TOL = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    g = torch.cat([x.double().flatten() for x in got])
    w = torch.cat([x.double().flatten() for x in want])
    assert torch.isfinite(w).all() and torch.isfinite(g).all()
    return ((g - w).norm() / w.norm()).item()


def _grads(fn, inputs: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    # Inputs a joint module holds are its parameters (the from-joint losses take their
    # gradients through ``joint.parameters()``).
    params = getattr(fn, "params", ())
    xs = [torch.nn.Parameter(x.detach().to(dtype)) if i in params
          else x.detach().to(dtype).requires_grad_() for i, x in enumerate(inputs)]
    loss = fn(*xs)
    assert torch.isfinite(loss).all()
    return list(torch.autograd.grad(loss.sum(), xs))


def gradient_errors(fn, inputs: list[torch.Tensor], dtype: torch.dtype) -> dict[str, float]:
    """The gradient's error in ``dtype`` against float64 on the ``dtype``-rounded inputs:
    ``"inputs"``, of the data inputs, and ``"params"``, of a joint module's parameters
    (where ``fn`` has them), from one backward pass in each dtype."""
    rounded = [x.to(dtype).double() for x in inputs]
    params = getattr(fn, "params", ())
    got, want = _grads(fn, rounded, dtype), _grads(fn, rounded, torch.float64)
    out = {}
    for which in ("inputs", "params") if params else ("inputs",):
        keep = [i for i in range(len(inputs)) if (i in params) == (which == "params")]
        out[which] = _rel([got[i] for i in keep], [want[i] for i in keep])
    return out


def gradient_error(fn, inputs: list[torch.Tensor], dtype: torch.dtype,
                   which: str = "inputs") -> float:
    """The gradient's error in ``dtype`` against float64 on the ``dtype``-rounded inputs:
    of the data inputs, or (``which="params"``) of a joint module's parameters."""
    return gradient_errors(fn, inputs, dtype)[which]


# --------------------------------------------------------------------------- cases
def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def lattice_rnnt_case(T: int, U: int = 100, backend: str = "numba", device: str = "cpu"):
    # The reproducer: one score per frame, blank vs emission.
    z = torch.randn(1, T, U + 1, generator=_g(T), dtype=torch.float64)

    def fn(ab, ae):
        return seqloss.transducer_lattice(ab, ae, [T], [U], backend=backend)

    return fn, [F.logsigmoid(z)[..., None].to(device), F.logsigmoid(-z)[..., None].to(device)]


def lattice_many_case(T: int = 1000, U: int = 100, backend: str = "numba", device: str = "cpu"):
    lp = torch.randn(1, T, U + 1, 4, generator=_g(1), dtype=torch.float64).log_softmax(-1)

    def fn(ab, ae):
        return seqloss.transducer_lattice(ab, ae, [T], [U], (1, 2), (0, 1), backend=backend)

    return fn, [lp[..., :2].contiguous().to(device), lp[..., 2:].contiguous().to(device)]


def _ctc(T: int = 5000, S: int = 1000, C: int = 32):
    lp = torch.randn(T, 1, C, generator=_g(2), dtype=torch.float64).log_softmax(-1)
    tg = torch.randint(1, C, (1, S), generator=_g(3))

    def fn(x):
        return seqloss.ctc_loss(x, tg, [T], [S], reduction="sum", backend="numba")

    return fn, [lp]


def _joint_inputs(T: int, U: int, V: int, seed: int, D: int = 0):
    logits = torch.randn(1, T, U + 1, V + D, generator=_g(seed), dtype=torch.float64)
    # Labels 1 .. V-4: clear of blank 0 and of multi-blank's big blanks at the top.
    tg = torch.randint(1, V - 3, (1, U), generator=_g(seed + 1), dtype=torch.int64)
    return logits, tg


def _rnnt(T: int = 1000, U: int = 100, V: int = 16):
    logits, tg = _joint_inputs(T, U, V, 4)

    def fn(x):
        return seqloss.rnnt_loss(x, tg, [T], [U], blank=0, backend="numba")

    return fn, [logits]


def _rnnt_packed(T: int = 1000, U: int = 100, V: int = 16):
    logits, tg = _joint_inputs(T, U, V, 5)

    def fn(x):
        return seqloss.rnnt_loss_packed(x, tg, [T], [U], blank=0, backend="numba")

    return fn, [logits.reshape(-1, V)]


def _multiblank(T: int = 1000, U: int = 100, V: int = 16):
    logits, tg = _joint_inputs(T, U, V, 6)

    def fn(x):
        return seqloss.multiblank_rnnt_loss(x, tg, [T], [U], [2, 4], backend="numba")

    return fn, [logits]


def _tdt(T: int = 1000, U: int = 100, V: int = 16):
    durations = [0, 1, 2, 3, 4]
    logits, tg = _joint_inputs(T, U, V, 7, len(durations))

    def fn(x):
        return seqloss.tdt_loss(x, tg, [T], [U], durations, backend="numba")

    return fn, [logits]


def _factored(T: int = 1000, U: int = 100, V: int = 16, seed: int = 8):
    lm = torch.randn(1, U + 1, V, generator=_g(seed), dtype=torch.float64)
    am = torch.randn(1, T, V, generator=_g(seed + 1), dtype=torch.float64)
    symbols = torch.randint(1, V, (1, U), generator=_g(seed + 2))
    return lm, am, symbols


def _simple():
    lm, am, sy = _factored()

    def fn(lm, am):
        return seqloss.rnnt_loss_simple(lm, am, sy, 0, reduction="sum", backend="numba")

    return fn, [lm, am]


def _smoothed():
    lm, am, sy = _factored(seed=11)

    def fn(lm, am):
        return seqloss.rnnt_loss_smoothed(lm, am, sy, 0, 0.1, 0.1, reduction="sum",
                                          backend="numba")

    return fn, [lm, am]


def _pruned(s_range: int = 5):
    lm, am, sy = _factored(seed=14)
    T, U1 = am.shape[1], lm.shape[1]
    boundary = torch.tensor([[0, 0, U1 - 1, T]])
    _, (px_grad, py_grad) = seqloss.rnnt_loss_simple(lm, am, sy, 0, boundary, return_grad=True,
                                                     reduction="sum")
    ranges = seqloss.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range)
    am_p, lm_p = seqloss.do_rnnt_pruning(am, lm, ranges)
    logits = am_p + lm_p

    def fn(x):
        return seqloss.rnnt_loss_pruned(x, sy, ranges, 0, boundary, reduction="sum",
                                        backend="numba")

    return fn, [logits]


def _logmmexp():
    a = torch.randn(1000, 64, generator=_g(17), dtype=torch.float64) * 30
    b = torch.randn(64, 101, generator=_g(18), dtype=torch.float64) * 30

    def fn(a, b):
        return seqloss.logmmexp(a, b, backend="numba")

    return fn, [a, b]


def _from_joint(name: str, T: int = 1000, U: int = 100, H: int = 8, V: int = 16):
    extra = {"multiblank_rnnt_loss_from_joint": ([2, 4],),
             "tdt_loss_from_joint": ([0, 1, 2, 3, 4],)}.get(name, ())
    Vj = V + (5 if name == "tdt_loss_from_joint" else 0)
    enc = torch.randn(1, T, H, generator=_g(19), dtype=torch.float64)
    pred = torch.randn(1, U + 1, H, generator=_g(20), dtype=torch.float64)
    w = torch.randn(Vj, H, generator=_g(21), dtype=torch.float64)
    b = torch.randn(Vj, generator=_g(22), dtype=torch.float64)
    tg = torch.randint(1, V - 3, (1, U), generator=_g(23))

    def fn(enc, pred, w, b):
        joint = _Joint(w, b)
        return getattr(seqloss, name)(enc, pred, joint, tg, [T], [U], *extra, backend="numba",
                                      reduction="sum")

    fn.params = (2, 3)
    fn.materialized = lambda enc, pred, w, b: getattr(seqloss, name.replace("_from_joint", ""))(
        _Joint(w, b)(enc, pred), tg, [T], [U], *extra, backend="numba", reduction="sum")
    # The joint's parameters: their gradients sum T U rows in the joint's own backward.
    # reduction="sum", as every case here: the loss's own error, not a mean's factor's
    # (a factor of 0.01 fed to the joint's bfloat16 backward moved the predictor's
    # gradient error 2.2e-3 -> 4.4e-3 where a power of two changes nothing).
    fn.materialized.params = (2, 3)
    return fn, [enc, pred, w, b]


class _Joint(torch.nn.Module):
    def __init__(self, w: torch.nn.Parameter, b: torch.nn.Parameter) -> None:
        super().__init__()
        self.w, self.b = w, b

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(enc[:, :, None] + pred[:, None]), self.w, self.b)


def scaled(case, scale: float):
    """``case`` with its floating inputs times ``scale``: the peaked logits of a trained
    model, whose log-probs (down to ``-2 scale``) float32 scores can hold only to
    ``eps |score|``."""

    def make():
        fn, inputs = case()
        return fn, [x * scale if x.is_floating_point() else x for x in inputs]

    return make


CASES = {
    "ctc_loss": _ctc,
    "rnnt_loss": _rnnt,
    "rnnt_loss_packed": _rnnt_packed,
    "multiblank_rnnt_loss": _multiblank,
    "tdt_loss": _tdt,
    "rnnt_loss[scale=30]": scaled(_rnnt, 30),
    "multiblank_rnnt_loss[scale=100]": scaled(_multiblank, 100),
    "tdt_loss[scale=30]": scaled(_tdt, 30),
    "transducer_lattice[T=1000]": lambda: lattice_rnnt_case(1000),
    "transducer_lattice[T=4000]": lambda: lattice_rnnt_case(4000),
    "transducer_lattice[many-arc]": lattice_many_case,
    "rnnt_loss_simple": _simple,
    "rnnt_loss_smoothed": _smoothed,
    "rnnt_loss_pruned": _pruned,
    "logmmexp": _logmmexp,
    "rnnt_loss_from_joint": lambda: _from_joint("rnnt_loss_from_joint"),
    "multiblank_rnnt_loss_from_joint": lambda: _from_joint("multiblank_rnnt_loss_from_joint"),
    "tdt_loss_from_joint": lambda: _from_joint("tdt_loss_from_joint"),
}


