r"""The table of arcs that turns a joint network's logits into a transducer lattice.

Every transducer loss on a full joint ``(B, T, U+1, V [+ D])`` is the same three steps:

1. **prologue**: log-softmax over the ``V`` token logits (and, if the table has a
   duration block, a second log-softmax over the ``D`` duration logits after them);
   the score of each arc of the lattice is read off those log-probabilities;
2. the **lattice** recursion (``seqloss.transducer_lattice``) on those arc scores;
3. **epilogue**: the arcs' occupations mapped back to a gradient on the logits,
   ``softmax * (occupation of all arcs leaving the state) - sum over arcs of
   occupation * onehot(the arc's class)``, per block, then ``clamp`` and scaling.

What differs between RNN-T, multi-blank RNN-T and TDT is only which arcs exist: that
is this table. An arc is a token class (a fixed class for blank-like arcs; the next
target label for emissions), a frame advance, and optionally an index into the
duration block whose log-probability is added to the arc's score::

    arc_blank[t, u, i] = lp_tok[t, u, blank_arcs[i].token] - sigma
                         + lp_dur[t, u, blank_arcs[i].duration_logit]
    arc_emit[t, u, j]  = lp_tok[t, u, y_{u+1}] - sigma + lp_dur[t, u, emit_arcs[j].duration_logit]

(the ``lp_dur`` term only where the arc names a duration logit). FastEmit
(``fastemit_lambda``) scales every emission arc's occupation by ``1 + λ`` in the
gradient, and the loss by ``1 + λ``. ``sigma`` is NeMo's logit under-normalization:
it shifts every arc's token log-probability, blank-like arcs included (NeMo's
multi-blank and TDT kernels subtract it after every ``logp``), so a path pays
``sigma`` per step and paths with fewer (longer) steps gain; on emissions alone it
would be a constant ``U sigma`` with no effect on the gradient. Its derivative with
respect to the logits is zero: it acts through the occupations only.

``delay_penalty`` (k2's latency penalty) adds ``delay_penalty * ((T_b - 1) / 2 - t)``
to every emission arc leaving frame ``t`` of sequence ``b`` (every duration's, for
TDT): a per-frame constant on the emission scores, formed in the lattice's float64
in each backend's prologue, so like ``sigma`` it reaches the gradient through the
occupations only (the epilogue is unchanged). Centred on the middle frame, it leaves
the likelihood of a path emitting uniformly over time about unchanged and rewards
early emissions for ``delay_penalty > 0``.

**The blank's normalizer** (``normalizer``). ``"softmax"`` (every table above): one
log-softmax over the ``V`` token logits scores every arc. ``"hat"`` (the hybrid
autoregressive transducer, Variani et al., 2020): the blank arc's class is not in the
labels' softmax; it is normalized alone, by a sigmoid, and the emissions share what it
leaves::

    arc_blank[t, u] = logsigmoid(z_blank) - sigma
    arc_emit[t, u]  = logsigmoid(-z_blank) + z_y - logsumexp_{c != blank} z_c - sigma (+ delay)

(``log(1 - sigmoid(z)) = logsigmoid(-z)``: exact). Its epilogue, with ``o_b``, ``o_e``
the blank's and the emission's occupations (``o_e`` with FastEmit's ``1 + λ``)::

    g[blank] = sigmoid(z_blank) (o_b + o_e) - o_b
    g[c]     = softmax_{c' != blank}(z)[c] o_e - o_e [c = y]       (c != blank)

then ``clamp`` and scaling as for ``"softmax"``. A ``"hat"`` table has one blank arc (its
``token`` is the blank's class), no duration block, and raw logits only (fused: HAT has
no log-probability form).

The duration block may also be a tensor of its own (TDT's ``(token_logits,
duration_logits)`` pair): every backend reads the two blocks through two views
(``joint_loss_forward_pair``), so the pair is never concatenated.

Each backend has one implementation of the prologue and the epilogue that reads this
table (``reference.py``, ``numba_cpu.py``, ``triton_cuda.py`` beside it); a new
variant is a new table and a few lines of public-function code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORMALIZERS = ("softmax", "hat")
"""The token block's normalizers a table may name (``JointTable.normalizer``)."""


@dataclass(frozen=True)
class Arc:
    """One kind of lattice arc.

    Attributes:
        duration: frame advance (``>= 1`` for blank-like arcs, ``>= 0`` for emissions).
        token: the token class scored, for a blank-like arc (``None`` for an emission,
            which scores the next target label).
        duration_logit: index into the duration block whose log-probability is added
            (``None``: no duration term).
    """

    duration: int
    token: int | None = None
    duration_logit: int | None = None


