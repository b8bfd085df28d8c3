"""Losses from the joint network against the materialized joint through the full-joint losses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import seqloss

SEED = 1234


class Joint(nn.Module):
    """``Linear(tanh(enc_proj + pred_proj))``, optional dropout before the output layer."""

    def __init__(self, He: int, Hp: int, H: int, W: int, p: float = 0.0,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.enc = nn.Linear(He, H, dtype=dtype)
        self.pred = nn.Linear(Hp, H, dtype=dtype)
        self.out = nn.Linear(H, W, dtype=dtype)
        self.drop = nn.Dropout(p)

    def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None])
        return self.out(self.drop(h))


def _case(B=3, T=6, U=4, V=7, D=0, He=5, Hp=4, H=8, seed=0, p=0.0, dtype=torch.float64,
          tl=None, Tl=None):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joint = Joint(He, Hp, H, V + D, p, dtype)
    with torch.no_grad():
        joint.out.weight.mul_(3.0)
    enc = torch.randn(B, T, He, generator=g, dtype=dtype).requires_grad_()
    pred = torch.randn(B, U + 1, Hp, generator=g, dtype=dtype).requires_grad_()
    # labels avoid the top classes (blank, big blanks)
    targets = torch.randint(1, max(V - 3, 2), (B, U), generator=g)
    Tl = torch.tensor(Tl if Tl is not None else [T - (b % 3) for b in range(B)], dtype=torch.long)
    tl = torch.tensor(tl if tl is not None else [U - (b % 2) * (b % 4) for b in range(B)],
                      dtype=torch.long)
    return joint, enc, pred, targets, Tl, tl


def _grads(loss, joint, enc, pred):
    params = [p for p in joint.parameters()]
    return torch.autograd.grad(loss, [enc, pred, *params], retain_graph=True, allow_unused=True)


def _compare(kind, kw, chunk, seed=0, reduction="mean", **case):
    D = len(kw["durations"]) if kind == "tdt" else 0
    joint, enc, pred, tg, Tl, tl = _case(D=D, seed=seed, **case)
    logits = joint(enc, pred)
    if kind == "rnnt":
        ref = seqloss.rnnt_loss(logits, tg, Tl, tl, reduction=reduction, **kw)
        got = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction=reduction,
                                           chunk_elements=chunk, **kw)
    elif kind == "mb":
        ref = seqloss.multiblank_rnnt_loss(logits, tg, Tl, tl, reduction=reduction, **kw)
        got = seqloss.multiblank_rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl,
                                                      reduction=reduction, chunk_elements=chunk,
                                                      **kw)
    else:
        ref = seqloss.tdt_loss(logits, tg, Tl, tl, reduction=reduction, **kw)
        got = seqloss.tdt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction=reduction,
                                          chunk_elements=chunk, **kw)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, equal_nan=True)
    w = torch.linspace(0.5, 1.5, ref.numel(), dtype=ref.dtype).reshape(ref.shape)
    fin = torch.isfinite(ref)
    gr = _grads((torch.where(fin, ref, 0.0) * w).sum(), joint, enc, pred)
    gg = _grads((torch.where(fin, got, 0.0) * w).sum(), joint, enc, pred)
    for a, b in zip(gg, gr, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    return got


V, U1 = 7, 5
CHUNKS = [1, V, 3 * V, 10**9]  # below one row (one row), one row, a few rows, the whole batch


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_volume"])
def test_rnnt_matches_materialized(chunk, reduction, tile_ops):
    _compare("rnnt", {}, chunk, reduction=reduction)


@pytest.mark.parametrize("last", ["log_softmax", "relu", "linear"])
@pytest.mark.parametrize("kind", ["rnnt", "mb"])
def test_joint_whose_backward_reads_its_output(kind, last, tile_ops):
    """The row passes write a tile's gradient over its logits only where the joint's
    backward does not read them (a final matmul); a joint ending in ``log_softmax`` or
    ``relu`` saves its output, which must reach its backward intact."""
    joint, enc, pred, tg, Tl, tl = _case(V=9, seed=2)
    fn = {"log_softmax": lambda z: torch.log_softmax(z, -1), "relu": torch.relu,
          "linear": lambda z: z}[last]

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.joint = joint

        def forward(self, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return fn(self.joint(e, p))

    wrapped = Wrapped()
    kw = {"big_blank_durations": [2]} if kind == "mb" else {}
    loss_fn = seqloss.multiblank_rnnt_loss if kind == "mb" else seqloss.rnnt_loss
    from_joint = (seqloss.multiblank_rnnt_loss_from_joint if kind == "mb"
                  else seqloss.rnnt_loss_from_joint)
    for chunk in (9, 10**9):
        ref = loss_fn(wrapped(enc, pred), tg, Tl, tl, reduction="sum", **kw)
        got = from_joint(enc, pred, wrapped, tg, Tl, tl, reduction="sum", chunk_elements=chunk,
                         **kw)
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
        for a, b in zip(_grads(got, joint, enc, pred), _grads(ref, joint, enc, pred),
                        strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunk", [V, 2 * V * U1, 10**9])
@pytest.mark.parametrize("kw", [{"clamp": 0.05}, {"fastemit_lambda": 0.3},
                                {"blank": 0, "clamp": 0.1, "fastemit_lambda": 0.2}])
def test_rnnt_keywords(chunk, kw, tile_ops):
    _compare("rnnt", kw, chunk, reduction="sum", seed=1)


def test_rnnt_padding_beyond_longest_and_wide_targets():
    # T and U+1 larger than any sequence needs; padding frames hold NaN (never read).
    joint, enc, pred, tg, Tl, tl = _case(B=3, T=8, U=6, Tl=[5, 3, 4], tl=[3, 1, 2])
    with torch.no_grad():
        enc[1, 3:] = float("nan")
        pred[1, 2:] = float("nan")
    enc.grad = None
    got = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction="sum",
                                       chunk_elements=2 * V)
    e2 = torch.where(torch.isnan(enc), 0.0, enc.detach()).requires_grad_()
    p2 = torch.where(torch.isnan(pred), 0.0, pred.detach()).requires_grad_()
    ref = seqloss.rnnt_loss(joint(e2, p2), tg, Tl, tl, reduction="sum")
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    ge, gp, *gw = _grads(got, joint, enc, pred)
    re, rp, *rw = _grads(ref, joint, e2, p2)
    assert torch.isfinite(ge).all() and (ge[1, 3:] == 0).all() and (gp[1, 2:] == 0).all()
    torch.testing.assert_close(ge, re, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gp, rp, rtol=1e-9, atol=1e-9)
    for a, b in zip(gw, rw, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("chunk", [V, 10**9])
def test_zero_frames(zero_infinity, chunk):
    joint, enc, pred, tg, Tl, tl = _case(B=3, Tl=[6, 0, 4], tl=[2, 3, 1])
    got = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction="none",
                                       zero_infinity=zero_infinity, chunk_elements=chunk)
    ref = seqloss.rnnt_loss(joint(enc, pred), tg, Tl, tl, reduction="none",
                            zero_infinity=zero_infinity)
    assert got[1] == (0.0 if zero_infinity else float("inf"))
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    ge, gp, *_ = _grads(torch.where(torch.isfinite(got), got, 0.0).sum(), joint, enc, pred)
    assert (ge[1] == 0).all() and (gp[1] == 0).all()
    if zero_infinity:
        gs = _grads(got.sum(), joint, enc, pred)
        gr = _grads(ref.sum(), joint, enc, pred)
        for a, b in zip(gs, gr, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_all_zero_frames_and_empty_batch():
    joint, enc, pred, tg, Tl, tl = _case(B=2, Tl=[0, 0], tl=[1, 2])
    got = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction="sum",
                                       zero_infinity=True)
    assert got.item() == 0.0
    ge, gp, *gw = _grads(got, joint, enc, pred)
    assert all((g is None or (g == 0).all()) for g in (ge, gp, *gw))
    joint, enc, pred, tg, Tl, tl = _case(B=0, tl=[], Tl=[])
    out = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction="none")
    assert out.shape == (0,)
    assert seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl).item() == 0.0


def test_errors_match_the_full_joint():
    joint, enc, pred, tg, Tl, tl = _case()
    bad = tg.clone()
    bad[0, 0] = V - 1  # the blank
    for fn, args in ((seqloss.rnnt_loss, (joint(enc, pred),)), ):
        with pytest.raises(seqloss.InputError, match="targets"):
            fn(*args, bad, Tl, tl)
    with pytest.raises(seqloss.InputError, match="targets"):
        seqloss.rnnt_loss_from_joint(enc, pred, joint, bad, Tl, tl)
    with pytest.raises(seqloss.InputError, match="logit_lengths"):
        seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl + 10, tl)
    with pytest.raises(seqloss.InputError, match="reduction"):
        seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, reduction="avg")
    with pytest.raises(seqloss.InputError, match="chunk_elements"):
        seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, chunk_elements=0)
    with pytest.raises(seqloss.InputError, match="joint"):
        seqloss.rnnt_loss_from_joint(enc, pred, lambda e, p: e, tg, Tl, tl)
    with pytest.raises(TypeError):
        seqloss.rnnt_loss_from_joint(enc.long(), pred, joint, tg, Tl, tl)


def test_plain_callable_joint_and_retain_graph():
    joint, enc, pred, tg, Tl, tl = _case()
    fn = lambda e, p: joint(e, p)  # not a Module: inner backward into .grad
    loss = seqloss.rnnt_loss_from_joint(enc, pred, fn, tg, Tl, tl, chunk_elements=2 * V)
    loss.backward(retain_graph=True)
    loss.backward()  # a second backward doubles every gradient
    g1 = [enc.grad.clone(), pred.grad.clone(), *[p.grad.clone() for p in joint.parameters()]]
    for t in (enc, pred, *joint.parameters()):
        t.grad = None
    ref = seqloss.rnnt_loss(joint(enc, pred), tg, Tl, tl)
    ref.backward()
    g2 = [enc.grad, pred.grad, *[p.grad for p in joint.parameters()]]
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, 2 * b, rtol=1e-9, atol=1e-9)


def test_torch_compile_runs_it_eagerly_and_fullgraph_says_why():
    """Inside a compiled model the loss is a graph break (eager, same values and
    gradients); ``fullgraph=True`` raises the compiler's error naming the reason."""
    joint, enc, pred, tg, Tl, tl = _case()
    want = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl) * 2
    gw = _grads(want, joint, enc, pred)
    torch._dynamo.reset()
    f = torch.compile(lambda e, p: seqloss.rnnt_loss_from_joint(e, p, joint, tg, Tl, tl) * 2)
    got = f(enc, pred)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(_grads(got, joint, enc, pred), gw, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch._dynamo.reset()
    g = torch.compile(lambda e, p: seqloss.rnnt_loss_from_joint(e, p, joint, tg, Tl, tl),
                      fullgraph=True)
    with pytest.raises(Exception, match="losses from the joint network run eagerly"):
        g(enc, pred)


# --------------------------------------------------------------------------- variants
MB = {"big_blank_durations": [2, 3]}


@pytest.mark.parametrize("chunk", [V, 3 * V, 10**9])
@pytest.mark.parametrize("kw", [{}, {"sigma": 0.05, "clamp": 0.05, "fastemit_lambda": 0.2}])
def test_multiblank_matches_materialized(chunk, kw, tile_ops):
    _compare("mb", {**MB, **kw}, chunk, reduction="mean_volume")


@pytest.mark.parametrize("chunk", [V + 4, 3 * (V + 4), 10**9])
@pytest.mark.parametrize("kw", [{}, {"omega": 0.3, "sigma": 0.05},
                                {"omega": 0.4, "clamp": 0.05}, {"omega": 1.0}])
def test_tdt_matches_materialized(chunk, kw):
    _compare("tdt", {"durations": [0, 1, 2, 3], **kw}, chunk, reduction="mean")


def test_variants_reductions_and_zero_frames():
    for red in ("none", "sum", "mean_volume"):
        _compare("mb", MB, 2 * V, reduction=red, Tl=[6, 0, 4], tl=[2, 3, 1])
        _compare("tdt", {"durations": [0, 1, 2], "omega": 0.5}, 2 * (V + 3), reduction=red,
                 Tl=[6, 0, 4], tl=[2, 3, 1])
    got = _compare("tdt", {"durations": [0, 1, 2], "zero_infinity": True}, 2 * (V + 3),
                   reduction="none", Tl=[6, 0, 4], tl=[2, 3, 1])
    assert got[1] == 0.0


# --------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("chunk", [V, 10**9])
def test_dropout_gradient_is_the_derivative_of_the_loss(chunk):
    joint, enc, pred, tg, Tl, tl = _case(p=0.3)
    joint.train()
    params = [enc, pred, *joint.parameters()]
    dirs = [torch.randn_like(p) for p in params]

    def f(eps: float) -> torch.Tensor:
        if eps == 0.0:
            torch.manual_seed(SEED)
            return seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl,
                                                chunk_elements=chunk)
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            for p, d in zip(params, dirs, strict=True):
                p.add_(eps * d)
            torch.manual_seed(SEED)
            out = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl,
                                               chunk_elements=chunk)
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
        return out

    loss = f(0.0)
    grads = torch.autograd.grad(loss, params)
    analytic = sum((g * d).sum() for g, d in zip(grads, dirs, strict=True))
    h = 1e-6
    with torch.no_grad():
        numeric = (f(h) - f(-h)) / (2 * h)
    torch.testing.assert_close(analytic, numeric, rtol=1e-6, atol=1e-8)
    # and the masks really differ from a second draw
    torch.manual_seed(SEED + 1)
    other = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, chunk_elements=chunk)
    assert abs(other.item() - loss.item()) > 1e-6


