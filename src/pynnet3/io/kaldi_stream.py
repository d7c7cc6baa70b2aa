"""Kaldi's object serialization, text and binary, behind one reader and one writer API.

Component and network code is written once against :class:`KaldiReader` /
:class:`KaldiWriter`; the text and binary classes differ only in how a token, an
integer, a float, a bool, a matrix and a vector look on disk:

============  ==========================  ==================================
kind          text                        binary
============  ==========================  ==================================
token         ``<Tok> ``                  ``<Tok> ``
int32         ``12 ``                     ``\\x04`` + int32 LE
float         ``0.5 `` (7 sig. digits)    ``\\x04`` + float32 (``\\x08`` + f64)
bool          ``T `` / ``F ``             ``T`` / ``F``
matrix        `` [\\n  r0 \\n  r1 ]\\n``     ``FM `` rows cols raw-f32
vector        `` [ v0 v1 ]\\n``             ``FV `` dim raw-f32
============  ==========================  ==================================

Writing what was read gives Kaldi's bytes back (text: byte-identical, because
floats are printed as C++ ``ostream`` with precision 7 prints them).
"""

from __future__ import annotations

import re
import struct

import numpy as np

from ..errors import FormatError
from ..limits import check_option

_WS = re.compile(rb"\s*")
_TOKEN = re.compile(rb"\S+")


def format_float(x: float) -> str:
    """A float as Kaldi's text streams print it (C++ ``ostream``, precision 7)."""
    x = float(x)
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return f"{x:.7g}"


class KaldiReader:
    """Reads Kaldi objects from a byte buffer; ``binary`` says which encoding.

    Errors name the source, the line (text) or byte offset (binary) and the token.
    """

    binary: bool = False

    def __init__(self, data: bytes, source: str = "<string>", pos: int = 0):
        self.data = data
        self.source = source
        self.pos = pos
        self.tag = ""  # the last <Tag> read: integers after it are checked against its limit

    # -- error reporting -------------------------------------------------
    def error(self, message: str, token: str | None = None, pos: int | None = None) -> FormatError:
        pos = self.pos if pos is None else pos
        if self.binary:
            return FormatError(message, self.source, offset=pos, token=token)
        return FormatError(message, self.source, line=self.data.count(b"\n", 0, pos) + 1,
                           token=token)

    def token_start(self) -> int:
        """Where the next token starts (after whitespace): the position to report."""
        return _WS.match(self.data, self.pos).end()

    def at_eof(self) -> bool:
        m = _WS.match(self.data, self.pos)
        return m.end() >= len(self.data)

    # -- tokens ------------------------------------------------------------
    def read_token(self) -> str:
        m = _WS.match(self.data, self.pos)
        start = m.end()
        m = _TOKEN.match(self.data, start)
        if m is None:
            raise self.error("unexpected end of file while reading a token", pos=start)
        self.pos = m.end()
        if self.binary and self.pos < len(self.data) and self.data[self.pos:self.pos + 1] == b" ":
            self.pos += 1
        try:
            tok = m.group().decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("token is not valid UTF-8", token=repr(m.group()[:40]),
                             pos=start) from None
        if tok[:1] == "<":
            self.tag = tok
        return tok

    def peek_token(self) -> str:
        saved, tag = self.pos, self.tag
        try:
            return self.read_token()
        finally:
            self.pos, self.tag = saved, tag

    def check_int(self, value: int, start: int, token: str | None = None) -> int:
        """``value`` (read at ``start``) if it fits Kaldi's int32 (every integer of
        an nnet3 model is one; a binary 8-byte integer must fit too) and the limit
        of the field it was read for (:func:`pynnet3.limits.option_limit` of the
        last tag); else a FormatError there."""
        problem = check_option(self.tag or "integer", value)
        if problem:
            raise self.error(problem, token=str(value) if token is None else token, pos=start)
        return value

    def check_ints(self, values: np.ndarray, start: int, what: str) -> np.ndarray:
        """:meth:`check_int` for a whole integer array (vectorized)."""
        if values.size:
            for v in (int(values.min()), int(values.max())):
                if check_option(self.tag or what, v):
                    self.check_int(v, start)
        return values

    def expect_token(self, expected: str) -> None:
        start = self.token_start()
        tok = self.read_token()
        if tok != expected:
            raise self.error(f"expected {expected!r}", token=tok, pos=start)

    def read_line(self) -> str:
        """The rest of the current line (without the newline); used for the
        config-line header of a model, which is plain text even in binary files."""
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            end = len(self.data)
        line = self.data[self.pos:end]
        self.pos = min(end + 1, len(self.data))
        return line.decode("utf-8", errors="replace")

    # -- basic types: implemented per encoding -------------------------------
    def read_int(self) -> int:
        raise NotImplementedError

    def read_float(self) -> float:
        raise NotImplementedError

    def read_bool(self) -> bool:
        raise NotImplementedError

    def read_matrix(self) -> np.ndarray:
        raise NotImplementedError

    def read_vector(self) -> np.ndarray:
        raise NotImplementedError

    def read_double_vector(self) -> np.ndarray:
        """A vector read as Kaldi reads one into a ``Vector<double>``: float64 (text
        parsed straight into doubles, a binary FV widened)."""
        raise NotImplementedError

    def read_int_vector(self) -> np.ndarray:
        raise NotImplementedError

    def read_int_pair_vector(self) -> np.ndarray:
        """A ``(k, 2)`` int array: ``[ a,b c,d ]`` in text, count + raw int32 pairs in binary."""
        raise NotImplementedError

    # -- conveniences used by component readers ------------------------------
    def read_tagged(self, tag: str, kind: str):
        """``<Tag> value``: expect the tag, then read a value of ``kind``
        (``int``, ``float``, ``bool``, ``matrix``, ``vector``, ``int_vector``, ``token``)."""
        self.expect_token(tag)
        return getattr(self, f"read_{kind}")()

    def read_optional(self, tag: str, kind: str, default=None):
        """Like :meth:`read_tagged` when the next token is ``tag``; else ``default``."""
        if self.peek_token() == tag:
            return self.read_tagged(tag, kind)
        return default


