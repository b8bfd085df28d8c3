"""``seqloss demo``: a one-minute tour on CPU, with nothing to download.

Trains a tiny CTC model, a tiny RNN-T model and a tiny TDT model (the RNN-T model
with a duration head; the demo counts the decoding steps it saves) on the synthetic
task of :mod:`seqloss.demo.data`, then shows seqloss beside torch's
``ctc_loss`` on the same batch, a half-precision batch, an impossible sequence, and
writes an alignment heatmap.
"""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import seqloss

from . import data as D

N_EVAL = 64  # held-out utterances every model is scored on
PLOT_HINT = "matplotlib is not installed: pip install seqloss[plot] to get the alignment heatmap"


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:>7.3f}"), TimeElapsedColumn(),
        console=console, transient=False,
    )


def _checkpoints(steps: int) -> list[int]:
    marks = sorted({0, *(int(steps * f) - 1 for f in (0.1, 0.25, 0.5, 0.75, 1.0))})
    return [m for m in marks if 0 <= m < steps]


def _heading(console: Console, title: str) -> None:
    console.print(f"[bold]{title}[/bold]", highlight=False)


def _loss_table(losses: list[float], steps: int) -> Table:
    t = Table()
    t.add_column("step", justify="right")
    t.add_column("loss (mean of last 10)", justify="right")
    for m in _checkpoints(steps):
        window = losses[max(0, m - 9): m + 1]
        t.add_row(str(m + 1), f"{statistics.fmean(window):.3f}")
    return t


def _decode_table(truth: list[list[int]], hyp: list[list[int]], n: int = 5) -> Table:
    t = Table()
    t.add_column("truth")
    t.add_column("greedy decode")
    t.add_column("", justify="center")
    for a, b in list(zip(truth, hyp, strict=True))[:n]:
        t.add_row(" ".join(map(str, a)), " ".join(map(str, b)), "ok" if a == b else "x")
    return t


def _ler(truth: list[list[int]], hyp: list[list[int]]) -> float:
    err = sum(D.edit_distance(h, r) for h, r in zip(hyp, truth, strict=True))
    return err / max(1, sum(len(r) for r in truth))


# Seconds of each model's first training step (label -> s): on a fresh install, mostly
# Numba compiling the kernels it reaches; the end of the demo says how much.
FIRST_STEP_S: dict[str, float] = {}
# The bar's label during the first step, which waits for that compile.
COMPILING = "(first step: compiling kernels, once)"


class _FirstStep:
    """Times step 0 into ``FIRST_STEP_S[label]`` and relabels the bar after it."""

    def __init__(self, prog: Progress, task, label: str) -> None:
        self.prog, self.task, self.label = prog, task, label
        self.t0 = time.perf_counter()

    def done(self, step: int) -> None:
        if step == 0:
            FIRST_STEP_S[self.label.strip()] = time.perf_counter() - self.t0
            self.prog.update(self.task, description=f"{self.label} training")


def train_ctc(steps: int, seed: int, backend: str,
              console: Console) -> tuple[D.TinyCTC, list[float]]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = D.TinyCTC()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses: list[float] = []
    with _progress(console) as prog:
        task = prog.add_task(f"CTC   {COMPILING}", total=steps, loss=float("nan"))
        first = _FirstStep(prog, task, "CTC  ")
        for step in range(steps):
            b = make_train_batch(g)
            loss = seqloss.ctc_loss(model(b.x), b.targets, b.input_lengths, b.target_lengths,
                                    blank=D.BLANK, backend=backend)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            first.done(step)
            prog.update(task, advance=1, loss=statistics.fmean(losses[-10:]))
    return model, losses


def _train_transducer(model: D.TinyRNNT, loss_fn, label: str, steps: int, seed: int,
                      console: Console) -> list[float]:
    # The same batches for every transducer (seed + 1), so that they compare.
    g = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses: list[float] = []
    with _progress(console) as prog:
        task = prog.add_task(f"{label} {COMPILING}", total=steps, loss=float("nan"))
        first = _FirstStep(prog, task, label)
        for step in range(steps):
            b = make_train_batch(g)
            logits = model(b.x, b.targets)
            loss = loss_fn(logits, b)
            # The batch mean is per sequence; per label reads like the CTC loss.
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()) / float(b.target_lengths.float().mean()))
            first.done(step)
            prog.update(task, advance=1, loss=statistics.fmean(losses[-10:]))
    return losses


