"""Kaldi's GeneralMatrix: the features of an example are a full, compressed or sparse matrix.

An ``NnetIo`` of an examples archive holds one of three kinds of matrix
(Kaldi's ``GeneralMatrix``):

- a full float matrix (``FM``; ``DM`` is read and kept as float32, as Kaldi's
  ``Matrix<BaseFloat>`` does): a ``numpy.ndarray`` of float32 here;
- a :class:`CompressedMatrix` (``CM`` / ``CM2`` / ``CM3``): the bytes as read are kept,
  so writing it again gives the same bytes; :meth:`CompressedMatrix.to_array`
  decompresses with Kaldi's arithmetic (``CompressedMatrix::CopyToMat``) bit for bit;
- a :class:`SparseMatrix` (``SM``, rows of ``SV`` sparse vectors): supervision such as
  one-hot labels or posteriors.

:func:`read_general_matrix` / :func:`write_general_matrix` read and write one in
Kaldi's binary or text layout (text has no compressed form: a compressed matrix is
written decompressed, as Kaldi does). Bad input is a :class:`FormatError` naming the
byte offset or line.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError
from .kaldi_stream import KaldiReader, KaldiWriter, format_float

# -- compressed matrices --------------------------------------------------------------------------
# min_value, range, num_rows, num_cols (the format is the token before them)
_CM_HEADER = struct.Struct("<ffii")
_U16_SCALE = np.float32(1.52590218966964e-05)  # Kaldi's 1/65535 constant, as a float
_U8_SCALE = np.float32(1.0) / np.float32(255.0)


@dataclass(frozen=True)
class CompressedMatrix:
    """A Kaldi CompressedMatrix held as its serialized bytes.

    ``fmt`` is the token (``CM``: one byte per element with per-column percentile
    headers, Kaldi's speech-feature method; ``CM2``: two bytes per element; ``CM3``:
    one byte per element); ``payload`` is everything after the token (the 16-byte
    global header, then the data). Invariant: ``payload`` has exactly the size the
    header implies."""

    fmt: str
    payload: bytes

    @property
    def header(self) -> tuple[float, float, int, int]:
        return _CM_HEADER.unpack_from(self.payload, 0)

    @property
    def shape(self) -> tuple[int, int]:
        _, _, rows, cols = self.header
        return rows, cols

    @staticmethod
    def data_size(fmt: str, rows: int, cols: int) -> int:
        """Bytes after the global header (Kaldi's ``DataSize`` minus the header)."""
        if fmt == "CM":
            return 8 * cols + rows * cols
        if fmt == "CM2":
            return 2 * rows * cols
        return rows * cols

    def to_array(self) -> np.ndarray:
        """The float32 matrix, as Kaldi's ``CopyToMat`` computes it (same float and
        double roundings, so the values are Kaldi's bit for bit)."""
        min_value, range_, rows, cols = self.header
        min_value, range_ = np.float32(min_value), np.float32(range_)
        data = memoryview(self.payload)[_CM_HEADER.size:]
        if self.fmt == "CM2":
            q = np.frombuffer(data, dtype="<u2").reshape(rows, cols).astype(np.float32)
            return min_value + (range_ * _U16_SCALE) * q
        if self.fmt == "CM3":
            q = np.frombuffer(data, dtype="u1").reshape(rows, cols).astype(np.float32)
            return min_value + (range_ * _U8_SCALE) * q
        heads = np.frombuffer(data[:8 * cols], dtype="<u2").reshape(cols, 4).astype(np.float32)
        p = min_value + (range_ * _U16_SCALE) * heads          # (cols, 4): p0 p25 p75 p100
        p0, p25, p75, p100 = (p[:, i:i + 1] for i in range(4))
        v = np.frombuffer(data[8 * cols:], dtype="u1").reshape(cols, rows).astype(np.float32)
        # CharToFloat: (float difference * float count) in float, then times a double
        # constant and added in double, rounded to float on return.
        low = (p25 - p0) * v
        mid = (p75 - p25) * (v - np.float32(64))
        high = (p100 - p75) * (v - np.float32(192))
        out = np.where(v <= 64, p0 + low.astype(np.float64) * (1 / 64.0),
                       np.where(v <= 192, p25 + mid.astype(np.float64) * (1 / 128.0),
                                p75 + high.astype(np.float64) * (1 / 63.0)))
        return np.ascontiguousarray(out.astype(np.float32).T)

    @classmethod
    def compress(cls, matrix: np.ndarray, method: str = "auto") -> CompressedMatrix:
        """Kaldi's ``CompressedMatrix::CopyFromMat``: ``auto`` (Kaldi's default
        kAutomaticMethod: ``CM`` for more than 8 rows, else ``CM2``), ``CM``, ``CM2`` or
        ``CM3`` (kSpeechFeature, kTwoByteAuto, kOneByteAuto), byte for byte as Kaldi
        writes them: its float steps in float32, and the ``+ 0.499`` / ``+ 0.5`` of its
        rounding in double (a float times an int constant, plus a double literal).
        kaldiio's compression, used before, added those in float32 and decoded the
        percentiles in another order: 1 in 6 speech-feature matrices and 1 in 3
        two-byte ones came out a quantization step off in some byte."""
        m = np.ascontiguousarray(matrix, dtype=np.float32)
        rows, cols = m.shape
        fmt = method if method != "auto" else ("CM" if rows > 8 else "CM2")
        if fmt not in ("CM", "CM2", "CM3"):
            raise ValueError(f"unknown compression method {method!r}")
        if not m.size:
            raise ValueError("cannot compress an empty matrix (Kaldi stores no data)")
        min_value, max_value = m.min(), m.max()
        if not (np.isfinite(min_value) and np.isfinite(max_value)):
            raise ValueError("cannot compress a matrix with NaN or Inf")
        if max_value == min_value:  # (in double, then stored as a float)
            max_value = np.float32(float(min_value) + (1.0 + abs(float(min_value))))
        range_ = np.float32(max_value - min_value)
        header = _CM_HEADER.pack(min_value, range_, rows, cols)
        if fmt == "CM2":
            return cls(fmt, header + _to_uint(m, min_value, range_, 65535).astype("<u2").tobytes())
        if fmt == "CM3":
            return cls(fmt, header + _to_uint(m, min_value, range_, 255).astype("u1").tobytes())
        # kOneByteWithColHeaders: per column, its 0/25/75/100th percentiles (the
        # elements at sorted positions 0, rows/4, 3*(rows/4), rows-1; rows > 8 here
        # except when CM is asked for, and then Kaldi sorts all when rows < 5)
        s = np.sort(m, axis=0)
        q = rows // 4
        pos = (0, q, 3 * q, rows - 1) if rows >= 5 else (0, 1, 2, 3)
        h = [_to_uint(s[min(i, rows - 1)], min_value, range_, 65535) for i in pos]
        if rows < 5:  # (missing ones are the previous plus one)
            for k in range(1, 4):
                if pos[k] >= rows:
                    h[k] = h[k - 1] + 1
        h[0] = np.minimum(h[0], 65532)
        h[1] = np.minimum(np.maximum(h[1], h[0] + 1), 65533)
        h[2] = np.minimum(np.maximum(h[2], h[1] + 1), 65534)
        h[3] = np.maximum(h[3], h[2] + 1)
        heads = np.stack(h, axis=1).astype("<u2")                   # (cols, 4)
        p0, p25, p75, p100 = (min_value + (range_ * _U16_SCALE) * hk.astype(np.float32)
                              for hk in h)                           # Uint16ToFloat
        # each entry through its own quarter's formula only (as Kaldi's FloatToChar
        # branches): its column's base, width and step count gathered by quarter
        v = m.T                                                      # (cols, rows)
        quarter = (v >= p25[:, None]).astype(np.intp) + (v >= p75[:, None])
        base = np.stack([p0, p25, p75], axis=1)                      # (cols, 3)
        width = np.stack([p25 - p0, p75 - p25, p100 - p75], axis=1)
        pick = np.take_along_axis
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            scaled = ((v - pick(base, quarter, axis=1)) / pick(width, quarter, axis=1)) \
                * _QUARTER_STEPS[quarter]
        chars = np.clip(_round(scaled, 0.5) + _QUARTER_START[quarter],
                        _QUARTER_START[quarter], _QUARTER_END[quarter])
        return cls(fmt, header + heads.tobytes() + chars.astype("u1").tobytes())


_INT_MIN = -2**31
# FloatToChar's quarters (below p25, below p75, the rest): steps, first and last code
_QUARTER_STEPS = np.array([64, 128, 63], np.float32)
_QUARTER_START = np.array([0, 64, 192], np.int64)
_QUARTER_END = np.array([64, 192, 255], np.int64)


def _round(x: np.ndarray, half: float) -> np.ndarray:
    """``static_cast<int>(x + half)`` for a float ``x`` and a double ``half``: the sum
    in double, truncated toward zero; NaN, infinities and values out of the int range
    give INT_MIN, as x86's conversion does (the callers then clamp)."""
    y = x.astype(np.float64) + half
    ok = np.isfinite(y) & (y > _INT_MIN - 1.0) & (y < 2.0**31)
    return np.where(ok, np.trunc(np.where(ok, y, 0.0)), _INT_MIN).astype(np.int64)


def _to_uint(values: np.ndarray, min_value, range_, top: int) -> np.ndarray:
    """Kaldi's FloatToUint16 (``top`` 65535) / FloatToUint8 (255): ``(value - min) /
    range`` in float clamped to [0, 1], times ``top`` in float, rounded by + 0.499."""
    f = (np.asarray(values, np.float32) - np.float32(min_value)) / np.float32(range_)
    f = np.minimum(np.maximum(f, np.float32(0)), np.float32(1))
    return _round(f * np.float32(top), 0.499)


# -- sparse matrices ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SparseMatrix:
    """Kaldi's SparseMatrix in compressed-row form: row ``r`` has the entries
    ``cols[row_ptr[r]:row_ptr[r+1]]`` (increasing, each in ``[0, num_cols)``) with
    ``values`` of the same range (float32)."""

    num_cols: int
    row_ptr: np.ndarray
    cols: np.ndarray
    values: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.row_ptr) - 1, self.num_cols

    def to_array(self) -> np.ndarray:
        """The dense float32 matrix (posteriors densified)."""
        rows = len(self.row_ptr) - 1
        out = np.zeros((rows, self.num_cols), dtype=np.float32)
        r = np.repeat(np.arange(rows), np.diff(self.row_ptr))
        np.add.at(out, (r, self.cols), self.values)
        return out

    @classmethod
    def from_labels(cls, labels, num_cols: int, weight: float = 1.0) -> SparseMatrix:
        """One entry per row: ``labels[r]`` with ``weight`` (Kaldi's one-hot supervision)."""
        labels = np.asarray(labels, dtype=np.int32)
        if labels.size and (labels.min() < 0 or labels.max() >= num_cols):
            raise FormatError(f"label out of range [0, {num_cols})")
        return cls(int(num_cols), np.arange(labels.size + 1, dtype=np.int64), labels,
                   np.full(labels.size, weight, dtype=np.float32))

    @staticmethod
    def append_rows(mats: list[SparseMatrix]) -> SparseMatrix:
        """Rows of ``mats`` one after the other (Kaldi's AppendSparseMatrixRows)."""
        dims = {m.num_cols for m in mats}
        if len(dims) != 1:
            raise FormatError(f"appending sparse matrices of different dims {sorted(dims)}")
        ptr, offset = [np.zeros(1, dtype=np.int64)], 0
        for m in mats:
            ptr.append(m.row_ptr[1:] + offset)
            offset += int(m.row_ptr[-1])
        return SparseMatrix(dims.pop(), np.concatenate(ptr),
                            np.concatenate([m.cols for m in mats]),
                            np.concatenate([m.values for m in mats]))

    def _check(self, reader: KaldiReader, start: int) -> SparseMatrix:
        if self.cols.size:
            bad = (self.cols < 0) | (self.cols >= self.num_cols)
            seg = np.diff(self.row_ptr)
            same_row = np.repeat(np.arange(len(seg)), seg)
            dec = (np.diff(self.cols) <= 0) & (np.diff(same_row) == 0)
            if bad.any() or dec.any():
                raise reader.error(f"sparse vector indexes must be increasing and in "
                                   f"[0, {self.num_cols})", pos=start)
        if not np.isfinite(self.values).all():
            raise reader.error("non-finite value in a sparse matrix", pos=start)
        return self


