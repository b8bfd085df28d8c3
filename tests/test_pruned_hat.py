"""``rnnt_loss_pruned(..., use_hat_loss=True)``: k2's HAT normalization of the pruned joint.

Oracles: the HAT arc scores built from the definition in probability space
(``p(blank) = sigmoid(z_b)``, ``p(y) = (1 - sigmoid(z_b)) softmax(z_labels)[y]``), float64,
scattered into k2's full ``px (S, T)``, ``py (S + 1, T)`` lattice and summed over every path
by enumeration (``test_factored.k2_log_likelihood``); gradients by autograd through that.
Extreme logits against mpmath.
"""

from __future__ import annotations

import mpmath
import pytest
import torch
from conftest import device_for, other_backend
from test_factored import _finish_px, k2_log_likelihood

from seqloss.transducer.factored.api import rnnt_loss_pruned

TYPES = ("regular", "modified", "constrained")
F64 = torch.float64
NINF = float("-inf")


# --------------------------------------------------------------------------- oracle
def hat_log_probs(z, term):
    """``(..., C)`` HAT log-probabilities from the definition, in probability space."""
    pb = torch.sigmoid(z[..., term])
    labels = [c for c in range(z.shape[-1]) if c != term]
    p = torch.zeros_like(z)
    p[..., term] = pb
    p[..., labels] = (1 - pb)[..., None] * torch.softmax(z[..., labels], dim=-1)
    # log(0) = -inf with gradient 0, not autograd's 0 * (1 / 0) = NaN
    return torch.where(p > 0, torch.where(p > 0, p, 1.0).log(), NINF)


def oracle_hat(logits, symbols, ranges, term, boundary, rnnt_type, dp=0.0, lp=None):
    """-log sum over k2's paths of the HAT arc scores, per sequence."""
    B, T, R, C = logits.shape
    S = symbols.shape[1]
    lp = hat_log_probs(logits, term) if lp is None else lp
    ninf = logits.new_full((), NINF)
    out = []
    for b in range(B):
        s0, t0, s1, t1 = (int(v) for v in boundary[b])
        ext = [int(v) for v in symbols[b]] + [term]
        px = [[ninf] * T for _ in range(S)]
        py = [[ninf] * T for _ in range(S + 1)]
        for t in range(T):
            for k in range(R):
                s = int(ranges[b, t, k])
                py[s][t] = lp[b, t, k, term]
                if s < S:
                    px[s][t] = lp[b, t, k, ext[s]]
        pxt = (torch.stack([torch.stack(r) for r in px]) if S
               else logits.new_zeros(0, T))
        pyt = torch.stack([torch.stack(r) for r in py])
        pxt = _finish_px(pxt, pyt, rnnt_type, dp, t1)
        ll = k2_log_likelihood(pxt, pyt, s0, t0, s1, t1, rnnt_type)
        # no path: a constant (autograd's logsumexp over -inf scores would give 0 * NaN)
        out.append(-(ll.detach() if torch.isinf(ll) else ll))
    return torch.stack(out)


# --------------------------------------------------------------------------- inputs
def _case(B, T, S, R, C, term, rnnt_type, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, R, C, generator=g, dtype=F64)
    ids = torch.tensor([c for c in range(C) if c != term])
    symbols = ids[torch.randint(len(ids), (B, S), generator=g)]
    # windows from 0, each frame's start at most one window on (k2's constraint), ending
    # on the last position; the last frame's window holds the final state.
    step = R - 1 if rnnt_type == "regular" else 1
    r0 = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for t in range(1, T):
            r0[b, t] = min(int(r0[b, t - 1]) + int(torch.randint(step + 1, (1,), generator=g)),
                           S + 1 - R)
        r0[b, T - 1] = max(int(r0[b, T - 1]), S + 1 - R)
    ranges = r0[:, :, None] + torch.arange(R)
    return logits, symbols, ranges