def train_rnnt(steps: int, seed: int, backend: str,
               console: Console) -> tuple[D.TinyRNNT, list[float]]:
    torch.manual_seed(seed)
    model = D.TinyRNNT()

    def loss_fn(logits: torch.Tensor, b: D.Batch) -> torch.Tensor:
        return seqloss.rnnt_loss(logits, b.targets, b.input_lengths, b.target_lengths,
                                 blank=D.BLANK, reduction="mean", backend=backend)

    return model, _train_transducer(model, loss_fn, "RNN-T", steps, seed, console)


def train_tdt(steps: int, seed: int, backend: str,
              console: Console) -> tuple[D.TinyTDT, list[float]]:
    torch.manual_seed(seed)
    model = D.TinyTDT()

    def loss_fn(logits: torch.Tensor, b: D.Batch) -> torch.Tensor:
        return seqloss.tdt_loss(logits, b.targets, b.input_lengths, b.target_lengths,
                                model.durations, blank=D.BLANK, reduction="mean_batch",
                                backend=backend)

    return model, _train_transducer(model, loss_fn, "TDT  ", steps, seed, console)


def decoding_steps(truth: list[list[int]], rnnt: tuple[list[list[int]], list[int]],
                   tdt: tuple[list[list[int]], list[int]], frames: int) -> Table:
    """RNN-T and TDT greedy decoding side by side: error rate and decoding steps."""
    t = Table()
    t.add_column("model")
    t.add_column("label error rate", justify="right")
    t.add_column("decoding steps", justify="right")
    t.add_column("steps per frame", justify="right")
    for name, (hyp, steps) in (("RNN-T", rnnt), ("TDT", tdt)):
        n = sum(steps)
        t.add_row(name, f"{_ler(truth, hyp):.1%}", str(n), f"{n / max(1, frames):.2f}")
    return t


DEFAULT_STEPS = 300


def _undertrained_hint(console: Console, ler: float, steps: int) -> None:
    # Early in training a CTC/RNN-T model emits only blanks (the easiest way to cut
    # the loss first), so short runs decode to nothing: say so instead of leaving a
    # bare 100%.
    if ler >= 0.5 and steps < DEFAULT_STEPS:
        console.print(
            f"[yellow]hint:[/] {steps} steps are too few for this model to learn: it still "
            "emits (mostly) blanks, hence the empty decodes. Run `seqloss demo` with the "
            f"default --steps {DEFAULT_STEPS} (about a minute)."
        )


def make_train_batch(g: torch.Generator) -> D.Batch:
    return D.make_batch(16, g)


def _median_ms(fn, n: int = 5) -> float:
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def compare_with_torch(model: D.TinyCTC, batch: D.Batch, backend: str, console: Console) -> None:
    with torch.no_grad():
        logits = model.logits(batch.x)
    args = (batch.targets, batch.input_lengths, batch.target_lengths)

    def run(lib: str) -> tuple[float, torch.Tensor]:
        x = logits.clone().requires_grad_(True)
        lp = x.log_softmax(-1)
        if lib == "torch":
            loss = F.ctc_loss(lp, *args, blank=D.BLANK, reduction="mean")
        else:
            loss = seqloss.ctc_loss(lp, *args, blank=D.BLANK, reduction="mean", backend=backend)
        loss.backward()
        return float(loss.detach()), x.grad

    (ls, gs), (lt, gt) = run("seqloss"), run("torch")
    _heading(console, f"The same batch (T, B, C = {tuple(logits.shape)}), through log_softmax, "
             "reduction mean")
    t = Table()
    t.add_column("library")
    t.add_column("loss", justify="right")
    t.add_column("forward+backward ms (median)", justify="right")
    t.add_row("seqloss", f"{ls:.6f}", f"{_median_ms(lambda: run('seqloss')):.2f}")
    t.add_row("torch", f"{lt:.6f}", f"{_median_ms(lambda: run('torch')):.2f}")
    console.print(t)
    console.print("largest |gradient difference| on the logits: "
                  f"{float((gs - gt).abs().max()):.2e}")


