"""``pynnet3 am-info`` and ``pynnet3 am-copy`` (Kaldi's nnet3-am-info and nnet3-am-copy);
``info``, ``copy``, ``optimize-network`` and ``show-computation`` take a final.mdl
where they take a raw network."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3.am import AcousticModel, read_am
from pynnet3.io.am_file import HmmState, HmmTopology, TransitionModel
from pynnet3.nnet import nnet_from_bytes, read_nnet

from ..components.common import KALDI_TEXT_MOVES, same_but_batchnorm_stats
from ..reference import REF, ref_params
from .test_cli_stdio import CONFIG, REQUEST, run


@pytest.fixture
def am_path(tmp_path):
    entry = [HmmState(0, 0, [(0, 0.5), (1, 0.5)]), HmmState()]
    topo = HmmTopology([entry], np.array([-1, 0, 0]))
    tm = TransitionModel.build(topo, lambda phone, c: phone - 1)
    am = AcousticModel(tm, pynnet3.Nnet.from_config(CONFIG, seed=3), np.array([0.25, 0.75]))
    path = tmp_path / "final.mdl"
    am.write(path, binary=True)
    return path


def test_am_info(monkeypatch, am_path):
    rc, out, err = run(["am-info", am_path], b"", monkeypatch)
    assert rc == 0 and err == ""
    text = out.decode()
    for line in ("num-phones: 2", "num-pdfs: 2", "num-transition-states: 2",
                 "num-transition-ids: 4", "input-dim: 3", "ivector-dim: -1",
                 "prior-dimension: 2", "prior-sum: 1", "left-context: 1", "right-context: 0",
                 "input-node name=input dim=3"):
        assert line + "\n" in text, line
    rc, out2, _ = run(["am-info", "-"], am_path.read_bytes(), monkeypatch)  # stdin
    assert rc == 0 and out2 == out


def test_am_copy_text_binary_and_raw(monkeypatch, am_path, tmp_path):
    data = am_path.read_bytes()
    rc, text, err = run(["am-copy", "--binary=false", am_path, "-"], b"", monkeypatch)
    assert rc == 0 and err == "" and text.startswith(b"<TransitionModel> \n<Topology> \n")
    rc, _, _ = run(["am-copy", "-", tmp_path / "back.mdl"], text, monkeypatch)
    assert rc == 0
    assert read_am(tmp_path / "back.mdl").to_bytes(False) == text
    rc, raw, _ = run(["am-copy", "--raw=true", am_path, "-"], b"", monkeypatch)
    assert rc == 0 and raw.startswith(b"\0B<Nnet3> ")
    assert raw == read_nnet(am_path).to_bytes(True)
    rc, raw_text, _ = run(["am-copy", "--raw=true", "--binary=false", "-", "-"], data,
                          monkeypatch)
    assert rc == 0 and raw_text == nnet_from_bytes(raw).to_bytes(False)


def test_network_commands_take_a_final_mdl(monkeypatch, am_path, tmp_path):
    raw = tmp_path / "raw.mdl"
    read_nnet(am_path).write(raw, binary=True)
    rc, info_am, _ = run(["info", am_path], b"", monkeypatch)
    rc2, info_raw, _ = run(["info", raw], b"", monkeypatch)
    assert rc == rc2 == 0 and info_am == info_raw
    rc, out, _ = run(["copy", am_path, "-"], b"", monkeypatch)
    assert rc == 0 and out == raw.read_bytes()
    rc, _, err = run(["optimize-network", am_path, tmp_path / "opt.mdl"], b"", monkeypatch)
    assert rc == 0 and err == "" and read_nnet(tmp_path / "opt.mdl").output_names() == ["output"]
    req = tmp_path / "req.json"
    req.write_text(json.dumps(REQUEST))
    rc, out, _ = run(["show-computation", am_path, "--request", req], b"", monkeypatch)
    assert rc == 0 and b"# stats:" in out


def test_bad_acoustic_model_is_one_line_error(monkeypatch, am_path):
    data = am_path.read_bytes()
    rc, out, err = run(["am-info", "-"], data[:60], monkeypatch)
    assert rc == 1 and out == b"" and err.count("\n") == 1
    assert err.startswith("pynnet3 am-info: error: <stdin>, byte ")
    rc, _, err = run(["am-copy", "-", "-"], b"", monkeypatch)
    assert rc == 1 and "empty model file" in err
    raw = read_nnet(am_path).to_bytes(False)
    rc, _, err = run(["am-info", "-"], raw, monkeypatch)  # a raw nnet is not an am
    assert rc == 1 and "<TransitionModel>" in err


@pytest.mark.parametrize("name", ref_params(["tdnnf_chain", "tdnn_relu_bn"], "am cases"))
def test_am_copy_reference_files(monkeypatch, name, tmp_path):
    folder = REF / "am" / name
    rc, out, _ = run(["am-copy", "--binary=false", folder / "final.mdl.txt", "-"], b"",
                     monkeypatch)
    # (as nnet3-am-copy: byte-exact but for the BatchNorm statistics it moves)
    assert rc == 0
    moved = same_but_batchnorm_stats((folder / "final.mdl.txt").read_bytes(), out)
    assert moved == KALDI_TEXT_MOVES[f"realistic/{name}/model.txt"]
    rc, _, _ = run(["am-copy", folder / "final.mdl", tmp_path / "out.mdl"], b"", monkeypatch)
    assert rc == 0
    same_but_batchnorm_stats((folder / "final.mdl").read_bytes(),
                             (tmp_path / "out.mdl").read_bytes())
    rc, out, _ = run(["am-info", folder / "final.mdl"], b"", monkeypatch)
    meta = json.loads((folder / "info.json").read_text())
    assert f"num-transition-ids: {meta['num_transition_ids']}\n" in out.decode()
