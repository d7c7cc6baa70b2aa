"""Kaldi nnet3 examples (``NnetExample``, ``<Nnet3Eg>``) and their archives.

An example is a list of :class:`NnetIo`: a name (an input or output node), the
indexes ``(n, t, x)`` of its rows and the features of those rows (a
:mod:`GeneralMatrix <pynnet3.io.general_matrix>`: full, compressed or sparse).
Training archives (``egs.*.ark``) hold one example per key; kaldiio stops at their
``<Nnet3Eg>`` token, so this module reads and writes them itself, in Kaldi's binary
and text layouts: reading then writing an archive gives its bytes back.

Indexes in binary use Kaldi's compact run-length form (``WriteIndexVector``): one
signed byte ``t - t_prev`` when an index continues the previous one with the same
``n`` and ``x`` and a step under 125 (the first relative to ``(0, 0, 0)``), else the
byte 127 and the full index as three int32. Both directions are vectorized: the
loop runs once per full index (one per sequence), not per row.

Tables: :func:`read_examples` takes an rspecifier (``ark:egs.ark``, ``scp:egs.scp``,
``ark:-``, ``"ark:gunzip -c egs.ark.gz |"``), :class:`ExampleWriter` a wspecifier
(``ark:out.ark``, ``ark,t:out.txt``, ``ark,scp:out.ark,out.scp``), written atomically
as :class:`pynnet3.io.ark.TableWriter` does.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError
from .general_matrix import (
    CompressedMatrix,
    SparseMatrix,
    general_matrix_shape,
    read_general_matrix,
    to_dense,
    write_general_matrix,
)
from .kaldi_stream import BinaryReader, KaldiReader, TextReader, make_writer

_MAX_NUM_IO = 1_000_000  # Kaldi's bound on <NumIo>


@dataclass
class NnetIo:
    """One named input or supervision of an example. Invariant: ``indexes`` is a
    ``(rows, 3)`` int32 array of ``(n, t, x)`` and ``features`` has that many rows."""

    name: str
    indexes: np.ndarray
    features: object  # np.ndarray | CompressedMatrix | SparseMatrix

    @classmethod
    def from_matrix(cls, name: str, t_begin: int, features, n: int = 0) -> NnetIo:
        """Kaldi's ``NnetIo(name, t_begin, feats)``: rows at ``t = t_begin, t_begin+1, ...``."""
        rows = general_matrix_shape(features)[0]
        idx = np.zeros((rows, 3), dtype=np.int32)
        idx[:, 0] = n
        idx[:, 1] = np.arange(t_begin, t_begin + rows)
        return cls(name, idx, features)

    @classmethod
    def from_labels(cls, name: str, dim: int, t_begin: int, labels,
                    t_stride: int = 1) -> NnetIo:
        """Kaldi's ``NnetIo(name, dim, t_begin, labels)``: one-hot sparse supervision."""
        labels = np.asarray(labels, dtype=np.int32)
        idx = np.zeros((labels.size, 3), dtype=np.int32)
        idx[:, 1] = t_begin + t_stride * np.arange(labels.size)
        return cls(name, idx, SparseMatrix.from_labels(labels, dim))

    @property
    def num_rows(self) -> int:
        return int(self.indexes.shape[0])

    @property
    def dim(self) -> int:
        return general_matrix_shape(self.features)[1]

    def dense(self) -> np.ndarray:
        """The features as a float32 matrix (decompressed or densified)."""
        return to_dense(self.features)

    def is_sparse(self) -> bool:
        return isinstance(self.features, SparseMatrix)