def half_precision(model: D.TinyCTC, batch: D.Batch, backend: str, console: Console) -> None:
    with torch.no_grad():
        lp32 = model(batch.x)
    args = (batch.targets, batch.input_lengths, batch.target_lengths)
    # torch's float64 loss is the reference: an independent one, and it spares a
    # first run compiling seqloss's float64 kernels for one line of the demo.
    ref = F.ctc_loss(lp32.double(), *args, blank=D.BLANK, reduction="none")
    _heading(console, "Half precision on CPU (per-sequence loss against torch's float64)")
    t = Table()
    t.add_column("dtype")
    t.add_column("library")
    t.add_column("result")
    for dtype in (torch.float16, torch.bfloat16):
        lp = lp32.to(dtype)
        try:
            lt = F.ctc_loss(lp, *args, blank=D.BLANK, reduction="none")
            torch_res = (f"loss dtype {lt.dtype}, "
                         f"max |error| {float((lt.double() - ref).abs().max()):.2e}")
        except Exception as e:  # noqa: BLE001 -- torch's refusal is what we show
            torch_res = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        x = lp.clone().requires_grad_(True)
        ls = seqloss.ctc_loss(x, *args, blank=D.BLANK, reduction="none", backend=backend)
        ls.sum().backward()
        err = float((ls.detach().double() - ref).abs().max())
        name = str(dtype).replace("torch.", "")
        t.add_row(name, "torch", torch_res)
        t.add_row(name, "seqloss", f"loss dtype {ls.dtype}, max |error| {err:.2e}, "
                  f"grad dtype {x.grad.dtype}, finite: {bool(torch.isfinite(x.grad).all())}")
    console.print(t)


def infeasible(model: D.TinyCTC, batch: D.Batch, backend: str, console: Console) -> None:
    B = 3
    with torch.no_grad():
        logits = model.logits(batch.x[:B])
    tg, il, tl = batch.targets[:B], batch.input_lengths[:B].clone(), batch.target_lengths[:B]
    il[1] = int(tl[1]) - 1  # fewer frames than labels: no alignment exists
    _heading(console, f"An impossible sequence (item 1: {int(tl[1])} labels, {int(il[1])} frames)")
    t = Table()
    t.add_column("library")
    t.add_column("losses (none)")
    t.add_column("mean")
    t.add_column("gradient of the mean")
    for lib, zi in (("torch", False), ("seqloss", False), ("torch", True), ("seqloss", True)):
        cells = []
        for red in ("none", "mean"):
            x = logits.clone().requires_grad_(True)
            lp = x.log_softmax(-1)
            if lib == "torch":
                loss = F.ctc_loss(lp, tg, il, tl, blank=D.BLANK, reduction=red, zero_infinity=zi)
            else:
                loss = seqloss.ctc_loss(lp, tg, il, tl, blank=D.BLANK, reduction=red,
                                        zero_infinity=zi, backend=backend)
            if red == "none":
                cells.append("[" + ", ".join(f"{v:.3f}" for v in loss.tolist()) + "]")
            else:
                loss.backward()
                g = x.grad
                nan = int(torch.isnan(g).sum())
                item = g[:, 1]
                desc = f"{nan} NaN" if nan else (
                    "finite; item 1 zero" if bool((item == 0).all()) else "finite")
                cells += [f"{float(loss.detach()):.3f}", desc]
        t.add_row(lib + (" zero_infinity" if zi else ""), *cells)
    console.print(t)
    rep = seqloss.diagnose("ctc", logits.log_softmax(-1), tg, il, tl, blank=D.BLANK,
                           backend=backend)
    console.print("seqloss.diagnose says, for item 1: " + rep.sequences[1].verdict, markup=False)


