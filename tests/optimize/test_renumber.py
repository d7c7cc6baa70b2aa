"""Renumbering (optimize/renumber.py) against a plain per-object reference written
here, the command-field contract it relies on, and the driver's shortcuts (no
renumbering after passes that keep every reference; only dropping no-ops after
passes that only drop commands or that return KeptReferences; one renumbering for
several passes that tolerate a computation not renumbered yet) against
renumbering after every changing pass."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

import pynnet3
from pynnet3.compiler import compile_computation
from pynnet3.computation import CommandType as CT
from pynnet3.computation import SubMatrix
from pynnet3.optimize import PIPELINE, OptimizeOptions
from pynnet3.optimize.pipeline import (
    KEEPS_REFERENCES,
    ONLY_DROPS_COMMANDS,
    ONLY_LEAVES_UNUSED,
    TOLERATES_PENDING,
    KeptReferences,
    OptimizationPass,
    _builtin,
    run_pipeline,
)
from pynnet3.optimize.renumber import _GROUPS, drop_noops, renumber
from tests.compiler import nets
from tests.reference import require_reference

_SUB = ("dst", "src", "in_value", "out_value", "out_deriv", "in_deriv")
_MULTI = (CT.COPY_ROWS_MULTI, CT.ADD_ROWS_MULTI, CT.COPY_TO_ROWS_MULTI, CT.ADD_TO_ROWS_MULTI)


def reference_renumber(c) -> None:
    """The documented semantics, one object at a time: drop no-ops; keep the
    submatrices commands or multi tables name (the first of equal ones), the
    matrices those or sizing commands name, the tables and precomputed objects
    commands name, all in their old order; whole-matrix submatrix: the first kept
    one, else a new one at the end."""
    c.commands = [x for x in c.commands if x.type is not CT.NO_OPERATION]
    used_sub = {0}
    tables = {"rows": set(), "multi": set(), "ranges": set(), "blocks": set()}
    pre = set()
    for x in c.commands:
        used_sub |= {getattr(x, f) for f in _SUB if getattr(x, f)}
        if x.type in (CT.COPY_ROWS, CT.ADD_ROWS):
            tables["rows"].add(x.table)
        elif x.type in _MULTI:
            tables["multi"].add(x.table)
            used_sub |= {int(s) for s in c.indexes_multi[x.table][:, 0] if s > 0}
        elif x.type is CT.ADD_ROW_RANGES:
            tables["ranges"].add(x.table)
        elif x.type in (CT.PROPAGATE, CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE):
            if x.precomputed:
                pre.add(x.precomputed)
            for k in (x.table, x.deriv_table):  # input value / derivative as blocks
                if k >= 0:
                    tables["blocks"].add(k)
                    used_sub |= {int(s) for s in c.indexes_blocks[k]}
    sub_map, kept, first = {}, [], {}
    for s in sorted(used_sub):
        sm = c.submatrices[s]
        if sm not in first:
            first[sm] = len(kept)
            kept.append(sm)
        sub_map[s] = first[sm]
    used_mat = {0} | {sm.matrix for sm in kept}
    for x in c.commands:
        used_mat |= {m for m in (x.matrix, x.src_matrix) if m}
    mat_map = {m: i for i, m in enumerate(sorted(used_mat))}
    c.matrices = [c.matrices[m] for m in sorted(used_mat)]
    c.submatrices = [SubMatrix(mat_map[sm.matrix], sm.row_offset, sm.num_rows, sm.col_offset,
                               sm.num_cols) for sm in kept]
    c._whole = {}
    for i, sm in enumerate(c.submatrices[1:], 1):
        info = c.matrices[sm.matrix]
        if (sm.row_offset, sm.col_offset, sm.num_rows, sm.num_cols) == \
                (0, 0, info.rows, info.cols):
            c._whole.setdefault(sm.matrix, i)
    for m in range(1, len(c.matrices)):
        if m not in c._whole:
            c._whole[m] = c.new_submatrix(m, 0, c.matrices[m].rows, 0, c.matrices[m].cols)
    maps = {}
    for kind, attr in (("rows", "indexes"), ("multi", "indexes_multi"),
                       ("ranges", "indexes_ranges"), ("blocks", "indexes_blocks")):
        order = sorted(tables[kind])
        maps[kind] = {old: i for i, old in enumerate(order)}
        setattr(c, attr, [getattr(c, attr)[k] for k in order])
    c.indexes_multi = [np.array([[sub_map[int(s)] if s > 0 else s, r] for s, r in t],
                                dtype=np.int64).reshape(-1, 2) for t in c.indexes_multi]
    c.indexes_blocks = [np.array([sub_map[int(s)] for s in t], dtype=np.int64)
                        for t in c.indexes_blocks]
    pre_order = sorted(pre)
    pre_map = {old: i + 1 for i, old in enumerate(pre_order)}
    c.precomputed = [None] + [c.precomputed[k] for k in pre_order]
    for x in c.commands:
        for f in _SUB:
            if getattr(x, f):
                setattr(x, f, sub_map[getattr(x, f)])
        x.matrix = mat_map[x.matrix] if x.matrix else 0
        x.src_matrix = mat_map[x.src_matrix] if x.src_matrix else 0
        if x.type in (CT.COPY_ROWS, CT.ADD_ROWS):
            x.table = maps["rows"][x.table]
        elif x.type in _MULTI:
            x.table = maps["multi"][x.table]
        elif x.type is CT.ADD_ROW_RANGES:
            x.table = maps["ranges"][x.table]
        elif x.table >= 0:
            x.table = maps["blocks"][x.table]
        if x.deriv_table >= 0:
            x.deriv_table = maps["blocks"][x.deriv_table]
        if x.precomputed:
            x.precomputed = pre_map[x.precomputed]


def dump(c) -> tuple:
    """Everything that identifies a computation, as comparable plain values."""
    def arr(a):
        return None if a is None else (str(a.dtype), a.shape, a.tobytes())

    return (
        [(m.rows, m.cols, m.node, m.is_deriv, arr(m.indexes)) for m in c.matrices],
        [tuple(s) for s in c.submatrices],
        [arr(t) for t in c.indexes], [arr(t) for t in c.indexes_multi],
        [arr(t) for t in c.indexes_ranges], [arr(t) for t in c.indexes_blocks],
        [id(p) for p in c.precomputed],
        [dataclasses.astuple(x) for x in c.commands],
        sorted(c._whole.items()),
    )


def _copy(c):
    """A deep copy sharing the precomputed objects (compared by identity)."""
    return copy.deepcopy(c, {id(p): p for p in c.precomputed if p is not None})


def _small(config, **kw):
    nnet = pynnet3.Nnet.from_config(config, seed=1)
    req = nets.request({"input": nets.frames(-4, 8, n=2)}, {"output": nets.frames(0, 4, n=2)},
                       input_deriv=True, output_deriv=True, model=True)
    return nnet, compile_computation(nnet, req)


def _reference(rel):
    case = require_reference() / rel
    model = case / "model.txt" if (case / "model.txt").exists() else case.parent / "model.txt"
    nnet = pynnet3.read_nnet(str(model))
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    return nnet, compile_computation(nnet, req)


_CASES = ["tdnn", "rnn", "generated/case_3", "generated/case_9", "generated/case_24",
          "realistic/tdnn_lstm/train"]


def _case(which):
    if which == "tdnn":
        return _small(nets.TDNN)
    if which == "rnn":
        return _small(nets.RNN)
    return _reference(which)


_VARIANTS = {
    "default": OptimizeOptions(),
    "swaps_and_compression": OptimizeOptions(allocate_from_other_peak_aware=False,
                                             memory_compression_level=2),
    "no_merging": OptimizeOptions(allow_left_merge=False, allow_right_merge=False),
    # limit_derivative_times changes much before remove_dead_input_derivatives,
    # which does not tolerate a computation left unrenumbered
    "deriv_limited": OptimizeOptions(max_deriv_time=2, min_deriv_time=-2),
}


@pytest.mark.parametrize("which", _CASES)
def test_renumber_matches_reference_after_every_pass(which):
    nnet, c = _case(which)
    options = OptimizeOptions(memory_compression_level=2)
    compared = 0
    for p in PIPELINE:
        if not p.enabled(options):
            continue
        if not p.fn(c, nnet, options):
            continue
        ref = _copy(c)
        reference_renumber(ref)
        renumber(c)
        assert dump(c) == dump(ref), p.name
        compared += 1
        again = _copy(c)
        renumber(again)  # idempotent
        assert dump(again) == dump(c), p.name
    assert compared >= 3


def _naive_pipeline(c, nnet, options):
    for p in PIPELINE:
        if p.enabled(options) and p.fn(c, nnet, options):
            renumber(c)


@pytest.mark.parametrize("variant", list(_VARIANTS))
@pytest.mark.parametrize("which", _CASES)
def test_driver_shortcuts_change_nothing(which, variant):
    """The driver skips or shortens renumbering after some passes; the result is
    identical to renumbering after every pass that changed something."""
    nnet, c = _case(which)
    options = _VARIANTS[variant]
    naive = _copy(c)
    _naive_pipeline(naive, nnet, options)
    pynnet3.optimize.optimize(c, nnet, options)
    assert dump(c) == dump(naive)


@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_driver_shortcuts_change_nothing_on_random_networks(seed):
    from pynnet3.testing import case_for_seed

    case = case_for_seed(seed)
    nnet = pynnet3.Nnet.from_config(case.config, seed=case.nnet_seed)
    c = compile_computation(nnet, case.request)
    naive = _copy(c)
    _naive_pipeline(naive, nnet, OptimizeOptions())
    pynnet3.optimize.optimize(c, nnet, OptimizeOptions())
    assert dump(c) == dump(naive)


def test_driver_renumbers_once_for_several_passes(monkeypatch):
    """Not vacuous above: on a training computation the driver renumbers fewer
    times than there are passes that leave work for renumbering, and a report
    (which shows each pass's result) brings back renumbering after each."""
    import pynnet3.optimize.renumber as renumber_module

    calls = []
    real = renumber_module.renumber
    monkeypatch.setattr(renumber_module, "renumber", lambda c: calls.append(1) or real(c))
    nnet, c = _case("realistic/tdnn_lstm/train")
    eager = _copy(c)
    pynnet3.optimize.optimize(c, nnet, OptimizeOptions())
    lazy_calls = len(calls)
    calls.clear()
    pynnet3.optimize.optimize(eager, nnet, OptimizeOptions(),
                              report=pynnet3.optimize.OptimizeReport())
    assert dump(c) == dump(eager)
    assert 1 <= lazy_calls < len(calls)


def test_shortcut_passes_are_the_builtin_ones():
    names = {_builtin(p) for p in PIPELINE}
    assert KEEPS_REFERENCES <= names and ONLY_DROPS_COMMANDS <= names
    assert TOLERATES_PENDING <= names
    assert "dead_derivs.remove_dead_input_derivatives" not in TOLERATES_PENDING
    assert ONLY_LEAVES_UNUSED <= names
    assert {p.name for p in PIPELINE if _builtin(p) in ONLY_LEAVES_UNUSED} == {"extend_matrices"}
    assert {p.name for p in PIPELINE if _builtin(p) in KEEPS_REFERENCES} == \
        {"move_sizing_commands", "consolidate_io", "free_provided_outputs", "fix_goto_label",
         "convert_addition"}


def test_a_user_pass_is_always_followed_by_renumbering():
    """A pass registered by a user is renumbered after, even under a built-in name."""
    from pynnet3.optimize.pipeline import OptimizationPass, run_pipeline

    nnet, c = _small(nets.TDNN)
    sizes = []

    def first(comp, nnet, options):
        return "changed"  # a changing pass: the driver renumbers after it

    def touch(comp, nnet, options):
        sizes.append(len(comp.submatrices))
        comp.new_submatrix(1, 0, 1, 0, 1)  # unreferenced: renumbering drops it
        return "touched"

    touch.__qualname__ = "sizing.move_sizing_commands"  # not the built-in function
    run_pipeline(c, nnet, OptimizeOptions(),
                 passes=[OptimizationPass("first", first, lambda o: True),
                         OptimizationPass("move_sizing_commands", touch, lambda o: True)])
    assert len(c.submatrices) == sizes[0]


_ID_DEFAULTS = {f: 0 for f in (*_SUB, "matrix", "src_matrix", "precomputed")}


def test_every_command_type_has_its_fields_listed():
    listed = [t for types, _, _ in _GROUPS for t in types]
    assert sorted(listed, key=lambda t: t.name) == sorted(CT, key=lambda t: t.name)
    assert _GROUPS[0][0] == (CT.NO_OPERATION,)


@pytest.mark.parametrize("variant", list(_VARIANTS))
@pytest.mark.parametrize("which", _CASES)
def test_unused_id_fields_stay_at_their_defaults(which, variant):
    """renumber reads only the id fields a command's type uses (Command's contract:
    the others stay at their defaults); every pass keeps to that."""
    nnet, c = _case(which)
    options = _VARIANTS[variant]
    fields_of = {t: fields for types, fields, _ in _GROUPS for t in types}

    def check(where):
        for x in c.commands:
            if x.type is CT.NO_OPERATION:
                continue  # dropped unread
            for f, default in _ID_DEFAULTS.items():
                if f not in fields_of[x.type]:
                    assert getattr(x, f) == default, (where, x)

    check("unoptimized")
    for p in PIPELINE:
        if p.enabled(options) and p.fn(c, nnet, options):
            check(p.name)
            renumber(c)


@pytest.mark.parametrize("variant", list(_VARIANTS))
@pytest.mark.parametrize("which", _CASES)
def test_kept_references_claims_hold(which, variant):
    """Where a pass returns KeptReferences on a renumbered computation, renumbering
    would only drop the no-ops."""
    nnet, c = _case(which)
    options = _VARIANTS[variant]
    renumbered = False
    for p in PIPELINE:
        if not p.enabled(options):
            continue
        changed = p.fn(c, nnet, options)
        if not changed:
            continue
        if renumbered and isinstance(changed, KeptReferences):
            dropped = _copy(c)
            drop_noops(dropped)
            renumber(c)
            assert dump(c) == dump(dropped), p.name
        else:
            renumber(c)
        renumbered = True


def _zeroing_result(which):
    """The zeroing pass's result on ``which`` in the default pipeline, and whether
    renumbering after it then only drops the no-ops."""
    nnet, c = _case(which)
    options = OptimizeOptions()
    for p in PIPELINE:
        if p.enabled(options):
            changed = p.fn(c, nnet, options)
            if changed:
                dropped = _copy(c)
                drop_noops(dropped)
                renumber(c)
                if p.name == "remove_unnecessary_zeroing":
                    return changed, dump(c) == dump(dropped)
    raise AssertionError("no zeroing removed")


def test_zeroing_claims_kept_references_exactly_when_true():
    """Not vacuous above: the zeroing pass claims where every removed zeroing's
    destination is still named, and not where one names a submatrix nothing else
    does (a spliced input written piecewise: renumbering moves its whole-matrix
    submatrix to the end)."""
    changed, only_drops = _zeroing_result("rnn")
    assert isinstance(changed, KeptReferences) and only_drops
    changed, only_drops = _zeroing_result("realistic/tdnn_relu_bn/decode")
    assert changed and not isinstance(changed, KeptReferences) and not only_drops


def test_a_user_pass_may_claim_kept_references():
    """The driver trusts the claim: it drops the no-ops and renumbers nothing; a
    falsy claim is no change."""
    nnet, c = _small(nets.TDNN)

    def first(comp, nnet, options):
        return "changed"  # renumbered after

    def claim(comp, nnet, options):
        comp.new_submatrix(1, 0, 1, 0, 1)  # unreferenced, and a false claim: stays
        comp.commands[-1].type = CT.NO_OPERATION
        return KeptReferences("dropped the last command")

    def nothing(comp, nnet, options):
        comp.new_submatrix(1, 0, 1, 0, 1)  # and claimed unchanged: not renumbered
        return KeptReferences("")

    run_pipeline(c, nnet, OptimizeOptions(),
                 passes=[OptimizationPass("first", first, lambda o: True)])
    n, ns = len(c.commands), len(c.submatrices)
    run_pipeline(c, nnet, OptimizeOptions(),
                 passes=[OptimizationPass("first", first, lambda o: True),
                         OptimizationPass("claim", claim, lambda o: True),
                         OptimizationPass("nothing", nothing, lambda o: True)])
    assert len(c.commands) == n - 1 and len(c.submatrices) == ns + 2
    assert CT.NO_OPERATION not in {x.type for x in c.commands}

