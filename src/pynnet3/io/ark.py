"""Kaldi tables of matrices and vectors (archives and scp files) through kaldiio.

Kaldi names a table to read with an *rspecifier* and one to write with a
*wspecifier*: ``ark:feats.ark``, ``scp:feats.scp``, ``ark,t:out.txt``,
``ark,scp:out.ark,out.scp``, ``ark:-`` (stdin / stdout), ``"ark:gunzip -c f.gz |"``
(a pipe to read), ``"ark:| gzip -c > f.gz"`` (a pipe to write), scp lines with
byte offsets (``utt1 feats.ark:123``). Kaldi's options before the colon (``s``,
``cs``, ``p``, ``t``, ``b``, ``f``, ...) are accepted; ``t`` writes text and ``p``
(permissive) stops quietly at a bad entry. kaldiio does the reading (binary and text
entries; float, double and compressed ``CM``/``CM2``/``CM3`` matrices) and the
writing. This module adds what Kaldi's tools promise and kaldiio leaves to us:

- :class:`TableWriter` writes an archive (and its scp) to temporary files beside the
  targets and renames them into place only on :meth:`TableWriter.commit`, so a run that
  fails or is killed leaves no complete-looking output (:mod:`pynnet3.io.atomic` names
  and cleans the temporaries); the scp names the final archive path.
- :func:`read_table` yields entries one by one; an entry of an scp that cannot be read
  is reported as a :class:`TableEntryError` entry and reading goes on, an archive
  that breaks ends the iteration with a :class:`FormatError`.
- :func:`random_access_table` is Kaldi's RandomAccess reader (a mapping by key).
- Errors are :class:`pynnet3.errors.FormatError` naming the specifier.

:func:`parse_ark`, :func:`ark_bytes`, :func:`read_ark` and :func:`write_ark` are the
small whole-archive helpers (bytes and files).
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError
from .atomic import remove_stale_temporaries, start_writeback, temp_path

_FLOAT32_LE = np.dtype("<f4")
_WRITEBACK_STEP = 1 << 18  # archive bytes between two starts of the writeback

# Kaldi's table options (util/kaldi-table.h): read-side and write-side.
_READ_OPTIONS = {"ark", "scp", "t", "b", "s", "ns", "cs", "ncs", "o", "no", "p", "np", "bg"}
_WRITE_OPTIONS = {"ark", "scp", "t", "b", "f", "nf", "p", "np"}


def _kaldiio():
    try:
        import kaldiio
    except ImportError as e:  # (a dependency: only a broken install gets here)
        raise FormatError("reading and writing Kaldi archives needs the kaldiio package "
                          "(pip install kaldiio)") from e
    return kaldiio


class _LazyKaldiio:
    """kaldiio, imported when first used: a table whose entries are all plain binary
    matrices in files never needs it (a few ms of every ``compute`` start)."""

    def __getattr__(self, name: str):
        return getattr(_kaldiio(), name)


_LAZY_KALDIIO = _LazyKaldiio()
# kaldiio's text encoding for scp files (kaldiio.utils.default_encoding)
_SCP_ENCODING = "utf-8"


@dataclass(frozen=True)
class Specifier:
    """A parsed rspecifier or wspecifier: ``kind`` is ``"ark"``, ``"scp"`` or
    ``"ark,scp"``; ``targets`` the file names (two for ``ark,scp``), each a path,
    ``-`` or a pipe; ``options`` the other letters."""

    text: str
    kind: str
    targets: tuple[str, ...]
    options: frozenset[str]

    @property
    def is_text(self) -> bool:
        return "t" in self.options

    @property
    def permissive(self) -> bool:
        return "p" in self.options


def parse_specifier(text: str, write: bool = False) -> Specifier:
    """Parse an rspecifier (``write=False``) or a wspecifier; a malformed one is a
    :class:`FormatError` saying what was expected."""
    what = "wspecifier" if write else "rspecifier"
    head, sep, rest = str(text).partition(":")
    words = [w.strip() for w in head.split(",")] if sep else []
    allowed = _WRITE_OPTIONS if write else _READ_OPTIONS
    if not sep or not rest.strip() or not words or any(w not in allowed for w in words):
        example = "ark:out.ark, ark,t:out.txt, ark,scp:out.ark,out.scp or ark:-" if write \
            else "ark:feats.ark, scp:feats.scp, ark:- or 'ark:command |'"
        raise FormatError(f"bad {what} {text!r}: expected {example}")
    has_ark, has_scp = "ark" in words, "scp" in words
    if has_ark and has_scp:
        if not write:
            raise FormatError(f"bad rspecifier {text!r}: give ark: or scp:, not both")
        ark, comma, scp = rest.partition(",")
        if not comma or not ark.strip() or not scp.strip():
            raise FormatError(f"bad wspecifier {text!r}: ark,scp needs two files, "
                              "e.g. ark,scp:out.ark,out.scp")
        return Specifier(text, "ark,scp", (ark.strip(), scp.strip()),
                         frozenset(words) - {"ark", "scp"})
    if not (has_ark or has_scp):
        raise FormatError(f"bad {what} {text!r}: it names neither ark nor scp")
    if write and has_scp:
        raise FormatError(f"bad wspecifier {text!r}: writing an scp alone (to the files it "
                          "lists) is not supported; use ark:FILE or ark,scp:FILE.ark,FILE.scp")
    kind = "ark" if has_ark else "scp"
    return Specifier(text, kind, (rest.strip(),), frozenset(words) - {kind})


def _is_stream(target: str) -> bool:
    """``-`` or a pipe: written in place, not through a temporary."""
    return target == "-" or target.startswith("|") or target.endswith("|")


# -- reading -------------------------------------------------------------------------------------
class TableEntryError:
    """Yielded by :func:`read_table` in place of an array for an scp entry that could
    not be read (the message says why); reading goes on with the next entry."""

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"TableEntryError({self.message!r})"


def _as_array(key: str, value, source: str) -> np.ndarray:
    if isinstance(value, tuple):  # (rate, wave) of a wav entry: not a matrix
        raise FormatError(f"entry {key!r} is a wav, not a matrix or vector", source)
    arr = np.asarray(value)
    if arr.dtype.kind in "iu":  # (kaldiio reads a text "[ 1 2 ]" as integers)
        arr = arr.astype(np.float32)
    if arr.ndim not in (1, 2) or arr.dtype.kind != "f":
        raise FormatError(f"entry {key!r}: expected a float matrix or vector, got "
                          f"{arr.dtype} of shape {arr.shape}", source)
    return arr


def _stream_size(f) -> int | None:
    """The size of ``f`` when it is a regular file or a BytesIO (its entries' sizes
    can be checked against it before reading); None for a pipe or terminal."""
    if isinstance(f, io.BytesIO):
        return f.getbuffer().nbytes
    try:
        st = os.fstat(f.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _declared_data(head: bytes) -> tuple[int, int] | None:
    """``(offset of the data, bytes of data)`` a binary entry's header declares, from
    the entry's first bytes ``head`` (its ``\\0B`` on): ``FM``/``DM``, ``FV``/``DV``,
    an int32 vector, ``CM``/``CM2``/``CM3``; None for anything else (text, ...)."""
    if head[:2] != b"\0B":
        return None
    plain = _PLAIN_HEADS.get(head[2:5])
    if plain is not None:  # (float and double matrices and vectors: most entries)
        layout, width, start = plain
        if len(head) < start:
            return None
        v = layout.unpack_from(head)
        if v[0] != 4 or (len(v) == 4 and v[2] != 4):
            return None
        return start, width * (v[1] * v[3] if len(v) == 4 else v[1])
    if head[2:3] == b"\x04":  # an int32 vector: 5 bytes an element
        return (7, 5 * struct.unpack_from("<i", head, 3)[0]) if len(head) >= 7 else None
    width = {b"CM ": 1, b"CM2": 2, b"CM3": 1}.get(head[2:5])
    at = 5 if head[4:5] == b" " else 6
    if width is None or len(head) < at + 16:
        return None
    rows, cols = struct.unpack_from("<ii", head, at + 8)
    return at + 16, (8 * cols if head[2:5] == b"CM " else 0) + width * rows * cols


# token -> (its size fields after it, bytes per element, offset of the data)
_MATRIX_HEAD, _VECTOR_HEAD = struct.Struct("<5xBiBi"), struct.Struct("<5xBi")
_PLAIN_HEADS = {b"FM ": (_MATRIX_HEAD, 4, 15), b"DM ": (_MATRIX_HEAD, 8, 15),
                b"FV ": (_VECTOR_HEAD, 4, 10), b"DV ": (_VECTOR_HEAD, 8, 10)}


def _check_declared(f, size: int, key: str, source: str) -> None:
    """A :class:`FormatError` naming ``key`` when the entry at ``f``'s position
    declares more data than the file holds (a corrupt size field: kaldiio would
    allocate it, a MemoryError, or return a short vector without a word)."""
    pos = f.tell()
    head = f.read(32)
    f.seek(pos)
    declared = _declared_data(head)
    if declared is None:
        return
    start, nbytes = declared
    left = size - (pos + start)
    if nbytes < 0 or nbytes > left:
        raise FormatError(f"entry {key!r}: its header declares {nbytes} bytes of data, "
                          f"but only {max(left, 0)} are left (corrupt or truncated archive)",
                          source, offset=pos + start)


class _PipeReads:
    """A pipe as kaldiio reads archive entries from it: a read of the bytes an
    entry declares is made in chunks up to the end of the stream (kaldiio's one
    read would first make a buffer that large), and a short read of data (over 5
    bytes: kaldiio's probes and size fields ask for at most 5) is kept in
    ``short`` as ``(bytes declared, bytes there)``."""

    _CHUNK = 1 << 24

    def __init__(self, f):
        self._f = f
        self.short: tuple[int, int] | None = None

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n <= self._CHUNK:
            data = self._f.read(n)
        else:
            parts, want = [], n
            while want > 0:
                chunk = self._f.read(min(want, self._CHUNK))
                if not chunk:
                    break
                parts.append(chunk)
                want -= len(chunk)
            data = b"".join(parts)
        if n is not None and 5 < n and len(data) < n and self.short is None:
            self.short = (n, len(data))
        return data


def _read_value(f, size: int | None, kaldiio, key: str, source: str):
    """The value after ``key`` in ``f`` (kaldiio's read_kaldi), checked against a
    corrupt size field: before reading in a file of ``size`` bytes, after reading in a
    pipe (``f`` a :class:`_PipeReads`)."""
    if size is not None:
        _check_declared(f, size, key, source)
        return kaldiio.matio.read_kaldi(f)
    try:
        value = kaldiio.matio.read_kaldi(f)
    except Exception:
        if f.short is None:
            raise
    if f.short is not None:
        raise FormatError(f"entry {key!r}: its header declares {f.short[0]} bytes of data, "
                          f"but only {f.short[1]} are left (corrupt or truncated archive)",
                          source)
    return value


def _archive_entries(f, kaldiio, source: str) -> Iterator[tuple[str, object]]:
    """kaldiio's load_ark, with the entries' sizes checked (see :func:`_read_value`)."""
    size = _stream_size(f)
    if size is None:
        f = _PipeReads(f)
    while True:
        key = kaldiio.matio.read_token(f)
        if key is None:
            return
        yield key, _read_value(f, size, kaldiio, key, source)


def read_table(rspecifier: str) -> Iterator[tuple[str, np.ndarray | TableEntryError]]:
    """Entries ``(key, array)`` of a table in order (Kaldi's SequentialTableReader).
    An scp entry that cannot be read gives ``(key, TableEntryError)``; an archive that
    breaks raises :class:`FormatError` after its good entries (with ``p``: stops
    quietly)."""
    spec = parse_specifier(rspecifier)
    if spec.kind == "scp":
        yield from _read_scp(spec, _LAZY_KALDIIO)
        return
    plain_file = not _is_stream(spec.targets[0].strip())
    kaldiio = _LAZY_KALDIIO if plain_file else _kaldiio()
    try:
        f = (open(spec.targets[0], "rb") if plain_file  # (as kaldiio opens a file)
             else kaldiio.utils.open_like_kaldi(spec.targets[0], "rb"))
    except OSError as e:
        raise FormatError(f"cannot open {spec.targets[0]!r}: {e.strerror or e}",
                          rspecifier) from None
    with f:
        entries = (_file_archive_entries(f, rspecifier) if plain_file
                   else _archive_entries(f, kaldiio, rspecifier))
        yield from _archive_arrays(entries, rspecifier, spec.permissive)


_KEY_PROBE = 1024  # bytes read at an entry's start: its key, a space, a plain header


def _file_archive_entries(f, source: str) -> Iterator[tuple[str, object]]:
    """:func:`_archive_entries` of an archive file ``f``, read without kaldiio while
    the entries are plain binary float matrices or vectors (``FM``/``DM``/``FV``/
    ``DV``, as a feature or iVector archive holds them: a key, a space, the header,
    the data, read straight into the array); from the first other entry (text,
    compressed, integers, a long key, a size past the end of the file) on, kaldiio
    reads the rest as before, its errors unchanged (also a file that is not a regular
    one: a named pipe cannot go back to an entry's start)."""
    size = _stream_size(f)
    if size is None:
        yield from _archive_entries(f, _kaldiio(), source)
        return
    while True:
        pos = f.tell()
        probe = f.read(_KEY_PROBE)
        if not probe:
            return
        space = probe.find(b" ")
        head = probe[space + 1:space + 16]
        plain = _PLAIN_HEADS.get(head[2:5]) if space > 0 and head[:2] == b"\0B" else None
        arr = None
        if plain is not None and len(head) >= plain[2]:
            layout, width, start = plain
            v = layout.unpack_from(head)
            shape = (v[1], v[3]) if len(v) == 4 else (v[1],)
            data = pos + space + 1 + start
            if (v[0] == 4 and (len(v) == 2 or v[2] == 4) and min(shape) >= 0
                    and width * math.prod(shape) <= size - data):
                try:
                    key = probe[:space].decode(_SCP_ENCODING)
                except UnicodeDecodeError:
                    key = None
                if key is not None:
                    arr = np.empty(shape, "<f4" if width == 4 else "<f8")
                    f.seek(data)
                    if arr.nbytes and f.readinto(memoryview(arr).cast("B")) != arr.nbytes:
                        arr = None
        if arr is None:
            f.seek(pos)
            yield from _archive_entries(f, _kaldiio(), source)
            return
        yield key, arr


def _archive_arrays(entries: Iterator, source: str, permissive: bool = False
                    ) -> Iterator[tuple[str, np.ndarray]]:
    """``(key, array)`` of each archive entry from ``entries``. An entry that cannot
    be read ends the archive: quietly when ``permissive`` (Kaldi's ``p``), else as a
    :class:`FormatError` naming ``source``, after the good entries."""
    while True:
        try:
            key, value = next(entries)
            arr = _as_array(key, value, source)
        except StopIteration:
            return
        except FormatError:
            if permissive:
                return
            raise
        except Exception as e:
            if permissive:
                return
            raise FormatError(f"corrupt or truncated archive: {_why(e)}", source) from None
        yield key, arr


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _scp_lines(spec: Specifier, kaldiio) -> list[tuple[str, str]]:
    target = spec.targets[0]
    try:
        if _is_stream(target.strip()):
            with kaldiio.utils.open_like_kaldi(target, "r") as f:
                lines = f.read().splitlines()
        else:  # (a plain file: as kaldiio opens it, without importing kaldiio)
            with open(target, encoding=_SCP_ENCODING) as f:
                lines = f.read().splitlines()
    except OSError as e:
        raise FormatError(f"cannot open {spec.targets[0]!r}: {e.strerror or e}",
                          spec.text) from None
    except UnicodeDecodeError as e:
        raise FormatError(f"{spec.targets[0]!r} is not UTF-8 text (byte {e.start}: "
                          f"{e.object[e.start:e.start + 1]!r})", spec.text) from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.strip().split(None, 1)
        if len(parts) != 2:
            raise FormatError(f"scp line {number}: expected 'KEY RXFILENAME', got "
                              f"{line.strip()!r}", spec.text)
        out.append((parts[0], parts[1]))
    return out


_BINARY_ENTRIES = {b"FM ": ("<f4", 2), b"DM ": ("<f8", 2), b"FV ": ("<f4", 1),
                   b"DV ": ("<f8", 1)}


def _binary_entry(where: str) -> np.ndarray | None:
    """The entry at ``where`` (``FILE:OFFSET``) when it is a plain binary float matrix
    or vector (read straight into its array: what kaldiio.load_mat gives, with less
    work per entry); None for anything else (compressed, text, a pipe, a range, a
    short or unreadable file: kaldiio reads it or says what is wrong)."""
    path, colon, offset = where.rpartition(":")
    if not colon or not offset.isdigit() or not path or _is_stream(path.strip()):
        return None
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(int(offset))
            head = f.read(15)  # \0B, the type, 4-byte sizes (each after a \x04)
            kind = _BINARY_ENTRIES.get(head[2:5])
            if head[:2] != b"\0B" or kind is None:
                return None
            dtype, ndim = kind
            sizes = [head[6 + 5 * i:10 + 5 * i] for i in range(ndim)]
            if any(head[5 + 5 * i] != 4 or len(sizes[i]) != 4 for i in range(ndim)):
                return None
            shape = tuple(int.from_bytes(b, "little", signed=True) for b in sizes)
            start = int(offset) + 5 + 5 * ndim
            nbytes = np.dtype(dtype).itemsize * math.prod(shape)
            if min(shape) < 0 or nbytes > os.fstat(f.fileno()).st_size - start:
                return None  # (a corrupt size: the guarded read below says so)
            arr = np.empty(shape, dtype)
            f.seek(start)
            if arr.nbytes and f.readinto(memoryview(arr).cast("B")) != arr.nbytes:
                return None
            return arr
    except (OSError, ValueError, IndexError):
        return None


def _load_mat(kaldiio, where: str, key: str):
    """The entry at ``where`` (``FILE:OFFSET[RANGE]``, a pipe, ...), as kaldiio's
    load_mat reads it, its size checked (see :func:`_read_value`)."""
    arr = _binary_entry(where)
    if arr is not None:
        return arr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path, offset, slices = kaldiio.matio._parse_arkpath(where)
        with kaldiio.utils.open_like_kaldi(path, "rb") as f:
            if offset is not None:
                f.seek(offset)
            size = _stream_size(f)
            value = _read_value(f if size is not None else _PipeReads(f), size, kaldiio,
                                key, path)
    if slices is not None:
        value = (value[0], value[1][slices]) if isinstance(value, tuple) else value[slices]
    return value


def _read_scp(spec: Specifier, kaldiio) -> Iterator[tuple[str, np.ndarray | TableEntryError]]:
    for key, where in _scp_lines(spec, kaldiio):
        try:
            arr = _as_array(key, _load_mat(kaldiio, where, key), spec.text)
        except Exception as e:
            if spec.permissive:
                return
            yield key, TableEntryError(f"cannot read {where!r}: {_why(e)}")
            continue
        yield key, arr


class _ScpTable(Mapping):
    """Random access to an scp: entries loaded when asked for."""

    def __init__(self, spec: Specifier, kaldiio):
        self._spec, self._kaldiio = spec, kaldiio
        self._where = dict(_scp_lines(spec, kaldiio))

    def __getitem__(self, key: str) -> np.ndarray:
        where = self._where[key]
        try:
            return _as_array(key, _load_mat(self._kaldiio, where, key), self._spec.text)
        except FormatError:
            raise
        except Exception as e:
            raise FormatError(f"entry {key!r}: cannot read {where!r}: {_why(e)}",
                              self._spec.text) from None

    def __contains__(self, key) -> bool:  # (Mapping's would load the entry)
        return key in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def random_access_table(rspecifier: str) -> Mapping[str, np.ndarray]:
    """Kaldi's RandomAccessTableReader: a mapping ``key -> array``. An scp is read
    lazily (entries loaded when asked for), an archive or pipe whole."""
    spec = parse_specifier(rspecifier)
    if spec.kind == "scp":
        return _ScpTable(spec, _LAZY_KALDIIO)
    return {key: value for key, value in read_table(rspecifier)}


# -- writing -------------------------------------------------------------------------------------
class TableWriter:
    """Kaldi's TableWriter for matrices and vectors. Files are written to temporaries
    beside the targets and renamed into place by :meth:`commit` (the scp last, naming
    the final archive); :meth:`abort` (or leaving a ``with`` block by an exception)
    removes them. ``-`` and pipes are written as they go. ``compression_method``:
    kaldiio's (Kaldi's CompressionMethod numbers, 1 = automatic) or None."""

    def __init__(self, wspecifier: str, compression_method: int | None = None):
        self.spec = parse_specifier(wspecifier, write=True)
        self._kaldiio = _LAZY_KALDIIO  # (plain float32 entries to files need none of it)
        self.compression_method = compression_method
        self.num_written = 0
        self._done = False
        self._files: list[tuple[io.IOBase, str | None, str]] = []  # (file, temp, target)
        self._scp = None
        try:
            ark = self.spec.targets[0]
            self._ark = self._open(ark, "wb")
            self._ark_name = ark
            # an archive file's bytes are handed to the kernel's writeback every
            # _WRITEBACK_STEP bytes as they are written
            self._ark_temp = self._files[-1][1] is not None
            self._written_back = 0
            if self.spec.kind == "ark,scp":
                if _is_stream(ark):
                    raise FormatError(f"bad wspecifier {wspecifier!r}: an scp needs the "
                                      "archive to be a file (not '-' or a pipe)")
                self._scp = self._open(self.spec.targets[1], "w")
        except BaseException:
            self.abort()
            raise

    def _open(self, target: str, mode: str):
        if _is_stream(target):
            f = self._kaldiio.utils.open_like_kaldi(target, mode)
            self._files.append((f, None, target))
            return f
        remove_stale_temporaries(target)
        tmp = temp_path(target)
        try:
            f = open(tmp, mode.replace("w", "x"))  # noqa: SIM115
        except OSError as e:
            raise FormatError(f"cannot write {target!r}: {e.strerror or e}",
                              self.spec.text) from None
        self._files.append((f, tmp, target))
        return f

    def write(self, key: str, array) -> None:
        """Write one entry (a matrix or vector, stored as float32 ``FM``/``FV``)."""
        self._check_key(key)
        arr = np.asarray(array)
        if arr.ndim not in (1, 2):
            raise FormatError(f"entry {key!r}: expected a matrix or vector, got shape "
                              f"{arr.shape}", self.spec.text)
        if arr.dtype != np.float64:
            arr = arr.astype(np.float32, copy=False)
        offset = self._ark.tell() if self._scp is not None else 0
        if (arr.dtype == _FLOAT32_LE and not self.spec.is_text
                and self.compression_method is None):
            # the bytes kaldiio writes (key, \0B, FM rows cols / FV dim, the floats),
            # the floats straight from the array (no copy, no per-entry overhead)
            sizes = b"".join(b"\x04" + int(n).to_bytes(4, "little", signed=True)
                             for n in arr.shape)
            self._ark.write(f"{key} ".encode() + (b"\0BFM " if arr.ndim == 2 else b"\0BFV ")
                            + sizes)
            self._ark.write(np.ascontiguousarray(arr).data)
        else:
            self._kaldiio.save_ark(self._ark, {key: arr}, text=self.spec.is_text,
                                   compression_method=self.compression_method)
        self._entry_written(key, offset)

    __setitem__ = write

    def _check_key(self, key: str) -> None:
        if not key or any(ch.isspace() for ch in key):
            raise FormatError(f"archive key {key!r} is empty or has whitespace",
                              self.spec.text)

    def _entry_written(self, key: str, offset: int) -> None:
        """Once an entry's bytes are written from archive position ``offset``: its scp
        line (pointing past the key and its space), a flush for ``f``, the count."""
        if self._scp is not None:
            position = offset + len(key.encode("utf-8")) + 1
            self._scp.write(f"{key} {self._ark_name}:{position}\n")
        if "f" in self.spec.options:
            self._ark.flush()
        self.num_written += 1
        if self._ark_temp:  # (see start_writeback: commit's fsync waits for less)
            end = self._ark.tell()
            if end - self._written_back >= _WRITEBACK_STEP:
                self._ark.flush()
                start_writeback(self._ark.fileno(), self._written_back,
                                end - self._written_back)
                self._written_back = end

    def write_object(self, key: str, payload: bytes) -> None:
        """Write one entry whose serialization is already made (``payload``: a Kaldi
        object as its holder writes it, with the ``\\0B`` marker when binary), e.g. an
        example of :mod:`pynnet3.io.egs`; the scp line points at the payload."""
        self._check_key(key)
        offset = self._ark.tell() if self._scp is not None else 0
        self._ark.write(key.encode("utf-8") + b" " + payload)
        self._entry_written(key, offset)

    def commit(self) -> None:
        """Flush, sync and rename the temporaries into place (the archive before the
        scp, so a listed archive always exists)."""
        if self._done:
            return
        try:
            for f, tmp, _target in self._files:
                f.flush()
                if tmp is not None:
                    os.fsync(f.fileno())
                f.close()
            mask = os.umask(0)
            os.umask(mask)
            for _f, tmp, target in self._files:
                if tmp is not None:
                    os.chmod(tmp, 0o666 & ~mask)
                    os.replace(tmp, target)
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        """Close and remove the temporaries; the targets are left as they were."""
        if self._done:
            return
        self._done = True
        for f, tmp, _target in self._files:
            try:
                if tmp is not None or not f.closed:
                    f.close()
            except Exception:  # (a broken pipe: nothing to keep)
                pass
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


# -- whole archives --------------------------------------------------------------------------------
def parse_ark(data: bytes, source: str = "<bytes>") -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(key, array)`` for every entry of an archive held in ``data`` (binary or
    text entries, compressed matrices); a bad archive is a :class:`FormatError`."""
    yield from _archive_arrays(_archive_entries(io.BytesIO(data), _kaldiio(), source), source)


def ark_bytes(entries: dict[str, np.ndarray], double: bool = False) -> bytes:
    """Binary archive bytes for ``key -> matrix or vector`` (float32 unless ``double``)."""
    kaldiio = _kaldiio()
    out = io.BytesIO()
    dtype = np.float64 if double else np.float32
    for key, value in entries.items():
        if not key or any(ch.isspace() for ch in key):
            raise FormatError(f"archive key {key!r} is empty or has whitespace")
        arr = np.asarray(value)
        if arr.ndim not in (1, 2):
            raise FormatError(f"entry {key!r}: expected a matrix or vector, got shape "
                              f"{arr.shape}")
        kaldiio.save_ark(out, {key: np.ascontiguousarray(arr, dtype=dtype)})
    return out.getvalue()


def read_ark(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All entries of an archive file, key -> array (later keys win)."""
    with open(path, "rb") as f:
        data = f.read()
    return dict(parse_ark(data, str(path)))


def write_ark(path: str | os.PathLike, entries: dict[str, np.ndarray],
              double: bool = False) -> None:
    """Write a binary archive (atomically)."""
    from .atomic import atomic_write

    atomic_write(path, ark_bytes(entries, double))


__all__ = ["Specifier", "TableEntryError", "TableWriter", "ark_bytes", "parse_ark",
           "parse_specifier", "random_access_table", "read_ark", "read_table", "write_ark"]