def _ctc_path(lp: torch.Tensor, batch: D.Batch, b: int) -> torch.Tensor:
    """Utterance ``b``'s forced alignment ``(T,)`` from the CTC model's ``lp (T, 1, C)``."""
    labels, _ = seqloss.ctc_align(lp[:, :1], batch.targets[b: b + 1],
                                  batch.input_lengths[b: b + 1], batch.target_lengths[b: b + 1],
                                  blank=D.BLANK)
    return labels[0]


@torch.no_grad()
def _rnnt_logits(rnnt_model: D.TinyRNNT, batch: D.Batch, b: int) -> torch.Tensor:
    """Utterance ``b``'s joint logits ``(T_b, U_b + 1, C)``."""
    L, Tb = int(batch.target_lengths[b]), int(batch.input_lengths[b])
    return rnnt_model(batch.x[b: b + 1], batch.targets[b: b + 1, :L])[0, :Tb]


def _rnnt_frames(logits: torch.Tensor, batch: D.Batch, b: int) -> torch.Tensor:
    """The frame of each label on utterance ``b``'s best RNN-T path, ``(U_b,)``."""
    L = int(batch.target_lengths[b])
    frames, _ = seqloss.rnnt_align(logits[None], batch.targets[b: b + 1, :L],
                                   batch.input_lengths[b: b + 1], batch.target_lengths[b: b + 1],
                                   blank=D.BLANK)
    return frames[0]


