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

    arc_blank[t, u, i] = lp_tok[t, u, blank_arcs[i].token] + lp_dur[t, u, blank_arcs[i].duration_logit]
    arc_emit[t, u, j]  = lp_tok[t, u, y_{u+1}] - sigma + lp_dur[t, u, emit_arcs[j].duration_logit]

(the ``lp_dur`` term only where the arc names a duration logit). FastEmit
(``fastemit_lambda``) scales every emission arc's occupation by ``1 + λ`` in the
gradient, and the loss by ``1 + λ``. ``sigma`` shifts the emission scores only
(its derivative is zero).

Each backend has one implementation of the prologue and the epilogue that reads this
table (``reference.py``, ``numba_cpu.py``, ``triton_cuda.py`` beside it); a new
variant is a new table and a few lines of public-function code.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        sigma: subtracted from every emission's token log-probability.
        fastemit_lambda: FastEmit's ``λ >= 0``.
        clamp: ``> 0`` clamps each gradient element to ``[-clamp, clamp]``.
        emit_can_end: an emission may land on the final frame (see the lattice).
    """

    blank_arcs: tuple[Arc, ...]
    emit_arcs: tuple[Arc, ...]
    num_tokens: int
    num_durations: int = 0
    sigma: float = 0.0
    fastemit_lambda: float = 0.0
    clamp: float = -1.0
    emit_can_end: bool = False

    def encode(self) -> tuple[list[int], list[float]]:
        """The table as two flat lists (a ``torch.library`` schema takes no dataclass)."""
        ints = [len(self.blank_arcs), len(self.emit_arcs), self.num_tokens, self.num_durations,
                int(self.emit_can_end)]
        for a in (*self.blank_arcs, *self.emit_arcs):
            ints += [a.duration, -1 if a.token is None else a.token,
                     -1 if a.duration_logit is None else a.duration_logit]
        return ints, [float(self.sigma), float(self.fastemit_lambda), float(self.clamp)]

    @staticmethod
    def decode(ints: list[int], floats: list[float]) -> JointTable:
        nb, ne, V, D, can_end = ints[:5]
        arcs = [Arc(ints[k], None if ints[k + 1] < 0 else ints[k + 1],
                    None if ints[k + 2] < 0 else ints[k + 2]) for k in range(5, len(ints), 3)]
        return JointTable(tuple(arcs[:nb]), tuple(arcs[nb : nb + ne]), V, D, floats[0],
                          floats[1], floats[2], bool(can_end))

    @property
    def blank_durations(self) -> tuple[int, ...]:
        return tuple(a.duration for a in self.blank_arcs)

    @property
    def emit_durations(self) -> tuple[int, ...]:
        return tuple(a.duration for a in self.emit_arcs)

    @property
    def blank_tokens(self) -> tuple[int, ...]:
        return tuple(int(a.token) for a in self.blank_arcs)  # type: ignore[arg-type]


def rnnt_table(V: int, blank: int, clamp: float = -1.0, fastemit_lambda: float = 0.0) -> JointTable:
    """RNN-T (Graves, 2012): one blank advancing a frame, emissions advancing none."""
    return JointTable(blank_arcs=(Arc(1, token=blank),), emit_arcs=(Arc(0),), num_tokens=V,
                      clamp=clamp, fastemit_lambda=fastemit_lambda)
