"""The family registry: each entry names its loss, and diagnose, bench, the CLI's choices
and conftest's ``<family>_backend`` fixtures are read off it (no per-variant code)."""

from __future__ import annotations

import pytest
from conftest import BACKENDS

import seqloss
from seqloss import bench, cli
from seqloss._core import registry
from seqloss.diagnose import KINDS, diagnose_transducer


@pytest.mark.parametrize("name,fn", [
    ("multiblank", "multiblank_rnnt_loss"),
    ("tdt", "tdt_loss"),
])
def test_registry_entries(name, fn):
    fam = registry.family(name)
    assert fam.loss_fn() is getattr(seqloss, fn)
    assert fam.input_name == "logits" and fam.kernels == "joint"
    # The generic transducer report and benchmark, read off the entry: no per-variant code.
    assert fam.diagnose is None and fam.bench is None and fam.transducer is not None
    assert fam.diagnose_fn().func is diagnose_transducer
    mod = fam.bench_module()
    assert mod.name == name and mod.seqloss_name == f"seqloss {name}"
    for attr in ("cases", "implementations", "run", "pair_rows"):
        assert callable(getattr(mod, attr))
    assert name in registry.NAMES and name in bench.LOSSES
    assert name in KINDS


def test_backend_fixtures_for_multiblank_and_tdt(multiblank_backend, tdt_backend):
    # conftest makes one <family>_backend fixture per registered family.
    assert multiblank_backend in BACKENDS and tdt_backend in BACKENDS


def test_cli_choices_name_multiblank_and_tdt():
    p = cli.build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    loss = next(a for a in sub.choices["bench"]._actions if a.dest == "loss")
    assert {"multiblank", "tdt"} <= set(loss.choices)


def test_hat_registry_entry_and_cli_choice():
    fam = registry.family("hat")
    assert fam.loss_fn() is seqloss.hat_loss and fam.input_name == "logits"
    assert fam.diagnose_fn().func is diagnose_transducer
    mod = fam.bench_module()
    assert {"seqloss hat", "seqloss rnnt_loss"} <= set(mod.implementations())
    assert "hat" in KINDS and "hat" in bench.LOSSES
    p = cli.build_parser()
    sub = next(a for a in p._actions if a.dest == "command")
    loss = next(a for a in sub.choices["bench"]._actions if a.dest == "loss")
    assert "hat" in loss.choices