@dataclass
class NnetExample:
    """Kaldi's NnetExample: the inputs and supervisions of one (or, merged, several)
    sequences."""

    io: list[NnetIo] = field(default_factory=list)

    def __getitem__(self, name: str) -> NnetIo:
        for io in self.io:
            if io.name == name:
                return io
        raise KeyError(name)

    def names(self) -> list[str]:
        return [io.name for io in self.io]

    def size(self) -> int:
        """Kaldi's GetNnetExampleSize: the most rows of any NnetIo."""
        return max((io.num_rows for io in self.io), default=0)

    def structure_key(self) -> tuple:
        """Equal for examples Kaldi's NnetExampleStructureCompare calls equal (names,
        feature sizes, indexes): only those are merged together."""
        return tuple((io.name, general_matrix_shape(io.features), io.indexes.tobytes())
                     for io in self.io)

    def compress(self) -> NnetExample:
        """Kaldi's ``NnetExample::Compress``: full matrices become compressed ones."""
        return NnetExample([NnetIo(io.name, io.indexes, CompressedMatrix.compress(io.features))
                            if isinstance(io.features, np.ndarray) and io.features.size else io
                            for io in self.io])

    # -- serialization --------------------------------------------------------------
    def to_bytes(self, binary: bool = True) -> bytes:
        """The example as Kaldi writes it (binary with the ``\\0B`` marker)."""
        w = make_writer(binary)
        if binary:
            w.raw(b"\0B")
        write_example(w, self)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> NnetExample:
        r = BinaryReader(data, source, pos=2) if data[:2] == b"\0B" else TextReader(data, source)
        eg = read_example(r)
        if not r.at_eof():
            raise r.error("trailing data after </Nnet3Eg>", pos=r.token_start())
        return eg


# -- index vectors --------------------------------------------------------------------------------
_FULL = 127


def _read_index_vector_binary(r: KaldiReader) -> np.ndarray:
    start = r.pos
    size = r.read_int()
    if size < 0:
        raise r.error(f"negative index-vector size {size}", pos=start)
    data, pos = r.data, r.pos
    if size > len(data) - pos:  # (an index takes a byte at least: a corrupt size is
        # an error here, not an allocation of size * 12 bytes)
        _ran_out(r)
        raise r.error(f"index-vector size {size} is more than the {len(data) - pos} bytes "
                      "left", token=str(size), pos=start)
    out = np.empty((size, 3), dtype=np.int32)
    i, prev = 0, (0, 0, 0)
    while i < size:
        # Bytes up to the next 127 (or the end of the vector) are one-byte t steps.
        stop = data.find(b"\x7f", pos, pos + (size - i))
        run = (size - i) if stop < 0 else stop - pos
        if run:
            if pos + run > len(data):
                raise r.error("unexpected end of file in an index vector", pos=pos)
            steps = np.frombuffer(data, dtype=np.int8, count=run, offset=pos).astype(np.int64)
            if (np.abs(steps) >= 125).any():
                bad = int(np.argmax(np.abs(steps) >= 125))
                raise r.error("bad byte in a compact index vector",
                              token=str(int(steps[bad]) & 0xFF), pos=pos + bad)
            out[i:i + run, 0] = prev[0]
            out[i:i + run, 2] = prev[2]
            out[i:i + run, 1] = prev[1] + np.cumsum(steps)
            prev = (prev[0], int(out[i + run - 1, 1]), prev[2])
            i += run
            pos += run
        if i < size:  # a full index
            if pos + 16 > len(data):
                raise r.error("unexpected end of file in an index vector", pos=pos)
            if data[pos + 1] != 4 or data[pos + 6] != 4 or data[pos + 11] != 4:
                raise r.error("bad integer size byte in a full index", pos=pos)
            n, t, x = (struct.unpack_from("<i", data, pos + o)[0] for o in (2, 7, 12))
            out[i] = (n, t, x)
            prev = (n, t, x)
            i += 1
            pos += 16
    r.pos = pos
    return out


_I1 = re.compile(rb"\s*<I1>\s+(\S+)\s+(\S+)\s+(\S+)")
# What the data ends with when it is the start of an index (cut off in a stream)
_I1_START = re.compile(rb"\s*(?:<(?:I(?:1(?:>(?:\s+(?:\S+(?:\s+(?:\S+(?:\s+)?)?)?)?)?)?)?)?)?\Z")
_INT64 = 2**63


def _ran_out(r: KaldiReader) -> None:
    """Mark that ``r`` ran into the end of its data (for a stream: its buffer): an
    error that follows may be the cut's, so more is read (:func:`_entries`)."""
    r.ran_out = True


