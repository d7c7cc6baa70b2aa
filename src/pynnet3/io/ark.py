"""Kaldi binary archives of matrices and vectors (``ark:`` files), without kaldiio.

An archive is a sequence of entries ``<key> \\0B <object>``, the object being a
float or double matrix (``FM ``/``DM ``: ``\\x04`` + int32 rows, ``\\x04`` + int32
cols, row-major data) or vector (``FV ``/``DV ``: ``\\x04`` + int32 dim, data).
Only the binary form is handled; anything else raises :class:`FormatError` naming
the byte offset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ..errors import FormatError
from .atomic import atomic_write

_TYPES = {b"FM ": (np.float32, 2), b"DM ": (np.float64, 2),
          b"FV ": (np.float32, 1), b"DV ": (np.float64, 1)}


def _int32(data: bytes, pos: int, source: str) -> tuple[int, int]:
    if data[pos:pos + 1] != b"\x04" or pos + 5 > len(data):
        raise FormatError("expected a 4-byte integer (size byte \\x04)", source, offset=pos)
    return int(np.frombuffer(data, dtype="<i4", count=1, offset=pos + 1)[0]), pos + 5


def parse_ark(data: bytes, source: str = "<bytes>") -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(key, array)`` for every entry of a binary archive held in ``data``."""
    pos = 0
    n = len(data)
    while pos < n:
        while pos < n and data[pos:pos + 1] in (b"\n", b" "):
            pos += 1
        if pos >= n:
            return
        end = data.find(b" ", pos)
        if end < 0:
            raise FormatError("archive key without object", source, offset=pos)
        key = data[pos:end].decode("utf-8", errors="replace")
        pos = end + 1
        if data[pos:pos + 2] != b"\0B":
            raise FormatError(f"entry {key!r} is not in binary form (no \\0B marker)",
                              source, offset=pos)
        pos += 2
        tag = data[pos:pos + 3]
        if tag not in _TYPES:
            raise FormatError(f"entry {key!r}: unsupported object type", source, offset=pos,
                              token=tag.decode("latin-1"))
        dtype, ndim = _TYPES[tag]
        pos += 3
        if ndim == 2:
            rows, pos = _int32(data, pos, source)
            cols, pos = _int32(data, pos, source)
            shape: tuple[int, ...] = (rows, cols)
        else:
            dim, pos = _int32(data, pos, source)
            shape = (dim,)
        if min(shape) < 0:
            raise FormatError(f"entry {key!r}: negative size {shape}", source, offset=pos)
        count = int(np.prod(shape))
        nbytes = count * np.dtype(dtype).itemsize
        if pos + nbytes > n:
            raise FormatError(f"entry {key!r}: data truncated ({n - pos} of {nbytes} bytes)",
                              source, offset=pos)
        arr = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=count,
                            offset=pos).reshape(shape).astype(dtype)
        pos += nbytes
        yield key, arr


def read_ark(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All entries of a binary archive file, key -> array (later keys win)."""
    from pathlib import Path

    return dict(parse_ark(Path(path).read_bytes(), str(path)))


def ark_bytes(entries: dict[str, np.ndarray], double: bool = False) -> bytes:
    """Binary archive bytes for ``key -> matrix or vector`` (float32 unless ``double``)."""
    out = bytearray()
    dtype = np.dtype("<f8" if double else "<f4")
    for key, value in entries.items():
        if not key or any(ch.isspace() for ch in key):
            raise FormatError(f"archive key {key!r} is empty or has whitespace")
        arr = np.asarray(value)
        if arr.ndim not in (1, 2):
            raise FormatError(f"entry {key!r}: expected a matrix or vector, got shape "
                              f"{arr.shape}")
        tag = ("D" if double else "F") + ("M " if arr.ndim == 2 else "V ")
        out += key.encode() + b" \0B" + tag.encode()
        for d in arr.shape:
            out += b"\x04" + np.int32(d).astype("<i4").tobytes()
        out += np.ascontiguousarray(arr, dtype=dtype).tobytes()
    return bytes(out)


def write_ark(path: str | os.PathLike, entries: dict[str, np.ndarray],
              double: bool = False) -> None:
    """Write a binary archive (atomically)."""
    atomic_write(path, ark_bytes(entries, double))