def _u32(data, pos: int) -> int:
    return struct.unpack_from("<i", data, pos)[0]


def _read_sparse_binary(r: KaldiReader, start: int) -> SparseMatrix:
    """After the ``SM`` token: rows, then per row ``SV`` dim count (index value)*.
    Rows all with the same count (one-hot supervision) are decoded in one numpy
    view; others row by row."""
    num_rows = r.read_int()
    if num_rows < 0:
        raise r.error(f"negative sparse-matrix size {num_rows}", pos=start)
    data, pos = r.data, r.pos
    if num_rows == 0:
        return SparseMatrix(0, np.zeros(1, np.int64), np.zeros(0, np.int32),
                            np.zeros(0, np.float32))
    if data[pos:pos + 3] == b"SV " and pos + 13 <= len(data):
        k = _u32(data, pos + 9)
        if 0 <= k <= 1_000_000:
            fast = _sparse_uniform(data, pos, num_rows, k)
            if fast is not None:
                r.pos = pos + num_rows * (13 + 10 * k)
                return fast._check(r, start)
    dims, ptr, cols, vals = set(), [0], [], []
    for _ in range(num_rows):
        r.expect_token("SV")
        dims.add(r.read_int())
        k = r.read_int()
        if k < 0:
            raise r.error(f"negative sparse-vector size {k}")
        for _ in range(k):
            cols.append(r.read_int())
            vals.append(r.read_float())
        ptr.append(len(cols))
    if len(dims) != 1:
        raise r.error(f"sparse matrix rows of different dims {sorted(dims)}", pos=start)
    return SparseMatrix(dims.pop(), np.array(ptr, np.int64), np.array(cols, np.int32),
                        np.array(vals, np.float32))._check(r, start)