class TextReader(KaldiReader):
    binary = False

    def read_int(self) -> int:
        start = self.token_start()
        tok = self.read_token()
        try:
            value = int(tok)
        except ValueError:
            raise self.error("expected an integer", token=tok, pos=start) from None
        return self.check_int(value, start, tok)

    def read_float(self) -> float:
        start = self.token_start()
        tok = self.read_token()
        try:
            value = float(tok)
        except ValueError:
            raise self.error("expected a number", token=tok, pos=start) from None
        if value != value:
            raise self.error("NaN is not allowed here", token=tok, pos=start)
        return value

    def read_bool(self) -> bool:
        start = self.token_start()
        tok = self.read_token()
        if tok in ("T", "true"):
            return True
        if tok in ("F", "false"):
            return False
        raise self.error("expected T or F", token=tok, pos=start)

    def _bracketed(self, what: str) -> tuple[bytes, int]:
        start = self.token_start()
        tok_start = _WS.match(self.data, self.pos).end()
        if self.data[tok_start:tok_start + 1] != b"[":
            tok = self.peek_token() if tok_start < len(self.data) else "<eof>"
            raise self.error(f"expected '[' starting a {what}", token=tok, pos=start)
        end = self.data.find(b"]", tok_start)
        if end < 0:
            raise self.error(f"unterminated {what} (no closing ']')", pos=tok_start)
        self.pos = end + 1
        return self.data[tok_start + 1:end], tok_start

    def _parse_numbers(self, body: bytes, start: int, what: str,
                       dtype=np.float32) -> np.ndarray:
        fast = _float32_numbers(body) if dtype == np.float32 else None
        if fast is not None:
            return fast[0]
        words = body.split()
        try:
            with np.errstate(over="ignore"):
                values = np.array(words, dtype=np.float64).astype(dtype)
        except ValueError:
            i = next(i for i, w in enumerate(words) if not _is_float(w))
            raise self.error(f"bad number in {what}", token=_word(words[i]),
                             pos=start + 1 + _word_offset(body, i)) from None
        finite = np.isfinite(values)
        if not finite.all():
            i = int(np.argmin(finite))
            raise self.error(f"non-finite value in {what}", token=_word(words[i]),
                             pos=start + 1 + _word_offset(body, i))
        return values

    def read_matrix(self) -> np.ndarray:
        body, start = self._bracketed("matrix")
        fast = _float32_numbers(body)
        if fast is not None:  # (else the checks below say what is wrong)
            values, starts = fast
            # the numbers on each line that has any: equal counts make a matrix
            newlines = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)
            per_line = np.diff(np.searchsorted(starts, newlines), prepend=0,
                               append=starts.size)
            per_line = per_line[per_line > 0]
            if not per_line.size:
                return np.zeros((0, 0), dtype=np.float32)
            if (per_line == per_line[0]).all():
                return values.reshape(per_line.size, int(per_line[0]))
        rows = [r for r in body.split(b"\n") if r.strip()]
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        values = self._parse_numbers(body, start, "matrix")
        num_rows = len(rows)
        cols = len(rows[0].split())
        if values.size != num_rows * cols or any(len(r.split()) != cols for r in rows):
            i = next(i for i, r in enumerate(rows) if len(r.split()) != cols)
            line_start = start + 1 + body.find(rows[i])
            raise self.error(f"matrix rows have different lengths (row 0 has {cols} values, "
                             f"row {i} has {len(rows[i].split())})", pos=line_start,
                             token=_word(rows[i].split()[0]) if rows[i].split() else None)
        return values.reshape(num_rows, cols)

    def read_vector(self) -> np.ndarray:
        body, start = self._bracketed("vector")
        return self._parse_numbers(body, start, "vector")

    def read_double_vector(self) -> np.ndarray:
        body, start = self._bracketed("vector")
        return self._parse_numbers(body, start, "vector", np.float64)

    def read_int_vector(self) -> np.ndarray:
        body, start = self._bracketed("integer vector")
        words = body.split()
        try:
            values = [int(w) for w in words]
        except ValueError:
            i = next(i for i, w in enumerate(words) if not w.lstrip(b"+-").isdigit())
            raise self.error("bad integer in vector", token=_word(words[i]),
                             pos=start + 1 + _word_offset(body, i)) from None
        for v in (min(values), max(values)) if values else ():
            self.check_int(v, start)
        return np.array(values, dtype=np.int64)

    def read_int_pair_vector(self) -> np.ndarray:
        body, start = self._bracketed("integer-pair vector")
        pairs = []
        for word in body.split():
            parts = word.split(b",")
            try:
                if len(parts) != 2:
                    raise ValueError
                pairs.append((int(parts[0]), int(parts[1])))
            except ValueError:
                raise self.error("expected an integer pair like '-1,0'",
                                 token=word.decode(errors="replace"),
                                 pos=start + body.find(word) + 1) from None
        flat = [v for pair in pairs for v in pair]
        for v in (min(flat), max(flat)) if flat else ():
            self.check_int(v, start)
        return np.array(pairs, dtype=np.int64).reshape(-1, 2)


