"""The one joint prologue/epilogue of every transducer loss, driven by a table of arcs."""

from .table import Arc, JointTable, rnnt_table

__all__ = ["Arc", "JointTable", "rnnt_table"]
