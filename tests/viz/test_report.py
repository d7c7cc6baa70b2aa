"""The optimizers' reports as a chart: the plotted numbers are the reports' (and end
at the optimized computation's / network's own counts); PNG/SVG when matplotlib is
installed, a clear error when it is not."""

from __future__ import annotations

import sys
from importlib import resources

import pytest

import pynnet3
from pynnet3.cli.demo import demo_requests
from pynnet3.errors import DependencyError
from pynnet3.viz import network_series, plot_report, report_series


@pytest.fixture(scope="module")
def reports():
    cfg = resources.files("pynnet3").joinpath("examples/tdnnf.config").read_text()
    nnet = pynnet3.Nnet.from_config(cfg, seed=0)
    nnet.set_test_mode(True)
    net_report = pynnet3.NetworkReport()
    opt = pynnet3.optimize_network(nnet, report=net_report)
    _, _, req = demo_requests(opt, train_seqs=2, train_frames=10)[1]
    report = pynnet3.OptimizeReport()
    comp = pynnet3.compile(opt, req, report=report)
    unopt = pynnet3.compile(opt, req, optimize=False)
    return nnet, opt, net_report, unopt, comp, report


def test_report_series(reports):
    _, _, _, unopt, comp, report = reports
    s = report_series(report)
    assert len(s["pass"]) == len(report.passes) + 1
    assert len(s["commands"]) == len(s["matrices"]) == len(s["peak_floats"]) == len(s["pass"])
    for key, stat in (("commands", "num_commands"), ("peak_floats", "peak_memory_floats")):
        assert s[key][0] == unopt.stats()[stat]
        assert s[key][-1] == comp.stats()[stat]
    assert s["matrices"][-1] == comp.stats()["num_matrices"]


def test_network_series(reports):
    nnet, opt, net_report, *_ = reports
    s = network_series(net_report)
    assert s["pass"][0] == "(before)" and len(s["pass"]) == len(net_report.passes) + 1
    assert s["parameters"][0] == nnet.num_params()
    assert s["parameters"][-1] == opt.num_params()
    assert s["nodes"][0] == len(nnet.nodes) and s["nodes"][-1] == len(opt.nodes)


def test_plot_without_matplotlib(reports, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(DependencyError, match="matplotlib"):
        plot_report(tmp_path / "r.png", reports[-1])


def test_plot_arguments(reports, tmp_path):
    with pytest.raises(ValueError, match="no report"):
        plot_report(tmp_path / "r.png")
    with pytest.raises(ValueError, match=".png"):
        plot_report(tmp_path / "r.gif", reports[-1])


@pytest.mark.parametrize("suffix,head", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<svg")])
def test_plot(reports, tmp_path, suffix, head):
    pytest.importorskip("matplotlib")
    _, _, net_report, _, _, report = reports
    for args in ((report, net_report), (report, None), (None, net_report)):
        out = tmp_path / ("r" + suffix)
        plot_report(out, *args, title="bundled TDNN-F")
        assert out.read_bytes()[:4096].find(head) >= 0
