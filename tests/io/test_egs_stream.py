"""Examples archives from stdin and pipes (issue 18): read a chunk at a time
(pynnet3.io.egs.STREAM_CHUNK), not whole. Through a pipe with chunks of a few bytes
the examples are those of the file (Kaldi's archives, text and mixed archives, an
example larger than a chunk), a truncated or broken stream is the error a file gives
(offsets and lines of the whole stream), examples come while the pipe is still
open, and a corrupt index-vector size is a FormatError, not an allocation."""

from __future__ import annotations

import io
import shlex
import tracemalloc

import numpy as np
import pytest

import pynnet3.io.egs as egs_module
from pynnet3.errors import FormatError
from pynnet3.io.egs import NnetExample, NnetIo, examples_bytes, parse_examples, read_examples
from tests.reference import REF, ref_params

CASES = ["tdnn_relu_bn", "xvector"]
ARCHIVES = [(c, a) for c in CASES for a in ("egs.ark", "merged.ark")]


def _pipe(path) -> str:
    return f"ark:cat {shlex.quote(str(path))} |"


def _outcome(rspecifier: str, source: str) -> list:
    """The (key, bytes) read, then the error (its message with ``source`` as ``SRC``)."""
    out = []
    try:
        for key, eg in read_examples(rspecifier):
            out.append((key, eg.to_bytes()))
    except FormatError as e:
        out.append(("error", str(e).replace(source, "SRC")))
    return out


def _egs(n: int, rows: int = 5, dim: int = 3, seed: int = 0) -> list[tuple[str, NnetExample]]:
    rng = np.random.default_rng(seed)
    return [(f"eg{i}", NnetExample([
        NnetIo.from_matrix("input", -2, rng.standard_normal((rows, dim)).astype(np.float32)),
        NnetIo.from_labels("output", 7, 0, rng.integers(0, 7, rows))])) for i in range(n)]


@pytest.mark.parametrize("case, archive", ref_params(ARCHIVES, "train-cli archives", 2))
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_kaldi_archives_through_a_pipe_in_small_chunks(case, archive, chunk, monkeypatch):
    path = REF / "train-cli" / case / archive
    want = [(k, eg.to_bytes()) for k, eg in read_examples(f"ark:{path}")]
    assert len(want) == (32 if archive == "egs.ark" else 4)
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", chunk)
    got = [(k, eg.to_bytes()) for k, eg in read_examples(_pipe(path))]
    assert got == want
    assert b"".join(k.encode() + b" " + b for k, b in got) == path.read_bytes()


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_text_and_mixed_archives_through_a_pipe(chunk, tmp_path, monkeypatch):
    egs = _egs(6)
    data = (examples_bytes(egs[:2]) + examples_bytes(egs[2:4], binary=False)
            + examples_bytes(egs[4:]))
    path = tmp_path / "mixed.ark"
    path.write_bytes(data)
    want = _outcome(f"ark:{path}", f"ark:{path}")
    assert [k for k, _ in want] == [f"eg{i}" for i in range(6)]
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", chunk)
    assert _outcome(_pipe(path), _pipe(path)) == want


def test_an_example_larger_than_a_chunk(tmp_path, monkeypatch):
    egs = _egs(3, rows=300, dim=40)  # ~50 KB each
    data = examples_bytes(egs)
    path = tmp_path / "big.ark"
    path.write_bytes(data)
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 1000)
    got = list(read_examples(_pipe(path)))
    assert examples_bytes(got) == data
    # the buffer grows by half of itself: a few reads per example, not one per chunk
    reads = []
    f = io.BytesIO(data)

    def read(n):
        reads.append(n)
        return f.read(n)

    assert examples_bytes(list(egs_module._entries(b"", "s", False, read))) == data
    assert len(reads) < 3 * 12


def _mutations(data: bytes, text_at: int):
    yield "cut in the last example", data[:-40]
    yield "cut after a key", data[:data.rindex(b"eg5 ") + 4]
    yield "cut in a text example", data[:text_at + 60]
    at = data.index(b"</NnetIo>", data.index(b"eg4 "))
    yield "bad token late in the stream", data[:at] + b"</NnetIX>" + data[at + 9:]
    at = data.index(b"<I1>", text_at)
    yield "bad text index", data[:at] + b"<I2>" + data[at + 4:]
    at = data.index(b"FM ", data.index(b"eg5 ")) + 4
    yield "bad matrix size", data[:at] + (1 << 20).to_bytes(4, "little") + data[at + 4:]


