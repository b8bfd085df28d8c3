"""Float32 and half-precision gradients against float64 on the same (rounded) inputs.

For every differentiable public function at the sizes where float32 state values reach
thousands of nats (CTC T=5000, S=1000; transducers T=1000, U=100; the lattice also
T=4000): the relative Frobenius error of the float32 gradient against the float64
gradient of the same inputs is at most 2e-6. float16/bfloat16 inputs: the gradient,
returned in the input's dtype, is within that dtype's own rounding (unit roundoff) of
the float64 gradient of the rounded inputs. The oracle is the float64 computation of
the same function (its own correctness is checked against brute force and gradcheck
elsewhere); the float64 path never shares the float32 path's rounding.
"""

from __future__ import annotations

import pytest
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


def _error(fn, inputs: list[torch.Tensor], dtype: torch.dtype, which: str = "inputs") -> float:
    """The gradient's error in ``dtype`` against float64 on the ``dtype``-rounded inputs:
    of the data inputs, or (``which="params"``) of a joint module's parameters."""
    rounded = [x.to(dtype).double() for x in inputs]
    params = getattr(fn, "params", ())
    keep = [i for i in range(len(inputs)) if (i in params) == (which == "params")]
    got, want = _grads(fn, rounded, dtype), _grads(fn, rounded, torch.float64)
    return _rel([got[i] for i in keep], [want[i] for i in keep])


# --------------------------------------------------------------------------- cases
def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lattice_rnnt(T: int, U: int = 100, backend: str = "numba"):
    # The reproducer: one score per frame, blank vs emission.
    z = torch.randn(1, T, U + 1, generator=_g(T), dtype=torch.float64)

    def fn(ab, ae):
        return seqloss.transducer_lattice(ab, ae, [T], [U], backend=backend)

    return fn, [F.logsigmoid(z)[..., None], F.logsigmoid(-z)[..., None]]


def _lattice_many(T: int = 1000, U: int = 100, backend: str = "numba"):
    lp = torch.randn(1, T, U + 1, 4, generator=_g(1), dtype=torch.float64).log_softmax(-1)

    def fn(ab, ae):
        return seqloss.transducer_lattice(ab, ae, [T], [U], (1, 2), (0, 1), backend=backend)

    return fn, [lp[..., :2].contiguous(), lp[..., 2:].contiguous()]


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
        return getattr(seqloss, name)(enc, pred, joint, tg, [T], [U], *extra, backend="numba")

    fn.params = (2, 3)
    fn.materialized = lambda enc, pred, w, b: getattr(seqloss, name.replace("_from_joint", ""))(
        _Joint(w, b)(enc, pred), tg, [T], [U], *extra, backend="numba")
    fn.materialized.params = (2, 3)
    return fn, [enc, pred, w, b]


class _Joint(torch.nn.Module):
    def __init__(self, w: torch.nn.Parameter, b: torch.nn.Parameter) -> None:
        super().__init__()
        self.w, self.b = w, b

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(enc[:, :, None] + pred[:, None]), self.w, self.b)


CASES = {
    "ctc_loss": _ctc,
    "rnnt_loss": _rnnt,
    "rnnt_loss_packed": _rnnt_packed,
    "multiblank_rnnt_loss": _multiblank,
    "tdt_loss": _tdt,
    "transducer_lattice[T=1000]": lambda: _lattice_rnnt(1000),
    "transducer_lattice[T=4000]": lambda: _lattice_rnnt(4000),
    "transducer_lattice[many-arc]": _lattice_many,
    "rnnt_loss_simple": _simple,
    "rnnt_loss_smoothed": _smoothed,
    "rnnt_loss_pruned": _pruned,
    "logmmexp": _logmmexp,
    "rnnt_loss_from_joint": lambda: _from_joint("rnnt_loss_from_joint"),
    "multiblank_rnnt_loss_from_joint": lambda: _from_joint("multiblank_rnnt_loss_from_joint"),
    "tdt_loss_from_joint": lambda: _from_joint("tdt_loss_from_joint"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_float32_gradient_within_2e_6_of_float64(case):
    fn, inputs = CASES[case]()
    err = _error(fn, inputs, torch.float32)
    assert err <= F32_TOL, f"{case}: float32 gradient {err:.3g} from float64"


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("_from_joint")])
def test_joint_parameter_gradients_no_worse_than_the_materialized_joint(case):
    """A joint's parameter gradient sums ``T U`` rows in the joint's own backward (torch's
    float32 matmul: ~1e-6 here): the loss from the joint adds nothing to that error
    beyond the materialized pipeline's (``loss(joint(enc, pred))``) in the same dtype."""
    fn, inputs = CASES[case]()
    err = _error(fn, inputs, torch.float32, "params")
    ref = _error(fn.materialized, inputs, torch.float32, "params")
    assert err <= max(F32_TOL, 1.25 * ref), f"{case}: {err:.3g}, materialized {ref:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_half_gradient_within_its_own_rounding(case, dtype):
    fn, inputs = CASES[case]()
    err = _error(fn, inputs, dtype)
    tol = HALF_TOL[dtype]
    if hasattr(fn, "materialized"):
        # The joint itself runs in half precision (its tanh, its matmuls): the loss from
        # the joint may add no error beyond the materialized pipeline's in that dtype.
        tol = max(tol, 1.25 * _error(fn.materialized, inputs, dtype))
    assert err <= tol, f"{case}: {dtype} gradient {err:.3g} from float64 (tolerance {tol:.3g})"


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("kind", ["rnnt", "many-arc"])
def test_lattice_float32_on_every_backend(backend, kind):
    """The reference and the Triton kernels (interpreted here: smaller sizes) too."""
    T, U = (300, 50) if backend == "triton" else (1000, 100)
    fn, inputs = (_lattice_rnnt(T, U, backend) if kind == "rnnt"
                  else _lattice_many(T, U, backend))
    err = _error(fn, inputs, torch.float32)
    assert err <= F32_TOL, f"{backend} {kind}: float32 gradient {err:.3g} from float64"