# -- fast reading of text numbers ---------------------------------------------------
# The numbers of a text matrix or vector are converted in whole-array NumPy steps
# instead of one float per word (a 4 MB text model: ~0.07 s less). A word
# [+-]digits[.digits][(e|E)[+-]digits] with at most 16 digits is an integer mantissa m
# times a power of ten p: when m < 2**53 and |p| <= 22 both are exact doubles and one
# multiplication or division rounds once, so the double is the correctly rounded one
# that float() gives (Clinger's fast path); the other words of that form go through
# float(). Anything else (nan, inf, a bad byte) makes _decimal_numbers give up, and the
# word-by-word reading reports the error as before. The steps work from the positions
# of the words, their dots and e's (no pass that numbers every byte): the digits on
# either side of a word's dot are read eight at a time from the bytes where they lie.
_POW10 = 10.0 ** np.arange(23)
_SIGNED_POW10 = np.concatenate([_POW10, -_POW10])  # (index + 23: the negative word's)
_POW10_INT = 10 ** np.arange(17, dtype=np.int64)
_EXP_CHARS = 4  # characters after the e handled here: a sign and 3 digits, or 4 digits
_SWAR = tuple(np.uint64(x) for x in (0x0F0F0F0F0F0F0F0F, 2561, 0x00FF00FF00FF00FF,
                                     6553601, 0x0000FFFF0000FFFF, 42949672960001,
                                     8, 16, 32))