def _boundaries(rnnt_type, B, T, S):
    rows = [[0, 0, S, T], [1, 1, S, T], [0, 0, S - 1, T - 1]]
    if rnnt_type != "regular":
        rows[2] = [1, 0, S - 1, T - 2]
    return torch.tensor(rows[:B], dtype=torch.int64)


def _check(got, want, x, rtol=1e-10, atol=1e-10, grad_rtol=1e-9):
    assert torch.equal(torch.isinf(got), torch.isinf(want)), (got, want)
    fin = torch.isfinite(want)
    assert fin.any()
    torch.testing.assert_close(got[fin], want[fin], rtol=rtol, atol=atol)
    (gg,) = torch.autograd.grad(got[fin].sum(), x)
    (gw,) = torch.autograd.grad(want[fin].sum(), x)
    torch.testing.assert_close(gg, gw, rtol=grad_rtol, atol=atol)


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("R", [2, 3, 4])
@pytest.mark.parametrize("term", [0, 2, 3])
@pytest.mark.parametrize(("dp", "bounded"), [(0.0, False), (0.3, True)])
def test_against_path_enumeration(rnnt_type, R, term, dp, bounded):
    B, T, S, C = 3, 4, 3, 4
    logits, symbols, ranges = _case(B, T, S, R, C, term, rnnt_type, seed=R * 10 + term)
    bnd = _boundaries(rnnt_type, B, T, S) if bounded else None
    x = logits.clone().requires_grad_()
    got = rnnt_loss_pruned(x, symbols, ranges, term, boundary=bnd, rnnt_type=rnnt_type,
                           delay_penalty=dp, reduction="none", use_hat_loss=True)
    full = torch.tensor([[0, 0, S, T]] * B) if bnd is None else bnd
    want = oracle_hat(x, symbols, ranges, term, full, rnnt_type, dp)
    _check(got, want, x)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_gradcheck(rnnt_type):
    B, T, S, C, R, term = 3, 4, 3, 5, 2, 2
    logits, symbols, ranges = _case(B, T, S, R, C, term, rnnt_type, seed=7)
    bnd = _boundaries(rnnt_type, B, T, S)
    fin = torch.isfinite(rnnt_loss_pruned(logits, symbols, ranges, term, boundary=bnd,
                                          rnnt_type=rnnt_type, reduction="none",
                                          use_hat_loss=True))
    assert fin.sum() >= 2  # gradcheck's finite differences need finite losses
    logits, symbols, ranges, bnd = logits[fin], symbols[fin], ranges[fin], bnd[fin]
    x = logits.requires_grad_()
    # one random direction (fast_mode): test_against_path_enumeration checks every element
    for red in ("none", "mean"):
        def f(x, red=red):
            return rnnt_loss_pruned(x, symbols, ranges, term, boundary=bnd, rnnt_type=rnnt_type,
                                    delay_penalty=0.2, reduction=red, use_hat_loss=True)

        assert torch.autograd.gradcheck(f, (x,), fast_mode=True)


def test_every_backend_equals_the_plain_loss_on_hat_log_probs(pruned_backend):
    """HAT log-probabilities are normalized, so the plain loss's log-softmax leaves them as
    they are: the HAT loss on ``z`` is the plain loss on ``hat_log_probs(z)``, gradients
    through autograd included, on every lattice backend, at a size enumeration can't do."""
    B, T, S, C, R, term = 3, 12, 6, 6, 3, 4
    dev = device_for(pruned_backend)
    for rt in TYPES:
        logits, symbols, ranges = (v.to(dev) for v in _case(B, T, S, R, C, term, rt, seed=11))
        bnd = torch.tensor([[0, 0, S, T], [1, 2, S, T], [0, 0, S - 2, T - 3]], device=dev)
        x = logits.clone().requires_grad_()
        got = rnnt_loss_pruned(x, symbols, ranges, term, boundary=bnd, rnnt_type=rt,
                               delay_penalty=0.1, reduction="none", use_hat_loss=True,
                               backend=pruned_backend)
        want = rnnt_loss_pruned(hat_log_probs(x, term), symbols, ranges, term, boundary=bnd,
                                rnnt_type=rt, delay_penalty=0.1, reduction="none",
                                backend=other_backend(pruned_backend))
        _check(got, want, x)