def _sparse_uniform(data, pos: int, num_rows: int, k: int) -> SparseMatrix | None:
    """The rows as one structured view when every row has ``k`` entries written with
    4-byte ints and floats (what Kaldi writes); None when the bytes say otherwise."""
    row = np.dtype([("tok", "S3"), ("s1", "u1"), ("dim", "<i4"), ("s2", "u1"), ("k", "<i4"),
                    ("pairs", [("si", "u1"), ("i", "<i4"), ("sf", "u1"), ("v", "<f4")], (k,))])
    end = pos + num_rows * row.itemsize
    if end > len(data):
        return None
    rows = np.frombuffer(data, dtype=row, count=num_rows, offset=pos)
    pairs = rows["pairs"]
    if not ((rows["tok"] == b"SV ").all() and (rows["s1"] == 4).all()
            and (rows["s2"] == 4).all() and (rows["k"] == k).all()
            and (pairs["si"] == 4).all() and (pairs["sf"] == 4).all()
            and (rows["dim"] == rows["dim"][0]).all()):
        return None
    return SparseMatrix(int(rows["dim"][0]), np.arange(num_rows + 1, dtype=np.int64) * k,
                        pairs["i"].reshape(-1).astype(np.int32),
                        pairs["v"].reshape(-1).astype(np.float32))