# _LAST_BYTES[k]: the mask of a little-endian uint64's last k bytes (the highest)
_LAST_BYTES = np.array([0] + [((1 << 64) - 1) << (64 - 8 * k) & ((1 << 64) - 1)
                              for k in range(1, 9)], np.uint64)


def _eight_digits(v: np.ndarray) -> np.ndarray:
    """The number each uint64 of ``v`` spells with its eight bytes, digit values 0-9
    (the low nibble of an ASCII digit; a cleared byte is a leading 0), the most
    significant in the lowest byte (SWAR, as simdjson's parse_eight_digits_unrolled)."""
    f0, m10, f1, m100, f2, m10k, s8, s16, s32 = _SWAR
    v = ((v & f0) * m10) >> s8
    v = ((v & f1) * m100) >> s16
    return ((v & f2) * m10k) >> s32


def _digits_before(window: np.ndarray, end: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The numbers spelled by the ``length`` (0-16) digits before each body offset
    ``end`` (``window[j]``: the body's eight bytes before offset ``j - 8``)."""
    value = _eight_digits(window[end + 8] & _LAST_BYTES[np.minimum(length, 8)])
    long = np.flatnonzero(length > 8)
    if long.size:  # digits 9-16 from the end
        high = window[end[long]] & _LAST_BYTES[length[long] - 8]
        value[long] += _eight_digits(high) * np.uint64(10**8)
    return value.astype(np.int64)


def _decimal_numbers(body: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """(float64 values, start offsets) of the whitespace-separated words of ``body``
    when every word is a plain decimal number (the comment above), else None."""
    arr = np.frombuffer(body, np.uint8)
    n = arr.size
    # the bytes below 33 must be whitespace as bytes.split() sees it (also in a body
    # with no word: a lone control byte such as \x1c is a bad word there too)
    if np.count_nonzero(arr < 32) != np.count_nonzero(arr - np.uint8(9) < 5):
        return None
    edge = np.zeros(n + 2, bool)
    in_word = edge[1:-1]
    np.greater(arr, 32, out=in_word)
    bounds = np.flatnonzero(edge[1:] != edge[:-1])
    starts, ends = bounds[0::2], bounds[1::2]
    if starts.size == 0:
        return np.zeros(0), starts
    # The bytes of the words that are not digits must be exactly: a sign starting its
    # word, at most one dot and one e (or E) per word, and a sign right after the e.
    # Those are found by position and counted; equal counts leave digits elsewhere.
    others = np.count_nonzero(in_word) - np.count_nonzero(arr - np.uint8(48) < 10)
    first = arr[starts]
    negative = first == 45
    signed = negative | (first == 43)
    is_dot = arr == 46
    num_dots = np.count_nonzero(is_dot)
    exps = np.flatnonzero((arr | np.uint8(32)) == 101)  # (e or E)
    found = np.count_nonzero(signed) + num_dots + exps.size
    if found > others:
        return None
    mantissa_start, mantissa_end = starts + signed, ends
    power = np.zeros(starts.size, np.int64)
    if exps.size:
        w = np.searchsorted(starts, exps, "right") - 1  # (the word of each e)
        end = ends[w]
        length = end - exps - 1  # characters after the e
        if np.any(w[1:] == w[:-1]) or length.min() < 1 or length.max() > _EXP_CHARS:
            return None
        after = arr[exps + 1]
        exp_signed = (after == 45) | (after == 43)
        found += np.count_nonzero(exp_signed)
        if np.any(length - exp_signed < 1):
            return None
        at = exps[:, None] + 1 + np.arange(_EXP_CHARS)
        digits = at < end[:, None]
        digits[:, 0] &= ~exp_signed
        at = np.minimum(at, n - 1)
        e = np.zeros(exps.size, np.int64)
        for k in range(_EXP_CHARS):
            e = np.where(digits[:, k], e * 10 + (arr[at[:, k]] - 48), e)
        power[w] = np.where(after == 45, -e, e)
        mantissa_end = ends.copy()
        mantissa_end[w] = exps
    if found != others:
        return None
    # Kaldi's text: one digit, the dot, the other digits ("-0.0123", "1.5e-05") in
    # every word. Then as many dots as words, each right after the word's first
    # digit, say where all of them are; else they are looked for.
    point = mantissa_start + 1
    first_digit = None
    if (num_dots == starts.size and point[-1] < n and np.all(arr[point] == 46)
            and np.all(point < mantissa_end)):
        first_digit = (arr[mantissa_start] - np.uint8(48)).astype(np.int64)
        whole = np.ones(starts.size, np.int64)
        fraction = mantissa_end - point - 1  # digits after the dot
    else:
        dots = np.flatnonzero(is_dot)
        point = mantissa_end.copy()  # (a word without a dot: as if after its mantissa)
        fraction = np.zeros(starts.size, np.int64)
        if dots.size:
            if dots.size == starts.size and np.all((dots >= mantissa_start)
                                                   & (dots < mantissa_end)):
                w = slice(None)  # (a dot in every word's mantissa)
            else:
                w = np.searchsorted(starts, dots, "right") - 1  # (the word of each dot)
                if (np.any(w[1:] == w[:-1]) or np.any(dots < mantissa_start[w])
                        or np.any(dots >= mantissa_end[w])):
                    return None
            point[w] = dots
            fraction[w] = mantissa_end[w] - dots - 1
        whole = point - mantissa_start
    power -= fraction
    num_digits = whole + fraction
    if num_digits.min() < 1:
        return None
    exact = num_digits <= 16
    if not exact.all():  # (float() below reads them; no digits past the 16th here)
        whole, fraction = np.where(exact, whole, 0), np.where(exact, fraction, 0)
    raw = bytes(16) + body + bytes(8)  # (every eight-byte window inside)
    window = np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))
    high = first_digit if first_digit is not None else _digits_before(window, point, whole)
    m = high * _POW10_INT[fraction] + _digits_before(window, mantissa_end, fraction)
    exact &= (m < 2**53) & (np.abs(power) <= 22)
    # m / 10**-p or m * 10**p, the word's sign carried by the power of ten (-0.0 too)
    sign_at = negative.view(np.uint8) * np.uint8(23)
    value = m.astype(np.float64)
    value /= _SIGNED_POW10[np.clip(-power, 0, 22) + sign_at]
    up = np.flatnonzero(power > 0)
    if up.size:
        value[up] = m[up] * _SIGNED_POW10[np.minimum(power[up], 22) + sign_at[up]]
    for i in np.flatnonzero(~exact):  # (rare: float() rounds them)
        value[i] = float(body[starts[i]:ends[i]])
    return value, starts


# Bodies shorter than this are read word by word (NumPy's float() of each word):
# the whole-array steps cost ~50 us whatever the size, the words ~60 ns each, so
# below ~2,000 numbers (vectors, small matrices) the words are faster.
_WHOLE_ARRAY_MIN_BYTES = 16384


def _float32_numbers(body: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_decimal_numbers` as float32 (as Kaldi reads them), or None when that
    gives up or a value is out of float32's range (the caller's error), and for a
    body shorter than ``_WHOLE_ARRAY_MIN_BYTES`` (the word-by-word reading's)."""
    if len(body) < _WHOLE_ARRAY_MIN_BYTES:
        return None
    numbers = _decimal_numbers(body)
    if numbers is None:
        return None
    with np.errstate(over="ignore"):
        values = numbers[0].astype(np.float32)
    if not np.isfinite(values).all():
        return None
    return values, numbers[1]

def _word(word: bytes) -> str:
    return word[:40].decode(errors="replace")


def _word_offset(body: bytes, i: int) -> int:
    """Byte offset in ``body`` of its ``i``-th whitespace-separated word."""
    for k, m in enumerate(_TOKEN.finditer(body)):
        if k == i:
            return m.start()
    return 0


def _is_float(word: bytes) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


class BinaryReader(KaldiReader):
    binary = True

    def _take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise self.error(f"unexpected end of file while reading {what}")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def read_int(self) -> int:
        start = self.pos
        size = self._take(1, "an integer")[0]
        if size == 4:
            return self.check_int(struct.unpack("<i", self._take(4, "an integer"))[0], start)
        if size == 8:
            return self.check_int(struct.unpack("<q", self._take(8, "an integer"))[0], start)
        raise self.error(f"bad integer size byte {size}", pos=start)

    def read_float(self) -> float:
        start = self.pos
        size = self._take(1, "a float")[0]
        if size == 4:
            value = float(np.frombuffer(self._take(4, "a float"), dtype="<f4")[0])
        elif size == 8:
            value = float(np.frombuffer(self._take(8, "a float"), dtype="<f8")[0])
        else:
            raise self.error(f"bad float size byte {size}", pos=start)
        if value != value:
            raise self.error("NaN is not allowed here", token="nan", pos=start)
        return value

    def read_bool(self) -> bool:
        m = _WS.match(self.data, self.pos)
        self.pos = m.end()
        c = self._take(1, "a bool")
        if c == b"T":
            return True
        if c == b"F":
            return False
        raise self.error("expected T or F", token=c.decode(errors="replace"), pos=self.pos - 1)

    def _header(self, kinds: dict[str, str]) -> tuple[str, int]:
        start = self.token_start()
        tok = self.read_token()
        if tok not in kinds:
            raise self.error(f"expected one of {sorted(kinds)}", token=tok, pos=start)
        return kinds[tok], start

    def read_matrix(self) -> np.ndarray:
        dtype, start = self._header({"FM": "<f4", "DM": "<f8"})
        rows, cols = self.read_int(), self.read_int()
        if rows < 0 or cols < 0:
            raise self.error(f"negative matrix size {rows}x{cols}", pos=start)
        width = np.dtype(dtype).itemsize
        data_start = self.pos
        raw = self._take(rows * cols * width, f"a {rows}x{cols} matrix")
        values = np.frombuffer(raw, dtype=dtype).astype(np.float32)
        self._check_finite(values, data_start, width, "matrix")
        return values.reshape(rows, cols)

    def read_vector(self) -> np.ndarray:
        return self._vector(np.float32)

    def read_double_vector(self) -> np.ndarray:
        return self._vector(np.float64)

    def _vector(self, out_dtype) -> np.ndarray:
        """An FV or DV vector as ``out_dtype``."""
        dtype, start = self._header({"FV": "<f4", "DV": "<f8"})
        dim = self.read_int()
        if dim < 0:
            raise self.error(f"negative vector size {dim}", pos=start)
        width = np.dtype(dtype).itemsize
        data_start = self.pos
        raw = self._take(dim * width, f"a vector of {dim}")
        values = np.frombuffer(raw, dtype=dtype).astype(out_dtype)
        self._check_finite(values, data_start, width, "vector")
        return values

    def _check_finite(self, values: np.ndarray, data_start: int, width: int, what: str) -> None:
        finite = np.isfinite(values)
        if not finite.all():
            i = int(np.argmin(finite))
            raise self.error(f"non-finite value in {what} (element {i})",
                             token=str(values[i]), pos=data_start + i * width)

    def read_int_vector(self) -> np.ndarray:
        """Kaldi's layout: a size byte (4), an int32 count, then raw int32 elements."""
        start = self.pos
        size = self._take(1, "an integer vector")[0]
        if size != 4:
            raise self.error(f"bad integer-vector size byte {size}", pos=start)
        n = struct.unpack("<i", self._take(4, "an integer vector"))[0]
        if n < 0:
            raise self.error(f"negative integer-vector size {n}", pos=start)
        raw = self._take(4 * n, f"an integer vector of {n}")
        return self.check_ints(np.frombuffer(raw, dtype="<i4").astype(np.int64), start,
                               "integer vector")

    def read_int_pair_vector(self) -> np.ndarray:
        start = self.pos
        size = self._take(1, "an integer-pair vector")[0]
        if size != 4:
            raise self.error(f"bad integer-pair-vector size byte {size}", pos=start)
        n = struct.unpack("<i", self._take(4, "an integer-pair vector"))[0]
        if n < 0:
            raise self.error(f"negative integer-pair-vector size {n}", pos=start)
        raw = self._take(8 * n, f"an integer-pair vector of {n}")
        return self.check_ints(np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(n, 2),
                               start, "integer-pair vector")


def make_reader(data: bytes, source: str = "<string>") -> KaldiReader:
    """A reader for ``data``: binary when it starts with Kaldi's ``\\0B`` marker."""
    if data[:2] == b"\0B":
        return BinaryReader(data, source, pos=2)
    return TextReader(data, source)


class KaldiWriter:
    """Accumulates Kaldi's serialization of objects; ``getvalue()`` gives the bytes."""

    binary: bool = False

    def __init__(self):
        self.parts: list[bytes] = []

    def getvalue(self) -> bytes:
        return b"".join(self.parts)

    def raw(self, text: str | bytes) -> None:
        self.parts.append(text.encode() if isinstance(text, str) else text)

    def write_token(self, token: str) -> None:
        self.parts.append(token.encode() + b" ")

    def write_tagged(self, tag: str, kind: str, value) -> None:
        self.write_token(tag)
        getattr(self, f"write_{kind}")(value)


class TextWriter(KaldiWriter):
    binary = False

    def write_int(self, value: int) -> None:
        self.parts.append(b"%d " % int(value))

    def write_float(self, value: float) -> None:
        self.parts.append(format_float(value).encode() + b" ")

    def write_double(self, value: float) -> None:
        self.write_float(value)

    def write_bool(self, value: bool) -> None:
        self.parts.append(b"T " if value else b"F ")

    def write_matrix(self, m: np.ndarray) -> None:
        m = np.asarray(m)
        if m.size == 0:
            self.parts.append(b" [ ]\n")
            return
        out = [" ["]
        for row in m:
            out.append("\n  " + "".join(format_float(v) + " " for v in row.tolist()))
        out.append("]\n")
        self.parts.append("".join(out).encode())

    def write_vector(self, v: np.ndarray) -> None:
        v = np.asarray(v).ravel()
        body = "".join(format_float(x) + " " for x in v.tolist())
        self.parts.append((" [ " + body + "]\n").encode())

    def write_int_vector(self, v) -> None:
        body = "".join(f"{int(x)} " for x in v)
        self.parts.append(("[ " + body + "]\n").encode())

    def write_int_pair_vector(self, pairs) -> None:
        body = "".join(f"{int(a)},{int(b)} " for a, b in pairs)
        self.parts.append(("[ " + body + "]\n").encode())


class BinaryWriter(KaldiWriter):
    binary = True

    def write_int(self, value: int) -> None:
        self.parts.append(b"\x04" + struct.pack("<i", int(value)))

    def write_float(self, value: float) -> None:
        self.parts.append(b"\x04" + struct.pack("<f", float(value)))

    def write_double(self, value: float) -> None:
        self.parts.append(b"\x08" + struct.pack("<d", float(value)))

    def write_bool(self, value: bool) -> None:
        self.parts.append(b"T" if value else b"F")

    def write_matrix(self, m: np.ndarray) -> None:
        m = np.asarray(m)
        if m.ndim != 2:
            m = m.reshape(0, 0)
        self.write_token("FM")
        self.write_int(m.shape[0])
        self.write_int(m.shape[1])
        self.parts.append(np.ascontiguousarray(m, dtype="<f4").tobytes())

    def write_vector(self, v: np.ndarray) -> None:
        v = np.asarray(v).ravel()
        self.write_token("FV")
        self.write_int(v.size)
        self.parts.append(np.ascontiguousarray(v, dtype="<f4").tobytes())

    def write_int_vector(self, v) -> None:
        v = np.asarray(list(v), dtype="<i4")
        self.parts.append(b"\x04" + struct.pack("<i", len(v)) + v.tobytes())

    def write_int_pair_vector(self, pairs) -> None:
        v = np.asarray([(int(a), int(b)) for a, b in pairs], dtype="<i4").reshape(-1, 2)
        self.parts.append(b"\x04" + struct.pack("<i", len(v)) + v.tobytes())


def make_writer(binary: bool) -> KaldiWriter:
    return BinaryWriter() if binary else TextWriter()
