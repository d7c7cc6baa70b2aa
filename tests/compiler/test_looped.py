"""Looped compilation: iVector period, chunk requests, multi-segment compilation and
the looped optimization, against Kaldi's looped runs (kaldi-reference/looped) and
against running the same requests without the loop."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler.looped import (
    compile_looped,
    create_looped_requests,
    extrapolate_requests,
    get_chunk_size,
    modify_ivector_period,
)
from pynnet3.compiler.multi_segment import compile_segments, segment_bounds
from pynnet3.computation import CommandType as CT
from pynnet3.errors import ComputeError
from pynnet3.optimize import OptimizeOptions
from pynnet3.optimize.looped import find_time_shift, fix_goto_label, optimize_looped_computation
from pynnet3.runtime.computer import NnetComputer
from tests.compiler import nets as N
from tests.reference import REF, require_reference

RUNS = ["tdnn_lstm_fpc20", "tdnnf_chain_fpc20", "tdnnf_chain_fpc9_fsf3"]

# A recurrence through a dim-range node, with an utterance iVector.
LOOPED_RNN = """
input-node name=input dim=3
input-node name=ivector dim=2
component name=affine1 type=AffineComponent input-dim=8 output-dim=5
component-node name=affine1 component=affine1 input=Append(input, IfDefined(Offset(rec, -2)), ReplaceIndex(ivector, t, 0))
component name=tanh1 type=TanhComponent dim=5
component-node name=tanh1 component=tanh1 input=affine1
dim-range-node name=rec input-node=tanh1 dim-offset=0 dim=3
dim-range-node name=out input-node=tanh1 dim-offset=3 dim=2
component name=affine2 type=AffineComponent input-dim=4 output-dim=2
component-node name=affine2 component=affine2 input=Append(Offset(out, -1), Offset(out, 1))
output-node name=output input=affine2
"""  # noqa: E501

ALL_OFF = OptimizeOptions(**{
    f.name: (0 if f.name == "memory_compression_level" else False)
    for f in dataclasses.fields(OptimizeOptions) if isinstance(f.default, bool)
    or f.name == "memory_compression_level"})


def _ref_run(name: str):
    d = require_reference() / "looped" / name
    info = json.loads((d / "run_info.json").read_text())
    opts = json.loads((d / "options.json").read_text())
    nnet = pynnet3.read_nnet(d / info["model"])
    nnet.set_test_mode(True)
    return nnet, info, opts


def _summary(request) -> dict:
    out = {}
    for kind, specs in (("input", request.inputs), ("output", request.outputs)):
        for s in specs:
            t = s.indexes[:, 1]
            out[f"{kind}:{s.name}"] = {"num_indexes": len(t), "t_min": int(t.min()),
                                       "t_max": int(t.max())}
    return out


def _looped_setup(nnet, fpc: int, fsf: int):
    """(modified nnet, chunk size, 3 requests) as DecodableNnetSimpleLoopedInfo."""
    left, right = nnet.context()
    chunk = get_chunk_size(nnet, fsf, fpc)
    m = modify_ivector_period(nnet, chunk) if nnet.has_node("ivector") else nnet
    return m, chunk, create_looped_requests(m, chunk, fsf, chunk, left, right)


# -- Kaldi's looped runs ----------------------------------------------------------------
@pytest.mark.parametrize("run", RUNS)
def test_ivector_period_lines_match_kaldi(run):
    nnet, info, opts = _ref_run(run)
    chunk = get_chunk_size(nnet, opts["frame-subsampling-factor"], opts["frames-per-chunk"])
    assert chunk == info["frames_per_chunk_used"]
    before = [n.config_line() for n in nnet.nodes]
    m = modify_ivector_period(nnet, chunk)
    after = [n.config_line() for n in m.nodes]
    changed = [a for a, b in zip(after, before, strict=True) if a != b]
    assert changed == [info["ivector_descriptor_lines_after_ModifyNnetIvectorPeriod"]]
    assert [n.config_line() for n in nnet.nodes] == before  # the original is untouched
    assert m.modulus() == chunk


@pytest.mark.parametrize("run", RUNS)
def test_requests_match_kaldi(run):
    nnet, info, opts = _ref_run(run)
    assert nnet.context() == (info["left_context"], info["right_context"])
    _, _, reqs = _looped_setup(nnet, opts["frames-per-chunk"], opts["frame-subsampling-factor"])
    for k, r in enumerate(reqs):
        assert _summary(r) == info[f"request{k + 1}"]


@pytest.mark.parametrize("run", RUNS)
def test_loop_structure_matches_kaldi(run):
    """Kaldi's looped computation (computation.txt / command_histogram) loops from
    segment 2 to segment 3; the I/O and loop commands agree, and so does the number
    of matrices carried over the goto."""
    nnet, info, opts = _ref_run(run)
    m, _, reqs = _looped_setup(nnet, opts["frames-per-chunk"], opts["frame-subsampling-factor"])
    c = compile_looped(m, reqs, check=True)  # the checker runs after every pass
    hist = c.stats()["command_types"]
    kaldi = info["command_histogram"]
    for t in ("kAcceptInput", "kProvideOutput", "kNoOperationMarker", "kNoOperationPermanent",
              "kNoOperationLabel", "kGotoLabel", "kSwapMatrix"):
        assert hist.get(t, 0) == kaldi[t], t
    label = next(i for i, x in enumerate(c.commands) if x.type is CT.NO_OPERATION_LABEL)
    assert sum(x.type is CT.NO_OPERATION_MARKER for x in c.commands[:label]) == 2
    assert c.commands[-1].type is CT.GOTO_LABEL and c.commands[-1].label == label
    text = (REF / "looped" / run / "computation.txt").read_text()
    kaldi_label = next(line for line in text.splitlines() if "label for goto" in line)
    kaldi_markers = text.split(kaldi_label)[0].count("computation segment separator")
    assert kaldi_markers == 2


# -- requests ------------------------------------------------------------------------------
def test_chunk_size_rounds_up_to_modulus_and_subsampling():
    nnet = pynnet3.Nnet.from_config(N.ROUND, seed=0)  # modulus 3
    assert get_chunk_size(nnet, 1, 7) == 9
    assert get_chunk_size(nnet, 2, 7) == 12
    assert get_chunk_size(nnet, 3, 9) == 9
    with pytest.raises(ComputeError):
        get_chunk_size(nnet, 0, 7)


def test_requests_of_several_sequences_have_n_outer():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=0)
    m = modify_ivector_period(nnet, 4)
    r0, r1, r2 = create_looped_requests(m, 4, 2, 4, 1, 0, num_sequences=2)
    idx = r0.input("input").indexes
    assert idx[:, 0].tolist() == [0] * 5 + [1] * 5
    assert idx[:5, 1].tolist() == [-1, 0, 1, 2, 3]
    assert r0.input("ivector").indexes.tolist() == [[0, -4, 0], [0, 0, 0], [1, -4, 0],
                                                    [1, 0, 0]]
    assert r1.input("ivector").indexes[:, 1].tolist() == [4, 4]
    assert r2.output("output").indexes.tolist() == [[0, 8, 0], [0, 10, 0], [1, 8, 0],
                                                    [1, 10, 0]]
    with pytest.raises(ComputeError, match="multiple"):
        create_looped_requests(m, 5, 2, 4, 1, 0)


def test_modify_ivector_period_rewrites_only_replace_index_t0():
    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=0)
    m = modify_ivector_period(nnet, 6)
    line = m.node("affine1").config_line()
    assert "Round(ivector, 6)" in line and "ReplaceIndex" not in line
    assert "ReplaceIndex(ivector, t, 0)" in nnet.node("affine1").config_line()
    assert m.components["affine1"] is nnet.components["affine1"]
    same = modify_ivector_period(pynnet3.Nnet.from_config(N.TDNN, seed=0), 6)
    assert [n.config_line() for n in same.nodes] == [
        n.config_line() for n in pynnet3.Nnet.from_config(N.TDNN, seed=0).nodes]


def test_extrapolation_needs_shifted_requests():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=0)
    reqs = list(create_looped_requests(nnet, 4, 1, 4, 3, 3))
    more = extrapolate_requests(reqs, 6)
    assert len(more) == 6
    for a, b in zip(more[1:], more[2:], strict=False):
        np.testing.assert_array_equal(b.inputs[0].indexes[:, 1], a.inputs[0].indexes[:, 1] + 4)
    reqs[2] = reqs[0]
    with pytest.raises(ComputeError, match="time shift"):
        extrapolate_requests(reqs, 5)


# -- multi-segment compilation ---------------------------------------------------------------
def _whole(nnet, requests, inputs, dtype=np.float64):
    """Outputs of one ordinary computation that gets every segment's inputs at once."""
    merged_in = {}
    for r in requests:
        for s in r.inputs:
            merged_in.setdefault(s.name, []).append(s.indexes)
    outs = np.concatenate([r.outputs[0].indexes for r in requests])
    req = N.request({k: np.concatenate(v) for k, v in merged_in.items()}, {"output": outs})
    c = pynnet3.compile(nnet, req, optimize=False)
    x = {k: np.concatenate(v) for k, v in inputs.items()}
    return pynnet3.run(nnet, c, x, dtype=dtype).outputs["output"]


