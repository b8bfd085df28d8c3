"""Triton kernels (CUDA; CPU under ``TRITON_INTERPRET=1``), one module per loss family.

Supported: triton >= 3.0 (the one torch 2.4 ships). The interpreter of the older
releases needs two things from this package, both done at import and only when
``TRITON_INTERPRET`` is set (compiled kernels are untouched): see
:func:`_interpreter_compat`. The kernels themselves avoid three constructs those
interpreters get wrong (``~`` on a boolean block, a scalar store mask, a string
``tl.constexpr`` annotation); the comments at those lines say which release.
"""

from __future__ import annotations

import os


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _interpreter_compat() -> None:
    """Make the interpreter of older Triton releases usable, or refuse loudly.

    * triton <= 3.6 with numpy >= 2.4. The interpreter holds every scalar as a
      one-element 1-D array and gives ``tl.tensor`` an ``__index__`` of
      ``int(handle.data)``: Python calls it for a run-time loop bound such as
      ``range(1, T_b)``. numpy 2.4 refuses ``int()`` of an array that is not 0-d
      ("only 0-dimensional arrays can be converted to Python scalars"); later
      Triton squeezes the array first. The interpreter re-installs ``__index__`` on
      every launch, so that installer is wrapped to put a one-element version back.
    * triton < 3.2 with numpy >= 2. Its interpreter's C extension was built for
      numpy 1.x; under numpy 2 every ``tl.store`` is silently dropped (outputs keep
      their initial fill). Nothing can repair that from here: refuse to run.
    """
    if not _interpreting():
        return
    import numpy as np
    import triton

    triton_version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    if triton_version < (3, 2) and int(np.__version__.split(".")[0]) >= 2:
        raise RuntimeError(
            f"the interpreter of triton {triton.__version__} (TRITON_INTERPRET=1) needs "
            f"numpy < 2 (found {np.__version__}): under numpy 2 it drops every store. "
            "Install numpy<2 or triton>=3.2."
        )
    from triton.runtime import interpreter

    install = getattr(interpreter, "_patch_lang_tensor", None)
    if install is None or getattr(install, "_seqloss_compat", False):
        return

    def _index(self) -> int:
        return int(self.handle.data.item())

    def _patch_lang_tensor(tensor, *args, **kwargs):
        out = install(tensor, *args, **kwargs)
        tensor.__index__ = _index
        return out

    _patch_lang_tensor._seqloss_compat = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = _patch_lang_tensor


_interpreter_compat()


def state_warps(block_k: int) -> int:
    """Warps for a serial recursion with a barrier per step: few, about 2 states per thread."""
    return max(1, min(8, block_k // 64))