def _read_index_vector_text(r: KaldiReader) -> np.ndarray:
    start = r.token_start()
    size = r.read_int()
    if size < 0:
        raise r.error(f"negative index-vector size {size}", pos=start)
    # (an index takes 10 bytes at least, '<I1> n t x': a corrupt size allocates no more
    # than the data can fill, and the match after the last one there fails as before)
    out = np.empty((min(size, (len(r.data) - r.pos) // 10 + 1), 3), dtype=np.int64)
    for i in range(size):
        m = _I1.match(r.data, r.pos)
        if m is None:
            if _I1_START.match(r.data, r.pos):
                _ran_out(r)
            raise r.error("expected '<I1> n t x'", pos=r.token_start(),
                          token=r.peek_token() if not r.at_eof() else "<eof>")
        if m.end() >= len(r.data):  # (the last number may go on)
            _ran_out(r)
        try:
            values = [int(g) for g in m.groups()]
        except ValueError:
            raise r.error("bad integer in an index", pos=m.start(1),
                          token=b" ".join(m.groups()).decode(errors="replace")) from None
        try:
            out[i] = values
        except OverflowError:  # beyond int64: out of the int32 range, reported below
            out[i] = [min(max(v, -_INT64), _INT64 - 1) for v in values]
        r.pos = m.end()
    if size and ((out < -2**31) | (out > 2**31 - 1)).any():
        raise r.error("index out of the int32 range", pos=start)
    return out.astype(np.int32)


def _write_index_vector(w, indexes: np.ndarray) -> None:
    w.write_token("<I1V>")
    idx = np.asarray(indexes, dtype=np.int64).reshape(-1, 3)
    w.write_int(len(idx))
    if not w.binary:
        w.raw("".join(f"<I1> {n} {t} {x} " for n, t, x in idx.tolist()))
        return
    if not len(idx):
        return
    prev = np.vstack([np.zeros((1, 3), np.int64), idx[:-1]])
    step = idx[:, 1] - prev[:, 1]
    short = (idx[:, 0] == prev[:, 0]) & (idx[:, 2] == prev[:, 2]) & (np.abs(step) < 125)
    sizes = np.where(short, 1, 16)
    ends = np.cumsum(sizes)
    buf = np.zeros(int(ends[-1]), dtype=np.uint8)
    starts = ends - sizes
    buf[starts[short]] = step[short].astype(np.int8).view(np.uint8)
    full = np.flatnonzero(~short)
    if full.size:
        rec = np.zeros(full.size, dtype=[("m", "u1"), ("s1", "u1"), ("n", "<i4"), ("s2", "u1"),
                                          ("t", "<i4"), ("s3", "u1"), ("x", "<i4")])
        rec["m"], rec["s1"], rec["s2"], rec["s3"] = _FULL, 4, 4, 4
        rec["n"], rec["t"], rec["x"] = idx[full, 0], idx[full, 1], idx[full, 2]
        raw = rec.view(np.uint8).reshape(full.size, 16)
        buf[starts[full][:, None] + np.arange(16)] = raw
    w.raw(buf.tobytes())


# -- examples -------------------------------------------------------------------------------------
def read_example(r: KaldiReader) -> NnetExample:
    """One ``<Nnet3Eg> ... </Nnet3Eg>`` at the reader's position."""
    r.expect_token("<Nnet3Eg>")
    r.expect_token("<NumIo>")
    start = r.token_start()
    num_io = r.read_int()
    if not 0 < num_io <= _MAX_NUM_IO:
        raise r.error(f"invalid <NumIo> {num_io}", token=str(num_io), pos=start)
    ios = []
    for _ in range(num_io):
        r.expect_token("<NnetIo>")
        name = r.read_token()
        r.expect_token("<I1V>")
        at = r.token_start()
        indexes = (_read_index_vector_binary(r) if r.binary else _read_index_vector_text(r))
        features = read_general_matrix(r)
        rows = general_matrix_shape(features)[0]
        if rows != len(indexes):
            raise r.error(f"NnetIo {name!r}: {len(indexes)} indexes but features have "
                          f"{rows} rows", token=name, pos=at)
        r.expect_token("</NnetIo>")
        ios.append(NnetIo(name, indexes, features))
    r.expect_token("</Nnet3Eg>")
    return NnetExample(ios)


def write_example(w, eg: NnetExample) -> None:
    """Kaldi's ``NnetExample::Write`` (without the binary marker)."""
    if not eg.io:
        raise FormatError("cannot write an example with no NnetIo")
    w.write_token("<Nnet3Eg>")
    w.write_token("<NumIo>")
    w.write_int(len(eg.io))
    for io in eg.io:
        rows = general_matrix_shape(io.features)[0]
        if rows != len(io.indexes):
            raise FormatError(f"NnetIo {io.name!r}: {len(io.indexes)} indexes but {rows} "
                              "feature rows")
        w.write_token("<NnetIo>")
        w.write_token(io.name)
        _write_index_vector(w, io.indexes)
        write_general_matrix(w, io.features)
        w.write_token("</NnetIo>")
    w.write_token("</Nnet3Eg>")


# -- archives -------------------------------------------------------------------------------------
_KEY = re.compile(rb"\s*(\S+)")

# Bytes read from stdin, a pipe or a FIFO at a time: an archive there is parsed from a
# buffer of about a chunk plus the entry being read, not read whole (a 2 GB egs archive
# piped in took 2 GB before its first example).
STREAM_CHUNK = 1 << 22


def _is_stream(target: str) -> bool:
    return target == "-" or target.startswith("|") or target.endswith("|")


def _open_data(target: str, source: str):
    """The bytes of a file: a regular one memory-mapped; anything else (stdin, a pipe's
    output, a FIFO, a character device) read whole (an archive is read from those a
    chunk at a time by :func:`read_examples`)."""
    with _open(target, source) as f:
        if isinstance(f, _Regular):
            return f.data
        return _read_all(f, target, source)


class _Regular:
    """An opened regular file: its bytes (memory-mapped; b"" when empty)."""

    def __init__(self, data):
        self.data = data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _open(target: str, source: str):
    """:class:`_Regular` for a regular file, else an open binary stream (stdin, a
    pipe's output, a FIFO, /dev/stdin: their size is no length, so they are read, not
    mapped)."""
    from .ark import _kaldiio

    if _is_stream(target):
        try:
            return _kaldiio().utils.open_like_kaldi(target, "rb")
        except OSError as e:
            raise FormatError(f"cannot read {target!r}: {e.strerror or e}", source) from None
    try:
        f = open(target, "rb")  # noqa: SIM115
    except OSError as e:
        raise FormatError(f"cannot open {target!r}: {e.strerror or e}", source) from None
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        return f
    with f:
        if st.st_size == 0:
            return _Regular(b"")
        return _Regular(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def _reader(f, target: str, source: str):
    def read(n: int) -> bytes:
        try:
            return f.read(n)
        except OSError as e:
            raise FormatError(f"cannot read {target!r}: {e.strerror or e}", source) from None

    return read


def _read_all(f, target: str, source: str) -> bytes:
    return _reader(f, target, source)(-1)


class _StreamReading:
    """For the readers of a part of a stream (a buffer of it): ``ran_out`` is set when
    reading ran into the end of the buffer, so that an error may be the cut's and not
    the stream's: only then is more read (:func:`_entries`). The readers check the
    bounds of every read, and those that fail at the end of the data say "unexpected
    end of file" (:meth:`_check_end`); a token, number or whitespace run that ends
    where the buffer does leaves ``pos`` there (it only grows); searches for a
    delimiter (a ']', a regular expression of egs or general_matrix) that find none
    there are marked by them."""

    data: bytes
    pos: int
    ran_out = False

    def peek_token(self) -> str:
        m = _KEY.match(self.data, self.pos)  # (pos goes back after a peek)
        if m is None or m.end() >= len(self.data):
            self.ran_out = True
        return super().peek_token()  # type: ignore[misc]

    def at_eof(self) -> bool:
        if super().at_eof():  # type: ignore[misc]
            self.ran_out = True
            return True
        return False

    def _check_end(self, message: str, pos: int) -> None:
        if (pos >= len(self.data) or self.pos >= len(self.data)
                or message.startswith("unexpected end of file")
                or (message.startswith("expected a sparse vector")
                    and _SPARSE_START.match(self.data, pos))):
            self.ran_out = True


# What the data ends with when it is the start of a text sparse vector (the match of
# general_matrix's 'dim=D [ index value ... ]' failed there because it was cut off)
_SPARSE_START = re.compile(rb"\s*(?:d(?:i(?:m(?:=(?:\S+(?:\s+(?:\[[^\]]*)?)?)?)?)?)?)?\Z")


class _StreamBinaryReader(_StreamReading, BinaryReader):
    """A BinaryReader over a part of a stream that starts ``base`` bytes into it:
    errors give offsets in the whole stream."""

    def __init__(self, data, source: str, pos: int, base: int):
        super().__init__(data, source, pos)
        self.base = base

    def error(self, message: str, token: str | None = None, pos: int | None = None):
        pos = self.pos if pos is None else pos
        self._check_end(message, pos)
        return FormatError(message, self.source, offset=self.base + pos, token=token)


class _StreamTextReader(_StreamReading, TextReader):
    """A TextReader over a part of a stream after ``lines`` newlines of it: errors
    give lines of the whole stream."""

    def __init__(self, data, source: str, pos: int, lines: int):
        super().__init__(data, source, pos)
        self.lines = lines

    def _bracketed(self, what: str) -> tuple[bytes, int]:
        at = _KEY.match(self.data, self.pos)  # (the '[' and what it opens)
        if at is None or (at.group(1)[:1] == b"[" and self.data.find(b"]", at.start(1)) < 0):
            self.ran_out = True
        return super()._bracketed(what)

    def error(self, message: str, token: str | None = None, pos: int | None = None):
        pos = self.pos if pos is None else pos
        self._check_end(message, pos)
        return FormatError(message, self.source,
                           line=self.lines + self.data.count(b"\n", 0, pos) + 1, token=token)


class _NeedMore(Exception):
    """The entry at the start of a stream's buffer goes on past it."""


def _entries(data, source: str, permissive: bool,
             read=None) -> Iterator[tuple[str, NnetExample]]:
    """``(key, example)`` for the entries of an archive: all in ``data`` (bytes or an
    mmap) when ``read`` is None; else ``data`` is its start and ``read(n)`` gives the
    rest, up to ``n`` bytes a call (none at the end) (:func:`read_examples`).

    From a stream, an entry is parsed from a buffer of what is left of the data read;
    one that cannot be parsed yet is parsed again after reading more, until the stream
    ends, when the entry's outcome (an example or an error) is the one the whole
    archive gives. An entry cannot be parsed yet when reading it ran into the end of
    the buffer (its reader's ``ran_out``, :class:`_StreamReading`): an error strictly
    inside the buffer is final at once (a corrupt entry is not followed by reading the
    rest of the stream). An entry read counts only when its last token is followed by
    a space or another byte there (so no token, number or run of whitespace of it ends
    where the buffer does): every read of the readers checks its bounds, or searches
    for a delimiter, so such an entry is the one the whole archive gives. Errors name
    places in the whole stream (offsets, lines)."""
    pos = base = lines = 0  # base, lines: the bytes and newlines before data[0]
    at_end = read is None
    while True:
        r: KaldiReader | None = None
        try:
            m = _KEY.match(data, pos)
            if m is None or m.end() <= m.start(1):
                if at_end:
                    return
                raise _NeedMore
            key = m.group(1).decode("utf-8", errors="replace")
            at = m.end()
            if not at_end and at + 3 > len(data):  # (the key, its space, the \0B may go on)
                raise _NeedMore
            sep = data[at:at + 1]
            if sep not in (b" ", b"\t", b"\n"):
                raise FormatError("expected a space after the key", source, offset=base + at,
                                  token=key)
            if sep != b"\n":
                at += 1
            text = data[at:at + 2] != b"\0B"
            if not text:
                r = (BinaryReader(data, source, pos=at + 2) if read is None
                     else _StreamBinaryReader(data, source, at + 2, base))
            else:
                if isinstance(data, mmap.mmap):  # text errors count lines: need bytes
                    data = bytes(data)
                r = (TextReader(data, source, pos=at) if read is None else
                     _StreamTextReader(data, source, at, lines))
            try:
                eg = read_example(r)
            except FormatError as e:
                raise FormatError(f"example {key!r}: {e}") from None
            if not at_end and r.pos >= len(data) and data[r.pos - 1:r.pos] != b" ":
                raise _NeedMore  # (the last token may go on)
        except Exception as e:
            cut = isinstance(e, _NeedMore) or (r is not None and (
                getattr(r, "ran_out", False) or r.pos >= len(data)))
            if at_end or not cut:
                if permissive and isinstance(e, FormatError):
                    return
                raise
            # read more: at least a chunk, and half what is left (a long entry is
            # parsed again a logarithmic number of times, not once per chunk)
            lines += data.count(b"\n", 0, pos)
            base += pos
            rest = data[pos:]
            more = read(max(STREAM_CHUNK, len(rest) // 2))
            at_end = not more
            data, pos = rest + more, 0
            continue
        pos = r.pos
        if text and data[pos:pos + 1] in (b" ", b"\n"):
            pos += 1
        yield key, eg


def parse_examples(data, source: str = "<bytes>",
                   permissive: bool = False) -> Iterator[tuple[str, NnetExample]]:
    """``(key, example)`` for every entry of an archive held in ``data`` (bytes or an
    mmap), binary or text entries; a broken entry is a :class:`FormatError` naming
    the key and place (with ``permissive``, reading stops there quietly)."""
    return _entries(data, source, permissive)


def read_examples(rspecifier: str) -> Iterator[tuple[str, NnetExample]]:
    """Examples ``(key, NnetExample)`` of a table in order (Kaldi's
    SequentialNnetExampleReader): ``ark:``, ``scp:``, ``-`` and pipes. A regular file
    is memory-mapped; stdin, a pipe's output or a FIFO is read as it comes,
    :data:`STREAM_CHUNK` bytes at a time: each example is yielded when it has been
    read."""
    from .ark import parse_specifier

    spec = parse_specifier(rspecifier)
    if spec.kind == "scp":
        yield from _read_scp(spec)
        return
    target = spec.targets[0]
    with _open(target, rspecifier) as f:
        if isinstance(f, _Regular):
            yield from parse_examples(f.data, rspecifier, spec.permissive)
        else:
            yield from _entries(b"", rspecifier, spec.permissive,
                                _reader(f, target, rspecifier))


def _read_scp(spec) -> Iterator[tuple[str, NnetExample]]:
    from .ark import _kaldiio, _scp_lines

    files: dict[str, object] = {}
    for key, where in _scp_lines(spec, _kaldiio()):
        m = re.fullmatch(r"(.*):(\d+)", where)
        path, offset = (m.group(1), int(m.group(2))) if m else (where, 0)
        if path not in files:
            files[path] = _open_data(path, spec.text)
        data = files[path]
        try:
            if data[offset:offset + 2] == b"\0B":
                r: KaldiReader = BinaryReader(data, where, pos=offset + 2)
            else:
                if isinstance(data, mmap.mmap):  # (text errors count lines: need bytes,
                    data = files[path] = bytes(data)  # made once per file, not per entry)
                r = TextReader(data, where, pos=offset)
            eg = read_example(r)
        except FormatError as e:
            if spec.permissive:
                return
            raise FormatError(f"example {key!r}: {e}") from None
        yield key, eg


class ExampleWriter:
    """Kaldi's NnetExampleWriter over :class:`pynnet3.io.ark.TableWriter`: ``ark:``,
    ``ark,t:`` (text), ``ark,scp:``, ``-``; files appear on :meth:`commit` (or at the
    end of a ``with`` block that raised nothing)."""

    def __init__(self, wspecifier: str):
        from .ark import TableWriter

        self._table = TableWriter(wspecifier)
        self.binary = not self._table.spec.is_text

    @property
    def num_written(self) -> int:
        return self._table.num_written

    def write(self, key: str, eg: NnetExample) -> None:
        self._table.write_object(key, eg.to_bytes(self.binary))

    def commit(self) -> None:
        self._table.commit()

    def abort(self) -> None:
        self._table.abort()

    def __enter__(self) -> ExampleWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def examples_bytes(entries, binary: bool = True) -> bytes:
    """An archive's bytes for ``(key, example)`` pairs (or a dict)."""
    items = entries.items() if isinstance(entries, dict) else entries
    return b"".join(key.encode() + b" " + eg.to_bytes(binary) for key, eg in items)


__all__ = ["ExampleWriter", "NnetExample", "NnetIo", "examples_bytes", "parse_examples",
           "read_example", "read_examples", "write_example"]
