"""Data-derived tolerance checks with separate reporting of non-finite mismatches."""

from __future__ import annotations

import torch


def assert_close_budget(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    rtol: float,
    atol_scale: float = 0.0,
    atol: float = 0.0,
    what: str = "value",
) -> None:
    """``|a - e| <= rtol * |e| + atol_scale * max|e| + atol`` elementwise.

    NaN/inf positions must match exactly; they are reported separately from
    finite mismatches so a NaN never hides inside a tolerance.
    """
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        idx = (nan_a != nan_e).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: NaN positions differ at {idx}")
    inf_a, inf_e = torch.isinf(a), torch.isinf(e)
    if not torch.equal(inf_a, inf_e) or not torch.equal(a[inf_a], e[inf_e]):
        idx = (inf_a != inf_e).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: inf positions/signs differ at {idx}")
    fin = torch.isfinite(e)
    if not fin.any():
        return
    af, ef = a[fin], e[fin]
    bound = rtol * ef.abs() + atol_scale * ef.abs().max() + atol
    err = (af - ef).abs()
    if (err > bound).any():
        i = int(((err - bound)).argmax())
        raise AssertionError(
            f"{what}: max violation at flat index {i}: actual {af[i].item():.10g}, "
            f"expected {ef[i].item():.10g}, |diff| {err[i].item():.3g} "
            f"> bound {bound[i].item():.3g} "
            f"({int((err > bound).sum())} of {err.numel()} elements)"
        )