@pytest.mark.parametrize("chunk", [1, 16, 1000])
def test_broken_pipe_streams_are_the_errors_of_files(chunk, tmp_path, monkeypatch):
    egs = _egs(6)
    head = examples_bytes(egs[:2]) + examples_bytes(egs[2:4], binary=False)
    data = head + examples_bytes(egs[4:])
    text_at = len(examples_bytes(egs[:2]))
    for i, (what, bad) in enumerate(_mutations(data, text_at)):
        path = tmp_path / f"bad{i}.ark"
        path.write_bytes(bad)
        monkeypatch.setattr(egs_module, "STREAM_CHUNK", 1 << 22)
        want = _outcome(f"ark:{path}", f"ark:{path}")
        assert want[-1][0] == "error", what
        assert ("byte" in want[-1][1]) or ("line" in want[-1][1]), what
        monkeypatch.setattr(egs_module, "STREAM_CHUNK", chunk)
        assert _outcome(_pipe(path), _pipe(path)) == want, what
        # ark,p: stops quietly after the same good examples
        quiet = [k for k, _ in read_examples(f"ark,p:cat {shlex.quote(str(path))} |")]
        assert quiet == [k for k, _ in want[:-1]], what


def test_offsets_and_lines_count_the_whole_stream(monkeypatch):
    egs = _egs(4)
    binary = examples_bytes(egs)
    bad = binary[:-40]
    with pytest.raises(FormatError) as whole:
        list(parse_examples(bad, "s"))
    assert f"byte {len(bad)}" in str(whole.value)  # the end of the data, past any chunk
    text = examples_bytes(egs, binary=False)
    bad_text = text[:text.rindex(b"<I1>")] + b"<I2>" + text[text.rindex(b"<I1>") + 4:]
    with pytest.raises(FormatError) as whole_text:
        list(parse_examples(bad_text, "s"))
    line = bad_text[:bad_text.rindex(b"<I2>")].count(b"\n") + 1
    assert f"line {line}" in str(whole_text.value)
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 3)
    for data, want in ((bad, whole.value), (bad_text, whole_text.value)):
        with pytest.raises(FormatError) as streamed:
            list(egs_module._entries(b"", "s", False, io.BytesIO(data).read))
        assert str(streamed.value) == str(want)


def test_memory_is_bounded_by_a_chunk_and_an_example(monkeypatch):
    egs = _egs(200, rows=20, dim=10)
    data = examples_bytes(egs)
    sizes = [len(examples_bytes([e])) for e in egs]
    ends = np.cumsum(sizes)
    chunk = 512
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", chunk)
    f, asked, given = io.BytesIO(data), [], [0]

    def read(n):
        asked.append(n)
        out = f.read(n)
        given[0] += len(out)
        return out

    for i, (key, _) in enumerate(egs_module._entries(b"", "s", False, read)):
        assert key == f"eg{i}"
        # what was read when an example comes: that example and at most a read more
        assert given[0] <= ends[i] + max(chunk, max(sizes))
    assert max(asked) <= max(chunk, max(sizes))
    assert given[0] == len(data)


def test_examples_come_while_the_pipe_is_open(tmp_path, monkeypatch):
    """The pipe writes three examples, then waits (up to 20 s) for a file the test
    makes only after it has the first example; a reader that read the stream whole
    would get it only after the wait, and the pipe says it timed out."""
    egs = _egs(6)
    first, rest = tmp_path / "first.ark", tmp_path / "rest.ark"
    first.write_bytes(examples_bytes(egs[:3]))
    rest.write_bytes(examples_bytes(egs[3:]))
    flag, late = tmp_path / "go", tmp_path / "timed_out"
    q = {k: shlex.quote(str(v)) for k, v in
         dict(first=first, rest=rest, flag=flag, late=late).items()}
    cmd = (f"cat {q['first']}; i=0; while [ ! -e {q['flag']} ]; do "
           f"i=$((i+1)); if [ $i -gt 400 ]; then touch {q['late']}; break; fi; "
           f"sleep 0.05; done; cat {q['rest']}")
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 64)
    it = read_examples(f"ark:{cmd} |")
    key, eg = next(it)
    assert key == "eg0" and eg.to_bytes() == egs[0][1].to_bytes()
    flag.touch()
    assert [k for k, _ in it] == [f"eg{i}" for i in range(1, 6)]
    assert not late.exists()