def _segment_inputs(nnet, requests, rng):
    per_seg = [{s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
                for s in r.inputs} for r in requests]
    merged = {}
    for d in per_seg:
        for k, v in d.items():
            merged.setdefault(k, []).append(v)
    return per_seg, merged


def _step_through(nnet, c, per_seg, dtype=np.float64):
    comp = NnetComputer(nnet, c, dtype=dtype)
    outs = []
    for inputs in per_seg:
        for name, value in inputs.items():
            comp.accept_input(name, value)
        comp.run_until_io()
        outs.append(comp.get_output("output"))
    return np.concatenate(outs)


@pytest.mark.parametrize("config", [N.TDNN, N.IVECTOR, N.FAILOVER, LOOPED_RNN],
                         ids=["tdnn", "ivector", "failover", "rnn"])
def test_segments_compute_each_cindex_once_and_match_one_computation(config):
    nnet = pynnet3.Nnet.from_config(config, seed=2)
    N.to_float64(nnet)
    m, _, reqs = _looped_setup(nnet, 4, 1)
    requests = extrapolate_requests(reqs, 5)
    c = compile_segments(m, requests)
    pynnet3.check(c, m)
    segs = segment_bounds(c)
    assert len(segs) == 6  # 5 segments, then the (empty) backward part: deallocations
    assert {x.type for x in c.commands[segs[5][0]:]} == {CT.DEALLOC_MATRIX}
    for k, (lo, hi) in enumerate(segs[:5]):
        types = [x.type for x in c.commands[lo:hi]]
        n_in = len(requests[k].inputs)
        assert types[:n_in] == [CT.ACCEPT_INPUT] * n_in
        assert types[n_in] is CT.NO_OPERATION_PERMANENT
        assert types.count(CT.NO_OPERATION_PERMANENT) == 1
        assert CT.PROVIDE_OUTPUT in types
    # A component node's value rows are computed in one segment only.
    comp_nodes = {n.name for n in m.nodes if n.kind == "component-node"}
    seen: dict[str, list] = {}
    for info in c.matrices[1:]:
        if info.node in comp_nodes:
            seen.setdefault(info.node, []).extend(map(tuple, info.indexes.tolist()))
    for node, rows in seen.items():
        assert len(rows) == len(set(rows)), node
    rng = np.random.default_rng(0)
    per_seg, merged = _segment_inputs(m, requests, rng)
    got = _step_through(m, c, per_seg)
    np.testing.assert_allclose(got, _whole(m, requests, merged), rtol=1e-12, atol=1e-12)