# --------------------------------------------------------------------------- autocast
def test_bfloat16_autocast_close_to_float32():
    joint, enc, pred, tg, Tl, tl = _case(B=2, T=10, U=6, V=30, H=16, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, chunk_elements=64)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    gb = _grads(got, joint, enc, pred)
    ref = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, chunk_elements=64)
    gf = _grads(ref, joint, enc, pred)
    torch.testing.assert_close(got, ref, rtol=3e-2, atol=3e-2)
    for a, b in zip(gb, gf, strict=True):
        assert a.dtype == b.dtype and torch.isfinite(a).all()
        assert (a - b).norm() <= 0.1 * b.norm() + 1e-3


# --------------------------------------------------------------------------- memory
_MEM_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    import seqloss
    from torch import nn
    torch.manual_seed(0)
    B, T, U, V, H = 1, 640, 100, 2048, 4   # logits: 640*101*2048*4 B = 530 MB
    mode = sys.argv[1]
    class J(nn.Module):
        def __init__(s):
            super().__init__(); s.out = nn.Linear(H, V)
        def forward(s, e, p):
            return s.out(torch.tanh(e[:, :, None] + p[:, None]))
    j = J()
    enc = torch.randn(B, T, H, requires_grad=True)
    pred = torch.randn(B, U + 1, H, requires_grad=True)
    tg = torch.randint(0, V - 1, (B, U))
    Tl = torch.full((B,), T); tl = torch.full((B,), U)
    # warm-up on a tiny problem (numba compilation, allocator)
    seqloss.rnnt_loss_from_joint(enc[:, :4], pred, j, tg, torch.full((B,), 4), tl,
                                 chunk_elements=2**18).backward()
    def hwm():  # VmHWM: per address space (ru_maxrss is inherited across fork + exec)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    base = hwm()
    loss = seqloss.rnnt_loss_from_joint(enc, pred, j, tg, Tl, tl, chunk_elements=2**20)
    loss.backward()
    print(f"{hwm() - base:.1f}", float(loss.detach()))
