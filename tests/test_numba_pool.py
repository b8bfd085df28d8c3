"""``_core.numba_pool.run_jobs``: every job once, on the threads asked for, errors raised
in the caller, whichever workers run them (torch's OpenMP team where torch runs on GNU
libgomp, else the Python pool)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from seqloss._core import numba_pool


@pytest.fixture(params=["team", "pool"])
def workers(request, monkeypatch):
    """Run with torch's team (skipped where there is none) and with the Python pool."""
    if request.param == "team":
        if numba_pool._team() is None:
            pytest.skip("torch does not run on GNU libgomp here")
    else:
        monkeypatch.setattr(numba_pool, "_TEAM", None)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield request.param
    torch.set_num_threads(old)


def test_every_job_once_on_two_threads(workers):
    ran: dict[int, list[int]] = {}
    lock = threading.Lock()

    def job(base, j):
        time.sleep(0.005)  # releases the GIL: both threads take jobs
        with lock:
            ran.setdefault(base + j, []).append(
                (threading.get_native_id(), threading.current_thread().name))

    numba_pool.run_jobs(job, (100,), range(16), order=[j % 5 for j in range(16)])
    assert sorted(ran) == list(range(100, 116))
    assert all(len(v) == 1 for v in ran.values())
    threads = {v[0][0] for v in ran.values()}
    assert len(threads) == 2 and threading.get_native_id() in threads
    pool_threads = {v[0][0] for v in ran.values() if v[0][1].startswith("seqloss")}
    # the team: torch's workers, not a pool of ours; else one pool thread beside the caller
    assert len(pool_threads) == (0 if workers == "team" else 1)


@pytest.mark.parametrize("where", ["first", "late"])
def test_an_error_in_a_job_reaches_the_caller(workers, where):
    started: list[int] = []
    bad = 0 if where == "first" else 9

    def job(j):
        started.append(j)
        time.sleep(0.002)
        if j == bad:
            raise KeyError(f"job {j}")

    with pytest.raises(KeyError, match=f"job {bad}"):
        numba_pool.run_jobs(job, (), range(40))
    assert len(started) < 40  # the others stopped taking jobs
    # and the workers are usable afterwards
    done: list[int] = []
    numba_pool.run_jobs(lambda j: done.append(j), (), range(8))
    assert sorted(done) == list(range(8))


def test_the_team_is_torchs_own_runtime():
    team = numba_pool._team()
    if team is None:
        pytest.skip("torch does not run on GNU libgomp here")
    # torch's parallel ops and the jobs share one libgomp: its team size follows
    # torch.set_num_threads, and a run_jobs call between torch ops changes no result.
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x = torch.randn(512, 512, dtype=torch.float64)
        want = x @ x
        out: dict[int, float] = {}
        numba_pool.run_jobs(lambda j: out.__setitem__(j, float(j) ** 0.5), (), range(64))
        assert torch.equal(x @ x, want)
        assert out == {j: float(j) ** 0.5 for j in range(64)}
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("work", [99, 100])
def test_small_work_runs_inline_in_order(workers, work):
    """Under ``inline_below`` every job runs on the calling thread, in the given order
    (``order`` ignored: nothing to balance); at the threshold the workers take part."""
    ran: list[tuple[int, int]] = []

    def job(j):
        time.sleep(0.002)  # releases the GIL: a worker, if any, takes jobs
        ran.append((j, threading.get_native_id()))

    numba_pool.run_jobs(job, (), range(12), order=list(range(12)), work=work, inline_below=100)
    assert sorted(j for j, _ in ran) == list(range(12))
    threads = {t for _, t in ran}
    if work < 100:
        assert ran == [(j, threading.get_native_id()) for j in range(12)]
    else:
        assert len(threads) == 2 and threading.get_native_id() in threads


def test_an_error_in_an_inline_job_reaches_the_caller():
    done: list[int] = []

    def job(j):
        if j == 3:
            raise KeyError("job 3")
        done.append(j)

    with pytest.raises(KeyError, match="job 3"):
        numba_pool.run_jobs(job, (), range(8), work=0)
    assert done == [0, 1, 2]  # the jobs after it never ran
