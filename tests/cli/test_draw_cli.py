"""pynnet3 draw: DOT to a file and to stdout, the side-by-side drawing, rendered
formats with Graphviz (skipped without it) and a clear error without it."""

from __future__ import annotations

import shutil

import pytest

import pynnet3
from pynnet3.cli.main import main

CONFIG = """\
input-node name=input dim=6
component name=a.1 type=AffineComponent input-dim=18 output-dim=8
component-node name=a.1 component=a.1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=bn-1 type=BatchNormComponent dim=8
component-node name=bn-1 component=bn-1 input=a.1
component name=a2 type=AffineComponent input-dim=8 output-dim=5
component-node name=a2 component=a2 input=bn-1
output-node name=output input=a2
"""


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "in.txt"
    pynnet3.Nnet.from_config(CONFIG, seed=3).write(path, binary=False)
    return path


def test_dot_file(model, tmp_path, capsys):
    out = tmp_path / "g.dot"
    assert main(["draw", str(model), str(out)]) == 0
    text = out.read_text()
    assert text.startswith("digraph ")
    for name in ("input", "a.1", "bn-1", "a2", "output"):
        assert f'"{name}" [label=' in text
    assert '"input" -> "a.1" [label="part 0 t-1"]' in text


def test_dot_to_stdout(model, capsys):
    assert main(["draw", str(model), "-"]) == 0
    assert capsys.readouterr().out.startswith("digraph ")


def test_optimized_side_by_side(model, tmp_path):
    out = tmp_path / "g.dot"
    assert main(["draw", str(model), str(out), "--optimized=true",
                 "--set-test-mode=true"]) == 0
    text = out.read_text()
    assert "cluster_original" in text and "cluster_optimized" in text
    assert "(removed)" in text  # the BatchNorm, folded into a.1


def test_unknown_format(model, tmp_path, capsys):
    assert main(["draw", str(model), str(tmp_path / "g.jpeg")]) == 1
    err = capsys.readouterr().err
    assert "pynnet3 draw: error:" in err and ".dot, .svg, .png or .pdf" in err


def test_without_graphviz(model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "g.svg"
    assert main(["draw", str(model), str(out)]) == 1
    assert "install Graphviz" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("suffix,head", [(".svg", b"<svg"), (".png", b"\x89PNG"),
                                         (".pdf", b"%PDF")])
def test_rendered(model, tmp_path, suffix, head):
    out = tmp_path / ("g" + suffix)
    assert main(["draw", str(model), str(out), "--optimized=true"]) == 0
    assert out.read_bytes()[:4096].find(head) >= 0


# -- show-computation --memory-plot ----------------------------------------------------

def _request(tmp_path):
    import json

    idx = [[0, t, 0] for t in range(-1, 6)]
    req = {"inputs": [{"name": "input", "indexes": idx, "has_deriv": True}],
           "outputs": [{"name": "output", "indexes": [[0, t, 0] for t in range(5)],
                        "has_deriv": True}],
           "need_model_derivative": True}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"optimized": {"peak_memory_floats": 100},
                                 "unoptimized": {"peak_memory_floats": 300}}))
    return path, stats


@pytest.mark.parametrize("optimize", ["true", "false"])
@pytest.mark.parametrize("suffix,head", [(".png", b"\x89PNG"), (".svg", b"<svg")])
def test_memory_plot(model, tmp_path, capsys, optimize, suffix, head):
    pytest.importorskip("matplotlib")
    req, stats = _request(tmp_path)
    out = tmp_path / ("memory" + suffix)
    assert main(["show-computation", str(model), "--request", str(req),
                 f"--optimize={optimize}", "--memory-plot", str(out),
                 "--kaldi-stats", str(stats)]) == 0
    assert out.read_bytes()[:4096].find(head) >= 0
    assert "# stats:" in capsys.readouterr().out


def test_memory_plot_errors(model, tmp_path, capsys, monkeypatch):
    import sys

    req, _ = _request(tmp_path)
    assert main(["show-computation", str(model), "--request", str(req),
                 "--memory-plot", str(tmp_path / "m.jpeg")]) == 1
    assert "must end in .png, .svg or .pdf" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["show-computation", str(model), "--request", str(req),
                 "--memory-plot", str(tmp_path / "m.png")]) == 1
    assert "pip install 'pynnet3[viz]'" in capsys.readouterr().err
    assert not (tmp_path / "m.png").exists()


@pytest.mark.parametrize("network_optimize", ["true", "false"])
def test_report_plot(model, tmp_path, capsys, network_optimize):
    pytest.importorskip("matplotlib")
    req, _ = _request(tmp_path)
    out = tmp_path / "report.svg"
    assert main(["show-computation", str(model), "--request", str(req),
                 f"--network-optimize={network_optimize}", "--report-plot", str(out)]) == 0
    assert out.read_bytes()[:4096].find(b"<svg") >= 0
    text = capsys.readouterr().out
    assert "# optimization report" not in text  # (only with --report)
    assert ("network optimizer report" in text) == (network_optimize == "true")
