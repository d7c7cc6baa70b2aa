"""``-`` is stdin / stdout where the command line reads a model, a config or a
request and where it writes a model (as in Kaldi's tools); unreadable input is a
one-line error."""

from __future__ import annotations

import io
import json
import sys

import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.nnet import nnet_from_bytes, read_nnet

CONFIG = """input-node name=input dim=3
component name=a type=AffineComponent input-dim=6 output-dim=2
component-node name=a component=a input=Append(Offset(input, -1), input)
output-node name=output input=a
"""
REQUEST = {"inputs": [{"name": "input", "indexes": [[0, t, 0] for t in range(-1, 4)]}],
           "outputs": [{"name": "output", "indexes": [[0, t, 0] for t in range(4)]}]}


def run(argv, stdin: bytes = b"", monkeypatch=None) -> tuple[int, bytes, str]:
    """main(argv) with ``stdin`` as standard input; (status, stdout bytes, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", err)
    rc = main([str(a) for a in argv])
    stdout.flush()
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.mdl"
    pynnet3.Nnet.from_config(CONFIG, seed=3).write(path, binary=True)
    return path


def test_init_from_stdin_to_stdout(monkeypatch, tmp_path):
    rc, out, err = run(["init", "-", "-", "--binary=false"], CONFIG.encode(), monkeypatch)
    assert rc == 0 and err == ""
    assert out.startswith(b"<Nnet3> \ninput-node name=input dim=3")
    assert nnet_from_bytes(out).to_bytes(False) == out
    rc, out_bin, _ = run(["init", "-", "-"], CONFIG.encode(), monkeypatch)  # binary default
    assert rc == 0 and out_bin.startswith(b"\0B<Nnet3>")
    rc, _, _ = run(["init", "-", tmp_path / "f.mdl"], CONFIG.encode(), monkeypatch)
    assert rc == 0 and read_nnet(tmp_path / "f.mdl").to_bytes(True) == out_bin


def test_copy_and_info_through_pipes(monkeypatch, model):
    data = model.read_bytes()
    rc, text, err = run(["copy", "-", "-", "--binary=false"], data, monkeypatch)
    assert rc == 0 and err == "" and text == read_nnet(model).to_bytes(False)
    rc, info, _ = run(["info", "-"], text, monkeypatch)
    assert rc == 0 and b"left-context: 1" in info and b"num-parameters: 14" in info


def test_show_computation_request_or_model_from_stdin(monkeypatch, model, tmp_path):
    req = tmp_path / "r.json"
    req.write_text(json.dumps(REQUEST))
    rc, ref, _ = run(["show-computation", model, "--request", req], b"", monkeypatch)
    assert rc == 0 and b"# stats:" in ref
    rc, out, _ = run(["show-computation", model, "--request", "-"],
                     json.dumps(REQUEST).encode(), monkeypatch)
    assert rc == 0 and out == ref
    rc, out, _ = run(["show-computation", "-", "--request", req], model.read_bytes(),
                     monkeypatch)
    assert rc == 0 and out == ref
    rc, out, err = run(["show-computation", "-", "--request", "-"], b"", monkeypatch)
    assert rc == 1 and out == b"" and "cannot both be '-'" in err


@pytest.mark.parametrize("argv,stdin,fragments", [
    (["init", "-", "-"], b"\xff\xfe component", ["<stdin>, line 1: not UTF-8 text"]),
    (["init", "-", "-"], b"# nothing\n", ["<stdin>: empty config"]),
    (["info", "-"], b"", ["<stdin>: empty model file"]),
    (["info", "-"], b"<Nnet3> \n", ["<stdin>", "unexpected end of file"]),
    (["show-computation", "MODEL", "--request", "-"], b'{"output": []}',
     ["<stdin>: output: unknown key"]),
    (["show-computation", "MODEL", "--request", "-"], b'{"outputs": [',
     ["<stdin>, line 1: not valid JSON"]),
])
def test_bad_input_on_stdin_is_one_line(monkeypatch, model, argv, stdin, fragments):
    argv = [model if a == "MODEL" else a for a in argv]
    rc, out, err = run(argv, stdin, monkeypatch)
    assert rc == 1 and out == b""
    assert err.count("\n") == 1 and err.startswith(f"pynnet3 {argv[0]}: error: ")
    for f in fragments:
        assert f in err, (f, err)