def test_merge_egs_through_a_pipe(tmp_path, monkeypatch, capsys):
    from pynnet3.cli.main import main
    from tests.reference import require_reference

    folder = require_reference() / "train-cli" / "tdnn_relu_bn"
    out = tmp_path / "merged.ark"
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 100)
    assert main(["merge-egs", "--minibatch-size=8", _pipe(folder / "egs.ark"),
                 f"ark:{out}"]) == 0
    assert out.read_bytes() == (folder / "merged.ark").read_bytes()
    assert "Processed 32 egs" in capsys.readouterr().err


def _size_at(data: bytes) -> int:
    return data.index(b"<I1V> ") + 6  # the index vector's size: b"\x04" + int32


def test_corrupt_index_vector_size_is_a_format_error():
    data = _egs(1)[0][1].to_bytes()
    at = _size_at(data)
    bad = data[:at + 1] + (1 << 30).to_bytes(4, "little") + data[at + 5:]
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="index-vector size 1073741824") as e:
            NnetExample.from_bytes(bad, "x.ark")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.offset == at and e.value.source == "x.ark"
    assert peak < 1 << 20
    # in an archive, streamed or not: the same error, naming the key
    archive = b"k1 " + bad + b"k2 " + data
    with pytest.raises(FormatError) as whole:
        list(parse_examples(archive, "s"))
    with pytest.raises(FormatError) as streamed:
        list(egs_module._entries(b"", "s", False, io.BytesIO(archive).read))
    assert "'k1'" in str(whole.value) and f"byte {at + 3}" in str(whole.value)
    assert str(streamed.value) == str(whole.value)


def test_corrupt_text_index_vector_size_allocates_nothing_large():
    text = _egs(1)[0][1].to_bytes(binary=False)
    bad = text.replace(b"<I1V> 5 ", b"<I1V> 1000000000 ", 1)
    assert bad != text
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="expected '<I1> n t x'"):
            NnetExample.from_bytes(bad, "x.txt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# -- a broken entry is final at once; other streams than pipes; huge text indexes ------------------
class _Counting:
    """``read(n)`` over ``pieces`` (the first call gives the first, and so on), then
    zeros up to ``total`` bytes in all: counts what was given."""

    def __init__(self, pieces, total: int = 0):
        self.pieces, self.total, self.given = list(pieces), total, 0

    def __call__(self, n: int) -> bytes:
        if self.pieces:
            out = self.pieces.pop(0)
        else:
            out = bytes(max(0, min(n, self.total - self.given)))
        self.given += len(out)
        return out


def _corruptions(text: bool):
    """(what, mutate) for a broken first entry of an archive (text or binary), each an
    error that its bytes show before the entry ends."""
    if text:
        yield "bad token", lambda d: d.replace(b"<NumIo>", b"<NumIx>", 1)
        yield "bad index", lambda d: d.replace(b"<I1>", b"<I2>", 1)
        yield "bad number", lambda d: d.replace(b"[\n", b"[\n  1.5x ", 1)
        yield "bad sparse vector", lambda d: d.replace(b"dim=7 [", b"dim=7 {", 1)
        yield "rows mismatch", lambda d: d.replace(b"<I1V> 5 ", b"<I1V> 4 ", 1).replace(
            b"<I1> 0 -2 0 ", b"", 1)
    else:
        yield "bad token", lambda d: d.replace(b"<NumIo>", b"<NumIx>", 1)
        yield "bad compact index byte", lambda d: d.replace(b"<I1V> \x04\x05\x00\x00\x00\xfe",
                                                            b"<I1V> \x04\x05\x00\x00\x00\x7d", 1)
        yield "bad matrix header", lambda d: d.replace(b"FM ", b"XM ", 1)
        yield "bad sparse token", lambda d: d.replace(b"SV ", b"SX ", 1)


@pytest.mark.parametrize("text", [False, True])
def test_a_broken_entry_is_final_at_once(text, monkeypatch):
    """An error inside what has been read is not read on past (a corrupt first entry on
    a pipe read and buffered the whole rest of the stream, ~840 MB for 400 MB of
    zeros, before its error): it comes from the first chunk, as the file gives it;
    more is read only where the entry runs into the end of what was read. Every cut
    point of such archives gives the file's examples and error."""
    egs = _egs(3)
    first = len(examples_bytes(egs[:1], binary=not text))
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 4096)
    for what, mutate in _corruptions(text):
        data = examples_bytes(egs, binary=not text)
        bad = mutate(data[:first]) + data[first:]
        assert bad[:first] != data[:first], what
        with pytest.raises(FormatError) as whole:
            list(parse_examples(bad, "s"))
        assert "'eg0'" in str(whole.value), what
        # the broken entry, then 16 MiB of zeros: one read, not the whole stream
        read = _Counting([bad[:first + 40]], total=1 << 24)
        with pytest.raises(FormatError) as streamed:
            list(egs_module._entries(b"", "s", False, read))
        assert str(streamed.value) == str(whole.value), what
        assert read.given == first + 40, what
        assert list(egs_module._entries(b"", "s", True, _Counting([bad[:first + 40]],
                                                                   1 << 24))) == []
        # cut anywhere: the file's outcome
        for cut in range(1, len(bad)):
            with pytest.raises(FormatError) as streamed:
                list(egs_module._entries(b"", "s", False, _Counting([bad[:cut], bad[cut:]])))
            assert str(streamed.value) == str(whole.value), (what, cut)


