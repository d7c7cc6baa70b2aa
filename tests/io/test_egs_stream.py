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
