"""Fork safety: every public function gives the parent's results in a forked DataLoader worker.

Two parents: one that ran a parallel torch op (torch's OpenMP pool is live when it forks), one
that ran seqloss's own kernels (their threads, if any, are live when it forks). Each forks two
DataLoader workers (``multiprocessing_context="fork"``); every public function runs there,
backward included, and its values must equal the parent's bit for bit (the kernels are
deterministic whatever the thread count).

DataLoader gives each worker one torch thread, so seqloss runs serially there. A worker
cannot take more: torch's own parallel ops (``log_softmax`` already) hang in a forked child
whose parent used OpenMP. So the jobs' workers after fork are checked on their own: a parent
that ran jobs on two threads (on torch's OpenMP team where torch runs on libgomp, else on
seqloss's pool) and no torch op forks a child that runs jobs on two threads (seqloss's pool:
a child never enters the parent's team).

Each scenario runs in its own interpreter, so an abort in a worker is a failure, and the
DataLoader's ``timeout`` turns a hang into one.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba is not installed")

SCRIPT = textwrap.dedent(
    r'''
    import json
    import sys

    import torch
    from torch.utils.data import DataLoader, Dataset

    import seqloss
    from seqloss._core.distributed import distributed_mean
    from seqloss.transducer.arc_logprobs import transducer_arc_logprobs
    from seqloss.transducer.hat import hat_loss, hat_loss_from_joint

    BK = "numba"
    SEEDS = [0, 1, 2, 3]


    def _ctc_batch(g, T=24, B=5, C=7, S=6):
        x = torch.randn(T, B, C, generator=g)
        il = torch.randint(S + 4, T + 1, (B,), generator=g)
        tl = torch.randint(0, S + 1, (B,), generator=g)
        il[0], tl[0] = T, S
        tg = torch.randint(1, C, (B, S), generator=g)
        return x, tg, il, tl


    def _rnnt_batch(g, B=4, T=9, U=5, V=8):
        x = torch.randn(B, T, U + 1, V, generator=g)
        il = torch.randint(1, T + 1, (B,), generator=g)
        tl = torch.randint(0, U + 1, (B,), generator=g)
        il[0], tl[0] = T, U
        tg = torch.randint(1, V, (B, U), generator=g)
        return x, tg, il, tl


    def _grad(fn, x):
        x = x.detach().clone().requires_grad_()
        loss = fn(x)
        (g,) = torch.autograd.grad(loss.sum(), x)
        return loss.detach(), g


    def compute(seed):
        """Every public function of seqloss on one seed's data (numba backend)."""
        g = torch.Generator().manual_seed(seed)
        out = {}
        x, tg, il, tl = _ctc_batch(g)
        lp = x.log_softmax(-1)
        out["ctc"] = _grad(lambda y: seqloss.ctc_loss(y.log_softmax(-1), tg, il, tl,
                                                      reduction="none", backend=BK), x)
        out["ctc_fused"] = _grad(lambda y: seqloss.ctc_loss(y, tg, il, tl, reduction="none",
                                                            fused_log_softmax=True, backend=BK), x)
        out["CTCLoss"] = _grad(lambda y: seqloss.CTCLoss(backend=BK)(y.log_softmax(-1), tg, il, tl),
                               x)
        out["ctc_grad_clamp"] = _grad(
            lambda y: seqloss.ctc_loss(seqloss.grad_clamp(y, 0.05), tg, il, tl, reduction="sum",
                                       fused_log_softmax=True, backend=BK), x)
        out["ctc_align"] = seqloss.ctc_align(lp, tg, il, tl, backend=BK)
        out["ctc_diagnose"] = json.dumps(seqloss.diagnose("ctc", lp, tg, il, tl,
                                                          backend=BK).to_dict())

        x, tg, il, tl = _rnnt_batch(g)
        out["rnnt"] = _grad(lambda y: seqloss.rnnt_loss(y, tg, il, tl, blank=0, reduction="none",
                                                        backend=BK), x)
        out["rnnt_logprobs"] = _grad(
            lambda y: seqloss.rnnt_loss(y.log_softmax(-1), tg, il, tl, blank=0, reduction="none",
                                        fused_log_softmax=False, clamp=0.2, backend=BK), x)
        packed = torch.cat([x[b, : il[b], : tl[b] + 1].reshape(-1, x.shape[-1])
                            for b in range(len(il))])
        out["rnnt_packed"] = _grad(lambda y: seqloss.rnnt_loss_packed(y, tg, il, tl, blank=0,
                                                                      reduction="none", backend=BK),
                                   packed)
        out["RNNTLoss"] = _grad(lambda y: seqloss.RNNTLoss(blank=0, fastemit_lambda=0.01,
                                                           backend=BK)(y, tg, il, tl), x)
        out["rnnt_grad_clamp"] = _grad(
            lambda y: seqloss.rnnt_loss(seqloss.grad_clamp(y, 0.05), tg, il, tl, blank=0,
                                        reduction="sum", backend=BK), x)
        out["rnnt_align"] = seqloss.rnnt_align(x, tg, il, tl, blank=0, backend=BK)
        out["rnnt_diagnose"] = json.dumps(seqloss.diagnose("rnnt", x, tg, il, tl, blank=0,
                                                           backend=BK).to_dict())
        # The families built on the lattice and the joint (same pool, same kernels).
        xm = x[..., :7]  # blank 6, big blank 5 (duration 2): labels below 5
        tgm = tg.clamp(max=4)
        out["multiblank"] = _grad(lambda y: seqloss.multiblank_rnnt_loss(
            y, tgm, il, tl, [2], reduction="none", backend=BK), xm)
        out["tdt"] = _grad(lambda y: seqloss.tdt_loss(y, tg.clamp(max=3), il, tl, [0, 1, 2],
                                                      blank=4, reduction="none", backend=BK),
                           x[..., :8])
        ab, ae = x[..., :1].log_softmax(1), x[..., 1:2].log_softmax(1)
        out["lattice"] = _grad(lambda y: seqloss.transducer_lattice(y, ae, il, tl, backend=BK), ab)
        a3, b3 = x[:, :, 0, :], x[:, 0, :, :].transpose(1, 2)
        out["logmmexp"] = _grad(lambda y: seqloss.logmmexp(y, b3, backend=BK), a3)
        am, lm = x[:, :, 0, :], x[:, 0, :, :]  # (B, T, C), (B, U+1, C)
        out["simple"] = _grad(lambda y: seqloss.rnnt_loss_simple(lm, y, tg, 0, reduction="none",
                                                                 backend=BK), am)
        _, (pxg, pyg) = seqloss.rnnt_loss_simple(lm, am, tg, 0, return_grad=True, backend=BK)
        rng = seqloss.get_rnnt_prune_ranges(pxg, pyg, None, 3)
        amp, lmp = seqloss.do_rnnt_pruning(am, lm, rng)
        out["pruned"] = _grad(lambda y: seqloss.rnnt_loss_pruned(y, tg, rng, 0, reduction="none",
                                                                 backend=BK), amp + lmp)
        enc, pred = x[:, :, 0, :], x[:, 0, :, :]
        out["from_joint"] = _grad(lambda y: seqloss.rnnt_loss_from_joint(
            y, pred, lambda e, p: e[:, :, None] + p[:, None], tg, il, tl, blank=0,
            reduction="none", backend=BK), enc)
        # HAT: its Numba row passes (CPU logits) and the lattice's kernels.
        out["hat"] = _grad(lambda y: hat_loss(y, tg, il, tl, blank=0, clamp=0.5,
                                              reduction="none", delay_penalty=0.1,
                                              backend=BK), x)
        out["hat_from_joint"] = _grad(lambda y: hat_loss_from_joint(
            y, pred, lambda e, p: e[:, :, None] + p[:, None], tg, il, tl, blank=0,
            reduction="none", backend=BK), enc)
        out["arc_logprobs"] = _grad(lambda y: torch.stack(
            transducer_arc_logprobs(y, tg, il, tl, blank=0)).nan_to_num(neginf=0.0), x)
        out["pruned_hat"] = _grad(lambda y: seqloss.rnnt_loss_pruned(
            y, tg, rng, 0, reduction="none", use_hat_loss=True, backend=BK), amp + lmp)
        out["rnnt_delay_penalty"] = _grad(lambda y: seqloss.rnnt_loss(
            y, tg, il, tl, blank=0, reduction="none", delay_penalty=0.2, backend=BK), x)
        out["distributed_mean"] = _grad(lambda y: distributed_mean(seqloss.rnnt_loss(
            y, tg, il, tl, blank=0, reduction="none", backend=BK), tl), x)
        return out


    class Seeds(Dataset):
        def __len__(self):
            return len(SEEDS)

        def __getitem__(self, i):
            return SEEDS[i], compute(SEEDS[i])


    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        if isinstance(a, (tuple, list)):
            return len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
        return a == b


    def pool_jobs():
        """Jobs on the seqloss pool: the threads that ran them, and a Numba kernel's result."""
        import threading
        import time

        import numpy as np

        from seqloss.align import numba_cpu as align
        from seqloss._core.numba_pool import run_jobs

        ran = {}

        def job(j):
            time.sleep(0.01)  # releases the GIL: both threads take jobs
            ran[j] = threading.get_ident()

        run_jobs(job, (), range(8))
        assert sorted(ran) == list(range(8)), ran
        rng = np.random.default_rng(0)
        T, B, C, S = 30, 6, 5, 6
        lp = rng.standard_normal((T, B, C))
        tg = rng.integers(1, C, (B, S))
        il, tl = np.full(B, T), rng.integers(0, S + 1, B)
        labels, scores = np.zeros((B, T), np.int64), np.zeros((B, T))
        run_jobs(align.ctc_align_kernel, (lp, tg, il, tl, 0, labels, scores), range(B),
                 order=il * tl)
        return len(set(ran.values())), labels, scores


    def pool_child(queue):
        from seqloss._core import numba_pool

        torch.set_num_threads(2)
        n, labels, scores = pool_jobs()
        assert numba_pool._team() is None  # the parent's OpenMP team is not the child's
        queue.put((n, labels.tolist(), scores.tolist()))


    def check_pool():
        # This parent runs no torch op: only its jobs' workers have threads when it forks.
        import multiprocessing

        n, labels, scores = pool_jobs()
        assert n == 2, f"the parent ran its jobs on {n} threads"
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=pool_child, args=(queue,))
        child.start()
        try:
            got = queue.get(timeout=120)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0, child.exitcode
        assert got == (2, labels.tolist(), scores.tolist()), got
        print("OK")


    def main(mode):
        torch.set_num_threads(2)  # a parent with a parallel torch, whatever the machine
        want = {}
        if mode == "warm":  # fills Numba's on-disk cache: no worker compiles under the timeout
            compute(0)
            print("OK")
            return
        if mode == "pool":
            check_pool()
            return
        if mode == "torch":
            a = torch.randn(512, 512)
            a @ a
        elif mode == "seqloss":
            want = {s: compute(s) for s in SEEDS}
        loader = DataLoader(Seeds(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                            timeout=120)
        got = dict(loader)
        if not want:
            want = {s: compute(s) for s in SEEDS}
        assert sorted(got) == SEEDS, sorted(got)
        bad = [(s, k) for s in SEEDS for k in want[s] if not same(got[s][k], want[s][k])]
        assert not bad, f"worker results differ from the parent's: {bad}"
        print("OK")


    if __name__ == "__main__":
        main(sys.argv[1])
    '''
)


def _run(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "fork_check.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env.pop("SEQLOSS_BACKEND", None)
    env.pop("OMP_NUM_THREADS", None)
    env["NUMBA_NUM_THREADS"] = "2"  # a parallel Numba kernel would hang/abort even on one core
    # The DataLoader's timeout (120 s) fails a hung worker; this one is a backstop.
    r = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                       timeout=420, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (
        f"rc={r.returncode}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> None:
    _run(tmp_path_factory.mktemp("fork_warm"), "warm")


@pytest.mark.parametrize("parent", ["torch", "seqloss"],
                         ids=["after_parallel_torch_op", "after_seqloss_kernels"])
def test_forked_dataloader_workers(tmp_path, warm_cache, parent):
    _run(tmp_path, parent)


def test_thread_pool_restarts_in_forked_child(tmp_path, warm_cache):
    _run(tmp_path, "pool")
