"""The layout of a Kaldi acoustic model (``final.mdl``): a ``TransitionModel`` then an
``AmNnetSimple`` (the nnet, ``<LeftContext>``, ``<RightContext>``, ``<Priors>``).

The transition model is plain data here: an :class:`HmmTopology` (one list of
:class:`HmmState` per topology entry, and which entry each phone uses), the
transition states as an int array of (phone, hmm_state, forward_pdf,
self_loop_pdf) rows, and the log-probabilities of the transition-ids. Reading and
writing give Kaldi's bytes back, text and binary (``TransitionModel::Write``,
``HmmTopology::Write``, ``AmNnetSimple::Write``); :class:`~pynnet3.am.AcousticModel`
turns the nnet part into a network.

On-disk quirks kept: in binary the topology stores the phone list and the
phone-to-entry map as integer vectors and flags a topology with separate self-loop
pdf classes by a ``-1`` before the entry count; such a model stores ``<Tuples>`` of
4 integers, an HMM one ``<Triples>`` of 3. In text, ``<PdfClass> c`` stands for
both pdf classes of an HMM state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..limits import exceeded
from .kaldi_stream import KaldiReader, KaldiWriter, make_reader, make_writer
from .model_file import AM_TOKEN, ModelParts, read_model_parts, write_model_parts
from .model_file import is_am_bytes as is_am_bytes  # (its home: io/model_file.py)

NO_PDF = -1  # Kaldi's kNoPdf: the pdf class of a final (non-emitting) state


@dataclass
class HmmState:
    """One state of a topology entry: its pdf classes (``NO_PDF`` for the final,
    non-emitting state) and its transitions as (destination state, probability)."""

    forward_pdf_class: int = NO_PDF
    self_loop_pdf_class: int = NO_PDF
    transitions: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class HmmTopology:
    """Kaldi's ``HmmTopology``: ``entries[i]`` is the list of states of entry i;
    ``phone2idx[p]`` is the entry phone p uses (-1: p has none; index 0 is unused)."""

    entries: list[list[HmmState]]
    phone2idx: np.ndarray

    @property
    def phones(self) -> np.ndarray:
        """The phones with an entry, ascending."""
        return np.flatnonzero(self.phone2idx >= 0)

    @property
    def is_hmm(self) -> bool:
        """True when every state's self-loop uses its forward pdf class (plain HMMs);
        False for chain-style topologies with separate self-loop pdf classes."""
        return all(s.forward_pdf_class == s.self_loop_pdf_class
                   for entry in self.entries for s in entry)

    def entry(self, phone: int) -> list[HmmState]:
        return self.entries[int(self.phone2idx[phone])]

    def num_pdf_classes(self, phone: int) -> int:
        classes = [c for s in self.entry(phone)
                   for c in (s.forward_pdf_class, s.self_loop_pdf_class)]
        return max(classes, default=NO_PDF) + 1


@dataclass
class TransitionModel:
    """Kaldi's ``TransitionModel``. ``tuples`` holds one row per transition state
    (numbered from 1): phone, hmm_state, forward_pdf, self_loop_pdf. ``log_probs[t]``
    is the log-probability of transition-id t (index 0 is unused and 0)."""

    topology: HmmTopology
    tuples: np.ndarray
    log_probs: np.ndarray

    @classmethod
    def build(cls, topology: HmmTopology,
              pdf_of: Callable[[int, int], int]) -> TransitionModel:
        """What Kaldi's ``TransitionModel(ctx_dep, topo)`` builds for a tree that maps
        (phone, pdf class) to ``pdf_of(phone, pdf_class)`` (a monophone tree): one
        transition state per emitting state of every phone, sorted, and the
        log-probabilities of the topology's transitions."""
        rows = set()
        for phone in topology.phones.tolist():
            for k, s in enumerate(topology.entry(phone)):
                if s.forward_pdf_class != NO_PDF:
                    rows.add((phone, k, pdf_of(phone, s.forward_pdf_class),
                              pdf_of(phone, s.self_loop_pdf_class)))
        tuples = np.array(sorted(rows), dtype=np.int64).reshape(-1, 4)
        log_probs = [0.0]
        for phone, k, _, _ in tuples.tolist():
            log_probs += [math.log(p) for _, p in topology.entry(phone)[k].transitions]
        return cls(topology, tuples, np.array(log_probs, dtype=np.float32))

    @property
    def is_hmm(self) -> bool:
        return self.topology.is_hmm

    @property
    def num_phones(self) -> int:
        return len(self.topology.phones)

    @property
    def num_pdfs(self) -> int:
        return int(self.tuples[:, 2:].max()) + 1 if len(self.tuples) else 0

    @property
    def num_transition_states(self) -> int:
        return len(self.tuples)

    @property
    def num_transition_ids(self) -> int:
        return sum(len(self.topology.entry(phone)[k].transitions)
                   for phone, k in self.tuples[:, :2].tolist())

    def problem(self) -> str | None:
        """Why this is not a valid transition model (None when it is)."""
        topo = self.topology
        for i, entry in enumerate(topo.entries):
            for k, s in enumerate(entry):
                for dest, _ in s.transitions:
                    if not 0 <= dest < len(entry):
                        return f"topology entry {i} state {k}: transition to missing state {dest}"
        rows = [tuple(row) for row in self.tuples.tolist()]
        if rows != sorted(set(rows)):
            return "transition states are not sorted and unique"
        for phone, k, fwd, loop in rows:
            if not 0 < phone < len(topo.phone2idx) or topo.phone2idx[phone] < 0:
                return f"transition state for phone {phone}, which has no topology entry"
            if not 0 <= k < len(topo.entry(phone)):
                return f"transition state for phone {phone} names missing hmm state {k}"
            if topo.entry(phone)[k].forward_pdf_class == NO_PDF:
                return f"transition state for phone {phone} is the final state {k}"
            if fwd < 0 or loop < 0:
                return f"transition state for phone {phone} state {k} has a negative pdf"
        if len(self.log_probs) != self.num_transition_ids + 1:
            return (f"<LogProbs> has {len(self.log_probs)} values; the topology and the "
                    f"transition states give {self.num_transition_ids} transition-ids + 1")
        return None


