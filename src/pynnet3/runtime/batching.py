"""Decoding several utterances at once (``pynnet3 compute --batch-size=N``, beyond
Kaldi's nnet3-compute, which runs one chunk at a time).

Each utterance is planned into chunks as :class:`pynnet3.runtime.simple.DecodableNnetSimple`
plans them; chunks of equal shape, from any utterance, wait in a :class:`ChunkQueue`
and run N at a time as the N sequences of one request (one sequence after another,
:func:`pynnet3.compiler.request.request_for_frames`), which the caching compiler's
shortcut builds cheaply from a two-sequence compile. No chunk sees another's rows,
so every output equals the chunk-by-chunk one up to float rounding.

A short last chunk has a shape of its own. Where
:func:`pynnet3.runtime.simple.pads_at_end` (frame-local networks, recurrences running
forward in time) it may be planned full-size instead
(``DecodableNnetSimple(pad_last_chunk=True)``: frames past the end repeat the last
frame) and cut back: its real rows are the same, and it joins the full chunks'
requests.

Invariant of the queue: utterances leave it in the order they came, each when all of
its chunks have run; it holds at most ``max_pending`` utterances before running the
oldest one's chunks in smaller batches (so memory stays bounded when some shape
never fills a batch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import PynnetError, RuntimeInputError
from .simple import ChunkPlan, DecodableNnetSimple, frame_local, run_chunks


@dataclass(eq=False)
class Utterance:
    """One utterance in a :class:`ChunkQueue`: its chunks' outputs as they arrive
    (priors and scale applied), how many are still to run, and the first error."""

    key: str
    decodable: DecodableNnetSimple
    plan: list[ChunkPlan]
    frames: int = 0
    outs: list = field(default_factory=list)
    left: int = 0
    error: PynnetError | None = None

    def output(self) -> np.ndarray:
        return self.outs[0] if len(self.outs) == 1 else np.concatenate(self.outs)


class ChunkQueue:
    """Chunks waiting to run ``batch_size`` at a time (module doc). ``add`` queues
    an utterance's plan; ``step`` runs what is ready and returns the utterances that
    are finished, oldest first. Every utterance must share one network, compiler,
    options and backend."""

    def __init__(self, batch_size: int, max_pending: int | None = None):
        if batch_size < 1:
            raise RuntimeInputError(f"batch size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.max_pending = max_pending if max_pending is not None else 2 * batch_size
        self.utterances: deque[Utterance] = deque()
        self.waiting: dict[tuple, list[tuple[Utterance, int]]] = {}

    def add(self, key: str, decodable: DecodableNnetSimple, plan: list[ChunkPlan],
            frames: int = 0) -> Utterance:
        u = Utterance(key, decodable, plan, frames, [None] * len(plan), len(plan))
        self.utterances.append(u)
        for j, chunk in enumerate(plan):
            self.waiting.setdefault(chunk.shape, []).append((u, j))
        return u

    def ready(self) -> bool:
        """Whether :meth:`step` has anything to run."""
        return len(self.utterances) > self.max_pending or any(
            len(m) >= self.batch_size for m in self.waiting.values())

    def _run(self, members: list[tuple[Utterance, int]]) -> None:
        try:
            outs = run_chunks(members[0][0].decodable, [u.plan[j] for u, j in members],
                              [u.decodable.features for u, _ in members])
        except PynnetError as e:  # (the computation failed: every utterance in it)
            outs = [e] * len(members)
        for (u, j), out in zip(members, outs, strict=True):
            if isinstance(out, PynnetError):
                u.error = u.error or out
            else:
                u.outs[j] = u.decodable.finish(out)
            u.left -= 1

    def _run_group(self, shape: tuple, whole: bool) -> None:
        """Run the waiting chunks of ``shape`` in batches: full ones only, or (whole)
        all of them."""
        members = self.waiting.pop(shape, [])
        size = self.batch_size
        while len(members) >= size or (whole and members):
            batch, members = members[:size], members[size:]
            self._run(batch)
        if members:
            self.waiting[shape] = members

    def step(self, final: bool = False) -> list[Utterance]:
        """Run every full batch (``final``: everything); while more than
        ``max_pending`` utterances are held, the oldest one's chunks run at once.
        Returns the finished utterances from the oldest on."""
        for shape in list(self.waiting):
            self._run_group(shape, whole=final)
        while len(self.utterances) > self.max_pending and self.utterances[0].left:
            head = self.utterances[0]
            for shape in {head.plan[j].shape for j, out in enumerate(head.outs)
                          if out is None}:
                self._run_group(shape, whole=True)
        done = []
        while self.utterances and not self.utterances[0].left:
            done.append(self.utterances.popleft())
        return done


def decode_batched(decodables: list[DecodableNnetSimple], batch_size: int,
                   plans: list[list[ChunkPlan]] | None = None) -> list[np.ndarray]:
    """The outputs of several utterances (each as :meth:`DecodableNnetSimple.output`)
    with their chunks run ``batch_size`` at a time (module doc); ``plans``: their
    :meth:`DecodableNnetSimple.plan` when already made. The first error of any
    utterance is raised."""
    queue = ChunkQueue(batch_size, max_pending=len(decodables))
    if plans is None:
        plans = [d.plan() for d in decodables]
    for i, (d, plan) in enumerate(zip(decodables, plans, strict=True)):
        queue.add(str(i), d, plan)
    done = queue.step(final=True)
    for u in done:
        if u.error is not None:
            raise u.error
    return [u.output() for u in done]


__all__ = ["ChunkQueue", "Utterance", "decode_batched", "frame_local"]  # (frame_local: simple's)
