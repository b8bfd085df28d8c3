"""Float32 and half-precision gradients against float64 on the same (rounded) inputs.

For every differentiable public function at the sizes where float32 state values reach
thousands of nats (CTC T=5000, S=1000; transducers T=1000, U=100; the lattice also
T=4000): the relative Frobenius error of the float32 gradient against the float64
gradient of the same inputs is at most 2e-6. float16/bfloat16 inputs: the gradient,
returned in the input's dtype, is within that dtype's own rounding (unit roundoff) of
the float64 gradient of the rounded inputs. The oracle is the float64 computation of
the same function (its own correctness is checked against brute force and gradcheck
elsewhere); the float64 path never shares the float32 path's rounding. The cases live
in ``seqloss.testing.precision`` (the benchmark's table uses them too).
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import device_for

from seqloss.testing.precision import (
    CASES,
    F32_TOL,
    HALF_TOL,
    gradient_errors,
    lattice_many_case,
    lattice_rnnt_case,
)
from seqloss.testing.precision import gradient_error as _error


@functools.cache
def _float32_errors(case: str) -> dict[str, float]:
    """One float32 and one float64 backward per case, shared by the two float32 tests."""
    fn, inputs = CASES[case]()
    return gradient_errors(fn, inputs, torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_float32_gradient_within_2e_6_of_float64(case):
    err = _float32_errors(case)["inputs"]
    assert err <= F32_TOL, f"{case}: float32 gradient {err:.3g} from float64"


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("_from_joint")])
def test_joint_parameter_gradients_no_worse_than_the_materialized_joint(case):
    """A joint's parameter gradient sums ``T U`` rows in the joint's own backward (torch's
    float32 matmul: ~1e-6 here): the loss from the joint adds nothing to that error
    beyond the materialized pipeline's (``loss(joint(enc, pred))``) in the same dtype."""
    fn, inputs = CASES[case]()
    err = _float32_errors(case)["params"]
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
    # Interpreted Triton (~0.1 s a diagonal): its float32 error is ~2.5e-8 at 100x20,
    # 150x30, 200x40 and 300x50 alike.
    T, U = (100, 20) if backend == "triton" else (1000, 100)
    dev = device_for(backend)
    fn, inputs = (lattice_rnnt_case(T, U, backend, dev) if kind == "rnnt"
                  else lattice_many_case(T, U, backend, dev))
    err = _error(fn, inputs, torch.float32)
    assert err <= F32_TOL, f"{backend} {kind}: float32 gradient {err:.3g} from float64"