def test_default_is_the_plain_loss():
    logits, symbols, ranges = _case(2, 4, 3, 2, 4, 0, "regular", seed=3)
    a = rnnt_loss_pruned(logits, symbols, ranges, 0, reduction="none")
    b = rnnt_loss_pruned(logits, symbols, ranges, 0, reduction="none", use_hat_loss=False)
    c = rnnt_loss_pruned(logits, symbols, ranges, 0, reduction="none", use_hat_loss=True)
    assert torch.equal(a, b) and not torch.allclose(a, c)


# --------------------------------------------------------------------------- extremes
def _mp_logsigmoid(z):
    return -mpmath.log1p(mpmath.exp(-mpmath.mpf(z)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("zb", [-1000.0, -60.0, 40.0, 60.0, 1000.0])
def test_extreme_blank_logit_is_exact(dtype, zb):
    """One frame, one symbol (regular): the path emits ``y`` on row 0 then the blank on row 1,
    ``-loss = logsigmoid(-z_b0) + log_softmax(z_labels)[y] + logsigmoid(z_b1)``. With
    ``z_b0 = 40`` and beyond, ``log(1 - sigmoid(z_b0))`` is ``log(0)`` in float64: the loss
    must still be exact, its gradient on ``z_b0`` ``sigmoid(z_b0)``."""
    y = 2
    z = torch.tensor([[[[zb, 0.5, -0.25, 1.0], [-zb / 2, 0.0, 0.0, 0.0]]]], dtype=dtype)
    x = z.clone().requires_grad_()
    loss = rnnt_loss_pruned(x, torch.tensor([[y]]), torch.tensor([[[0, 1]]]), 0,
                            reduction="sum", use_hat_loss=True)
    with mpmath.workdps(50):
        zl = [mpmath.mpf(float(v)) for v in z[0, 0, 0, 1:]]
        lsm = zl[y - 1] - mpmath.log(sum(mpmath.exp(v) for v in zl))
        want = -(_mp_logsigmoid(-zb) + lsm + _mp_logsigmoid(-zb / 2))
        rel = float(abs((mpmath.mpf(loss.item()) - want) / want))
        want_g = 1 / (1 + mpmath.exp(-mpmath.mpf(zb)))  # d(-logsigmoid(-z))/dz
    assert loss.dtype == dtype
    assert rel < (2e-7 if dtype == torch.float32 else 1e-15), (float(loss), float(want))
    (g,) = torch.autograd.grad(loss, x)
    assert abs(float(g[0, 0, 0, 0]) - float(want_g)) < 1e-6
    assert torch.isfinite(g).all()


# --------------------------------------------------------------------------- -inf, NaN, +inf
def test_masked_label_is_a_zero_probability_class():
    """A label at ``-inf`` (never a target) is out of the labels' softmax; exact gradient 0."""
    B, T, S, C, R, term = 3, 4, 3, 5, 3, 0
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=5)
    symbols = torch.where(symbols == 4, 1, symbols)
    logits[:, :, :, 4] = NINF
    x = logits.clone().requires_grad_()
    got = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
    want = oracle_hat(x, symbols, ranges, term, torch.tensor([[0, 0, S, T]] * B), "regular")
    _check(got, want, x)
    got = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
    (g,) = torch.autograd.grad(got[torch.isfinite(got)].sum(), x)
    assert (g[..., 4] == 0).all()


def test_masked_blank_equals_its_limit():
    """``z_b = -inf`` (the blank impossible there) equals ``z_b = -800`` (``e^-800`` = 0 in
    float64, so no path through it counts), loss and gradient."""
    B, T, S, C, R, term = 2, 4, 3, 4, 3, 1
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=6)
    cells = (torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([0, 1]))
    lim = logits.clone()
    lim[(*cells, torch.tensor([term, term]))] = -800.0
    inf = logits.clone()
    inf[(*cells, torch.tensor([term, term]))] = NINF
    res = []
    for v in (lim, inf):
        x = v.clone().requires_grad_()
        loss = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
        (g,) = torch.autograd.grad(loss.sum(), x)
        res.append((loss, g))
    torch.testing.assert_close(res[1][0], res[0][0], rtol=1e-14, atol=0)
    assert torch.isfinite(res[1][0]).all()
    torch.testing.assert_close(res[1][1], res[0][1], rtol=1e-12, atol=1e-300)