def alignment_png(model: D.TinyCTC, rnnt_model: D.TinyRNNT | None, batch: D.Batch, out: Path,
                  console: Console, b: int = 0, note: str | None = None) -> Path | None:
    """Utterance ``b``'s CTC posteriors with its forced (Viterbi) path; None without
    matplotlib. ``note``: what the greedy decoders made of it, printed beside the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        console.print(PLOT_HINT, markup=False)
        return None
    Tb, L = int(batch.input_lengths[b]), int(batch.target_lengths[b])
    with torch.no_grad():
        lp = model(batch.x[b: b + 1])  # (T, 1, C)
    post = lp[:Tb, 0].exp().T.numpy()  # (C, T)
    truth = batch.label_list(b)
    path_label = "greedy path (argmax)"
    path = lp[:Tb, 0].argmax(-1).tolist()
    if hasattr(seqloss, "ctc_align"):
        path = _ctc_path(lp, batch, b)[:Tb].tolist()
        path_label = "forced alignment (seqloss.ctc_align)"
    panels = 2 if rnnt_model is not None else 1
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels), squeeze=False)
    ax = axes[0, 0]
    im = ax.imshow(post, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1)
    ax.plot(range(Tb), path, "w.-", lw=1, ms=5, label=path_label)
    ax.set_yticks(range(D.NUM_CLASSES), ["blank"] + [str(c) for c in range(1, D.NUM_CLASSES)])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("frame")
    ax.set_ylabel("class")
    ax.set_title(f"CTC posteriors, target {' '.join(map(str, truth))}")
    ax.legend(loc="upper right", fontsize=8)
    fig.colorbar(im, ax=ax, label="p(class | frame)")
    if rnnt_model is not None:
        ax = axes[1, 0]
        logits = _rnnt_logits(rnnt_model, batch, b)
        lpr = logits.log_softmax(-1)
        emit = torch.stack([lpr[:, u, truth[u]] for u in range(L)], dim=1).exp()  # (T, U)
        im = ax.imshow(emit.T.numpy(), aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1)
        if hasattr(seqloss, "rnnt_align"):
            ax.plot(_rnnt_frames(logits, batch, b).tolist(), range(L), "c.-", lw=1, ms=6,
                    label="best path emissions (seqloss.rnnt_align)")
            ax.legend(loc="upper left", fontsize=8)
        ax.set_yticks(range(L), [f"{u}: {c}" for u, c in enumerate(truth)])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("frame")
        ax.set_ylabel("next token")
        ax.set_title("RNN-T: p(emit next target | frame, tokens so far)")
        fig.colorbar(im, ax=ax, label="probability")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path_png = out / "ctc_alignment.png"
    fig.savefig(path_png, dpi=120)
    plt.close(fig)
    console.print(f"alignment heatmap written to {path_png}" + (f" ({note})" if note else ""))
    return path_png


# ----------------------------------------------------------------- compiling ahead
# On a fresh install most of the demo's first minute is Numba compiling kernels, and
# Numba holds the GIL for most of a compile, so a thread would not overlap it with
# training: a child process compiles (into Numba's on-disk cache, which this process
# then loads) the RNN-T, TDT and alignment kernels while CTC compiles and trains here.


def _precompile(backend: str, parent_file: str | None = None) -> None:
    """The child's work: the demo's own calls on one batch, naming each group once compiled.
    Nothing when this is not the parent's seqloss (``parent_file``): Numba's cache is keyed by
    source path, so what it compiled would not serve the parent."""
    if parent_file is not None and str(Path(seqloss.__file__).resolve()) != parent_file:
        return
    torch.set_num_threads(1)
    quiet = Console(file=io.StringIO())
    batch = make_train_batch(torch.Generator().manual_seed(0))
    rnnt_model, _ = train_rnnt(1, 0, backend, quiet)
    print("rnnt", flush=True)
    train_tdt(1, 0, backend, quiet)
    print("tdt", flush=True)
    with torch.no_grad():
        lp = D.TinyCTC()(batch.x[:1])
    _ctc_path(lp, batch, 0)
    _rnnt_frames(_rnnt_logits(rnnt_model, batch, 0), batch, 0)
    print("align", flush=True)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Ahead:
    """The compiling child, when there is a core for it; :meth:`wait` ``(group)`` blocks
    until the child has compiled that group, or has ended (the caller then compiles)."""

    def __init__(self, backend: str, enabled: bool) -> None:
        self.proc: subprocess.Popen | None = None
        self.done: set[str] = set()
        if not enabled or _cpus() < 2:  # one core: the child would only take turns with us
            return
        here = Path(seqloss.__file__).resolve()
        # The parent's path (e.g. a script's folder) as a fallback, after the child's own.
        code = (f"import sys; sys.path.append({str(here.parent.parent)!r}); "
                "from seqloss.demo.run import _precompile; "
                f"_precompile({backend!r}, {str(here)!r})")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], text=True,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def wait(self, group: str, console: Console | None = None) -> None:
        if console is not None and self.proc is not None and group not in self.done:
            with console.status(f"the {group} kernels are compiling in the background "
                                "(first run only)"):
                self.wait(group)
            return
        while self.proc is not None and group not in self.done:
            line = self.proc.stdout.readline()
            if not line:  # ended early (e.g. no cache to write): compile what is left here
                self.close()
                return
            self.done.add(line.strip())

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc = None


def run_demo(steps: int = DEFAULT_STEPS, out: str = "seqloss-demo", seed: int = 0,
             backend: str = "auto", console: Console | None = None) -> int:
    console = console or Console()
    t_start = time.perf_counter()
    # Tiny batches: thread pools cost more than they give (and spin on a busy machine).
    torch.set_num_threads(1)
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass
    from .._core.dispatch import resolve_backend

    name = resolve_backend(backend, torch.device("cpu"))
    ahead = _Ahead(backend, enabled=name == "numba")
    FIRST_STEP_S.clear()
    try:
        _tour(steps, out, seed, backend, name, console, ahead)
    finally:
        ahead.close()
    total = time.perf_counter() - t_start
    first = sum(FIRST_STEP_S.values())
    # Worth a word when it took seconds: a fresh install's compile (loading the cached
    # kernels takes about a second; more on a busy machine).
    note = (f" ({first:.0f} s of it the models' first steps, where Numba compiles seqloss's "
            "kernels on a fresh install and loads them from its cache afterwards)"
            ) if first > 2 else ""
    console.print(f"demo finished in {total:.1f} s{note}")
    return 0


def _tour(steps: int, out: str, seed: int, backend: str, name: str, console: Console,
          ahead: _Ahead) -> None:
    console.rule("[bold]seqloss demo")
    console.print(
        f"Tiny models on a synthetic task: label strings (ids 1..{D.NUM_LABELS}, blank 0) spoken "
        "as noisy one-hot frames, each label 2-3 frames long. CPU, backend: "
        f"{name}, {steps} steps, seed {seed}."
    )
    if name == "numba":
        console.print("First run only: each model's first step waits for Numba to compile "
                      "seqloss's kernels" + (" (the RNN-T, TDT and alignment ones in a "
                      "background process)" if ahead.proc else "") + "; they are cached on "
                      "disk, and `seqloss warmup` builds that cache ahead (e.g. in a Dockerfile).")
    g_test = torch.Generator().manual_seed(seed + 1000)
    test = D.make_batch(N_EVAL, g_test)

    model, losses = train_ctc(steps, seed, backend, console)
    _heading(console, "CTC loss (per label) falling")
    console.print(_loss_table(losses, steps))
    with torch.no_grad():
        hyp = D.ctc_greedy(model(test.x), test.input_lengths)
    truth = [test.label_list(b) for b in range(test.x.shape[0])]
    _heading(console, "CTC greedy decode against the truth (held-out)")
    console.print(_decode_table(truth, hyp))
    console.print(f"CTC label error rate on {N_EVAL} held-out utterances: "
                  f"{_ler(truth, hyp):.1%}")
    _undertrained_hint(console, _ler(truth, hyp), steps)

    ahead.wait("rnnt", console)
    rnnt_model, r_losses = train_rnnt(steps, seed, backend, console)
    _heading(console, "RNN-T loss (per label) falling")
    console.print(_loss_table(r_losses, steps))
    r_hyp, r_steps = D.rnnt_greedy_steps(rnnt_model, test.x, test.input_lengths)
    _heading(console, "RNN-T greedy decode against the truth (held-out)")
    console.print(_decode_table(truth, r_hyp))
    console.print(f"RNN-T label error rate on {N_EVAL} held-out utterances: "
                  f"{_ler(truth, r_hyp):.1%}")
    _undertrained_hint(console, _ler(truth, r_hyp), steps)

    ahead.wait("tdt", console)
    tdt_model, t_losses = train_tdt(steps, seed, backend, console)
    _heading(console, f"TDT loss (per label) falling (durations {list(tdt_model.durations)})")
    console.print(_loss_table(t_losses, steps))
    t_hyp, t_steps = D.tdt_greedy(tdt_model, test.x, test.input_lengths, tdt_model.durations)
    frames = int(test.input_lengths.sum())
    _heading(console, f"RNN-T and TDT greedy decoding on the {N_EVAL} held-out utterances "
             f"({frames} frames; a step is one joint evaluation)")
    console.print(decoding_steps(truth, (r_hyp, r_steps), (t_hyp, t_steps), frames))
    saved = sum(r_steps) - sum(t_steps)
    console.print(f"TDT decodes in {sum(t_steps)} steps where RNN-T takes {sum(r_steps)}: "
                  f"{saved} fewer ({saved / max(1, sum(r_steps)):.0%}), by jumping over frames.")
    _undertrained_hint(console, _ler(truth, t_hyp), steps)

    console.rule("seqloss beside torch.nn.functional.ctc_loss")
    compare_with_torch(model, test, backend, console)
    half_precision(model, test, backend, console)
    infeasible(model, test, backend, console)

    console.rule("alignment")
    # Plot an utterance both greedy decoders got right, and say which it is.
    both = [b for b in range(N_EVAL) if hyp[b] == truth[b] and r_hyp[b] == truth[b]]
    b = both[0] if both else 0
    verdict = {True: "right", False: "wrong"}
    note = (f"held-out utterance {b}: CTC greedy {verdict[hyp[b] == truth[b]]}, "
            f"RNN-T greedy {verdict[r_hyp[b] == truth[b]]}")
    ahead.wait("align", console)
    alignment_png(model, rnnt_model, test, Path(out), console, b=b, note=note)
