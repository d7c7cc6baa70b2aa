"""Model files: every reference model reads and writes back byte-identical (text and
binary); malformed files give FormatError naming file, line/offset and token;
Nnet.write is atomic."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

import pynnet3
from pynnet3.errors import ConfigError, FormatError, PynnetError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader
from pynnet3.io.model_file import parse_model_bytes, read_model_parts, write_model_parts
from pynnet3.nnet import Nnet, read_nnet

from ..reference import REF, ref_params, require_reference


def _rel(p: Path) -> str:
    return str(p.relative_to(REF))


def _files(pattern: str) -> list[Path]:
    return sorted(REF.glob(pattern)) if REF.is_dir() else []


TEXT_MODELS = _files("**/model.txt")
BIN_MODELS = _files("**/model.bin")
EXTRA_TEXT = _files("collapsed/*/collapsed_all.txt") + _files("training/*/*.txt.gz")


def _nnet_bytes(data: bytes, source: str, binary: bool) -> bytes:
    parts = parse_model_bytes(data, source)
    assert parts.binary == binary
    return Nnet.from_model_parts(parts, source).to_bytes(binary)


def test_reference_models_present():
    require_reference()
    assert len(TEXT_MODELS) >= 120 and len(BIN_MODELS) == len(TEXT_MODELS)


@pytest.mark.parametrize("path", ref_params(TEXT_MODELS + EXTRA_TEXT), ids=_rel)
def test_text_model_round_trip_is_byte_identical(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    assert _nnet_bytes(data, str(path), binary=False) == data


@pytest.mark.parametrize("path", ref_params(BIN_MODELS), ids=_rel)
def test_binary_model_round_trip_is_byte_identical(path):
    data = path.read_bytes()
    assert data[:2] == b"\0B"
    assert _nnet_bytes(data, str(path), binary=True) == data


@pytest.mark.parametrize("path", ref_params(BIN_MODELS), ids=_rel)
def test_binary_and_text_agree(path):
    """model.bin written as text is model.txt; model.txt written as binary is model.bin
    (except BatchNorm stats, which Kaldi's own round trip moves by a float step)."""
    text = path.with_name("model.txt").read_bytes()
    nnet_bin = read_nnet(path)
    assert nnet_bin.to_bytes(binary=False) == text
    ours = read_nnet(path.with_name("model.txt")).to_bytes(binary=True)
    if b"<BatchNormComponent>" not in text:
        assert ours == path.read_bytes()
    else:
        assert len(ours) == len(path.read_bytes())
        assert _nnet_bytes(ours, "ours", True) == ours
        assert read_nnet_bytes(ours).to_bytes(False) == text


def read_nnet_bytes(data: bytes) -> Nnet:
    return Nnet.from_model_parts(parse_model_bytes(data, "<bytes>"), "<bytes>")


def _am_cases() -> list[Path]:
    return _files("am/*/info.json")


@pytest.mark.parametrize("info", ref_params(_am_cases(), "am cases"), ids=lambda p: p.parent.name)
def test_nnet_part_of_am_files_round_trips(info):
    meta = json.loads(info.read_text())
    # binary final.mdl: the nnet starts at nnet_offset_in_final_mdl
    data = (info.parent / "final.mdl").read_bytes()
    off = meta["nnet_offset_in_final_mdl"]
    r = BinaryReader(data, "final.mdl", pos=off)
    parts = read_model_parts(r)
    written = write_model_parts(Nnet.from_model_parts(parts).to_model_parts(), True)
    assert written[:2] == b"\0B"
    assert data[off:r.pos] == written[2:]
    assert data[r.pos:].startswith(b"<LeftContext> ")
    # text final.mdl.txt: the nnet part is byte-identical after the rewrite
    text = (info.parent / "final.mdl.txt").read_bytes()
    start = text.index(b"<Nnet3>")
    r = TextReader(text, "final.mdl.txt", pos=start)
    parts = read_model_parts(r)
    written = write_model_parts(Nnet.from_model_parts(parts).to_model_parts(), False)
    assert written.endswith(b"</Nnet3> ")  # Kaldi: no newline after </Nnet3>
    assert text[start:start + len(written)] == written
    assert text[start + len(written):].startswith(b"<LeftContext> ")


def test_read_nnet_detects_binary_by_content_not_name(tmp_path):
    require_reference()
    src = REF / "components" / "Affine_1"
    shutil.copy(src / "model.bin", tmp_path / "looks_like_text.txt")
    shutil.copy(src / "model.txt", tmp_path / "looks_like_binary.bin")
    a = pynnet3.read_nnet(tmp_path / "looks_like_text.txt")
    b = pynnet3.read_nnet(str(tmp_path / "looks_like_binary.bin"))
    assert a.to_bytes(False) == b.to_bytes(False) == (src / "model.txt").read_bytes()


# ----------------------------------------------------------------------------------
# Atomic writes
# ----------------------------------------------------------------------------------

SMALL = """\
input-node name=input dim=3
component name=affine type=AffineComponent input-dim=3 output-dim=2
component-node name=affine component=affine input=input
output-node name=output input=affine
"""


@pytest.mark.parametrize("binary", [False, True])
def test_write_then_read_back(tmp_path, binary):
    nnet = Nnet.from_config(SMALL, seed=1)
    out = tmp_path / "m.mdl"
    nnet.write(out, binary=binary)
    assert out.read_bytes() == nnet.to_bytes(binary)
    assert read_nnet(out).to_bytes(binary) == out.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["m.mdl"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_gives_normal_permissions_and_keeps_existing_ones(tmp_path):
    nnet = Nnet.from_config(SMALL)
    out = tmp_path / "new.mdl"
    nnet.write(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    existing = tmp_path / "existing.mdl"
    existing.write_bytes(b"old")
    os.chmod(existing, 0o640)
    nnet.write(existing)
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640
    assert existing.read_bytes() == nnet.to_bytes(False)


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    out = tmp_path / "model.mdl"
    out.write_bytes(b"the old model")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        Nnet.from_config(SMALL).write(out)
    monkeypatch.undo()
    assert out.read_bytes() == b"the old model"
    assert os.listdir(tmp_path) == ["model.mdl"]


def test_failure_while_writing_data_keeps_old_file(tmp_path, monkeypatch):
    out = tmp_path / "model.mdl"
    out.write_bytes(b"the old model")
    real_fsync = os.fsync

    def boom(fd):
        real_fsync(fd)
        raise KeyboardInterrupt  # interrupted after the data went to the temp file

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        Nnet.from_config(SMALL).write(out)
    monkeypatch.undo()
    assert out.read_bytes() == b"the old model"
    assert os.listdir(tmp_path) == ["model.mdl"]


def test_write_into_missing_directory_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        Nnet.from_config(SMALL).write(tmp_path / "no" / "such" / "dir.mdl")


# ----------------------------------------------------------------------------------
# Malformed files
# ----------------------------------------------------------------------------------

def _small_text() -> bytes:
    return Nnet.from_config(SMALL, seed=0).to_bytes(False)


def _read_error(data: bytes, exc=FormatError, source="bad.mdl"):
    with pytest.raises(PynnetError) as ei:
        read_nnet_from(data, source)
    assert isinstance(ei.value, exc), repr(ei.value)
    assert str(ei.value).startswith(source)
    return ei.value


def read_nnet_from(data: bytes, source: str) -> Nnet:
    return Nnet.from_model_parts(parse_model_bytes(data, source), source)


def _line_of(data: bytes, pos: int) -> int:
    return data.count(b"\n", 0, pos) + 1


@pytest.mark.parametrize("binary", [False, True])
def test_truncated_everywhere_is_a_format_error(binary):
    """Every proper prefix (except dropping the last space of '</Nnet3> ') fails cleanly."""
    data = Nnet.from_config(SMALL, seed=0).to_bytes(binary)
    for cut in range(len(data) - 1):
        err = _read_error(data[:cut])
        if binary and cut >= 2:
            assert err.offset is not None and f"byte {err.offset}" in str(err)
            assert 0 <= err.offset <= cut
        elif not binary:
            assert err.line is not None and f"line {err.line}" in str(err)
            assert err.line <= _line_of(data, cut)


@pytest.mark.parametrize("path", ref_params(_files("realistic/*/model.bin")
                                             + _files("realistic/*/model.txt")),
                         ids=_rel)
def test_truncated_reference_models(path):
    data = path.read_bytes()
    for frac in (0.0001, 0.01, 0.3, 0.5, 0.77, 0.999):
        cut = int(len(data) * frac)
        err = _read_error(data[:cut], source=str(path))
        if path.suffix == ".bin":
            assert err.offset is not None and err.offset <= cut
        else:
            assert err.line is not None and err.line <= _line_of(data, cut)


def test_garbage_token_names_token_and_line():
    data = _small_text()
    bad = data.replace(b"<BiasParams>", b"<Garbage>")
    err = _read_error(bad)
    assert err.token == "<Garbage>"
    assert err.line == _line_of(bad, bad.index(b"<Garbage>"))
    assert "'<Garbage>'" in str(err) and f"line {err.line}" in str(err)


def test_unknown_component_type_names_token_and_line():
    data = _small_text()
    bad = data.replace(b"<AffineComponent>", b"<FooComponent>")
    err = _read_error(bad)
    assert err.token == "<FooComponent>" and "unknown component type" in str(err)
    assert err.line == _line_of(bad, bad.index(b"<FooComponent>"))


@pytest.mark.parametrize("old, new, token", [
    (b"<NumComponents> 1", b"<NumComponents> x", "x"),
    (b"<NumComponents> 1", b"<NumComponents> -1", "-1"),
    (b"<NumComponents> 1", b"<NumComponents> 2", "</Nnet3>"),
    (b"<NumComponents> 1", b"<NumComponents> 0", "<ComponentName>"),
    (b"<Nnet3>", b"<Nnet2>", "<Nnet2>"),
    (b"</Nnet3>", b"</Nnet>", "</Nnet>"),
    (b"<LearningRate> 0.001", b"<LearningRate> abc", "abc"),
    (b"<LearningRate> 0.001", b"<LearningRate> nan", "nan"),
])
def test_bad_tokens(old, new, token):
    data = _small_text()
    assert old in data
    bad = data.replace(old, new)
    err = _read_error(bad)
    assert err.token == token
    assert err.line == _line_of(bad, bad.index(token.encode(), bad.index(new)))


def test_nan_and_inf_in_parameters_name_token_and_line():
    data = _small_text()
    lines = data.split(b"\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith(b"  ") and ln.strip())
    for word in (b"nan", b"-nan", b"inf", b"NaN", b"1e39"):
        row = lines[i].split()
        row[1] = word
        bad = b"\n".join(lines[:i] + [b"  " + b" ".join(row) + b" "] + lines[i + 1:])
        err = _read_error(bad)
        assert err.token == word.decode() and err.line == i + 1, str(err)
        assert "non-finite" in str(err)


def test_bad_dimensions():
    data = _small_text()
    lines = data.split(b"\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith(b"  ") and ln.strip())
    # a ragged parameter matrix (its second row is one value short)
    j = i + 1
    bad = b"\n".join(lines[:j] + [b"  " + b" ".join(lines[j].split()[1:])] + lines[j + 1:])
    err = _read_error(bad)
    assert "different lengths" in str(err) and err.line == j + 1
    # parameters that disagree with the network's declared dims
    bad = data.replace(b"input-node name=input dim=3", b"input-node name=input dim=4")
    with pytest.raises(pynnet3.errors.DimensionError, match="'affine'"):
        read_nnet_from(bad, "bad.mdl")
    # a bias of the wrong size
    bias = re.search(rb"<BiasParams>  \[ ([^\]]*)\]", data)
    bad = data.replace(bias.group(0), b"<BiasParams>  [ " + bias.group(1) + b"0.5 ]")
    with pytest.raises(PynnetError):
        read_nnet_from(bad, "bad.mdl")


def test_config_section_errors_name_file_and_line():
    data = _small_text()
    bad = data.replace(b"input=affine", b"input=Offset(affine)")
    with pytest.raises(ConfigError) as ei:
        read_nnet_from(bad, "bad.mdl")
    assert "bad.mdl" in str(ei.value) and "line 4" in str(ei.value)
    with pytest.raises(FormatError, match="config section"):
        read_nnet_from(data[:data.index(b"\n\n")], "bad.mdl")


def _binary_small() -> bytes:
    return Nnet.from_config(SMALL, seed=0).to_bytes(True)


def test_binary_garbage_and_unknown_type_name_offset_and_token():
    data = _binary_small()
    pos = data.index(b"<BiasParams>")
    bad = data.replace(b"<BiasParams>", b"<Garbage!!>")
    err = _read_error(bad)
    assert err.token == "<Garbage!!>" and err.offset == pos and f"byte {pos}" in str(err)
    pos = data.index(b"<AffineComponent>")
    bad = data.replace(b"<AffineComponent>", b"<AffineCompXnent>")
    err = _read_error(bad)
    assert err.token == "<AffineCompXnent>" and err.offset == pos


def test_binary_nan_in_parameters_names_offset():
    data = bytearray(_binary_small())
    start = data.index(b"FM ") + 3 + 5 + 5  # header, rows, cols
    data[start + 8:start + 12] = b"\x00\x00\xc0\x7f"  # float32 NaN as element 2
    err = _read_error(bytes(data))
    assert err.offset == start + 8 and "non-finite" in str(err)


def test_binary_bad_size_byte_names_offset():
    data = bytearray(_binary_small())
    pos = data.index(b"<NumComponents> ") + len(b"<NumComponents> ")
    data[pos] = 7
    err = _read_error(bytes(data))
    assert err.offset == pos and "size byte 7" in str(err)


def test_empty_and_non_model_files():
    for data in (b"", b"\0B", b"hello world", b"\0Bhello"):
        _read_error(data)
