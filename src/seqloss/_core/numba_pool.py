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

Little work (``work`` under ``INLINE_WORK`` element steps, ~0.2 ms on one thread) runs on
the calling thread alone: no parallel region at all. A region has to wake a worker and wait
for it at its end, ~50 us on a quiet machine; on a busy one the worker waits for a core
and a tiny call (RNN-T B=1 T=20 U=5 V=32 + CTC B=1 T=20) took 44 ms instead of 2.6 ms
beside two busy processes, its regions each waiting out a time slice.

The caller's thread works beside ``n - 1`` workers (no idle hand-off per call), all
taking jobs from one shared iterator, longest first when costs are given, so a long job
does not start last and run alone.

The workers are torch's own OpenMP team where torch runs its parallel ops on GNU
``libgomp`` (the Linux wheels): ``GOMP_parallel``, resolved through ``libtorch_cpu``,
runs the job loop on the calling thread and on the team's workers. After a parallel
torch op those workers spin for a while (``GOMP_SPINCOUNT``) before they sleep; a
thread pool of our own then shared the cores with them, and every Numba kernel that
follows a torch op ran at about half speed (the pruned pipeline, B=8 T=300 S=60 C=500,
2 threads: 36.2-37.7 ms on our pool, 31.2-32.9 ms on the team). Elsewhere (another
OpenMP runtime, no OpenMP, a forked child: see above) the jobs run on a Python thread
pool.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np
import torch

# Work (element steps, see run_jobs) under which the jobs run on the calling thread.
INLINE_WORK = 200_000
CELL = 10  # element steps of one lattice cell (a few log-add-exps)
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_UNSET = object()
_TEAM: object = _UNSET  # torch's GOMP_parallel, None where the jobs use the pool
_CALLS: dict[int, Callable[[], None]] = {}
_KEYS = itertools.count(1)
_HELD: set[int] = set()  # the team's threads that keep a thread state
_ENSURE = ctypes.pythonapi.PyGILState_Ensure
_ENSURE.restype = ctypes.c_int


def _forget_pool() -> None:
    # A forked child inherits the pool object but not its threads: start afresh. It never
    # enters the parent's OpenMP team: libgomp's state there describes threads it lacks.
    global _POOL, _LOCK, _TEAM
    _POOL = None
    _LOCK = threading.Lock()  # it may have been held by another thread at fork time
    _TEAM = None
    _HELD.clear()


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
             order: Sequence[float] | np.ndarray | None = None, *, work: float | None = None,
             inline_below: float | None = None) -> None:
    """Call ``fn(*args, job)`` for each ``job`` in ``jobs`` on ``torch.get_num_threads()`` threads.

    Args:
        fn: a GIL-free (``njit(nogil=True)``) function; each call must write only its
            own job's outputs, so the result does not depend on the schedule.
        args: the leading arguments, the same for every job.
        jobs: the job ids (e.g. ``range(B)``).
        order: optional cost of each job (same length as ``jobs``); the jobs then
            start largest cost first (ties in the given order).
        work: an estimate of the whole call's work in element steps (a logit of a row
            pass is one, a lattice cell about ten); under ``inline_below`` every job runs
            on the calling thread, in order: no worker is woken or waited for.
        inline_below: the threshold for ``work`` (default: ``INLINE_WORK``).

    Returns when every job has run; an exception raised by ``fn`` stops the
    remaining jobs and is re-raised once the running ones have finished.
    """
    n = max(1, min(torch.get_num_threads(), len(jobs)))
    below = INLINE_WORK if inline_below is None else inline_below
    if n == 1 or (work is not None and work < below):  # no ordering, no pool
        for job in jobs:
            fn(*args, job)
        return
    todo = list(jobs)
    if order is not None:
        rank = np.argsort(-np.asarray(order, dtype=np.float64), kind="stable")
        todo = [todo[i] for i in rank.tolist()]
    shared = iter(todo)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for job in shared:  # next() on a list iterator is atomic under the GIL
                fn(*args, job)
        except BaseException as e:  # noqa: BLE001 -- kept, re-raised by the caller
            errors.append(e)
            for _ in shared:  # the other threads stop after their current job
                pass

    team = _team()
    if team is not None:
        key = next(_KEYS)
        _CALLS[key] = work
        _HELD.add(threading.get_native_id())  # the caller, a Python thread, has its own
        try:
            team(_ENTRY, key, n, 0)  # returns when every thread of the team has returned
        finally:
            del _CALLS[key]
    else:
        pool = _pool(n - 1)
        helpers: list[Future] = [pool.submit(work) for _ in range(n - 1)]
        try:
            work()
        finally:
            for h in helpers:
                # One not started yet has nothing left to do; cancelling it also means a
                # call nested in a pool thread never waits for a free thread.
                h.cancel()
            wait(helpers)  # the others write into the caller's arrays: never return before
    if errors:
        raise errors[0]


def _enter(key: int) -> None:
    # Each thread of the team: ctypes takes the GIL; fn releases it while it computes;
    # work() keeps every exception. A worker's first call keeps its thread state (one
    # PyGILState_Ensure never released): ctypes would make and free one per call, and
    # the pair took ~40 us of each parallel region (CTC T=300 B=8: the pool 1.57-1.66 ms,
    # the team making a state per call 1.64-1.68, keeping them 1.48-1.61).
    tid = threading.get_native_id()
    if tid not in _HELD:
        _HELD.add(tid)
        _ENSURE()
    _CALLS[key]()


_ENTRY = _BODY(_enter)


def _team() -> Callable | None:
    """torch's ``GOMP_parallel`` (``void (*fn)(void *), void *data, unsigned threads,
    unsigned flags``), or ``None``: not Linux, torch's parallel backend not OpenMP, or no
    such symbol in ``libtorch_cpu``'s scope. Resolved through ``libtorch_cpu``'s own
    handle (already loaded), so it is the runtime torch's ops use, not another copy."""
    global _TEAM
    if _TEAM is _UNSET:
        team = None
        lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        if (sys.platform.startswith("linux") and os.path.exists(lib)
                and "parallel backend: OpenMP" in torch.__config__.parallel_info()):
            try:
                team = ctypes.CDLL(lib, mode=os.RTLD_NOLOAD).GOMP_parallel
            except (OSError, AttributeError):
                team = None
            if team is not None:
                team.argtypes = [_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
                team.restype = None
        _TEAM = team
    return _TEAM


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