_SPARSE_TEXT = re.compile(rb"\s*dim=(\S+)\s+\[([^\]]*)\]")


def _read_sparse_text(r: KaldiReader) -> SparseMatrix:
    """``rows=N`` then per row ``dim=D [ i v i v ... ]``."""
    start = r.token_start()
    tok = r.read_token()
    try:
        num_rows = int(tok[5:])
    except ValueError:
        raise r.error("expected rows=N", token=tok, pos=start) from None
    if num_rows < 0:
        raise r.error("negative sparse-matrix size", token=tok, pos=start)
    dims, ptr, cols, vals = set(), [0], [], []
    for _ in range(num_rows):
        at = r.token_start()
        m = _SPARSE_TEXT.match(r.data, r.pos)
        if m is None:
            raise r.error("expected a sparse vector 'dim=D [ index value ... ]'",
                          token=r.peek_token() if not r.at_eof() else "<eof>", pos=at)
        words = m.group(2).split()
        try:
            dims.add(int(m.group(1)))
            if len(words) % 2:
                raise ValueError
            cols.extend(int(w) for w in words[0::2])
            vals.extend(float(w) for w in words[1::2])
        except ValueError:
            raise r.error("bad sparse vector", token=m.group(0)[:40].decode(errors="replace"),
                          pos=at) from None
        ptr.append(len(cols))
        r.pos = m.end()
    if len(dims) > 1:
        raise r.error(f"sparse matrix rows of different dims {sorted(dims)}", pos=start)
    limit = np.iinfo(np.int32)
    if any(not limit.min <= c <= limit.max for c in cols) or \
            any(not limit.min <= d <= limit.max for d in dims):
        raise r.error("sparse vector index or dim out of the int32 range", pos=start)
    return SparseMatrix(dims.pop() if dims else 0, np.array(ptr, np.int64),
                        np.array(cols, np.int32), np.array(vals, np.float32))._check(r, start)


