"""ComputationRequest / IoSpecification: construction, JSON, validation."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pynnet3
from pynnet3 import ComputationRequest, IoSpecification
from pynnet3.errors import ComputeError
from tests.compiler import nets as N
from tests.reference import require_reference


def test_indexes_normalized_to_int64_k3():
    spec = IoSpecification("input", [[0, 1, 0], [0, 2, 0]])
    assert spec.indexes.dtype == np.int64 and spec.indexes.shape == (2, 3)
    assert IoSpecification("input", []).indexes.shape == (0, 3)
    assert spec.has_deriv is False


@pytest.mark.parametrize("bad", [[[1, 2]], [1, 2, 3], [[[0, 0, 0]]], [["a", "b", "c"]]])
def test_bad_indexes_are_compute_errors(bad):
    with pytest.raises(ComputeError, match="input"):
        IoSpecification("input", bad)


def test_json_round_trip():
    req = ComputationRequest(
        [IoSpecification("input", N.frames(-2, 5, n=2), True),
         IoSpecification("ivector", [[0, 0, 0], [1, 0, 0]])],
        [IoSpecification("output", N.frames(0, 3, n=2, x=1), True)],
        need_model_derivative=True, store_component_stats=True)
    obj = json.loads(json.dumps(req.to_json()))
    back = ComputationRequest.from_json(obj)
    assert back.to_json() == req.to_json()
    assert [s.name for s in back.inputs] == ["input", "ivector"]
    np.testing.assert_array_equal(back.output("output").indexes, N.frames(0, 3, n=2, x=1))
    assert back.input("ivector").has_deriv is False
    assert back.input("nope") is None and back.output("input") is None
    assert back.need_model_derivative and back.store_component_stats


def test_from_json_defaults():
    req = ComputationRequest.from_json({"inputs": [{"name": "input", "indexes": [[0, 0, 0]]}],
                                        "outputs": [{"name": "output",
                                                     "indexes": [[0, 0, 0]]}]})
    assert not req.need_model_derivative and not req.store_component_stats
    assert not req.inputs[0].has_deriv and not req.need_derivatives()


@pytest.mark.parametrize("obj", [
    {"inputs": [{"indexes": [[0, 0, 0]]}]},  # no name
    {"inputs": [{"name": "input", "indexes": [[0, 0]]}]},
    {"outputs": [{"name": "output", "indexes": "abc"}]},
])
def test_from_json_errors(obj):
    with pytest.raises(ComputeError):
        ComputationRequest.from_json(obj)


@pytest.mark.parametrize("i,o,m,want", [
    (False, False, False, False), (True, False, False, True),
    (False, True, False, True), (False, False, True, True)])
def test_need_derivatives(i, o, m, want):
    req = N.request({"input": N.frames(0, 2)}, {"output": N.frames(0, 1)}, i, o, m)
    assert req.need_derivatives() is want


def test_str_lists_everything():
    req = N.request({"input": N.frames(-2, 40)}, {"output": N.frames(0, 3)}, True, True, True)
    text = str(req)
    assert "input-0: name=input, has-deriv=true" in text
    assert "output-0: name=output" in text
    assert "need-model-derivative: true" in text
    assert "store-component-stats: false" in text


def test_reference_requests_load():
    reqs = sorted(require_reference().rglob("request.json"))[:20]
    assert len(reqs) == 20
    for path in reqs:
        obj = json.loads(path.read_text())
        req = ComputationRequest.from_json(obj)
        assert req.to_json()["inputs"][0]["indexes"] == obj["inputs"][0]["indexes"]


# -- requests the compiler rejects ----------------------------------------------------------

@pytest.fixture(scope="module")
def tdnn():
    return pynnet3.Nnet.from_config(N.TDNN, seed=1)


def test_duplicate_input_index_rejected(tdnn):
    inp = np.concatenate([N.frames(-3, 9), [[0, 2, 0]]])
    with pytest.raises(ComputeError, match=r"input 'input'.*t=2.*more than once"):
        pynnet3.compile(tdnn, N.request({"input": inp}, {"output": N.frames(0, 6)}),
                        optimize=False)


def test_duplicate_output_index_rejected(tdnn):
    out = np.concatenate([N.frames(0, 6), [[0, 5, 0]]])
    with pytest.raises(ComputeError, match=r"output 'output'.*t=5.*more than once"):
        pynnet3.compile(tdnn, N.request({"input": N.frames(-3, 9)}, {"output": out}),
                        optimize=False)


def test_same_input_twice_rejected(tdnn):
    req = ComputationRequest([IoSpecification("input", N.frames(-3, 3)),
                              IoSpecification("input", N.frames(3, 9))],
                             [IoSpecification("output", N.frames(0, 6))])
    with pytest.raises(ComputeError, match="'input'.*more than once"):
        pynnet3.compile(tdnn, req, optimize=False)


def test_empty_output_rejected(tdnn):
    with pytest.raises(ComputeError, match="'output'.*no indexes"):
        pynnet3.compile(tdnn, N.request({"input": N.frames(-3, 9)}, {"output": []}),
                        optimize=False)


def test_request_is_not_modified_by_compile(tdnn):
    rng = np.random.default_rng(1)
    inp = N.frames(-3, 9, n=2)
    inp = inp[rng.permutation(len(inp))]
    req = N.request({"input": inp}, {"output": N.frames(0, 6, n=2)[::-1]}, True, True, True)
    before = json.dumps(req.to_json())
    pynnet3.compile(tdnn, req, optimize=False)
    assert json.dumps(req.to_json()) == before
