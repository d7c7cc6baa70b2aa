"""The network optimizer against Kaldi's CollapseModel (all four options) on every
case of the reference data's ``collapsed/`` folder (README, "Model collapsing"; the
model, request and inputs are the ones each case's ``stats.json`` names): no more
components than Kaldi's collapsed model, its decode outputs, the optimized model
written and read back, and a decode computation no bigger than the unoptimized
network's."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from tests.graphopt.common import rel
from tests.reference import REF, ref_params

TOL = 1e-4  # Kaldi's collapsed model in float32 against ours: rounding of the folds


def _cases() -> list[str]:
    """Every folder of ``collapsed/`` with a stats.json (not a fixed list of names:
    a case added to the reference data is tested as it is)."""
    root = REF / "collapsed"
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob("*/stats.json"))


def _stats(name: str) -> dict:
    return json.loads((REF / "collapsed" / name / "stats.json").read_text())


def _named_file(name: str, key: str):
    """A file a case's stats.json names, relative to the case folder."""
    return (REF / "collapsed" / name / _stats(name)[key]).resolve()


# Acceptance criteria the current optimizer misses (strict: they fail loudly once fixed).
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def params(test: str) -> list:
    return ref_params([pytest.param(n, marks=pytest.mark.xfail(
        strict=True, reason=KNOWN_BUGS[(test, n)])) if (test, n) in KNOWN_BUGS else n
        for n in _cases()], "collapsed reference cases")


_memo: dict = {}


def prepared(name: str):
    """(network in test mode, optimized network, report, request, inputs), once."""
    if name not in _memo:
        nnet = pynnet3.read_nnet(_named_file(name, "model"))
        nnet.set_test_mode(True)
        report = pynnet3.NetworkReport()
        opt = pynnet3.optimize_network(nnet, report=report)
        request = pynnet3.ComputationRequest.from_json(
            json.loads(_named_file(name, "decode_request").read_text()))
        with np.load(_named_file(name, "decode_inputs")) as z:
            inputs = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("input:")}
        _memo[name] = (nnet, opt, report, request, inputs)
    return _memo[name]


@pytest.mark.parametrize("name", params("components"))
def test_no_more_components_than_kaldi(name):
    before, after = _stats(name)["all_options"]["num_components"]
    nnet, opt, report, _, _ = prepared(name)
    assert len(nnet.components) == before  # the same network Kaldi started from
    assert len(opt.components) <= after, (len(opt.components), after,
                                          report.rules_applied())


@pytest.mark.parametrize("name", ref_params(_cases(), "collapsed reference cases"))
def test_context_unchanged(name):
    """Rewrites keep what each output frame needs: the same left/right context."""
    nnet, opt, _, _, _ = prepared(name)
    assert (opt.left_context, opt.right_context) == (nnet.left_context, nnet.right_context)


@pytest.mark.parametrize("name", params("outputs"))
def test_outputs_match_kaldi_collapsed(name):
    _, opt, _, request, inputs = prepared(name)
    comp = pynnet3.compile(opt, request, optimize=True, check=True)
    got = pynnet3.run(opt, comp, inputs)
    with np.load(REF / "collapsed" / name / "arrays.npz") as z:
        want = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("output:")}
    assert want and set(got.outputs) == set(want)
    for out, value in want.items():
        err = rel(got.outputs[out], value)
        assert err <= TOL, f"{name} {out}: relative error {err:.3g}"


@pytest.mark.parametrize("name", params("decode"))
def test_decode_computation_no_bigger(name):
    nnet, opt, _, request, _ = prepared(name)
    base = pynnet3.compile(nnet, request, optimize=True, check=True).stats()
    ours = pynnet3.compile(opt, request, optimize=True, check=True).stats()
    assert ours["num_commands"] <= base["num_commands"], (ours, base)
    assert ours["peak_memory_floats"] <= base["peak_memory_floats"], (ours, base)


@pytest.mark.parametrize("name", params("reads_back"))
def test_optimized_model_reads_back(name, tmp_path):
    """The optimized network (folded BatchNorms, pruned NoOps and dropout) written as
    a Kaldi text model and read back gives Kaldi's collapsed outputs."""
    _, opt, _, request, inputs = prepared(name)
    path = tmp_path / "final.txt"
    opt.write(path)
    back = pynnet3.read_nnet(path)
    got = pynnet3.run(back, pynnet3.compile(back, request), inputs)
    with np.load(REF / "collapsed" / name / "arrays.npz") as z:
        for key in z.files:
            assert rel(got.outputs[key.split(":", 1)[1]], z[key]) <= TOL