@dataclass
class AmParts:
    """What a ``final.mdl`` holds, before its nnet part becomes an Nnet."""

    transition_model: TransitionModel
    model: ModelParts
    left_context: int
    right_context: int
    priors: np.ndarray
    binary: bool = False


# -- reading ------------------------------------------------------------------------


def _count(r: KaldiReader) -> int:
    start = r.token_start() if not r.binary else r.pos
    n = r.read_int()
    if n < 0:
        raise r.error(f"negative count after {r.tag}", token=str(n), pos=start)
    return n


def _read_state(r: KaldiReader, is_hmm: bool) -> HmmState:
    fwd = r.read_int()
    loop = fwd if is_hmm else r.read_int()
    transitions = [(r.read_int(), _read_prob(r)) for _ in range(_count(r))]
    return HmmState(fwd, loop, transitions)


def _read_prob(r: KaldiReader) -> float:
    return float(np.float32(r.read_float()))  # Kaldi's BaseFloat


def _read_topology_binary(r: KaldiReader) -> HmmTopology:
    start = r.pos
    phones = r.read_int_vector()
    phone2idx = r.read_int_vector()
    n = r.read_int()
    is_hmm = n != -1
    if not is_hmm:
        n = r.read_int()
    if n < 0:
        raise r.error("negative number of topology entries", token=str(n))
    entries = [[_read_state(r, is_hmm) for _ in range(_count(r))] for _ in range(n)]
    topo = HmmTopology(entries, phone2idx)
    if not np.array_equal(phones, topo.phones) or phone2idx.max(initial=-1) >= n \
            or phone2idx.min(initial=-1) < -1:
        raise r.error("topology phone list and phone-to-entry map disagree", pos=start)
    return topo


