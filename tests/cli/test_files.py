"""cli/files.py: model rxfilenames as Kaldi reads them -- plain files, gzip-compressed
files, ``"command |"`` pipes (raw networks and final.mdl) -- and one-line errors
naming the command when a pipe fails."""

from __future__ import annotations

import gzip
import shlex

import pytest

import pynnet3
from pynnet3.cli.files import is_pipe, read_bytes, read_model
from pynnet3.cli.main import main
from pynnet3.errors import FormatError
from tests.reference import require_reference

_CONFIG = """\
input-node name=input dim=4
component name=affine type=AffineComponent input-dim=8 output-dim=3
component-node name=affine component=affine input=Append(Offset(input, -1), input)
output-node name=output input=affine
"""


@pytest.fixture()
def model(tmp_path):
    path = tmp_path / "model.raw"
    pynnet3.Nnet.from_config(_CONFIG, seed=1).write(path, binary=True)
    return path


@pytest.mark.parametrize("text, pipe", [
    ("gunzip -c final.mdl.gz |", True), ("cat x|", True), ("final.mdl", False),
    ("-", False), ("|", False), ("| gzip -c > x", False)])
def test_is_pipe(text, pipe):
    assert is_pipe(text) is pipe


def test_a_gzipped_model_through_a_pipe_equals_the_file(model, tmp_path):
    gz = tmp_path / "model.raw.gz"
    gz.write_bytes(gzip.compress(model.read_bytes()))
    want = model.read_bytes()
    assert read_bytes(f"gunzip -c {shlex.quote(str(gz))} |")[0] == want
    piped = read_model(f"gunzip -c {shlex.quote(str(gz))} |")
    assert piped.to_bytes(True) == want
    # a pipe whose output is itself gzip-compressed is gunzipped too
    assert read_model(f"cat {shlex.quote(str(gz))} |").to_bytes(True) == want


def test_a_failing_command_is_an_error_naming_it(tmp_path):
    with pytest.raises(FormatError, match=r"gunzip -c .*nothere.gz \|: the command failed "
                                          r"\(exit status 1\)"):
        read_model(f"gunzip -c {tmp_path}/nothere.gz |")
    with pytest.raises(FormatError, match="exit status 3"):
        read_bytes("exit 3 |")


def test_a_command_with_no_output_is_an_empty_model(tmp_path):
    with pytest.raises(FormatError, match=r"true \|: empty model file"):
        read_model("true |")


def test_cli_info_reads_a_pipe_and_reports_a_failed_one(model, tmp_path, capsys):
    assert main(["info", f"cat {shlex.quote(str(model))} |"]) == 0
    assert capsys.readouterr().out == pynnet3.read_nnet(model).info()
    assert main(["info", f"gunzip -c {tmp_path}/none.gz |"]) == 1
    err = capsys.readouterr().err
    assert "the command failed" in err and "none.gz" in err and "Traceback" not in err


def test_final_mdl_through_a_gzip_pipe(tmp_path, capsys):
    ref = require_reference()
    mdl = ref / "am" / "tdnnf_chain" / "final.mdl"
    gz = tmp_path / "final.mdl.gz"
    gz.write_bytes(gzip.compress(mdl.read_bytes()))
    assert main(["am-info", f"gunzip -c {shlex.quote(str(gz))} |"]) == 0
    piped = capsys.readouterr().out
    assert main(["am-info", str(mdl)]) == 0
    assert piped == capsys.readouterr().out
