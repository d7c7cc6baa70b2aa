"""The optimizer's analysis session (analysis/session.py): what it hands out equals
a fresh analysis, and the pass contract (a built-in pass that reports no change
left the computation as it was) holds on real pipelines."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

import pynnet3
import pynnet3.analysis.accesses as accesses
from pynnet3.analysis.session import AnalysisSession, analysis_session, read_submatrices
from pynnet3.analysis.variables import submatrix_array
from pynnet3.compiler import compile_computation
from pynnet3.computation import SubMatrix
from pynnet3.optimize import PIPELINE, OptimizeOptions, optimize
from pynnet3.testing import case_for_seed
from tests.compiler import nets
from tests.reference import require_reference

_TABLE_FIELDS = [f.name for f in dataclasses.fields(accesses.AccessTable)]
_OPTIONS = {"default": OptimizeOptions(),
            "compressed": OptimizeOptions(memory_compression_level=2),
            "no_merging": OptimizeOptions(allow_left_merge=False, allow_right_merge=False),
            "deriv_relative": OptimizeOptions(max_deriv_time_relative=-1)}


def _cases():
    out = [("tdnn", None), ("rnn", None)]
    out += [(f"random{seed}", seed) for seed in range(12)]
    out += [(rel, None) for rel in ("generated/case_3", "generated/case_24",
                                    "realistic/tdnn_lstm/train")]
    return out


def _case(name, seed):
    if seed is not None:
        case = case_for_seed(seed)
        return pynnet3.Nnet.from_config(case.config, seed=case.nnet_seed), case.request
    if name in ("tdnn", "rnn"):
        nnet = pynnet3.Nnet.from_config(nets.TDNN if name == "tdnn" else nets.RNN, seed=1)
        return nnet, nets.request({"input": nets.frames(-4, 8, n=2)},
                                  {"output": nets.frames(0, 4, n=2)},
                                  input_deriv=True, output_deriv=True, model=True)
    case = require_reference() / name
    model = case / "model.txt" if (case / "model.txt").exists() else case.parent / "model.txt"
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    return pynnet3.read_nnet(str(model)), req


def _snapshot(c) -> tuple:
    return ([dataclasses.astuple(x) for x in c.commands],
            [tuple(s) for s in c.submatrices],
            [(m.rows, m.cols) for m in c.matrices],
            [[t.tobytes() for t in getattr(c, k)]
             for k in ("indexes", "indexes_multi", "indexes_ranges", "indexes_blocks")],
            [id(p) for p in c.precomputed])


def _assert_same_table(a, b):
    for f in _TABLE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y) and x.dtype == y.dtype, f
        else:
            assert x == y, f


@pytest.mark.parametrize("options", list(_OPTIONS))
@pytest.mark.parametrize("name,seed", _cases())
def test_session_hands_out_what_a_fresh_analysis_gives(name, seed, options, monkeypatch):
    """Every submatrix array the session gives a pass equals a fresh one, every
    built-in pass that reports no change left the computation exactly as it was,
    and the optimized result is the same as without a session."""
    nnet, req = _case(name, seed)
    opts = _OPTIONS[options]
    served = []
    real_sub_array = AnalysisSession.submatrix_array

    def sub_array(self, subs):
        arr = real_sub_array(self, subs)
        assert np.array_equal(arr, read_submatrices(subs)) and not arr.flags.writeable
        served.append(arr)
        return arr

    monkeypatch.setattr(AnalysisSession, "submatrix_array", sub_array)
    wrapped = []
    for p in PIPELINE:
        fn = p.fn

        def checked(c, nnet, o, fn=fn, p=p):
            before = _snapshot(c)
            changed = fn(c, nnet, o)
            if not changed:
                assert _snapshot(c) == before, f"{p.name} reported no change but changed"
            return changed

        checked.__module__, checked.__qualname__ = fn.__module__, fn.__qualname__
        wrapped.append((p, fn))
        p.fn = checked
    try:
        c = compile_computation(nnet, req)
        plain = copy.deepcopy(c, {id(p): p for p in c.precomputed if p is not None})
        optimize(c, nnet, opts)
    finally:
        for p, fn in wrapped:
            p.fn = fn
    monkeypatch.setattr("pynnet3.optimize.pipeline.analysis_session",
                        lambda c, nnet: analysis_session(object(), nnet))  # never matches
    optimize(plain, nnet, opts)
    assert _snapshot(c) == _snapshot(plain)
    assert served


def test_tables_are_read_only():
    nnet, req = _case("tdnn", None)
    c = compile_computation(nnet, req)
    t = accesses.build_access_table(c, nnet)
    for f in _TABLE_FIELDS:
        x = getattr(t, f)
        if isinstance(x, np.ndarray):
            assert not x.flags.writeable, f


def test_submatrix_array_follows_replacements_and_appends():
    nnet, req = _case("tdnn", None)
    c = compile_computation(nnet, req)
    with analysis_session(c, nnet):
        a = submatrix_array(c)
        assert submatrix_array(c) is a  # nothing changed: the same array
        sm = c.submatrices[3]
        c.submatrices[3] = SubMatrix(sm.matrix, sm.row_offset, sm.num_rows, sm.col_offset,
                                     sm.num_cols)  # equal, but another object
        c.new_submatrix(1, 0, 1, 0, 1)
        c.submatrices[1] = SubMatrix(*c.submatrices[2])
        b = submatrix_array(c)
        assert np.array_equal(b, read_submatrices(c.submatrices))
        del c.submatrices[-3:]
        assert np.array_equal(submatrix_array(c), read_submatrices(c.submatrices))
