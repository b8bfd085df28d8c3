"""Shared fixtures: backends, dtypes, and NaN-poisoned ``torch.empty``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re

import torch

# The Triton interpreter is chosen when @triton.jit runs: set it before any kernel import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.pop("SEQLOSS_BACKEND", None)

import pytest
from hypothesis import settings

from seqloss._core import registry
from seqloss._core.registry import NAMES

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _poison(fn):
    """Fill fresh float tensors with NaN so a kernel reading unwritten memory shows up."""

    def wrapped(*args, **kwargs):
        t = fn(*args, **kwargs)
        if t.is_floating_point():
            with torch.no_grad():  # a leaf made with requires_grad=True (inductor's own)
                t.fill_(float("nan"))
        return t

    return wrapped


torch.empty = _poison(torch.empty)
torch.empty_like = _poison(torch.empty_like)


def _kernel_available(backend: str, family: str) -> str | None:
    if backend == "numba" and importlib.util.find_spec("numba") is None:
        return "numba is not installed"
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


BACKENDS = ["reference", "numba", "triton"]


def backend_params(family: str):
    out = []
    for b in BACKENDS:
        why = _kernel_available(b, family)
        marks = [pytest.mark.skip(reason=why)] if why else []
        out.append(pytest.param(b, id=b, marks=marks))
    return out


# The quick tier, `python -m pytest -q -m quick` (the README's test command): every loss
# family on every backend against its core oracles (brute force, gradcheck, torch, the
# full-joint loss), the compile path, the README; a few minutes on 2 cores from a fresh
# Numba cache. The full suite (`python -m pytest -q tests`) runs in CI (.ci/run). An entry
# is a test file, a test function (every parametrization) or a node id with `*` wildcards.
QUICK = (
    # CTC
    "tests/test_ctc.py::test_brute_force[reference-*",
    "tests/test_ctc.py::test_brute_force[numba-*",
    "tests/test_ctc.py::test_brute_force[triton-T4C4L2b3-*",
    "tests/test_ctc.py::test_matches_torch[*-padded-blank0-none]",
    "tests/test_ctc.py::test_gradcheck[numba*",
    "tests/test_ctc.py::test_half_equals_float32_on_rounded[numba-*",
    "tests/test_ctc.py::test_nonfinite_poisons_one_sequence[numba-*",
    "tests/test_ctc.py::test_value_errors_name_argument_and_index",
    "tests/test_ctc_delay_penalty.py::test_brute_force[reference-*",
    "tests/test_ctc_delay_penalty.py::test_brute_force[numba-*",
    "tests/test_ctc_delay_penalty.py::test_brute_force[triton-pos-fused]",
    "tests/test_align.py::test_ctc_brute_force[reference-*",
    "tests/test_align.py::test_ctc_brute_force[numba-*",
    "tests/test_align.py::test_ctc_brute_force[triton-random]",
    # RNN-T
    "tests/test_rnnt.py::test_brute_force[reference-*",
    "tests/test_rnnt.py::test_brute_force[numba-*",
    "tests/test_rnnt.py::test_brute_force[triton-T3U3V5b4-*",
    "tests/test_rnnt.py::test_packed_equals_padded[numba-*",
    "tests/test_rnnt.py::test_half_equals_float32_on_rounded[numba-fused-*",
    "tests/test_rnnt.py::test_torch_compile_fullgraph[numba]",
    "tests/test_rnnt.py::test_errors",
    "tests/test_align.py::test_rnnt_brute_force[reference-*",
    "tests/test_align.py::test_rnnt_brute_force[numba-*",
    "tests/test_align.py::test_rnnt_brute_force[triton-random]",
    # multi-blank, TDT, HAT
    "tests/test_multiblank.py::test_against_brute_force[reference-*",
    "tests/test_multiblank.py::test_against_brute_force[numba-*",
    "tests/test_multiblank.py::test_against_brute_force[triton-default-none]",
    "tests/test_tdt.py::test_against_brute_force[reference-*-joint]",
    "tests/test_tdt.py::test_against_brute_force[numba-*",
    "tests/test_tdt.py::test_against_brute_force[triton-default-none-joint]",
    "tests/test_hat.py::test_against_brute_force[reference-*",
    "tests/test_hat.py::test_against_brute_force[numba-*",
    "tests/test_hat.py::test_against_brute_force[triton-mean_volume]",
    "tests/test_transducer_align.py::test_multiblank_brute_force[reference-*",
    "tests/test_transducer_align.py::test_multiblank_brute_force[numba-*",
    "tests/test_transducer_align.py::test_multiblank_brute_force[triton-random]",
    "tests/test_transducer_align.py::test_tdt_brute_force[reference-*-joint]",
    "tests/test_transducer_align.py::test_tdt_brute_force[numba-*",
    "tests/test_transducer_delay_penalty.py::test_against_brute_force[reference-*-pos]",
    "tests/test_transducer_delay_penalty.py::test_against_brute_force[numba-*-pos]",
    "tests/test_transducer_delay_penalty.py::test_against_brute_force[triton-rnnt-pos]",
    # the lattice, arc log-probabilities, the losses from the joint
    "tests/test_lattice.py::test_brute_force[reference-*",
    "tests/test_lattice.py::test_brute_force[numba-*",
    "tests/test_lattice.py::test_brute_force[triton-tdt-like]",
    "tests/test_lattice.py::test_arc_logprobs_compose_with_the_lattice",
    "tests/test_arc_logprobs.py::test_matches_float64_log_softmax[dtype0-*",
    "tests/test_arc_logprobs.py::test_gradcheck_float64",
    "tests/test_from_joint.py::test_rnnt_matches_materialized[*-mean-7]",
    "tests/test_from_joint.py::test_multiblank_matches_materialized[*-7]",
    "tests/test_from_joint.py::test_tdt_matches_materialized[*-11]",
    # simple/pruned RNN-T, logmmexp
    "tests/test_factored.py::test_every_backend_against_path_enumeration",
    "tests/test_factored.py::test_pruned_against_path_enumeration",
    "tests/test_pruned_hat.py::test_every_backend_equals_the_plain_loss_on_hat_log_probs[numba]",
    "tests/test_logmmexp.py::test_values_and_grads_match_exact[reference-randn-f64]",
    "tests/test_logmmexp.py::test_values_and_grads_match_exact[numba-*",
    "tests/test_logmmexp.py::test_values_and_grads_match_exact[triton-randn-f64]",
    "tests/test_logmmexp.py::test_gradcheck_float64[numba]",
    # across families: reductions, empty batches
    "tests/test_reductions.py::test_mean_is_the_replaced_librarys",
    "tests/test_empty_inputs.py::test_empty_batch_ctc",
    "tests/test_empty_inputs.py::test_empty_batch_rnnt",
    # the public names, the README
    "tests/test_public_api.py",
    "tests/test_readme.py",
)


def _quick_matches(entry: str, nodeid: str) -> bool:
    if "*" in entry:  # `*` only: node ids hold `[`, which fnmatch would read as a set
        return re.fullmatch(".*".join(map(re.escape, entry.split("*"))), nodeid) is not None
    return nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


def _mark_quick(config, items) -> None:
    matched = set()
    for item in items:
        hits = [e for e in QUICK if _quick_matches(e, item.nodeid)]
        if hits:
            item.add_marker(pytest.mark.quick)
            matched.update(hits)
    # A renamed test must not drop out of the tier unnoticed: an entry whose file was
    # collected whole (no node ids on the command line) matches something.
    if any("::" in a for a in config.args):
        return
    files = {item.nodeid.split("::", 1)[0] for item in items}
    stale = [e for e in QUICK if e not in matched and e.split("::", 1)[0] in files]
    if stale:
        raise pytest.UsageError(f"conftest.QUICK entries match no test: {stale}")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "reference_oracle: the oracle is the reference backend, so the test's "
        "reference parametrization (which would test the reference against itself) is not run")
    config.addinivalue_line(
        "markers", "quick: the quick tier (`python -m pytest -q -m quick`), listed in "
        "conftest.QUICK")


# tryfirst: the marks must be on the items before `-m quick` selects by them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    _mark_quick(config, items)
    kept, dropped = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        params = params.params if params else {}
        self_oracle = item.get_closest_marker("reference_oracle") and any(
            (k == "backend" or k.endswith("_backend")) and v == "reference"
            for k, v in params.items())
        (dropped if self_oracle else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def other_backend(backend: str) -> str:
    """A backend other than ``backend``, for a float64 oracle that is not the code under
    test: the reference, or for the reference itself the Numba kernels."""
    if backend != "reference":
        return "reference"
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed: no oracle other than the reference itself")
    return "numba"


def device_for(backend: str) -> torch.device:
    """Triton runs on CUDA when present, else on CPU under TRITON_INTERPRET=1."""
    if backend == "triton" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def _backend_fixture(name: str):
    @pytest.fixture(params=backend_params(name), name=f"{name}_backend")
    def fixture(request) -> str:
        return request.param

    return fixture


# One `<family>_backend` fixture per registered loss family (ctc_backend, rnnt_backend, ...),
# plus the lattice and the alignments.
for _name in (*NAMES, "lattice", "align"):
    globals()[f"_{_name}_backend"] = _backend_fixture(_name)


@pytest.fixture(params=[pytest.param(n, id=n) for n in NAMES])
def family(request):
    """Each registered loss family."""
    return registry.family(request.param)


DEVICES = [pytest.param("cpu", id="cpu")] + [
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    )
]


@pytest.fixture(params=["torch_ops", "row_passes"])
def tile_ops(request, monkeypatch):
    """The CPU tiles' forward normalizers: torch's ops, or the Numba backend's row passes
    (taken by default for rows of at least ``MIN_ROW_WIDTH`` classes), forced at these
    widths. The backward's epilogue is the backend's ``joint_tile_grad`` either way."""
    if request.param == "row_passes":
        rows = pytest.importorskip("seqloss.transducer.joint.numba_rows")
        monkeypatch.setattr(rows, "MIN_ROW_WIDTH", 1)
    return request.param


# Small float64 batches for the cross-cutting tests: sequence 0 takes the full lengths,
# the others one frame and one label fewer.
def ctc_batch(T=7, B=3, C=5, S=3, seed=0, layout="tbc"):
    """``(log_probs (T, B, C) or (B, T, C) when layout="btc", targets, input_lengths,
    target_lengths)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=torch.float64) if layout == "btc" else \
        torch.randn(T, B, C, generator=g, dtype=torch.float64)
    tg = torch.randint(1, C, (B, S), generator=g)
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([S] + [S - 1] * (B - 1))
    return x, tg, il, tl


def rnnt_batch(B=2, T=3, U=2, V=4, seed=0):
    """``(logits (B, T, U+1, V), targets, logit_lengths, target_lengths)``; blank V - 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 1, (B, U), generator=g)  # blank is V - 1
    il = torch.tensor([T] + [T - 1] * (B - 1))
    tl = torch.tensor([U] + [U - 1] * (B - 1))
    return x, tg, il, tl