def _read_topology_text(r: KaldiReader) -> HmmTopology:
    entries: list[list[HmmState]] = []
    owner: dict[int, int] = {}
    while r.peek_token() == "<TopologyEntry>":
        r.expect_token("<TopologyEntry>")
        r.expect_token("<ForPhones>")
        while r.peek_token() != "</ForPhones>":
            start = r.token_start()
            phone = r.read_int()
            if phone <= 0 or phone in owner:
                raise r.error("phone listed twice or not positive in <ForPhones>",
                              token=str(phone), pos=start)
            too_big = exceeded("max_dim", phone, "phone id")  # (sizes the phone table)
            if too_big:
                raise r.error(too_big, token=str(phone), pos=start)
            owner[phone] = len(entries)
        r.expect_token("</ForPhones>")
        states = []
        while r.peek_token() == "<State>":
            r.expect_token("<State>")
            start = r.token_start()
            if r.read_int() != len(states):
                raise r.error(f"expected state number {len(states)}", pos=start)
            s = HmmState()
            if r.peek_token() == "<PdfClass>":
                s.forward_pdf_class = s.self_loop_pdf_class = r.read_tagged("<PdfClass>", "int")
            elif r.peek_token() == "<ForwardPdfClass>":
                s.forward_pdf_class = r.read_tagged("<ForwardPdfClass>", "int")
                s.self_loop_pdf_class = r.read_tagged("<SelfLoopPdfClass>", "int")
            while r.peek_token() == "<Transition>":
                r.expect_token("<Transition>")
                s.transitions.append((r.read_int(), _read_prob(r)))
            r.expect_token("</State>")
            states.append(s)
        r.expect_token("</TopologyEntry>")
        entries.append(states)
    phone2idx = np.full(max(owner, default=0) + 1, -1, dtype=np.int64)
    for phone, i in owner.items():
        phone2idx[phone] = i
    return HmmTopology(entries, phone2idx)


def read_transition_model(r: KaldiReader) -> TransitionModel:
    """Read ``<TransitionModel> ... </TransitionModel>`` (``r`` at its first token)."""
    start = r.token_start()
    r.expect_token(AM_TOKEN)
    r.expect_token("<Topology>")
    topo = _read_topology_binary(r) if r.binary else _read_topology_text(r)
    r.expect_token("</Topology>")
    tok_start = r.token_start()
    tok = r.read_token()
    if tok not in ("<Triples>", "<Tuples>"):
        raise r.error("expected '<Triples>' or '<Tuples>'", token=tok, pos=tok_start)
    width = 3 if tok == "<Triples>" else 4
    n = _count(r)
    rows = []
    for _ in range(n):
        row = [r.read_int() for _ in range(width)]
        rows.append(row if width == 4 else row + row[2:])
    r.expect_token(tok.replace("<", "</"))
    log_probs = r.read_tagged("<LogProbs>", "vector")
    r.expect_token("</LogProbs>")
    r.expect_token("</TransitionModel>")
    tm = TransitionModel(topo, np.array(rows, dtype=np.int64).reshape(-1, 4), log_probs)
    if (width == 3) != topo.is_hmm:
        raise r.error(f"{tok} does not fit the topology (it has "
                      f"{'no ' if topo.is_hmm else ''}separate self-loop pdf classes)",
                      token=tok, pos=tok_start)
    problem = tm.problem()
    if problem:
        raise r.error(f"bad transition model: {problem}", pos=start)
    return tm


def read_am_parts(r: KaldiReader) -> AmParts:
    """Read a whole acoustic model (``r`` at ``<TransitionModel>``)."""
    tm = read_transition_model(r)
    model = read_model_parts(r)
    left = r.read_tagged("<LeftContext>", "int")
    right = r.read_tagged("<RightContext>", "int")
    priors = r.read_tagged("<Priors>", "vector")
    if not r.at_eof():
        raise r.error("unexpected data after the acoustic model", token=r.peek_token(),
                      pos=r.token_start())
    return AmParts(tm, model, left, right, priors, r.binary)


