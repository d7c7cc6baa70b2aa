"""The optimizer pipeline: registry, report, gating, and the results against
Kaldi's own optimized computations (stats.json)."""

from __future__ import annotations

import json

import pytest

import pynnet3
from pynnet3.computation import CommandType as CT
from pynnet3.optimize import PIPELINE, OptimizeOptions, OptimizeReport, register_pass
from tests.compiler import nets
from tests.reference import REF, needs_reference, ref_params

REALISTIC = sorted(p.parent.relative_to(REF).as_posix()
                   for p in (REF / "realistic").rglob("request.json")) if REF.is_dir() else []


def _case(rel: str):
    case = REF / rel
    nnet = pynnet3.read_nnet(str(case.parent / "model.txt"))
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    kaldi = json.loads((case / "stats.json").read_text())["optimized"]
    return nnet, req, kaldi


def test_every_default_pass_is_present():
    names = [p.name for p in PIPELINE]
    for want in ("consolidate_model_update", "convert_addition", "snip_row_ops",
                 "split_row_ops", "replace_row_with_matrix_ops", "extend_matrices",
                 "variable_merging", "remove_unnecessary_zeroing", "move_sizing_commands",
                 "optimize_looped_computation", "allocate_from_other", "consolidate_io",
                 "memory_compression", "limit_derivative_times", "remove_needless_noops",
                 "remove_dead_input_derivatives", "splice_free_affine", "free_provided_outputs"):
        assert want in names, want


@pytest.mark.parametrize("rel", ref_params(REALISTIC, "realistic cases"))
def test_realistic_against_kaldi(rel):
    """Peak memory never above Kaldi's by more than 10%, and a report row per pass."""
    nnet, req, kaldi = _case(rel)
    report = OptimizeReport()
    c = pynnet3.compile(nnet, req, optimize=True, report=report, check=True)
    st = c.stats()
    assert st["peak_memory_floats"] <= 1.10 * kaldi["peak_memory_floats"], \
        f"{rel}: peak {st['peak_memory_floats']} vs Kaldi {kaldi['peak_memory_floats']}"
    assert st["num_commands"] <= 1.15 * kaldi["num_commands"], \
        f"{rel}: {st['num_commands']} commands vs Kaldi {kaldi['num_commands']}"
    assert report.passes[-1].num_commands == st["num_commands"]
    assert report.passes[-1].peak_memory_floats == st["peak_memory_floats"]
    assert report.initial.num_commands > st["num_commands"]
    text = str(report)
    assert "variable_merging" in text and "move_sizing_commands" in text


@needs_reference
def test_kaldi_pairing_reproduces_kaldi_and_peak_aware_beats_it():
    nnet, req, kaldi = _case("realistic/tdnnf_chain/decode")
    as_kaldi = OptimizeOptions(allocate_from_other_peak_aware=False,
                               remove_needless_noops=False, splice_free_affine=False)
    c = pynnet3.compile(nnet, req, optimize=as_kaldi)
    assert c.stats()["peak_memory_floats"] == kaldi["peak_memory_floats"]
    ours = pynnet3.compile(nnet, req, optimize=True)
    assert ours.stats()["peak_memory_floats"] < kaldi["peak_memory_floats"]


def _tdnn(model=False):
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=1)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=model, output_deriv=model, model=model)
    return nnet, req


def test_needless_noops_go_only_when_nothing_follows():
    nnet, req = _tdnn()
    c = pynnet3.compile(nnet, req, optimize=True)
    kinds = {cmd.type for cmd in c.commands}
    assert CT.NO_OPERATION_PERMANENT not in kinds and CT.NO_OPERATION_MARKER not in kinds
    nnet, req = _tdnn(model=True)
    c = pynnet3.compile(nnet, req, optimize=True)
    assert sum(cmd.type is CT.NO_OPERATION_MARKER for cmd in c.commands) == 1
    kept = pynnet3.compile(nnet, req, optimize=OptimizeOptions(remove_needless_noops=False))
    assert sum(cmd.type is CT.NO_OPERATION_PERMANENT for cmd in kept.commands) == 1


def test_master_switch_gates_every_pass():
    nnet, req = _tdnn(model=True)
    plain = pynnet3.compile(nnet, req, optimize=False)
    off = pynnet3.compile(nnet, req, optimize=OptimizeOptions(optimize=False))
    assert off.stats() == plain.stats()


def test_user_pass_registration_and_report():
    calls = []

    def count_commands(c, nnet, options):
        """Counts commands; changes nothing."""
        calls.append(len(c.commands))
        return ""

    register_pass("test_counter", count_commands, lambda o: True, after="variable_merging")
    try:
        names = [p.name for p in PIPELINE]
        assert names.index("test_counter") == names.index("variable_merging") + 1
        nnet, req = _tdnn(model=True)
        report = OptimizeReport()
        pynnet3.compile(nnet, req, optimize=True, report=report)
        assert len(calls) == 1
        row = next(r for r in report.passes if r.name == "test_counter")
        assert row.changed == "" and row.num_commands == calls[0]
    finally:
        PIPELINE[:] = [p for p in PIPELINE if p.name != "test_counter"]
    with pytest.raises(pynnet3.errors.PynnetError, match="no pass named"):
        register_pass("x", count_commands, lambda o: True, before="nonexistent")