@dataclass(frozen=True)
class JointTable:
    """The arcs of a transducer and the joint's layout (see the module docstring).

    Attributes:
        blank_arcs: the blank-like arcs, ``Db >= 1`` of them (``token`` set).
        emit_arcs: the emission arcs, ``De >= 1`` of them (``token`` is ``None``).
        num_tokens: ``V``, the token logits (the first ``V`` classes of the joint).
        num_durations: ``D``, duration logits after the token logits (0: none).
        sigma: subtracted from every arc's token log-probability (blank-like arcs and
            emissions: NeMo's logit under-normalization).
        fastemit_lambda: FastEmit's ``λ >= 0``.
        clamp: ``> 0`` clamps each gradient element to ``[-clamp, clamp]``.
        emit_can_end: an emission may land on the final frame (see the lattice).
        delay_penalty: k2's delay penalty, added to every emission arc's score as
            ``delay_penalty * ((T_b - 1) / 2 - t)`` (see the module docstring).
        normalizer: ``"softmax"`` (one log-softmax over the token logits) or ``"hat"``
            (the blank arc's class by a sigmoid, outside the labels' softmax; see the
            module docstring).
    """

    blank_arcs: tuple[Arc, ...]
    emit_arcs: tuple[Arc, ...]
    num_tokens: int
    num_durations: int = 0
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = -1.0
    emit_can_end: bool = False
    delay_penalty: float = 0.0
    normalizer: str = "softmax"

    def __post_init__(self) -> None:
        if self.normalizer not in NORMALIZERS:
            raise ValueError(f"normalizer = {self.normalizer!r}: expected one of {NORMALIZERS}")
        if self.normalizer == "hat" and (len(self.blank_arcs) != 1 or self.num_durations):
            raise ValueError("a 'hat' table has one blank arc and no duration block")

    @property
    def hat(self) -> bool:
        """The blank's class is normalized by a sigmoid, outside the labels' softmax."""
        return self.normalizer == "hat"

    def encode(self) -> tuple[list[int], list[float]]:
        """The table as two flat lists (a ``torch.library`` schema takes no dataclass)."""
        ints = [len(self.blank_arcs), len(self.emit_arcs), self.num_tokens, self.num_durations,
                int(self.emit_can_end), NORMALIZERS.index(self.normalizer)]
        for a in (*self.blank_arcs, *self.emit_arcs):
            ints += [a.duration, -1 if a.token is None else a.token,
                     -1 if a.duration_logit is None else a.duration_logit]
        return ints, [float(self.sigma), float(self.fastemit_lambda), float(self.clamp),
                      float(self.delay_penalty)]

    @staticmethod
    def decode(ints: list[int], floats: list[float]) -> JointTable:
        nb, ne, V, D, can_end, norm = ints[:6]
        arcs = [Arc(ints[k], None if ints[k + 1] < 0 else ints[k + 1],
                    None if ints[k + 2] < 0 else ints[k + 2]) for k in range(6, len(ints), 3)]
        return JointTable(tuple(arcs[:nb]), tuple(arcs[nb : nb + ne]), V, D, floats[0],
                          floats[1], floats[2], bool(can_end),
                          floats[3] if len(floats) > 3 else 0.0, NORMALIZERS[norm])

    @property
    def blank_durations(self) -> tuple[int, ...]:
        return tuple(a.duration for a in self.blank_arcs)

    @property
    def emit_durations(self) -> tuple[int, ...]:
        return tuple(a.duration for a in self.emit_arcs)

    @property
    def blank_tokens(self) -> tuple[int, ...]:
        return tuple(int(a.token) for a in self.blank_arcs)  # type: ignore[arg-type]


