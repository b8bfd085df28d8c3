"""The factored joint: k2's simple, smoothed and pruned RNN-T losses, exactly.

``api.py`` (the losses), ``prune.py`` (pruning bounds and the pruned joiner inputs),
``arcs.py`` (the arc tables fed to ``transducer_lattice``), ``checks.py``.
"""

from .api import rnnt_loss_pruned, rnnt_loss_simple, rnnt_loss_smoothed
from .prune import do_rnnt_pruning, get_rnnt_prune_ranges

__all__ = ["do_rnnt_pruning", "get_rnnt_prune_ranges", "rnnt_loss_pruned", "rnnt_loss_simple",
           "rnnt_loss_smoothed"]