""")


def test_memory_is_bounded_by_the_tile():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", _MEM_SCRIPT, "x"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    extra_mb, loss = out.stdout.split()
    assert float(loss) == float(loss)  # finite, not NaN
    assert float(extra_mb) < 300, out.stdout  # the materialized logits alone: 530 MB


@pytest.mark.parametrize("empty", ["batch", "frames"])
def test_no_tile_still_gives_every_parameter_a_gradient(empty):
    """An empty batch (or every T_b = 0) runs no tile; the joint's parameters still get a
    gradient (zero), so a data-parallel rank without data joins the reduction."""
    joint, enc, pred, tg, Tl, tl = _case()
    if empty == "batch":
        enc, pred, tg = (enc[:0].detach().requires_grad_(), pred[:0].detach().requires_grad_(),
                         tg[:0])
        Tl, tl = Tl[:0], tl[:0]
    else:
        Tl = torch.zeros_like(Tl)
    loss = seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl, zero_infinity=True)
    grads = torch.autograd.grad(loss, [enc, pred, *joint.parameters()])
    assert loss.item() == 0.0
    assert all(g is not None and (g == 0).all() for g in grads)


# --------------------------------------------------------------------------- the pair joint
class PairJoint(nn.Module):
    """transformers' Parakeet TDT head: one hidden state, a token head and a duration head,
    returned as ``(token_logits, duration_logits)`` (``pair=False``: concatenated)."""

    def __init__(self, He: int, Hp: int, H: int, V: int, D: int, pair: bool = True) -> None:
        super().__init__()
        self.enc = nn.Linear(He, H, dtype=torch.float64)
        self.pred = nn.Linear(Hp, H, dtype=torch.float64)
        self.tok = nn.Linear(H, V, dtype=torch.float64)
        self.dur = nn.Linear(H, D, dtype=torch.float64)
        self.pair = pair

    def forward(self, e: torch.Tensor, p: torch.Tensor):
        h = torch.tanh(self.enc(e)[:, :, None] + self.pred(p)[:, None])
        tok, dur = self.tok(h) * 3.0, self.dur(h)
        return (tok, dur) if self.pair else torch.cat((tok, dur), dim=-1)


def _pair_case(D, seed=5):
    _, enc, pred, tg, Tl, tl = _case(D=D, seed=seed)
    torch.manual_seed(seed)
    return PairJoint(5, 4, 8, V, D), enc, pred, tg, Tl, tl


@pytest.mark.parametrize("chunk", [1, V + 4, 3 * (V + 4), None])
@pytest.mark.parametrize("kw", [{"reduction": "mean"},
                                {"reduction": "none", "omega": 0.3, "sigma": 0.05}])
def test_tdt_pair_joint_matches_concatenated(chunk, kw):
    """The pair joint gives the value and the gradients (encoder, predictor, every
    parameter of both heads) of the concatenated joint and of ``tdt_loss`` on the
    materialized pair."""
    durs = [0, 1, 2, 3]
    joint, enc, pred, tg, Tl, tl = _pair_case(len(durs))
    got = seqloss.tdt_loss_from_joint(enc, pred, joint, tg, Tl, tl, durs, chunk_elements=chunk,
                                      **kw)
    ref = seqloss.tdt_loss(joint(enc, pred), tg, Tl, tl, durs, **kw)  # tdt_loss's pair path
    joint.pair = False
    cat = seqloss.tdt_loss_from_joint(enc, pred, joint, tg, Tl, tl, durs, chunk_elements=chunk,
                                      **kw)
    assert got.dtype == torch.float64 and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got, cat, rtol=1e-12, atol=1e-12)
    w = torch.linspace(0.5, 1.5, ref.numel(), dtype=ref.dtype).reshape(ref.shape)
    for a, b, c in zip(*(_grads((x * w).sum(), joint, enc, pred) for x in (got, ref, cat)),
                       strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)


def test_tdt_pair_from_a_plain_callable():
    """A pair joint that is no Module: the gradients reach what it closes over (.grad)."""
    durs = [0, 1, 2]
    joint, enc, pred, tg, Tl, tl = _pair_case(len(durs), seed=6)
    fn = lambda e, p: joint(e, p)  # not a Module: inner backward into .grad
    seqloss.tdt_loss_from_joint(enc, pred, fn, tg, Tl, tl, durs, chunk_elements=2 * V,
                                reduction="sum").backward()
    got = [enc.grad, pred.grad, *[p.grad for p in joint.parameters()]]
    want = torch.autograd.grad(seqloss.tdt_loss(joint(enc, pred), tg, Tl, tl, durs,
                                                reduction="sum"),
                               [enc, pred, *joint.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_tdt_pair_joint_errors_name_the_joint():
    durs = [0, 1, 2, 3]
    joint, enc, pred, tg, Tl, tl = _pair_case(len(durs))

    def run(fn):
        return seqloss.tdt_loss_from_joint(enc, pred, fn, tg, Tl, tl, durs)

    what = r"joint\(encoder_out\[b0:b1, t0:t1\], predictor_out\[b0:b1, u0:u1\]\) returned "
    with pytest.raises(seqloss.InputError, match=what + r"token_logits \(1, 1, 1, 7\) and "
                       r"duration_logits \(1, 2, 1, 4\)"):
        run(lambda e, p: (joint(e, p)[0], joint(e, p)[1].expand(-1, 2, -1, -1)))
    with pytest.raises(seqloss.InputError, match=what + "duration_logits with 5 classes: "
                       r"expected len\(durations\) = 4"):
        run(lambda e, p: (joint(e, p)[0], torch.cat([joint(e, p)[1]] * 2, -1)[..., :5]))
    with pytest.raises(seqloss.InputError, match=what + "a tuple of 3: a pair must be"):
        run(lambda e, p: (*joint(e, p), joint(e, p)[1]))
    with pytest.raises(TypeError, match=what + "a pair of dtypes"):
        run(lambda e, p: (joint(e, p)[0], joint(e, p)[1].float()))
    # rnnt_loss_from_joint takes no pair: one joint output, one set of classes
    with pytest.raises(seqloss.InputError, match="joint"):
        seqloss.rnnt_loss_from_joint(enc, pred, joint, tg, Tl, tl)
