"""Kaldi tables through kaldiio (pynnet3.io.ark): specifiers, reading ark / scp /
pipes / compressed / text entries, atomic writing of ark and ark,scp, errors."""

from __future__ import annotations

import os

import kaldiio
import numpy as np
import pytest

from pynnet3.errors import FormatError
from pynnet3.io.ark import (
    TableEntryError,
    TableWriter,
    ark_bytes,
    parse_ark,
    parse_specifier,
    random_access_table,
    read_ark,
    read_table,
    write_ark,
)
from pynnet3.io.atomic import TAG


def _entries(seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((4, 3)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
            "c": rng.standard_normal((1, 3)).astype(np.float32)}


@pytest.mark.parametrize("text, write, kind, targets, options", [
    ("ark:f.ark", False, "ark", ("f.ark",), set()),
    ("ark,s,cs:-", False, "ark", ("-",), {"s", "cs"}),
    ("scp,p:f.scp", False, "scp", ("f.scp",), {"p"}),
    ("ark:gunzip -c f.gz |", False, "ark", ("gunzip -c f.gz |",), set()),
    ("ark,t:o.txt", True, "ark", ("o.txt",), {"t"}),
    ("ark,scp,t:o.ark,o.scp", True, "ark,scp", ("o.ark", "o.scp"), {"t"}),
])
def test_specifiers(text, write, kind, targets, options):
    spec = parse_specifier(text, write=write)
    assert (spec.kind, spec.targets, set(spec.options)) == (kind, targets, options)


@pytest.mark.parametrize("text, write", [
    ("f.ark", False), ("ark:", False), ("ark,scp:a,b", False), ("ark,zz:f", False),
    ("scp:o.scp", True), ("ark,scp:o.ark", True), ("t:o.txt", True)])
def test_bad_specifiers(text, write):
    with pytest.raises(FormatError, match="specifier"):
        parse_specifier(text, write=write)


def test_ark_scp_round_trip_with_offsets(tmp_path):
    entries = _entries()
    ark, scp = tmp_path / "o.ark", tmp_path / "o.scp"
    with TableWriter(f"ark,scp:{ark},{scp}") as w:
        for k, v in entries.items():
            w.write(k, v)
    assert sorted(os.listdir(tmp_path)) == ["o.ark", "o.scp"]
    for spec in (f"scp:{scp}", f"ark:{ark}", f"ark:cat {ark} |"):
        got = dict(read_table(spec))
        assert list(got) == list(entries)
        for k in entries:
            np.testing.assert_array_equal(got[k], entries[k])
    # kaldiio and Kaldi read our scp (offsets point after "KEY ")
    for k, v in kaldiio.load_scp(str(scp)).items():
        np.testing.assert_array_equal(v, entries[k])
    assert random_access_table(f"scp:{scp}")["c"].shape == (1, 3)
    assert set(random_access_table(f"ark:{ark}")) == set(entries)


def test_binary_float_entries_are_kaldiio_bytes(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.standard_normal((7, 6)).astype(np.float32)
    entries = {"m": big, "vec": big[2], "empty": np.zeros((0, 4), np.float32),
               "novec": np.zeros(0, np.float32), "strided": big[::2, 1::2],
               "fortran": np.asfortranarray(big), "double": big.astype(np.float64),
               "utt-é": big[:1]}
    kaldiio.save_ark(str(tmp_path / "want.ark"), entries, scp=str(tmp_path / "want.scp"))
    with TableWriter(f"ark,scp:{tmp_path}/got.ark,{tmp_path}/got.scp") as w:
        for key, value in entries.items():
            w.write(key, value)
    assert (tmp_path / "got.ark").read_bytes() == (tmp_path / "want.ark").read_bytes()
    assert ((tmp_path / "got.scp").read_text().replace("got.ark", "want.ark")
            == (tmp_path / "want.scp").read_text())
    got = dict(read_table(f"scp:{tmp_path}/got.scp"))
    assert all(np.array_equal(got[k], v) for k, v in entries.items())


def test_scp_entries_read_as_kaldiio_reads_them(tmp_path):
    rng = np.random.default_rng(1)
    mat = rng.standard_normal((5, 3)).astype(np.float32)
    entries = {"fm": mat, "fv": mat[0], "dm": mat.astype(np.float64),
               "dv": mat[1].astype(np.float64), "empty": np.zeros((0, 3), np.float32)}
    kaldiio.save_ark(str(tmp_path / "b.ark"), entries, scp=str(tmp_path / "b.scp"))
    kaldiio.save_ark(str(tmp_path / "c.ark"), {"cm": mat}, scp=str(tmp_path / "c.scp"),
                     compression_method=2)
    kaldiio.save_ark(str(tmp_path / "t.ark"), {"tm": mat}, scp=str(tmp_path / "t.scp"),
                     text=True)
    lines = [(tmp_path / f).read_text() for f in ("b.scp", "c.scp", "t.scp")]
    ark = str(tmp_path / "b.ark")
    lines.append(f"ranged {ark}:{int(lines[0].split(':')[-1].split()[0])}[1:2]\n")
    (tmp_path / "all.scp").write_text("".join(lines))
    want = kaldiio.load_scp(str(tmp_path / "all.scp"))
    got = dict(read_table(f"scp:{tmp_path}/all.scp"))
    table = random_access_table(f"scp:{tmp_path}/all.scp")
    assert list(got) == list(want) == list(table)
    for key in want:
        for value in (got[key], table[key]):
            assert value.dtype == want[key].dtype and value.shape == want[key].shape, key
            assert np.array_equal(value, want[key]), key
            assert value.flags.writeable or key not in entries, key  # (ours: writable)
    # past the end of the file, or not an entry: the entry's error, as before
    size = os.path.getsize(ark)
    (tmp_path / "bad.scp").write_text(f"short {ark}:{size - 8}\nnone {ark}:{size + 10}\n")
    got = dict(read_table(f"scp:{tmp_path}/bad.scp"))
    assert all(isinstance(v, TableEntryError) for v in got.values())


def test_archive_files_read_as_kaldiio_reads_them(tmp_path):
    # plain binary entries are read without kaldiio, up to the first other one; from
    # there kaldiio reads the rest (text, compressed, plain again)
    rng = np.random.default_rng(5)
    mat = rng.standard_normal((5, 3)).astype(np.float32)
    plain = {"fm": mat, "fv": mat[0], "dm": mat.astype(np.float64),
             "dv": mat[1].astype(np.float64), "empty": np.zeros((0, 3), np.float32),
             "\u00e9t\u00e9": mat[:2]}
    kaldiio.save_ark(str(tmp_path / "p.ark"), plain)
    kaldiio.save_ark(str(tmp_path / "c.ark"), {"cm": mat}, compression_method=2)
    kaldiio.save_ark(str(tmp_path / "t.ark"), {"tm": mat}, text=True)
    kaldiio.save_ark(str(tmp_path / "q.ark"), {"after": mat[3:]})
    parts = [(tmp_path / f).read_bytes() for f in ("p.ark", "c.ark", "t.ark", "q.ark")]
    (tmp_path / "all.ark").write_bytes(b"".join(parts))
    for name in ("p.ark", "all.ark"):
        want = list(kaldiio.load_ark(str(tmp_path / name)))
        got = list(read_table(f"ark:{tmp_path}/{name}"))
        assert [k for k, _ in got] == [k for k, _ in want]
        for (key, value), (_, expected) in zip(got, want, strict=True):
            expected = np.asarray(expected)
            assert value.dtype == expected.dtype and value.shape == expected.shape, key
            assert np.array_equal(value, expected), key
    # a size past the end of the file: kaldiio's reading and its error, as before
    data = parts[0]
    (tmp_path / "cut.ark").write_bytes(data[:-8])
    seen = []
    with pytest.raises(FormatError, match="declares .* bytes of data"):
        for k, _ in read_table(f"ark:{tmp_path}/cut.ark"):
            seen.append(k)
    assert seen == list(plain)[:-1]


def test_a_plain_archive_file_is_read_without_kaldiio(tmp_path):
    import subprocess
    import sys

    kaldiio.save_ark(str(tmp_path / "f.ark"), _entries(6))
    code = ("import sys\nfrom pynnet3.io.ark import read_table\n"
            f"print([k for k, _ in read_table('ark:{tmp_path}/f.ark')], "
            "'kaldiio' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.stdout.split("]")[-1].strip() == "False", res.stderr
    assert res.stdout.startswith("['a', 'b', 'c']")


def test_text_and_compressed_entries(tmp_path):
    entries = _entries(1)
    with TableWriter(f"ark,t:{tmp_path}/o.txt") as w:
        for k, v in entries.items():
            w.write(k, v)
    assert (tmp_path / "o.txt").read_bytes().startswith(b"a  [")
    got = dict(read_table(f"ark:{tmp_path}/o.txt"))
    for k in entries:
        np.testing.assert_allclose(got[k], entries[k], rtol=1e-6)
    mats = {k: v for k, v in entries.items() if v.ndim == 2}
    with TableWriter(f"ark:{tmp_path}/c.ark", compression_method=1) as w:
        for k, v in mats.items():
            w.write(k, v)
    assert (tmp_path / "c.ark").read_bytes().count(b"\0BCM") == len(mats)
    for k, v in read_table(f"ark:{tmp_path}/c.ark"):
        assert v.dtype == np.float32
        np.testing.assert_allclose(v, mats[k], atol=0.05)


def test_an_archive_file_is_handed_to_writeback_as_it_is_written(tmp_path, monkeypatch):
    import sys

    import pynnet3.io.ark as ark_module
    from pynnet3.io import atomic

    calls = []
    monkeypatch.setattr(ark_module, "start_writeback",
                        lambda fd, offset, n: (calls.append((offset, n)),
                                               atomic.start_writeback(fd, offset, n)))
    rng = np.random.default_rng(7)
    entries = {f"u{i}": rng.standard_normal((100, 300)).astype(np.float32)
               for i in range(12)}  # (120 kB each)
    with TableWriter(f"ark:{tmp_path}/o.ark") as w:
        for k, v in entries.items():
            w.write(k, v)
    # contiguous ranges from the start, each at least the step, before the commit
    assert len(calls) >= 2 and calls[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(calls, calls[1:], strict=False))
    assert all(n >= ark_module._WRITEBACK_STEP for _, n in calls)
    assert calls[-1][0] + calls[-1][1] <= (tmp_path / "o.ark").stat().st_size
    kaldiio.save_ark(str(tmp_path / "k.ark"), entries)
    assert (tmp_path / "o.ark").read_bytes() == (tmp_path / "k.ark").read_bytes()
    if sys.platform.startswith("linux"):
        assert atomic._sync_file_range  # (found in libc: the writeback really starts)
    # an archive to stdout or a pipe is not a file of ours: nothing asked
    calls.clear()
    with TableWriter(f"ark:cat > {tmp_path}/p.ark |") as w:
        for k, v in entries.items():
            w.write(k, v)
    assert calls == []


def test_writer_abort_and_exceptions_leave_nothing(tmp_path):
    (tmp_path / "o.ark").write_bytes(b"old")
    spec = f"ark,scp:{tmp_path}/o.ark,{tmp_path}/o.scp"
    with pytest.raises(RuntimeError), TableWriter(spec) as w:
        w.write("a", np.zeros((2, 2)))
        assert any(TAG in p for p in os.listdir(tmp_path))
        raise RuntimeError
    assert os.listdir(tmp_path) == ["o.ark"]
    assert (tmp_path / "o.ark").read_bytes() == b"old"


def test_scp_entry_errors_do_not_stop_reading(tmp_path):
    entries = _entries(2)
    kaldiio.save_ark(str(tmp_path / "f.ark"), entries, scp=str(tmp_path / "f.scp"))
    lines = (tmp_path / "f.scp").read_text().splitlines()
    lines.insert(1, f"lost {tmp_path}/nothere.ark:5")
    (tmp_path / "f.scp").write_text("\n".join(lines) + "\n")
    got = list(read_table(f"scp:{tmp_path}/f.scp"))
    assert [k for k, _ in got] == ["a", "lost", "b", "c"]
    assert isinstance(got[1][1], TableEntryError) and "nothere.ark" in got[1][1].message
    assert [k for k, _ in read_table(f"scp,p:{tmp_path}/f.scp")] == ["a"]
    table = random_access_table(f"scp:{tmp_path}/f.scp")
    with pytest.raises(FormatError, match="lost"):
        table["lost"]
    # membership is the scp's keys: it reads no entry (an unreadable one is still in)
    assert "lost" in table and "a" in table and "zz" not in table and 3 not in table


def test_a_truncated_archive_yields_its_good_entries_first(tmp_path):
    data = ark_bytes(_entries(3))
    (tmp_path / "t.ark").write_bytes(data[:-6])
    seen = []
    with pytest.raises(FormatError, match="truncated"):
        for k, _ in read_table(f"ark:{tmp_path}/t.ark"):
            seen.append(k)
    assert seen == ["a", "b"]
    assert [k for k, _ in read_table(f"ark,p:{tmp_path}/t.ark")] == ["a", "b"]


def test_whole_archive_helpers(tmp_path):
    entries = _entries(4)
    write_ark(tmp_path / "w.ark", entries, double=True)
    back = read_ark(tmp_path / "w.ark")
    assert back["a"].dtype == np.float64
    assert ark_bytes(back, double=True) == (tmp_path / "w.ark").read_bytes()
    assert list(dict(parse_ark(ark_bytes(entries)))) == ["a", "b", "c"]
    with pytest.raises(FormatError, match="whitespace"):
        ark_bytes({"a b": entries["a"]})


def test_an_scp_that_is_not_utf8_is_a_format_error(tmp_path):
    from pynnet3.errors import FormatError
    from pynnet3.io.ark import random_access_table, read_table

    scp = tmp_path / "bad.scp"
    scp.write_bytes(b"utt\xe9 /nowhere.ark:5\n")
    for read in (lambda s: list(read_table(s)), random_access_table):
        with pytest.raises(FormatError, match="not UTF-8"):
            read(f"scp:{scp}")