def test_a_corrupt_entry_on_a_pipe_stops_the_reading(tmp_path, monkeypatch):
    """The reviewer's case: a binary entry with a bad first token, then 25 MiB of zeros
    from a pipe; the error is at byte 5 after a chunk, and the pipe, closed then,
    stops writing: it has not written all its zeros."""
    done = tmp_path / "wrote_everything"
    cmd = (r"printf 'k1 \0B<Bad> '; i=0; while [ $i -lt 400 ]; do "
           r"head -c 65536 /dev/zero || exit 0; i=$((i+1)); done; "
           f"touch {shlex.quote(str(done))}")
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 4096)
    with pytest.raises(FormatError, match=r"example 'k1': .*byte 5: expected '<Nnet3Eg>'"):
        list(read_examples(f"ark:{cmd} |"))
    assert not done.exists()


def test_fifos_and_dev_stdin_are_read_as_streams(tmp_path):
    """A FIFO (and /dev/stdin on a pipe, process substitution) has size 0: it is read
    as a stream, not taken for an empty file."""
    import os
    import subprocess
    import sys
    import threading

    egs = _egs(3)
    data = examples_bytes(egs[:2]) + examples_bytes(egs[2:], binary=False)
    fifo = tmp_path / "egs.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    got = [(k, eg.to_bytes()) for k, eg in read_examples(f"ark:{fifo}")]
    writer.join(5)
    assert got == [(k, eg.to_bytes()) for k, eg in parse_examples(data)]
    assert [k for k, _ in got] == ["eg0", "eg1", "eg2"]
    code = ("from pynnet3.io.egs import read_examples, examples_bytes; import sys; "
            "sys.stdout.buffer.write(examples_bytes(list(read_examples('ark:/dev/stdin'))))")
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                         check=True, timeout=60)
    assert out.stdout == examples_bytes(list(parse_examples(data)))
    # a broken one: the error a file gives
    path = tmp_path / "bad.ark"
    path.write_bytes(data[:-30])
    code = ("from pynnet3.io.egs import read_examples; "
            "print(len(list(read_examples('ark:/dev/stdin'))))")
    with path.open("rb") as f:  # (a regular file on stdin: mapped)
        out = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True,
                             timeout=60)
    piped = subprocess.run([sys.executable, "-c", code], input=data[:-30], capture_output=True,
                           timeout=60)
    assert out.returncode == piped.returncode == 1
    for o in (out, piped):
        assert b"example 'eg2'" in o.stderr and b"ark:/dev/stdin, line" in o.stderr


@pytest.mark.parametrize("big", [b"3000000000", b"99999999999999999999", b"-99999999999999999999"])
def test_a_text_index_beyond_int64_is_a_format_error(big, tmp_path, monkeypatch):
    egs = _egs(3)
    data = examples_bytes(egs, binary=False)
    at = data.index(b"eg1 ")
    bad = data[:at] + data[at:].replace(b"<I1> 0 -1 0", b"<I1> 0 " + big + b" 0", 1)
    assert bad != data
    with pytest.raises(FormatError, match=r"example 'eg1': s, line \d+: index out of the int32"):
        list(parse_examples(bad, "s"))
    path = tmp_path / "big.ark"
    path.write_bytes(bad)
    monkeypatch.setattr(egs_module, "STREAM_CHUNK", 64)
    for spec in (f"ark:{path}", _pipe(path)):
        want = _outcome(spec, spec)
        assert want[-1][0] == "error" and "int32" in want[-1][1]
        assert [k for k, _ in read_examples(spec.replace("ark:", "ark,p:", 1))] == ["eg0"]
