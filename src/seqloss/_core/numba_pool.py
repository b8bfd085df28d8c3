"""The one parallel strategy of the Numba CPU kernels: GIL-free per-job calls on a thread pool.

A kernel is written as an ``njit(nogil=True, cache=True)`` function that does one
independent job (a sequence, or a sequence and a direction) and writes only that
job's outputs; :func:`run_jobs` calls it for every job on
``torch.get_num_threads()`` threads.

Why not ``njit(parallel=True)`` and ``prange``:

* Fork safety. Numba's parallel regions run on the OpenMP threading layer here
  (GNU ``libgomp``: the system's copy, mapped beside torch's own). A forked child (a
  DataLoader worker) then hangs
  in ``gomp_team_barrier_wait_end`` when the parent had run any parallel torch op,
  and aborts ("fork() called from a process already using GNU OpenMP, this is
  unsafe") when the parent had run such a kernel. A Python thread pool has neither
  problem: the child inherits no running threads, so the pool is forgotten at fork
  (``os.register_at_fork``) and started afresh on the child's first call.
* Compile time. Parfor lowering costs tens of seconds per kernel and dtype on a
  fresh install; a plain per-job function compiles in a few.
* Same parallelism: the jobs are independent, so the results do not depend on the
  schedule or the thread count (bit-deterministic).

The caller's thread works beside ``n - 1`` pool workers (no idle hand-off per call),
all taking jobs from one shared iterator, longest first when costs are given, so a
long job does not start last and run alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np
import torch

_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _forget_pool() -> None:
    # A forked child inherits the pool object but not its threads: start afresh.
    global _POOL, _LOCK
    _POOL = None
    _LOCK = threading.Lock()  # it may have been held by another thread at fork time


os.register_at_fork(after_in_child=_forget_pool)


def _pool(workers: int) -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL._max_workers < workers:
            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=workers,
                                                   thread_name_prefix="seqloss")
            if old is not None:
                old.shutdown(wait=False)  # its queued jobs still run, then its threads exit
        return _POOL


def run_jobs(fn: Callable[..., None], args: tuple, jobs: Sequence[int],
             order: Sequence[float] | np.ndarray | None = None) -> None:
    """Call ``fn(*args, job)`` for each ``job`` in ``jobs`` on ``torch.get_num_threads()`` threads.

    Args:
        fn: a GIL-free (``njit(nogil=True)``) function; each call must write only its
            own job's outputs, so the result does not depend on the schedule.
        args: the leading arguments, the same for every job.
        jobs: the job ids (e.g. ``range(B)``).
        order: optional cost of each job (same length as ``jobs``); the jobs then
            start largest cost first (ties in the given order).

    Returns when every job has run; an exception raised by ``fn`` stops the
    remaining jobs and is re-raised once the running ones have finished.
    """
    n = max(1, min(torch.get_num_threads(), len(jobs)))
    if n == 1:  # the common small-batch case: no ordering, no pool
        for job in jobs:
            fn(*args, job)
        return
    todo = list(jobs)
    if order is not None:
        rank = np.argsort(-np.asarray(order, dtype=np.float64), kind="stable")
        todo = [todo[i] for i in rank.tolist()]
    shared = iter(todo)

    def work() -> None:
        try:
            for job in shared:  # next() on a list iterator is atomic under the GIL
                fn(*args, job)
        except BaseException:
            for _ in shared:  # the other threads stop after their current job
                pass
            raise

    pool = _pool(n - 1)
    helpers: list[Future] = [pool.submit(work) for _ in range(n - 1)]
    try:
        work()
    finally:
        for h in helpers:
            # One not started yet has nothing left to do; cancelling it also means a call
            # nested in a pool thread never waits for a free thread.
            h.cancel()
        wait(helpers)  # the others write into the caller's arrays: never return before them
    for h in helpers:
        if not h.cancelled():
            h.result()


def own_lines(a: np.ndarray) -> np.ndarray:
    """A copy of a small array on 64-byte cache lines of its own.

    The pool's jobs read small shared arrays (lengths, durations) on every step. Left
    where numpy's small-object allocator puts them, they can share a cache line with
    data another thread writes, and that false sharing serialized two lattice jobs in
    isolation (two threads 20.8 ms, with own lines 10.5 ms, serial 20.5 ms; B=2, T=500,
    U=100). Inside the loss, libgomp's workers still spinning after torch's parallel
    ops compete with the pool for the cores (``OMP_WAIT_POLICY=passive`` stops them).
    """
    a = np.ascontiguousarray(a)
    buf = np.zeros(a.size + 2 * 64 // max(a.itemsize, 1), dtype=a.dtype)
    off = (-buf.ctypes.data % 64) // a.itemsize
    out = buf[off : off + a.size].reshape(a.shape)
    out[...] = a
    return out
