"""CTC input checks: every bad input raises before any kernel runs, naming argument and index."""

from __future__ import annotations

import pytest
import torch

import seqloss
from seqloss import InputError


def _ok(T=8, B=3, C=5, S=4):
    lp = torch.randn(T, B, C).log_softmax(-1)
    tg = torch.randint(1, C, (B, S))
    il = torch.full((B,), T)
    tl = torch.full((B,), S - 1)
    return lp, tg, il, tl


def test_input_error_is_value_and_runtime_error():
    assert issubclass(InputError, ValueError) and issubclass(InputError, RuntimeError)


@pytest.mark.parametrize("backend", ["reference", "numba", "numba-pool"])
def test_value_errors_name_argument_and_index(backend, monkeypatch):
    if backend == "numba-pool":
        # A batch this small runs on the calling thread in one Numba call (checks
        # included); force the pool's path, whose checks run in a call of their own.
        from seqloss.ctc import numba_cpu

        monkeypatch.setattr(numba_cpu, "POOL_MIN_CELLS", 0)
        old = torch.get_num_threads()
        torch.set_num_threads(2)
        monkeypatch.setattr(numba_cpu, "_ctc_chunk", _no_kernel)
        backend = "numba"
        try:
            _value_cases(backend)
        finally:
            torch.set_num_threads(old)
        return
    _value_cases(backend)


def _no_kernel(*args):
    raise AssertionError("a kernel ran before the checks raised")


def _value_cases(backend: str) -> None:
    lp, tg, il, tl = _ok()
    cases = [
        (dict(il=torch.tensor([8, -1, 8])), r"input_lengths\[1\] = -1 is negative"),
        (dict(il=torch.tensor([8, 8, 9])), r"input_lengths\[2\] = 9 exceeds"),
        (dict(tl=torch.tensor([3, -2, 3])), r"target_lengths\[1\] = -2 is negative"),
        (dict(tl=torch.tensor([5, 3, 3])), r"target_lengths\[0\] = 5 exceeds targets.size\(1\)"),
        (dict(tg=torch.tensor([[1, 2, 3, 0], [1, 7, 1, 1], [1, 1, 1, 1]])),
         r"targets\[1, 1\] = 7 is out of range"),
        (dict(tg=torch.tensor([[1, 2, 3, 0], [1, 1, 1, 1], [1, -3, 1, 1]])),
         r"targets\[2, 1\] = -3 is out of range"),
        (dict(tg=torch.tensor([[1, 0, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1]])),
         r"targets\[0, 1\] = 0 equals blank"),
    ]
    for kw, msg in cases:
        args = dict(lp=lp, tg=tg, il=il, tl=tl) | kw
        with pytest.raises(InputError, match=msg):
            seqloss.ctc_loss(args["lp"], args["tg"], args["il"], args["tl"], backend=backend)


def test_padding_ids_are_not_validated():
    lp, tg, il, tl = _ok()
    tg[:, -1] = -1  # ESPnet pads with -1; target_lengths = S - 1 never reads it
    loss = seqloss.ctc_loss(lp, tg, il, tl, reduction="none")
    assert torch.isfinite(loss).all()


def test_concatenated_targets_errors():
    lp, _, il, _ = _ok()
    tl = torch.tensor([2, 1, 2])
    with pytest.raises(InputError, match="sum to 5 but the concatenated 1-D targets hold 4"):
        seqloss.ctc_loss(lp, torch.tensor([1, 2, 3, 4]), il, tl)
    with pytest.raises(InputError, match=r"batch item 1, position 0"):
        seqloss.ctc_loss(lp, torch.tensor([1, 2, 9, 4, 4]), il, tl)


def test_shape_errors():
    lp, tg, il, tl = _ok()
    with pytest.raises(InputError, match="input_lengths must have shape \\(3,\\)"):
        seqloss.ctc_loss(lp, tg, il[:2], tl)
    with pytest.raises(InputError, match="target_lengths must have shape \\(3,\\)"):
        seqloss.ctc_loss(lp, tg, il, torch.tensor([1, 1, 1, 1]))
    with pytest.raises(InputError, match="targets must have shape \\(B=3, S\\)"):
        seqloss.ctc_loss(lp, tg[:2], il, tl)
    with pytest.raises(InputError, match="log_probs must be"):
        seqloss.ctc_loss(lp[None], tg, il, tl)
    with pytest.raises(InputError, match="blank = 5 is out of range"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=5)
    with pytest.raises(InputError, match="blank = -1 is out of range"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=-1)
    with pytest.raises(InputError, match="reduction"):
        seqloss.ctc_loss(lp, tg, il, tl, reduction="avg")
    with pytest.raises(InputError, match="backend='cuda'"):
        seqloss.ctc_loss(lp, tg, il, tl, backend="cuda")
    with pytest.raises(InputError, match="targets must be"):
        seqloss.ctc_loss(lp, tg[None], il, tl)


def test_type_errors():
    lp, tg, il, tl = _ok()
    with pytest.raises(TypeError, match="log_probs must be float16"):
        seqloss.ctc_loss(lp.long(), tg, il, tl)
    with pytest.raises(TypeError, match="targets must be an int32 or int64 tensor"):
        seqloss.ctc_loss(lp, tg.float(), il, tl)
    with pytest.raises(TypeError, match="input_lengths must be an int32 or int64 tensor"):
        seqloss.ctc_loss(lp, tg, il.float(), tl)
    with pytest.raises(TypeError, match="target_lengths\\[0\\] must be an int"):
        seqloss.ctc_loss(lp, tg, il, [3.0, 3, 3])
    with pytest.raises(TypeError, match="blank must be an int"):
        seqloss.ctc_loss(lp, tg, il, tl, blank=0.0)


def test_lengths_as_python_sequences_and_int32():
    lp, tg, il, tl = _ok()
    a = seqloss.ctc_loss(lp, tg, il.tolist(), tl.tolist(), reduction="none")
    b = seqloss.ctc_loss(lp, tg.int(), il.int(), tl.int(), reduction="none")
    c = seqloss.ctc_loss(lp, tg.tolist(), tuple(il.tolist()), tl, reduction="none")
    assert torch.equal(a, b) and torch.equal(a, c)


def test_validate_false_skips_value_checks_but_computes_valid_input():
    lp, tg, il, tl = _ok()
    a = seqloss.ctc_loss(lp, tg, il, tl, validate=False)
    b = seqloss.ctc_loss(lp, tg, il, tl)
    assert torch.equal(a, b)


def test_double_backward_raises():
    lp, tg, il, tl = _ok()
    x = lp.double().requires_grad_()
    loss = seqloss.ctc_loss(x, tg, il, tl, backend="reference")
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        g.sum().backward()


def test_env_var_selects_backend(monkeypatch):
    lp, tg, il, tl = _ok()
    monkeypatch.setenv("SEQLOSS_BACKEND", "bogus")
    with pytest.raises(InputError, match="SEQLOSS_BACKEND='bogus'"):
        seqloss.ctc_loss(lp, tg, il, tl)
    monkeypatch.setenv("SEQLOSS_BACKEND", "reference")
    a = seqloss.ctc_loss(lp, tg, il, tl)
    monkeypatch.delenv("SEQLOSS_BACKEND")
    b = seqloss.ctc_loss(lp, tg, il, tl, backend="reference")
    assert torch.equal(a, b)
