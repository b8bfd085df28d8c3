"""Timing and peak-memory machinery shared by the loss benchmarks.

The code ships inside the package (``seqloss.bench._common``) so that
``seqloss bench`` works from an installed wheel; this module re-exports it for
the scripts in this folder.
"""

from seqloss.bench._common import (
    Factory,
    _status_kib,
    format_table,
    interleaved_times,
    machine_info,
    median_ms,
    mem_child_main,
    peak_memory_subprocess,
    peak_of_call,
)

__all__ = [
    "Factory",
    "_status_kib",
    "format_table",
    "interleaved_times",
    "machine_info",
    "median_ms",
    "mem_child_main",
    "peak_memory_subprocess",
    "peak_of_call",
]