def test_segment_errors():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=0)
    reqs = list(create_looped_requests(nnet, 4, 1, 4, 3, 3))
    with pytest.raises(ComputeError, match="segment 1.*already supplied"):
        compile_segments(nnet, [reqs[0], reqs[0]])
    with pytest.raises(ComputeError, match="segment 1: output"):
        compile_segments(nnet, [reqs[0], reqs[2]])  # chunk 1's frames are missing
    with pytest.raises(ComputeError, match="derivatives"):
        compile_segments(nnet, [N.request({"input": N.frames(-3, 7)},
                                          {"output": N.frames(0, 4)}, output_deriv=True)])
    with pytest.raises(ComputeError):
        compile_segments(nnet, [])


# -- the looped optimization ---------------------------------------------------------------------
@pytest.mark.parametrize("config", [N.TDNN, N.IVECTOR, N.FAILOVER, LOOPED_RNN],
                         ids=["tdnn", "ivector", "failover", "rnn"])
@pytest.mark.parametrize("options", [None, ALL_OFF], ids=["optimized", "unoptimized"])
def test_looped_computation_runs_like_the_segments(config, options):
    """Chunk by chunk, the loop gives what the unlooped segments give (and goes on
    past the segments that were compiled)."""
    nnet = pynnet3.Nnet.from_config(config, seed=3)
    N.to_float64(nnet)
    m, _, reqs = _looped_setup(nnet, 4, 1)
    c = compile_looped(m, reqs, options, check=True)
    assert c.commands[-1].type is CT.GOTO_LABEL
    assert sum(x.type is CT.NO_OPERATION_LABEL for x in c.commands) == 1
    swaps = [x for x in c.commands if x.type is CT.SWAP_MATRIX]
    for s in swaps:
        a, b = c.matrices[s.matrix], c.matrices[s.src_matrix]
        assert (a.rows, a.cols, a.node) == (b.rows, b.cols, b.node)
        assert b.indexes[0, 1] > a.indexes[0, 1]
    requests = extrapolate_requests(reqs, 9)
    per_seg, merged = _segment_inputs(m, requests, np.random.default_rng(1))
    got = _step_through(m, c, per_seg)
    np.testing.assert_allclose(got, _whole(m, requests, merged), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", [N.TDNN, LOOPED_RNN], ids=["tdnn", "rnn"])
def test_looped_computation_of_two_sequences(config):
    nnet = pynnet3.Nnet.from_config(config, seed=4)
    N.to_float64(nnet)
    m = modify_ivector_period(nnet, 4) if nnet.has_node("ivector") else nnet
    reqs = create_looped_requests(m, 4, 1, 4, *nnet.context(), num_sequences=2)
    c = compile_looped(m, reqs)
    requests = extrapolate_requests(reqs, 8)
    per_seg, merged = _segment_inputs(m, requests, np.random.default_rng(2))
    got = _step_through(m, c, per_seg)
    np.testing.assert_allclose(got, _whole(m, requests, merged), rtol=1e-12, atol=1e-12)


def test_time_shift_and_idempotence():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=0)
    reqs = create_looped_requests(nnet, 6, 2, 6, 3, 3)
    c = compile_segments(nnet, extrapolate_requests(reqs, 5))
    assert find_time_shift(c) == 6
    assert optimize_looped_computation(c, nnet, None).startswith("loop from segment")
    n = len(c.commands)
    assert optimize_looped_computation(c, nnet, None) == ""  # already looped
    assert len(c.commands) == n
    # A goto whose label index went stale is pointed at the label again.
    c.commands.insert(0, c.commands[0].__class__(CT.NO_OPERATION))
    assert fix_goto_label(c) != ""
    assert c.commands[c.commands[-1].label].type is CT.NO_OPERATION_LABEL


def test_too_few_segments_are_left_alone():
    nnet = pynnet3.Nnet.from_config(N.TDNN, seed=0)
    reqs = create_looped_requests(nnet, 4, 1, 4, 3, 3)
    c = compile_segments(nnet, list(reqs[:2]))
    before = [x.type for x in c.commands]
    assert optimize_looped_computation(c, nnet, None) == ""
    assert [x.type for x in c.commands] == before
