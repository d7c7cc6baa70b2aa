"""ComputationRequest.from_frames / request_for_frames: requests built from frame
ranges, checked row by row against requests written out as JSON by hand, compiled and
run, and their bad arguments rejected with ComputeError."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler.request import ComputationRequest, request_for_frames
from pynnet3.errors import ComputeError

_CONFIG = """\
input-node name=input dim=3
input-node name=ivector dim=2
component name=affine type=AffineComponent input-dim=8 output-dim=4
component-node name=affine component=affine input=Append(Offset(input, -1), input, ReplaceIndex(ivector, t, 0))
output-node name=output input=affine
"""  # noqa: E501


def test_one_sequence_equals_the_json_request():
    req = ComputationRequest.from_frames(range(-1, 4), range(0, 4, 2), ivector=True)
    want = ComputationRequest.from_json({
        "inputs": [{"name": "input", "indexes": [[0, t, 0] for t in range(-1, 4)]},
                   {"name": "ivector", "indexes": [[0, 0, 0]]}],
        "outputs": [{"name": "output", "indexes": [[0, 0, 0], [0, 2, 0]]}]})
    assert req.to_json() == want.to_json()


def test_several_sequences_go_one_after_another():
    req = request_for_frames([5, 6, 7], [6], num_sequences=3, output_deriv=True,
                             need_model_derivative=True)
    assert req.input("input").indexes.tolist() == [[n, t, 0] for n in range(3)
                                                   for t in (5, 6, 7)]
    assert req.output("output").indexes.tolist() == [[0, 6, 0], [1, 6, 0], [2, 6, 0]]
    assert req.output("output").has_deriv and req.need_model_derivative
    assert req.input("ivector") is None and not req.input("input").has_deriv


def test_names_and_input_derivative():
    req = request_for_frames(range(2), range(1), input_name="mfcc", output_name="out2",
                             ivector=True, ivector_name="spk", input_deriv=True)
    assert [i.name for i in req.inputs] == ["mfcc", "spk"] and req.inputs[0].has_deriv
    assert req.outputs[0].name == "out2"


def test_a_batched_request_runs_each_sequence_as_alone():
    nnet = pynnet3.Nnet.from_config(_CONFIG, seed=2)
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((3, 6, 3)).astype(np.float32)  # 3 sequences, t = -1 .. 4
    ivec = rng.standard_normal((3, 2)).astype(np.float32)
    req = ComputationRequest.from_frames(range(-1, 5), range(5), 3, ivector=True)
    cc = pynnet3.CachingCompiler(nnet)
    out = pynnet3.run(nnet, cc.compile(req), {"input": feats.reshape(18, 3),
                                              "ivector": ivec}).outputs["output"]
    assert cc.info()["shortcut"] == 1
    # independent math: affine of [x(t-1), x(t), ivector]
    w = nnet.components["affine"].params()
    lin, bias = np.asarray(w["linear_params"], np.float64), np.asarray(w["bias_params"])
    for n in range(3):
        x = np.concatenate([feats[n, :-1], feats[n, 1:], np.repeat(ivec[n:n + 1], 5, 0)], 1)
        np.testing.assert_allclose(out[5 * n:5 * n + 5], x @ lin.T + bias, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"input_frames": range(3), "output_frames": range(0)}, "no output frames"),
    ({"input_frames": [1, 1], "output_frames": [0]}, "input_frames lists a time twice"),
    ({"input_frames": [3, 1, 2, 1], "output_frames": [0]}, "input_frames lists a time twice"),
    ({"input_frames": [0], "output_frames": [4, 2, 4]}, "output_frames lists a time twice"),
    ({"input_frames": [0.5], "output_frames": [0]}, "input_frames must be a range"),
    ({"input_frames": [[0]], "output_frames": [0]}, "input_frames must be a range"),
    ({"input_frames": [0], "output_frames": [0], "num_sequences": 0}, "must be >= 1"),
    ({"input_frames": [0], "output_frames": [0], "num_sequences": 1.0}, "must be an int"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ComputeError, match=message):
        request_for_frames(**kwargs)


def test_strict_json_still_rejects_output_for_outputs():
    # (item 8 of issue 16: "output" instead of "outputs" once compiled an empty program)
    with pytest.raises(ComputeError, match="output: unknown key"):
        ComputationRequest.from_json({"inputs": [], "output": [
            {"name": "output", "indexes": [[0, 0, 0]]}]})


def test_the_docs_example_runs():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "request-json.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", doc[doc.index("## From frame ranges"):],
                      re.M | re.S)[0]
    ns = {"pynnet3": pynnet3}
    exec(compile(code, "docs/request-json.md", "exec"), ns)
    req = ns["req"]
    assert len(req.input("input").indexes) == 8 * 76 and len(req.input("ivector").indexes) == 8
    assert req.output("output").indexes[:3, 1].tolist() == [0, 3, 6]


@pytest.mark.parametrize("times", [[5, 1, 3], [2, 1, 0], [0, 7, -3, 2], range(9, -3, -3)])
def test_distinct_times_in_any_order(times):
    req = request_for_frames(times, [0])
    np.testing.assert_array_equal(req.inputs[0].indexes[:, 1], list(times))


def test_chunk_requests_are_made_once_per_shape():
    from pynnet3.runtime.simple import chunk_request

    a = chunk_request(-13, 80, 17, 3, True, 4)
    assert chunk_request(-13, 80, 17, 3, True, 4) is a
    assert chunk_request(-13, 80, 17, 3, False, 4) is not a
    want = request_for_frames(range(-13, 67), range(0, 51, 3), 4, ivector=True)
    assert a.to_json() == want.to_json()


def test_interleaved_rows_go_time_by_time():
    req = request_for_frames(range(-1, 2), range(0, 2), 2, ivector=True, interleaved=True)
    inp = req.inputs[0].indexes
    np.testing.assert_array_equal(inp[:, 1], [-1, -1, 0, 0, 1, 1])
    np.testing.assert_array_equal(inp[:, 0], [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(req.outputs[0].indexes[:, :2], [[0, 0], [1, 0], [0, 1], [1, 1]])
    np.testing.assert_array_equal(req.inputs[1].indexes[:, :2], [[0, 0], [1, 0]])


@pytest.mark.parametrize("n", [2, 5])
def test_interleaved_request_computes_the_same_outputs(n):
    """The same sequences, their rows in the other order: the same numbers."""
    nnet = pynnet3.Nnet.from_config(_CONFIG, seed=3)
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((n, 6, 3)).astype(np.float32)
    ivec = rng.standard_normal((n, 2)).astype(np.float32)
    outs = {}
    for inter in (False, True):
        req = request_for_frames(range(-1, 5), range(0, 5), n, ivector=True,
                                 interleaved=inter)
        x = np.stack(list(feats), axis=1) if inter else feats
        res = pynnet3.run(nnet, req, {"input": x.reshape(-1, 3), "ivector": ivec})
        y = res.outputs["output"]
        outs[inter] = (y.reshape(5, n, 4).transpose(1, 0, 2) if inter
                       else y.reshape(n, 5, 4))
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-6, atol=1e-6)