# -- GeneralMatrix read / write ------------------------------------------------------------------
def read_general_matrix(r: KaldiReader):
    """A full (ndarray), compressed or sparse matrix, as Kaldi's ``GeneralMatrix::Read``
    decides by the next byte."""
    start = r.token_start()
    if not r.binary:
        if r.data[start:start + 1] == b"r":
            return _read_sparse_text(r)
        return r.read_matrix()
    head = r.data[start:start + 4]
    if head[:1] == b"C":
        tok = r.read_token()
        if tok not in ("CM", "CM2", "CM3"):
            raise r.error("expected CM, CM2 or CM3", token=tok, pos=start)
        if r.pos + 16 > len(r.data):
            raise r.error("unexpected end of file in a compressed-matrix header")
        _, _, rows, cols = _CM_HEADER.unpack_from(r.data, r.pos)
        if rows < 0 or cols < 0:
            raise r.error(f"bad compressed-matrix size {rows}x{cols}", pos=start)
        if cols == 0 or rows == 0:  # Kaldi keeps no data: an empty matrix
            r.pos += 16
            return np.zeros((0, 0), dtype=np.float32)
        size = 16 + CompressedMatrix.data_size(tok, rows, cols)
        if r.pos + size > len(r.data):
            raise r.error(f"unexpected end of file in a {rows}x{cols} compressed matrix")
        payload = bytes(r.data[r.pos:r.pos + size])
        r.pos += size
        return CompressedMatrix(tok, payload)
    if head[:1] == b"S":
        r.expect_token("SM")
        return _read_sparse_binary(r, start)
    return r.read_matrix()


def general_matrix_shape(m) -> tuple[int, int]:
    return tuple(m.shape) if not isinstance(m, np.ndarray) else (m.shape[0], m.shape[1])


def to_dense(m) -> np.ndarray:
    """Any GeneralMatrix as a float32 ndarray (decompressed / densified)."""
    if isinstance(m, np.ndarray):
        return m
    return m.to_array()


def write_general_matrix(w: KaldiWriter, m) -> None:
    """Kaldi's ``GeneralMatrix::Write`` layout."""
    if isinstance(m, SparseMatrix):
        _write_sparse(w, m)
    elif isinstance(m, CompressedMatrix):
        if w.binary:
            w.raw(m.fmt.encode() + b" " + m.payload)
        else:
            _write_text_matrix(w, m.to_array())
    elif w.binary:
        w.write_matrix(np.asarray(m, dtype=np.float32))
    else:
        _write_text_matrix(w, np.asarray(m, dtype=np.float32))


def _write_text_matrix(w: KaldiWriter, m: np.ndarray) -> None:
    if m.ndim != 2 or m.shape[1] == 0:
        w.raw(" [ ]\n")
        return
    rows = ["\n  " + "".join(format_float(v) + " " for v in row) for row in m.tolist()]
    w.raw(" [" + "".join(rows) + "]\n")


def _write_sparse(w: KaldiWriter, m: SparseMatrix) -> None:
    rows = len(m.row_ptr) - 1
    counts = np.diff(m.row_ptr)
    if not w.binary:
        out = [f"rows={rows} "]
        for r in range(rows):
            lo, hi = m.row_ptr[r], m.row_ptr[r + 1]
            entries = zip(m.cols[lo:hi].tolist(), m.values[lo:hi].tolist(), strict=True)
            pairs = "".join(f"{int(c)} {format_float(v)} " for c, v in entries)
            out.append(f"dim={m.num_cols} [ {pairs}] ")
        out.append("\n")
        w.raw("".join(out))
        return
    w.write_token("SM")
    w.write_int(rows)
    if rows and (counts == counts[0]).all():  # one structured array for uniform rows
        k = int(counts[0])
        row = np.dtype([("tok", "S3"), ("s1", "u1"), ("dim", "<i4"), ("s2", "u1"), ("k", "<i4"),
                        ("pairs", [("si", "u1"), ("i", "<i4"), ("sf", "u1"), ("v", "<f4")],
                         (k,))])
        a = np.zeros(rows, dtype=row)
        a["tok"], a["s1"], a["dim"], a["s2"], a["k"] = b"SV ", 4, m.num_cols, 4, k
        a["pairs"]["si"], a["pairs"]["sf"] = 4, 4
        a["pairs"]["i"] = m.cols.reshape(rows, k)
        a["pairs"]["v"] = m.values.reshape(rows, k)
        w.raw(a.tobytes())
        return
    for r in range(rows):
        lo, hi = int(m.row_ptr[r]), int(m.row_ptr[r + 1])
        w.write_token("SV")
        w.write_int(m.num_cols)
        w.write_int(hi - lo)
        for c, v in zip(m.cols[lo:hi].tolist(), m.values[lo:hi].tolist(), strict=True):
            w.write_int(c)
            w.write_float(v)


__all__ = ["CompressedMatrix", "SparseMatrix", "general_matrix_shape", "read_general_matrix",
           "to_dense", "write_general_matrix"]
