"""pynnet3.io.kaldi_stream: Kaldi's text and binary serialization of basic types."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynnet3.errors import FormatError
from pynnet3.io.kaldi_stream import (
    _WHOLE_ARRAY_MIN_BYTES,
    BinaryReader,
    BinaryWriter,
    TextReader,
    TextWriter,
    _decimal_numbers,
    format_float,
    make_reader,
    make_writer,
)


@pytest.mark.parametrize("value, text", [
    (0.0, "0"), (-0.0, "-0"), (1.0, "1"), (0.1, "0.1"), (-0.5, "-0.5"), (1e-05, "1e-05"),
    (0.0001, "0.0001"), (123456.7, "123456.7"), (1234567.0, "1234567"),
    (12345678.0, "1.234568e+07"), (1e20, "1e+20"), (0.123456789, "0.1234568"),
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
])
def test_format_float_is_cpp_ostream_precision_7(value, text):
    assert format_float(value) == text


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
@settings(max_examples=300, deadline=None)
def test_format_float_matches_printf_g7(x):
    assert format_float(x) == "%.7g" % x  # noqa: UP031 (C printf semantics)


# ----------------------------------------------------------------------------------
# Writers: exact bytes
# ----------------------------------------------------------------------------------

def test_text_writer_layout():
    w = TextWriter()
    w.write_token("<Tag>")
    w.write_int(-3)
    w.write_float(0.25)
    w.write_bool(True)
    w.write_bool(False)
    w.write_vector(np.array([1, -2.5], dtype=np.float32))
    w.write_matrix(np.array([[1, 2], [3, 4]], dtype=np.float32))
    w.write_matrix(np.zeros((0, 0), dtype=np.float32))
    w.write_int_vector([1, 2])
    assert w.getvalue() == (b"<Tag> -3 0.25 T F  [ 1 -2.5 ]\n"
                            b" [\n  1 2 \n  3 4 ]\n [ ]\n[ 1 2 ]\n")


def test_binary_writer_layout():
    w = BinaryWriter()
    w.write_token("<Tag>")
    w.write_int(-3)
    w.write_float(0.25)
    w.write_double(0.5)
    w.write_bool(True)
    w.write_vector(np.array([1.5], dtype=np.float32))
    w.write_matrix(np.array([[2.0]], dtype=np.float32))
    w.write_int_vector([7, 8])
    assert w.getvalue() == (
        b"<Tag> " + b"\x04" + struct.pack("<i", -3) + b"\x04" + struct.pack("<f", 0.25)
        + b"\x08" + struct.pack("<d", 0.5) + b"T"
        + b"FV \x04" + struct.pack("<i", 1) + struct.pack("<f", 1.5)
        + b"FM \x04" + struct.pack("<i", 1) + b"\x04" + struct.pack("<i", 1)
        + struct.pack("<f", 2.0)
        + b"\x04" + struct.pack("<i", 2) + struct.pack("<ii", 7, 8))


def test_make_writer_and_reader_choose_encoding():
    assert isinstance(make_writer(True), BinaryWriter)
    assert isinstance(make_writer(False), TextWriter)
    r = make_reader(b"\0B<Tok> ")
    assert isinstance(r, BinaryReader) and r.pos == 2 and r.read_token() == "<Tok>"
    r = make_reader(b"<Tok> ")
    assert isinstance(r, TextReader) and r.read_token() == "<Tok>"


# ----------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------

def _write_all(w, ints, floats, mat, vec, ivec):
    w.write_token("<A>")
    for i in ints:
        w.write_int(i)
    for f in floats:
        w.write_float(f)
    w.write_bool(True)
    w.write_token("<B>")
    w.write_matrix(mat)
    w.write_vector(vec)
    w.write_int_vector(ivec)
    w.write_token("</A>")


def _read_all(r, n_ints, n_floats):
    r.expect_token("<A>")
    ints = [r.read_int() for _ in range(n_ints)]
    floats = [r.read_float() for _ in range(n_floats)]
    b = r.read_bool()
    r.expect_token("<B>")
    return ints, floats, b, r.read_matrix(), r.read_vector(), r.read_int_vector(), r.read_token()


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("binary", [False, True])
@given(ints=st.lists(st.integers(-2**31, 2**31 - 1), max_size=5),
       floats=st.lists(st.sampled_from([0.0, 0.5, -1.25, 1e-05, 3.0, 1234.5]).map(
           lambda v: float(np.float32(v))), max_size=5),
       shape=st.tuples(st.integers(1, 4), st.integers(1, 5)),
       data=st.data())
@settings(max_examples=60, deadline=None)
def test_round_trip(binary, ints, floats, shape, data):
    values = data.draw(st.lists(finite32, min_size=shape[0] * shape[1],
                                max_size=shape[0] * shape[1]))
    mat = np.array(values, dtype=np.float32).reshape(shape)
    vec = np.array(data.draw(st.lists(finite32, max_size=6)), dtype=np.float32)
    ivec = data.draw(st.lists(st.integers(-1000, 1000), max_size=6))
    w = make_writer(binary)
    if binary:
        w.raw(b"\0B")
    _write_all(w, ints, floats, mat, vec, ivec)
    r = make_reader(w.getvalue())
    got = _read_all(r, len(ints), len(floats))
    # text gives the decimal's value; rounded to float32 it is the float written
    assert got[0] == ints and [float(np.float32(v)) for v in got[1]] == floats
    assert got[2] is True
    if binary:  # binary is bit-exact
        assert got[3].tobytes() == mat.tobytes() and got[4].tobytes() == vec.tobytes()
    else:  # text keeps 7 significant digits
        np.testing.assert_allclose(got[3], mat, rtol=1e-6, atol=0)
        np.testing.assert_allclose(got[4], vec, rtol=1e-6, atol=0)
    assert got[5].tolist() == ivec
    assert got[6] == "</A>"
    assert r.at_eof()


def test_text_reads_7_digit_text_back_to_the_same_text():
    text = b" [\n  0.1234568 -1e-05 3.402823e+38 \n  1 2 3 ]\n"
    m = TextReader(text).read_matrix()
    w = TextWriter()
    w.write_matrix(m)
    assert w.getvalue() == text


def test_binary_reads_double_matrices_and_vectors_and_8_byte_ints():
    data = (b"DM \x04" + struct.pack("<i", 1) + b"\x04" + struct.pack("<i", 2)
            + struct.pack("<dd", 0.5, -2.0) + b"DV \x04" + struct.pack("<i", 1)
            + struct.pack("<d", 3.0) + b"\x08" + struct.pack("<q", -(2**31)))
    r = BinaryReader(data)
    assert r.read_matrix().tolist() == [[0.5, -2.0]]
    assert r.read_vector().tolist() == [3.0]
    assert r.read_int() == -(2**31)  # an 8-byte integer (its value must fit int32)


def test_read_optional_and_tagged_and_peek():
    r = TextReader(b"<A> 3 <B> 0.5 <C> T")
    assert r.peek_token() == "<A>"
    assert r.read_optional("<X>", "int", default=-1) == -1
    assert r.read_optional("<A>", "int") == 3
    assert r.read_tagged("<B>", "float") == 0.5
    assert r.read_tagged("<C>", "bool") is True
    assert r.at_eof()


# ----------------------------------------------------------------------------------
# Text numbers are converted in whole-array steps: the same floats as float() gives
# ----------------------------------------------------------------------------------

number_words = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    finite32.map(lambda v: "%.7g" % v),  # noqa: UP031 (Kaldi's text: C's %.7g)
    finite32.map(lambda v: "%.9e" % v),  # noqa: UP031
    st.floats(-1e6, 1e6).map(lambda v: "%.4f" % v),  # noqa: UP031
    st.integers(-10**20, 10**20).map(str),
    st.tuples(st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=20),
              st.sampled_from(["", "."]), st.text("0123456789", max_size=20),
              st.sampled_from(["", "e", "E", "e+", "e-", "E-"]),
              st.text("0123456789", max_size=5)).map("".join).filter(bool),
)


@given(st.lists(number_words, min_size=1, max_size=40),
       st.sampled_from([" ", "  ", "\t", "\n", " \r\n ", "\x0b", "\x0c"]))
@settings(max_examples=400, deadline=None)
def test_text_vectors_read_as_float_then_float32(words, sep):
    body = sep.join(words).encode()
    try:  # what Kaldi's reading means: the correctly rounded float, then float32
        want = np.array([float(w) for w in words], dtype=np.float64)
    except ValueError:
        want = None
    if want is not None:
        with np.errstate(over="ignore"):
            want = want.astype(np.float32)
    r = TextReader(b" [ " + body + b" ]\n")
    if want is None or not np.isfinite(want).all():
        with pytest.raises(FormatError):
            r.read_vector()
        return
    got = r.read_vector()
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()  # (bits: -0.0 too)


# the words the whole-array conversion takes (the rest go word by word): a sign,
# digits with at most one dot, an exponent of at most 4 characters after the e
plain_words = st.tuples(
    st.sampled_from(["", "+", "-"]), st.text("0123456789", max_size=19),
    st.sampled_from(["", "."]), st.text("0123456789", max_size=19),
    st.sampled_from(["", "e", "E", "e+", "e-"]), st.text("0123456789", min_size=1, max_size=3),
).filter(lambda t: t[1] + t[3]).map(lambda t: "".join(t[:4]) + (t[4] + t[5] if t[4] else ""))


@given(st.lists(st.one_of(plain_words, finite32.map(lambda v: "%.7g" % v)),  # noqa: UP031
                min_size=1, max_size=40),
       st.sampled_from([" ", "\n  ", "\t"]), st.booleans())
@settings(max_examples=400, deadline=None)
def test_plain_decimal_words_take_the_whole_array_conversion(words, sep, dotted):
    if dotted:  # (one dot in every word: the conversion's shortcut for Kaldi's text)
        words = [w if "." in w else w.replace("e", ".e").replace("E", ".E") if "e" in w.lower()
                 else w + "." for w in words]
    body = sep.join(words).encode()
    got = _decimal_numbers(b" " + body + b" ")
    assert got is not None  # (not left to the word-by-word reading)
    want = np.array([float(w) for w in words])
    assert got[0].tobytes() == want.tobytes()  # (bits: -0.0 too)
    assert [body[s - 1:].split()[0] for s in got[1]] == body.split()


# Kaldi's own text: one digit before the dot in every word (the conversion's
# shortcut, which takes the dots' places from the words' first digits)
kaldi_words = st.tuples(
    st.sampled_from(["", "-", "+"]), st.text("0123456789", min_size=1, max_size=1),
    st.text("0123456789", max_size=17),
    st.sampled_from(["", "e", "E", "e+", "e-"]), st.text("0123456789", min_size=1, max_size=3),
).map(lambda t: f"{t[0]}{t[1]}.{t[2]}" + (t[3] + t[4] if t[3] else ""))


@given(st.lists(kaldi_words, min_size=1, max_size=40),
       st.sampled_from([None, "5", "12.5", ".5", "-3", "1e5", "0.5.", "7.e1"]),
       st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_one_digit_before_the_dot_takes_the_shortcut(words, odd, at):
    import pynnet3.io.kaldi_stream as ks

    calls = []
    real = ks._digits_before
    ks._digits_before = lambda *a: (calls.append(1), real(*a))[1]
    try:
        if odd is not None:  # (a word of another form: the dots are looked for)
            words = words[:at] + [odd] + words[at:]
        got = _decimal_numbers(" ".join(words).encode())
    finally:
        ks._digits_before = real
    if odd == "0.5.":
        assert got is None
        return
    assert got[0].tobytes() == np.array([float(w) for w in words]).tobytes()
    # (the shortcut reads no whole part: one call, for the digits after the dots)
    assert len(calls) == (1 if odd in (None, "7.e1") else 2)


@pytest.mark.parametrize("word", ["1e", "e5", "-", "+-1", "1-2", "1.2.3", "1e5e5", "1e-",
                                  ".", "-.e1", "1e1.5", "0x10", "--1", "1e+-5", "1E+0005",
                                  "1.5-", "nan", "inf", "1_0", "1e5-", ".e", "1,5"])
def test_other_words_are_left_to_the_word_by_word_reading(word):
    assert _decimal_numbers(f"1.5 {word} 2.5".encode()) is None
    assert _decimal_numbers(f"1.5 {word}".encode()) is None
    assert _decimal_numbers(word.encode()) is None


@pytest.mark.parametrize("word, value", [
    ("0", 0.0), ("-0", -0.0), ("+0.0", 0.0), (".5", 0.5), ("5.", 5.0), ("-.25e1", -2.5),
    ("1e22", 1e22), ("1e23", 1e23), ("1e-22", 1e-22), ("1.5e-30", 1.5e-30),
    ("9007199254740993", 9007199254740993.0), ("12345678901234567890", 1.2345678901234567e19),
    ("0.000000000000000000000000001", 1e-27), ("1E+0005", 1e5), ("3.402823e+38", 3.402823e38),
])
def test_text_numbers_at_the_edges_of_the_fast_conversion(word, value):
    got = TextReader(f"[ 1 {word} 2 ]".encode()).read_vector()
    want = np.array([1.0, value, 2.0]).astype(np.float32)
    assert got.tobytes() == want.tobytes()
    # the whole-array conversion itself (a body this short is read word by word),
    # and through a body long enough to take it
    fast = _decimal_numbers(f"1 {word} 2".encode())
    if word != "1E+0005":  # (5 characters after the e: left to the words)
        assert fast[0].tobytes() == np.array([1.0, value, 2.0]).tobytes()
    n = _WHOLE_ARRAY_MIN_BYTES // (len(word) + 1) + 1
    got = TextReader(b"[ " + (f"{word} " * n).encode() + b"]").read_vector()
    assert got.tobytes() == np.full(n, value).astype(np.float32).tobytes()


def test_long_and_short_bodies_read_the_same_floats():
    rng = np.random.default_rng(3)
    words = ["%.7g" % v for v in rng.standard_normal(3000) * 0.1]  # noqa: UP031
    text = " ".join(words).encode()
    assert len(text) > _WHOLE_ARRAY_MIN_BYTES > len(" ".join(words[:100]))
    want = np.array([float(w) for w in words]).astype(np.float32)
    assert TextReader(b"[ " + text + b" ]").read_vector().tobytes() == want.tobytes()
    rows = "\n".join(" ".join(words[i:i + 30]) for i in range(0, 3000, 30)).encode()
    got = TextReader(b"[\n" + rows + b" ]").read_matrix()
    assert got.shape == (100, 30) and got.tobytes() == want.tobytes()
    assert TextReader(b"[ " + " ".join(words[:100]).encode() + b" ]").read_vector().tobytes() \
        == want[:100].tobytes()


@pytest.mark.parametrize("word", ["1e", "e5", "-", "+-1", "1-2", "1.2.3", "1e5e5", "1e-",
                                  ".", "-.e1", "1e1.5", "0x10", "--1", "1e+-5"])
def test_text_words_that_are_not_numbers_are_errors(word):
    with pytest.raises(FormatError, match="bad number"):
        TextReader(f"[ 1 {word} 2 ]".encode(), "src.txt").read_vector()
    with pytest.raises(FormatError, match="bad number"):
        TextReader(f"[\n  1 2 \n  {word} 4 ]".encode(), "src.txt").read_matrix()


def test_text_matrix_rows_by_line_with_any_whitespace():
    text = b" [ \r\n  1\t2 \r\n\n   \n  -3e0 +4. ]\n"
    assert TextReader(text).read_matrix().tolist() == [[1.0, 2.0], [-3.0, 4.0]]
    assert TextReader(b" [ 1 2 3 ]").read_matrix().tolist() == [[1.0, 2.0, 3.0]]
    assert TextReader(b" [ \n ]").read_matrix().shape == (0, 0)


# ----------------------------------------------------------------------------------
# Errors name the source, line / byte offset and the token
# ----------------------------------------------------------------------------------

def _text_error(data: bytes, fn, *fragments, line=None):
    r = TextReader(data, "src.txt")
    with pytest.raises(FormatError) as ei:
        fn(r)
    msg = str(ei.value)
    assert msg.startswith("src.txt")
    for f in fragments:
        assert f in msg, (f, msg)
    if line is not None:
        assert ei.value.line == line and f"line {line}" in msg
    return ei.value


def test_text_errors():
    _text_error(b"<A>\n<B> ", lambda r: (r.expect_token("<A>"), r.expect_token("<C>")),
                "'<C>'", "'<B>'", line=2)
    _text_error(b"\n\n  x1 ", lambda r: r.read_int(), "integer", "'x1'", line=3)
    _text_error(b"3000000000 ", lambda r: r.read_int(), "int32", "'3000000000'", line=1)
    _text_error(b"abc", lambda r: r.read_float(), "number", "'abc'", line=1)
    _text_error(b"nan", lambda r: r.read_float(), "NaN", "'nan'", line=1)
    _text_error(b"yes", lambda r: r.read_bool(), "T or F", "'yes'", line=1)
    _text_error(b"   ", lambda r: r.read_token(), "end of file")
    _text_error(b"x [ 1 2", lambda r: r.read_vector(), "'['", "'x'")


def test_text_matrix_errors():
    _text_error(b" [\n  1 2 \n  3 4", lambda r: r.read_matrix(), "unterminated", line=1)
    # ragged rows, including a ragged row that keeps the total a multiple of the rows
    for body in (b" [\n  1 2 3 \n  4 ]", b" [\n  1 2 \n  3 4 5 \n  6 ]"):
        err = _text_error(body, lambda r: r.read_matrix(), "different lengths")
        assert err.line in (2, 3, 4)
    err = _text_error(b" [\n  1 2 \n  3 4 5 \n  6 ]", lambda r: r.read_matrix(),
                      "row 1 has 3", "'3'")
    assert err.line == 3
    _text_error(b" [\n  1 2 \n  3 x4 ]\n", lambda r: r.read_matrix(), "bad number", "'x4'",
                line=3)
    _text_error(b" [\n  1 2 \n  3 nan ]\n", lambda r: r.read_matrix(), "non-finite",
                "'nan'", line=3)
    _text_error(b" [\n  1 2 \n  inf 3 ]\n", lambda r: r.read_matrix(), "non-finite",
                "'inf'", line=3)
    _text_error(b" [ 1 1e40 ]\n", lambda r: r.read_vector(), "non-finite", "'1e40'", line=1)
    _text_error(b" [ 1\n NaN ]\n", lambda r: r.read_vector(), "non-finite", "'NaN'", line=2)
    _text_error(b"[ 1 2.5 ]", lambda r: r.read_int_vector(), "integer", "'2.5'", line=1)


def _binary_error(data: bytes, fn, *fragments, offset=None):
    r = BinaryReader(data, "src.bin")
    with pytest.raises(FormatError) as ei:
        fn(r)
    msg = str(ei.value)
    assert msg.startswith("src.bin")
    for f in fragments:
        assert f in msg, (f, msg)
    if offset is not None:
        assert ei.value.offset == offset and f"byte {offset}" in msg
    return ei.value


def test_binary_errors():
    _binary_error(b"\x05abcd", lambda r: r.read_int(), "size byte 5", offset=0)
    _binary_error(b"\x04ab", lambda r: r.read_int(), "end of file", offset=1)
    _binary_error(b"\x03abcd", lambda r: r.read_float(), "size byte 3", offset=0)
    _binary_error(b"\x04" + struct.pack("<f", float("nan")), lambda r: r.read_float(), "NaN",
                  offset=0)
    _binary_error(b"X", lambda r: r.read_bool(), "T or F", "'X'", offset=0)
    _binary_error(b"XM \x04", lambda r: r.read_matrix(), "'XM'", offset=0)
    _binary_error(b"FM \x04" + struct.pack("<i", -1) + b"\x04" + struct.pack("<i", 2),
                  lambda r: r.read_matrix(), "negative", offset=0)
    _binary_error(b"FM \x04" + struct.pack("<i", 100000) + b"\x04" + struct.pack("<i", 100000),
                  lambda r: r.read_matrix(), "end of file", offset=13)
    vals = struct.pack("<3f", 1.0, float("inf"), 2.0)
    _binary_error(b"FV \x04" + struct.pack("<i", 3) + vals, lambda r: r.read_vector(),
                  "non-finite", "element 1", offset=8 + 4)
    vals = struct.pack("<4f", 1.0, 2.0, 3.0, float("nan"))
    _binary_error(b"FM \x04" + struct.pack("<i", 2) + b"\x04" + struct.pack("<i", 2) + vals,
                  lambda r: r.read_matrix(), "non-finite", offset=13 + 12)
    _binary_error(b"\x02", lambda r: r.read_int_vector(), "size byte 2", offset=0)
    _binary_error(b"\x04" + struct.pack("<i", -2), lambda r: r.read_int_vector(), "negative",
                  offset=0)


@pytest.mark.parametrize("binary", [False, True])
def test_int_pair_vector_round_trip(binary):
    from pynnet3.io.kaldi_stream import make_reader, make_writer

    w = make_writer(binary)
    if binary:
        w.raw(b"\0B")
    w.write_int_pair_vector([(-1, 0), (0, 2), (3, -4)])
    data = w.getvalue()
    if not binary:
        assert data == b"[ -1,0 0,2 3,-4 ]\n"
    else:
        assert data[2:] == b"\x04" + struct.pack("<7i", 3, -1, 0, 0, 2, 3, -4)
    got = make_reader(data).read_int_pair_vector()
    assert got.tolist() == [[-1, 0], [0, 2], [3, -4]]


def test_int_pair_vector_bad_text_names_token():
    from pynnet3.errors import FormatError
    from pynnet3.io.kaldi_stream import make_reader

    with pytest.raises(FormatError, match="'1,2,3'"):
        make_reader(b"[ -1,0 1,2,3 ]").read_int_pair_vector()