def delay_terms(delay_penalty: float, logit_lengths: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, T)`` float64: ``delay_penalty * ((T_b - 1) / 2 - t)``, the delay penalty of an
    emission leaving frame ``t`` of sequence ``b`` (the kernels form the same numbers)."""
    tb = logit_lengths.to(torch.float64)[:, None]
    t = torch.arange(T, dtype=torch.float64, device=logit_lengths.device)[None, :]
    return delay_penalty * ((tb - 1.0) * 0.5 - t)


def rnnt_table(V: int, blank: int, clamp: float = -1.0, fastemit_lambda: float = 0.0, *,
               delay_penalty: float = 0.0) -> JointTable:
    """RNN-T (Graves, 2012): one blank advancing a frame, emissions advancing none."""
    return JointTable(blank_arcs=(Arc(1, token=blank),), emit_arcs=(Arc(0),), num_tokens=V,
                      clamp=clamp, fastemit_lambda=fastemit_lambda, delay_penalty=delay_penalty)


def _resolve_blank(blank: int, V: int) -> int:
    return blank % V if blank < 0 else blank


def multiblank_table(V: int, blank: int, big_blank_durations: tuple[int, ...], sigma: float = 0.0,
                     clamp: float = -1.0, fastemit_lambda: float = 0.0, *,
                     delay_penalty: float = 0.0) -> JointTable:
    """Multi-blank RNN-T (Xu et al., 2022) with NeMo's layout.

    The standard blank ``blank`` (``< 0`` counts from the end: ``-1`` is ``V - 1``)
    advances one frame; big blank ``i`` is class ``blank - 1 - i`` (``blank``
    resolved to ``[0, V)``) and advances ``big_blank_durations[i]`` frames; emissions
    advance none. NeMo's final state: the path ends on a blank-like arc landing
    exactly on ``T_b`` (``emit_can_end=False``). Arguments were validated by the caller.
    """
    blank = _resolve_blank(blank, V)
    arcs = (Arc(1, token=blank),) + tuple(
        Arc(int(d), token=blank - 1 - i) for i, d in enumerate(big_blank_durations))
    return JointTable(blank_arcs=arcs, emit_arcs=(Arc(0),), num_tokens=V, sigma=sigma,
                      fastemit_lambda=fastemit_lambda, clamp=clamp, delay_penalty=delay_penalty)


def tdt_table(V: int, blank: int, durations: tuple[int, ...], sigma: float = 0.0,
              clamp: float = -1.0, *, delay_penalty: float = 0.0) -> JointTable:
    """Token-and-Duration Transducer (Xu et al., 2023) with NeMo's layout.

    ``V`` token logits (the blank among them) then ``D = len(durations)`` duration
    logits. Duration ``k`` (``durations[k]`` frames) scores ``lp_dur[k]``: a blank
    takes every duration ``>= 1`` (never 0), an emission every duration (0
    included). As NeMo's ``TDTLossPytorch`` and its CUDA kernel compute it, an
    emission lands on a frame ``< T_b`` and the path ends on a blank landing exactly
    on ``T_b`` (``emit_can_end=False``). Arguments were validated by the caller.
    """
    blank = _resolve_blank(blank, V)
    blanks = tuple(Arc(int(d), token=blank, duration_logit=k)
                   for k, d in enumerate(durations) if d > 0)
    emits = tuple(Arc(int(d), duration_logit=k) for k, d in enumerate(durations))
    return JointTable(blank_arcs=blanks, emit_arcs=emits, num_tokens=V,
                      num_durations=len(durations), sigma=sigma, clamp=clamp,
                      delay_penalty=delay_penalty)


def epilogue_weights(table: JointTable, ob: torch.Tensor, oe: torch.Tensor,
                     blank_tokens: tuple[int, ...], D: int) -> torch.Tensor:
    """Each row's weights for the joint's epilogue (``joint_tile_grad``) from ``table``'s
    arc occupations ``ob (..., len(blank_arcs))`` and ``oe (..., len(emit_arcs))``
    (FastEmit's factor applied): ``(..., 3 + len(blank_tokens) + D)``, holding the token
    block's weight ``w`` (every arc leaving the row), the duration block's ``wd`` (``w``;
    0 for a table without durations, as TDT's RNN-T branch), the emission's ``oe``, each
    class of ``blank_tokens``' blank occupation, each duration logit's occupation."""
    nt = len(blank_tokens)
    occ = ob.new_zeros((*ob.shape[:-1], 3 + nt + D))
    total = ob.sum(-1) + oe.sum(-1)
    occ[..., 0] = total
    if table.num_durations:
        occ[..., 1] = total
    occ[..., 2] = oe.sum(-1)
    for i, a in enumerate(table.blank_arcs):
        occ[..., 3 + blank_tokens.index(a.token)] += ob[..., i]
        if a.duration_logit is not None:
            occ[..., 3 + nt + a.duration_logit] += ob[..., i]
    for j, a in enumerate(table.emit_arcs):
        if a.duration_logit is not None:
            occ[..., 3 + nt + a.duration_logit] += oe[..., j]
    return occ