def test_row_without_labels_emits_nothing():
    """Every label at ``-inf`` on a row: the row's blank stays valid, its labels impossible
    (softmax over an empty set: no label arc), so the final row, which only takes blanks in
    regular RNN-T, may hold such rows; gradient 0 on them, finite elsewhere."""
    B, T, S, C, R, term = 2, 4, 3, 4, 2, 0
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=8)
    ranges[:, -1] = torch.arange(S + 1 - R, S + 1)  # the last frame holds the final row S
    masked = logits.clone()
    masked[:, -1, -1, 1:] = NINF  # row S on the last frame: its labels are never emitted
    x = masked.clone().requires_grad_()
    got = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
    y = logits.clone().requires_grad_()
    want = rnnt_loss_pruned(y, symbols, ranges, term, reduction="none", use_hat_loss=True)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    (g,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), y)
    assert torch.isfinite(g).all() and (g[:, -1, -1, 1:] == 0).all()
    torch.testing.assert_close(g, gw, rtol=1e-12, atol=0)
    # a row of the middle without labels on one frame: the oracle with those arcs at -inf
    masked = logits.clone()
    masked[0, 1, 0, 1:] = NINF
    x = masked.clone().requires_grad_()
    got = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
    lp = hat_log_probs(x, term)
    lp = torch.where(torch.isnan(lp), NINF, lp)  # the labels' 0/0: no label arc
    want = oracle_hat(x, symbols, ranges, term, torch.tensor([[0, 0, S, T]] * B), "regular",
                      lp=lp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    (g,) = torch.autograd.grad(got.sum(), x)
    assert torch.isfinite(g).all() and (g[0, 1, 0, 1:] == 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("cls", [0, 2])
def test_nan_or_inf_gives_nan_for_that_sequence_only(bad, cls):
    B, T, S, C, R, term = 3, 4, 3, 4, 2, 0
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=9)
    ok = rnnt_loss_pruned(logits, symbols, ranges, term, reduction="none", use_hat_loss=True)
    assert torch.isfinite(ok[1])
    logits[1, 0, 0, cls] = bad  # frame 0, row 0: on every path
    x = logits.clone().requires_grad_()
    loss = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none", use_hat_loss=True)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isnan(loss[1]) and torch.isnan(g[1]).any()
    assert torch.equal(loss[[0, 2]], ok[[0, 2]]) and torch.isfinite(g[[0, 2]]).all()


def test_padding_is_never_read():
    B, T, S, C, R, term = 2, 6, 3, 5, 2, 3
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=10)
    ranges[0, 3:] = torch.arange(S + 1 - R, S + 1)  # the final state in frame 3
    bnd = torch.tensor([[0, 0, S, 4], [0, 0, S, T]])
    want = rnnt_loss_pruned(logits, symbols, ranges, term, boundary=bnd, reduction="none",
                            use_hat_loss=True)
    for bad in (float("nan"), float("inf"), NINF):
        x = logits.clone()
        x[0, 4:] = bad
        x.requires_grad_()
        got = rnnt_loss_pruned(x, symbols, ranges, term, boundary=bnd, reduction="none",
                               use_hat_loss=True)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (g,) = torch.autograd.grad(got.sum(), x)
        assert torch.isfinite(g).all() and (g[0, 4:] == 0).all()


