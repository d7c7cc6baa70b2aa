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
            raise r.error("expected '<I1> n t x'", pos=r.token_start(),
                          token=r.peek_token() if not r.at_eof() else "<eof>")
        try:
            out[i] = [int(g) for g in m.groups()]
        except ValueError:
            raise r.error("bad integer in an index", pos=m.start(1),
                          token=b" ".join(m.groups()).decode(errors="replace")) from None
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

# Bytes read from stdin or a pipe at a time: an archive there is parsed from a buffer
# of about a chunk plus the entry being read, not read whole (a 2 GB egs archive piped
# in took 2 GB before its first example).
STREAM_CHUNK = 1 << 22


def _is_stream(target: str) -> bool:
    return target == "-" or target.startswith("|") or target.endswith("|")


def _open_data(target: str, source: str):
    """The bytes of a file (memory-mapped), stdin or a pipe's output (read whole: an
    archive is read from those by :func:`_read_stream`)."""
    from .ark import _kaldiio

    if not _is_stream(target):
        try:
            f = open(target, "rb")  # noqa: SIM115
        except OSError as e:
            raise FormatError(f"cannot open {target!r}: {e.strerror or e}", source) from None
        with f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        with _kaldiio().utils.open_like_kaldi(target, "rb") as f:
            return f.read()
    except OSError as e:
        raise FormatError(f"cannot read {target!r}: {e.strerror or e}", source) from None


class _StreamBinaryReader(BinaryReader):
    """A BinaryReader over a part of a stream that starts ``base`` bytes into it:
    errors give offsets in the whole stream."""

    def __init__(self, data, source: str, pos: int, base: int):
        super().__init__(data, source, pos)
        self.base = base

    def error(self, message: str, token: str | None = None, pos: int | None = None):
        pos = self.pos if pos is None else pos
        return FormatError(message, self.source, offset=self.base + pos, token=token)


class _StreamTextReader(TextReader):
    """A TextReader over a part of a stream after ``lines`` newlines of it: errors
    give lines of the whole stream."""

    def __init__(self, data, source: str, pos: int, lines: int):
        super().__init__(data, source, pos)
        self.lines = lines

    def error(self, message: str, token: str | None = None, pos: int | None = None):
        pos = self.pos if pos is None else pos
        return FormatError(message, self.source,
                           line=self.lines + self.data.count(b"\n", 0, pos) + 1, token=token)


def _entries(data, source: str, permissive: bool,
             read=None) -> Iterator[tuple[str, NnetExample]]:
    """``(key, example)`` for the entries of an archive: all in ``data`` (bytes or an
    mmap) when ``read`` is None; else ``data`` is its start and ``read(n)`` gives the
    rest, up to ``n`` bytes a call (none at the end) (:func:`_read_stream`).

    From a stream, an entry is parsed from a buffer of what is left of the data read;
    one that cannot be parsed yet (its end not there, or wrong only because it is cut
    off: any exception) is parsed again after reading more, until the stream ends, when
    the entry's outcome (an example or an error) is the one the whole archive gives.
    An entry read counts only when its last token is followed by a space or another
    byte there (so no token, number or run of whitespace of it ends where the buffer
    does): every read of the readers checks its bounds, or searches for a delimiter, so
    such an entry is the one the whole archive gives. Errors name places in the whole
    stream (offsets, lines)."""
    pos = base = lines = 0  # base, lines: the bytes and newlines before data[0]
    at_end = read is None
    while True:
        try:
            m = _KEY.match(data, pos)
            if m is None or m.end() <= m.start(1):
                if at_end:
                    return
                raise EOFError
            key = m.group(1).decode("utf-8", errors="replace")
            at = m.end()
            sep = data[at:at + 1]
            if sep not in (b" ", b"\t", b"\n"):
                raise FormatError("expected a space after the key", source, offset=base + at,
                                  token=key)
            if sep != b"\n":
                at += 1
            text = data[at:at + 2] != b"\0B"
            if not text:
                r: KaldiReader = (BinaryReader(data, source, pos=at + 2) if read is None
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
                raise EOFError  # (the last token may go on)
        except Exception as e:
            if at_end:
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


def _read_stream(target: str, source: str,
                 permissive: bool) -> Iterator[tuple[str, NnetExample]]:
    """The examples of an archive on stdin (``-``) or from a pipe, read
    :data:`STREAM_CHUNK` bytes at a time: each is yielded when it has been read."""
    from .ark import _kaldiio

    try:
        f = _kaldiio().utils.open_like_kaldi(target, "rb")
    except OSError as e:
        raise FormatError(f"cannot read {target!r}: {e.strerror or e}", source) from None
    def read(n: int) -> bytes:
        try:
            return f.read(n)
        except OSError as e:
            raise FormatError(f"cannot read {target!r}: {e.strerror or e}", source) from None

    with f:
        yield from _entries(b"", source, permissive, read)


def read_examples(rspecifier: str) -> Iterator[tuple[str, NnetExample]]:
    """Examples ``(key, NnetExample)`` of a table in order (Kaldi's
    SequentialNnetExampleReader): ``ark:``, ``scp:``, ``-`` and pipes (read as they
    come, a chunk at a time)."""
    from .ark import parse_specifier

    spec = parse_specifier(rspecifier)
    if spec.kind == "scp":
        yield from _read_scp(spec)
        return
    target = spec.targets[0]
    if _is_stream(target):
        yield from _read_stream(target, rspecifier, spec.permissive)
        return
    yield from parse_examples(_open_data(target, rspecifier), rspecifier, spec.permissive)


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