def parse_am_bytes(data: bytes, source: str = "<string>") -> AmParts:
    return read_am_parts(make_reader(data, source))


# -- writing ------------------------------------------------------------------------


def _write_topology(w: KaldiWriter, topo: HmmTopology) -> None:
    is_hmm = topo.is_hmm
    w.write_token("<Topology>")
    if w.binary:
        w.write_int_vector(topo.phones.tolist())
        w.write_int_vector(topo.phone2idx.tolist())
        if not is_hmm:
            w.write_int(-1)
        w.write_int(len(topo.entries))
        for entry in topo.entries:
            w.write_int(len(entry))
            for s in entry:
                w.write_int(s.forward_pdf_class)
                if not is_hmm:
                    w.write_int(s.self_loop_pdf_class)
                w.write_int(len(s.transitions))
                for dest, prob in s.transitions:
                    w.write_int(dest)
                    w.write_float(prob)
    else:
        w.raw("\n")
        for i, entry in enumerate(topo.entries):
            w.write_token("<TopologyEntry>")
            w.raw("\n")
            w.write_token("<ForPhones>")
            w.raw("\n" + "".join(f"{p} " for p in np.flatnonzero(topo.phone2idx == i)) + "\n")
            w.write_token("</ForPhones>")
            w.raw("\n")
            for k, s in enumerate(entry):
                w.write_token("<State>")
                w.write_int(k)
                if s.forward_pdf_class != NO_PDF:
                    if is_hmm:
                        w.write_tagged("<PdfClass>", "int", s.forward_pdf_class)
                    else:
                        w.write_tagged("<ForwardPdfClass>", "int", s.forward_pdf_class)
                        w.write_tagged("<SelfLoopPdfClass>", "int", s.self_loop_pdf_class)
                for dest, prob in s.transitions:
                    w.write_token("<Transition>")
                    w.write_int(dest)
                    w.write_float(prob)
                w.write_token("</State>")
                w.raw("\n")
            w.write_token("</TopologyEntry>")
            w.raw("\n")
    w.write_token("</Topology>")
    if not w.binary:
        w.raw("\n")


def write_transition_model(w: KaldiWriter, tm: TransitionModel) -> None:
    nl = "" if w.binary else "\n"
    is_hmm = tm.is_hmm
    tag = "<Triples>" if is_hmm else "<Tuples>"
    w.write_token(AM_TOKEN)
    w.raw(nl)
    _write_topology(w, tm.topology)
    w.write_token(tag)
    w.write_int(len(tm.tuples))
    w.raw(nl)
    for row in tm.tuples.tolist():
        for v in row[:3] if is_hmm else row:
            w.write_int(v)
        w.raw(nl)
    w.write_token(tag.replace("<", "</"))
    w.raw(nl)
    w.write_token("<LogProbs>")
    w.raw(nl)
    w.write_vector(tm.log_probs)
    w.write_token("</LogProbs>")
    w.raw(nl)
    w.write_token("</TransitionModel>")
    w.raw(nl)


def write_am_parts(parts: AmParts, binary: bool) -> bytes:
    """Kaldi's bytes of ``TransitionModel::Write`` then ``AmNnetSimple::Write``
    (binary files start with the ``\\0B`` marker)."""
    w = make_writer(binary)
    if binary:
        w.raw(b"\0B")
    write_transition_model(w, parts.transition_model)
    nnet = write_model_parts(parts.model, binary)
    w.raw(nnet[2:] if binary else nnet)  # (without the raw model's own marker)
    w.write_tagged("<LeftContext>", "int", parts.left_context)
    w.write_tagged("<RightContext>", "int", parts.right_context)
    w.write_tagged("<Priors>", "vector", parts.priors)
    return w.getvalue()