# --------------------------------------------------------------------------- dtypes, errors
def test_half_inputs_give_float32_losses():
    logits, symbols, ranges = _case(2, 4, 3, 2, 5, 1, "regular", seed=12)
    h = logits.half()
    got = rnnt_loss_pruned(h, symbols, ranges, 1, reduction="none", use_hat_loss=True)
    assert got.dtype == torch.float32
    want = oracle_hat(h.double(), symbols, ranges, 1, torch.tensor([[0, 0, 3, 4]] * 2),
                      "regular")
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_compile():
    logits, symbols, ranges = _case(2, 4, 3, 2, 5, 1, "constrained", seed=13)
    x = logits.float().requires_grad_()

    def f(x):
        return rnnt_loss_pruned(x, symbols, ranges, 1, rnnt_type="constrained", reduction="sum",
                                use_hat_loss=True)

    want = f(x)
    (gw,) = torch.autograd.grad(want, x)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    (gg,) = torch.autograd.grad(got, x)
    torch.testing.assert_close(gg, gw)


@pytest.mark.parametrize("value", ["yes", None, 2, 0.0, torch.tensor([1, 0])])
def test_use_hat_loss_must_be_a_bool(value):
    logits, symbols, ranges = _case(1, 4, 3, 2, 4, 0, "regular", seed=14)
    with pytest.raises(TypeError, match="use_hat_loss"):
        rnnt_loss_pruned(logits, symbols, ranges, 0, use_hat_loss=value)


def test_diagnose_reports_hat_log_probs():
    import seqloss

    logits, symbols, ranges = _case(2, 4, 3, 2, 5, 1, "regular", seed=15)
    logits[0, 2, 1, 1] = -30.0  # the smallest HAT log-probability: sequence 0's blank there
    rep = seqloss.diagnose("pruned", logits, symbols, ranges, 1, use_hat_loss=True)
    loss = rnnt_loss_pruned(logits, symbols, ranges, 1, reduction="none", use_hat_loss=True)
    lp = hat_log_probs(logits, 1)
    assert rep.extra["use_hat_loss"] is True
    for b, seq in enumerate(rep.sequences):
        assert seq.loss == pytest.approx(float(loss[b]), rel=1e-12)
        assert seq.min_log_prob == pytest.approx(float(lp[b].min()), rel=1e-12)


@pytest.mark.parametrize("use_hat_loss", [False, True])
def test_inf_in_a_class_no_arc_takes_gives_nan(use_hat_loss):
    """``+inf`` in a read row, in a class that is neither the row's symbol nor the blank:
    NaN for that sequence (API: ``+inf`` anywhere a sequence reads), not a loss that
    silently drops the row (the plain loss gave ``x - inf = -inf`` arcs there)."""
    B, T, S, C, R, term = 3, 4, 3, 5, 2, 0
    logits, symbols, ranges = _case(B, T, S, R, C, term, "regular", seed=17)
    ok = rnnt_loss_pruned(logits, symbols, ranges, term, reduction="none",
                          use_hat_loss=use_hat_loss)
    assert torch.isfinite(ok[1])
    other = next(c for c in range(1, C) if c != int(symbols[1, 0]))
    logits[1, 0, 0, other] = float("inf")  # frame 0, row 0: on every path
    x = logits.clone().requires_grad_()
    loss = rnnt_loss_pruned(x, symbols, ranges, term, reduction="none",
                            use_hat_loss=use_hat_loss)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert torch.isnan(loss[1]) and torch.isnan(g[1]).any()
    assert torch.equal(loss[[0, 2]], ok[[0, 2]]) and torch.isfinite(g[[0, 2]]).all()
