"""splice_free_affine: affine propagates read their spliced input's column blocks in
place. Expected values come from the unoptimized computation (or Kaldi's reference
arrays); sizes from the same pipeline with the option off."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.computation import Command
from pynnet3.computation import CommandType as CT
from pynnet3.errors import CheckError
from pynnet3.optimize import OptimizeOptions, OptimizeReport
from pynnet3.optimize.splice import splice_free_affine, supports_blocks
from tests.cache.common import assert_same_results as assert_same_cache
from tests.cache.common import frames as cache_frames
from tests.cache.common import random_data, run_on_copy
from tests.compiler import nets
from tests.optimize.single_pass import apply_pass, assert_same_results, load_reference, run
from tests.reference import REF, needs_reference

OFF = OptimizeOptions(splice_free_affine=False)

LINEAR = """
input-node name=input dim=3
component name=lin1 type=LinearComponent input-dim=9 output-dim=4
component-node name=lin1 component=lin1 input=Append(Offset(input, -1), input, Offset(input, 2))
component name=relu1 type=RectifiedLinearComponent dim=4
component-node name=relu1 component=relu1 input=lin1
component name=affine2 type=NaturalGradientAffineComponent input-dim=8 output-dim=3
component-node name=affine2 component=affine2 input=Append(Offset(relu1, -1), relu1)
output-node name=output input=affine2
"""


def _block_propagates(c) -> list:
    return [cmd for cmd in c.commands if cmd.type is CT.PROPAGATE and cmd.table >= 0]


def _tdnn(config=nets.TDNN, n=1, t0=-4, t1=10, o1=6, model=False):
    nnet = pynnet3.Nnet.from_config(config, seed=1)
    req = nets.request({"input": nets.frames(t0, t1, n=n)}, {"output": nets.frames(0, o1, n=n)},
                       input_deriv=model, output_deriv=model, model=model)
    return nnet, req


def _data(nnet, req, dtype):
    rng = np.random.default_rng(7)
    return (nets.random_inputs(nnet, req, rng, dtype),
            nets.random_output_derivs(nnet, req, rng, dtype))


@pytest.mark.parametrize("config", [nets.TDNN, LINEAR], ids=["affine", "linear"])
def test_decode_keeps_a_multi_block_splice(config):
    """Read only by its propagate, a spliced input costs no more than the gathered
    temporary that would replace it (which counts in the peak): left alone."""
    nnet, req = _tdnn(config)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    off = pynnet3.compile(nnet, req, optimize=OFF, check=True)
    assert not _block_propagates(on)
    assert on.stats()["peak_memory_floats"] == off.stats()["peak_memory_floats"]


def test_gathered_temporary_counts_in_the_peak():
    from pynnet3.analysis.memory import memory_profile

    nnet, req = _tdnn(model=True)
    c = pynnet3.compile(nnet, req, optimize=True)
    i = next(i for i, cmd in enumerate(c.commands) if cmd.table >= 0
             and cmd.type is CT.PROPAGATE and cmd.in_value == 0)
    cmd = c.commands[i]
    width = nnet.components[nnet.node_map[cmd.node].component].input_dim
    rows = c.submatrices[cmd.out_value].num_rows
    assert c.gathered_floats(cmd) == rows * width
    live = memory_profile(c).live_floats
    assert live[i] == live[i - 1] + rows * width  # while the command runs
    assert c.peak_memory_floats() >= live[i]


@pytest.mark.parametrize("config, path", [(nets.TDNN, "whole"), ("""
input-node name=input dim=64
component name=a1 type=AffineComponent input-dim=192 output-dim=512
component-node name=a1 component=a1 input=Append(Offset(input, -1), input, Offset(input, 1))
output-node name=output input=a1
""", "direct")], ids=["whole", "direct"])
def test_derivative_temporary_counts_in_the_peak(config, path):
    """A backprop adding its input derivative to blocks counts, while it runs, the
    temporary add_input_deriv makes on its path (none on the direct one)."""
    from pynnet3.analysis.memory import memory_profile
    from pynnet3.components.blas import column_block_path

    nnet, req = _tdnn(config, t0=-3, t1=303, o1=300, model=True)
    c = pynnet3.compile(nnet, req, optimize=True, check=True)
    i = next(i for i, cmd in enumerate(c.commands) if cmd.deriv_table >= 0)
    cmd = c.commands[i]
    od = c.submatrices[cmd.out_deriv]
    widths = [c.submatrices[s].num_cols for s in c.indexes_blocks[cmd.deriv_table].tolist()]
    assert column_block_path(od.num_rows, od.num_cols, widths) == path
    temp = od.num_rows * sum(widths) if path == "whole" else 0
    gathered = c.gathered_floats(cmd) if cmd.in_value == 0 and cmd.table >= 0 else 0
    live = memory_profile(c).live_floats
    assert live[i] == live[i - 1] + temp + gathered
    assert c.peak_memory_floats() >= live[i]


@pytest.mark.parametrize("config", [nets.TDNN, LINEAR], ids=["affine", "linear"])
def test_training_backprop_reads_the_blocks_too(config):
    nnet, req = _tdnn(config, model=True)
    report = OptimizeReport()
    on = pynnet3.compile(nnet, req, optimize=True, check=True, report=report)
    off = pynnet3.compile(nnet, req, optimize=OFF, check=True)
    fired = next(p.changed for p in report.passes if p.name == "splice_free_affine")
    assert "also by a backprop" in fired
    backprops = [cmd for cmd in on.commands if cmd.type in (CT.BACKPROP,
                                                            CT.BACKPROP_NO_MODEL_UPDATE)
                 and cmd.table >= 0]
    assert backprops and all(cmd.in_value == 0 for cmd in backprops)
    assert "Backprop(pre0, blocks[" in str(on)
    # fewer commands always; the peak drops on real networks (test_realistic), while
    # on a net this small the sources living on next to the gathered temporary can
    # cost a few floats more than the spliced matrix did
    assert on.stats()["num_commands"] < off.stats()["num_commands"]
    plain = pynnet3.compile(nnet, req, optimize=False)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        inputs, derivs = _data(nnet, req, dtype)
        assert_same_results(run(nnet, on, inputs, derivs, dtype),
                            run(nnet, plain, inputs, derivs, dtype), value_rtol=tol,
                            grad_rtol=tol)


def test_float32_values_are_bit_identical():
    """The blocks are multiplied as one gathered matrix in the forward pass: no
    rounding change there (the sign of a near-zero pre-ReLU value, and so a gradient,
    may depend on it). Input derivatives this small go through the whole product:
    bit-identical too. The weight gradient is summed block by block into the
    gradient's columns: equal to float rounding (exactly where BLAS sums a column
    the same way wherever it stands, as on the development host)."""
    nnet, req = _tdnn(model=True)
    inputs, derivs = _data(nnet, req, np.float32)
    on = run(nnet, pynnet3.compile(nnet, req, optimize=True), inputs, derivs)
    off = run(nnet, pynnet3.compile(nnet, req, optimize=OFF), inputs, derivs)
    np.testing.assert_array_equal(on.outputs["output"], off.outputs["output"])
    np.testing.assert_array_equal(on.input_derivs["input"], off.input_derivs["input"])
    for comp, grads in off.gradients.items():
        for p, g in grads.items():
            _same_to_rounding(on.gradients[comp][p], g, np.float32)


def test_backprop_without_block_math_keeps_the_spliced_input(monkeypatch):
    from pynnet3.optimize import splice

    real = splice.supports_blocks
    monkeypatch.setattr(splice, "supports_blocks",
                        lambda comp, method="propagate": method == "propagate"
                        and real(comp, method))
    monkeypatch.setattr(splice, "_deriv_plan", lambda c, a, b: None)  # (tested below)
    nnet, req = _tdnn(model=True)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    off = pynnet3.compile(nnet, req, optimize=OFF)
    assert not [cmd for cmd in on.commands if cmd.table >= 0 and cmd.type is not CT.PROPAGATE
                and cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE)]
    assert not _block_propagates(on)
    assert on.stats() == off.stats()


# -- the derivative side: a backprop adds its input derivative to the blocks' places --


def _deriv_backprops(c) -> list:
    return [cmd for cmd in c.commands if cmd.deriv_table >= 0]


def _without_deriv_blocks(monkeypatch, fn):
    from pynnet3.optimize import splice

    with monkeypatch.context() as m:
        m.setattr(splice, "_deriv_plan", lambda c, a, b: None)
        return fn()


@pytest.mark.parametrize("config", [nets.TDNN, LINEAR], ids=["affine", "linear"])
def test_training_backprop_adds_its_input_derivative_in_place(config, monkeypatch):
    """No spliced derivative matrix: the backprop adds each column block of its input
    derivative where the copies used to put it. Bit-identical results (each block
    is the same product, added once into the same place), fewer commands, no more
    memory."""
    nnet, req = _tdnn(config, model=True)
    report = OptimizeReport()
    on = pynnet3.compile(nnet, req, optimize=True, check=True, report=report)
    fired = next(p.changed for p in report.passes if p.name == "splice_free_affine")
    assert "input derivative(s) added in place by their backprop" in fired
    back = _deriv_backprops(on)
    assert back and all(cmd.in_deriv == 0 and cmd.type in (CT.BACKPROP,
                                                            CT.BACKPROP_NO_MODEL_UPDATE)
                        for cmd in back)
    assert "+=blocks[" in str(on)
    before = _without_deriv_blocks(monkeypatch, lambda: pynnet3.compile(
        nnet, req, optimize=True, check=True))
    assert not _deriv_backprops(before)
    assert on.stats()["num_commands"] < before.stats()["num_commands"]
    # (the peak: in test_production_sized_layers_keep_the_floats and test_realistic;
    # blocks this small go through a temporary as large as the spliced derivative,
    # and the destination lives from the backprop on)
    inputs, derivs = _data(nnet, req, np.float32)
    mc_assert_exact(run(nnet, on, inputs, derivs), run(nnet, before, inputs, derivs))
    plain = pynnet3.compile(nnet, req, optimize=False)
    inputs, derivs = _data(nnet, req, np.float64)
    assert_same_results(run(nnet, on, inputs, derivs, np.float64),
                        run(nnet, plain, inputs, derivs, np.float64), value_rtol=1e-12,
                        grad_rtol=1e-12)


def mc_assert_exact(a, b) -> None:
    for name, v in b.outputs.items():
        np.testing.assert_array_equal(a.outputs[name], v)
    for name, v in b.input_derivs.items():
        np.testing.assert_array_equal(a.input_derivs[name], v)
    for comp, grads in b.gradients.items():
        for p, g in grads.items():
            np.testing.assert_array_equal(a.gradients[comp][p], g)


def _deriv_case():
    """An unoptimized training computation, its first backprop whose input derivative
    goes to a spliced derivative matrix, and the destination matrix of its blocks."""
    nnet, req = _tdnn(model=True)
    c = pynnet3.compile(nnet, req, optimize=False)
    b = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.BACKPROP
             and cmd.node == "affine1")
    d = c.submatrices[c.commands[b].in_deriv].matrix
    transfers = [j for j, cmd in enumerate(c.commands) if j > b and cmd.type in (
        CT.MATRIX_COPY, CT.MATRIX_ADD) and c.submatrices[cmd.src].matrix == d]
    assert len(transfers) > 1
    p = c.submatrices[c.commands[transfers[0]].dst].matrix
    return nnet, req, c, b, transfers, p


def _rewrites_like_the_original(nnet, req, c, expect: bool) -> None:
    want = copy.deepcopy(c)
    changed = apply_pass(splice_free_affine, nnet, c)
    assert bool(_deriv_backprops(c)) == expect, changed
    check_computation(c, nnet)
    inputs, derivs = _data(nnet, req, np.float64)
    assert_same_results(run(nnet, c, inputs, derivs, np.float64),
                        run(nnet, want, inputs, derivs, np.float64), value_rtol=1e-12,
                        grad_rtol=1e-12)


def test_derivative_blocks_on_an_unoptimized_computation():
    nnet, req, c, *_ = _deriv_case()
    _rewrites_like_the_original(nnet, req, c, expect=True)


def test_destination_touched_between_backprop_and_transfers_is_left_alone():
    """A command that reads the destination between the backprop and the transfers
    would see the derivative early if the backprop added it there: no rewrite."""
    nnet, req, c, b, transfers, p = _deriv_case()
    c.commands.insert(transfers[0], Command(CT.SET_CONST, dst=c.whole(p), alpha=0.5))
    _rewrites_like_the_original(nnet, req, c, expect=False)


def test_copy_into_a_destination_not_known_zero_is_left_alone():
    """The transfers' first copy overwrites its destination: adding instead is the
    same only where the destination was zero."""
    for value, expect in ((0.25, False), (0.0, True)):
        nnet, req, c, b, transfers, p = _deriv_case()
        # (the first transfer as a copy, as convert_addition makes it)
        j = transfers[0]
        c.commands[j] = dataclasses.replace(c.commands[j], type=CT.MATRIX_COPY)
        zero = max(j for j, cmd in enumerate(c.commands[:b]) if cmd.type is CT.SET_CONST
                   and c.submatrices[cmd.dst].matrix == p)
        c.commands[zero] = dataclasses.replace(c.commands[zero], alpha=value)
        _rewrites_like_the_original(nnet, req, c, expect=expect)


def test_transfers_out_of_column_order_are_left_alone():
    """The backprop adds the blocks in column order; transfers that add them in
    another order give other float32 sums where destinations overlap: no rewrite."""
    nnet, req, c, b, transfers, p = _deriv_case()
    i, j = transfers[-2], transfers[-1]
    assert all(c.commands[k].type is CT.MATRIX_ADD for k in (i, j))
    c.commands[i], c.commands[j] = c.commands[j], c.commands[i]
    _rewrites_like_the_original(nnet, req, c, expect=False)


def test_row_ops_see_the_backprop_writing_its_derivative_blocks():
    """snip_row_ops asks which commands write a matrix before a row copy's -1 rows
    (which zero those rows): a backprop adding into derivative blocks is one."""
    from pynnet3.optimize.row_ops import snip_row_ops

    nnet, req, c, *_ = _deriv_case()
    assert apply_pass(splice_free_affine, nnet, c)
    b = next(i for i, x in enumerate(c.commands) if x.deriv_table >= 0)
    p = c.submatrices[int(c.indexes_blocks[c.commands[b].deriv_table][0])].matrix
    rows, cols = c.matrices[p].rows, c.matrices[p].cols
    s = c.new_matrix(rows, cols, is_deriv=True)
    c.indexes.append(np.array([-1, -1, *range(2, rows)], dtype=np.int64))
    c.commands[b + 1:b + 1] = [
        Command(CT.ALLOC_MATRIX, matrix=s), Command(CT.SET_CONST, dst=c.whole(s), alpha=1.0),
        Command(CT.COPY_ROWS, dst=c.whole(p), src=c.whole(s), table=len(c.indexes) - 1),
        Command(CT.DEALLOC_MATRIX, matrix=s)]
    check_computation(c, nnet)
    want = copy.deepcopy(c)
    apply_pass(snip_row_ops, nnet, c)
    inputs, derivs = _data(nnet, req, np.float64)
    assert_same_results(run(nnet, c, inputs, derivs, np.float64),
                        run(nnet, want, inputs, derivs, np.float64), value_rtol=0.0,
                        grad_rtol=0.0)


def test_derivative_read_elsewhere_is_left_alone():
    nnet, req, c, b, transfers, p = _deriv_case()
    d = c.submatrices[c.commands[b].in_deriv]
    spare = c.new_matrix(d.num_rows, d.num_cols)  # (an extra reader of D)
    c.commands.insert(transfers[-1] + 1, Command(CT.MATRIX_COPY, dst=c.whole(spare),
                                                 src=c.commands[b].in_deriv))
    c.commands.insert(0, Command(CT.ALLOC_MATRIX, matrix=spare))
    c.commands.append(Command(CT.DEALLOC_MATRIX, matrix=spare))
    _rewrites_like_the_original(nnet, req, c, expect=False)


def test_component_with_its_own_backprop_keeps_the_spliced_derivative():
    """FixedAffineComponent's backprop has math of its own: no derivative blocks."""
    config = nets.TDNN.replace("type=AffineComponent", "type=FixedAffineComponent")
    nnet, req = _tdnn(config, model=True)
    assert not nnet.components["affine1"].deriv_blocks
    c = pynnet3.compile(nnet, req, optimize=True, check=True)
    fixed = {n.name for n in nnet.nodes if n.kind == "component-node"
             and type(nnet.components[n.component]).__name__ == "FixedAffineComponent"}
    assert not [cmd for cmd in _deriv_backprops(c) if cmd.node in fixed]


def test_source_overwritten_before_propagate_is_left_alone():
    nnet, req = _tdnn(model=True)
    c = pynnet3.compile(nnet, req, optimize=False)
    # the first spliced propagate and the copies that fill its input
    p = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.PROPAGATE
             and cmd.node == "affine1")
    sm = c.submatrices[c.commands[p].in_value].matrix
    copies = [cmd for cmd in c.commands[:p] if cmd.type is CT.MATRIX_COPY
              and c.submatrices[cmd.dst].matrix == sm]
    assert len(copies) == 3
    # overwrite one source after its copy, before the propagate: the propagate must
    # still see the old values, so the pass must not read the source in place
    src_matrix = c.submatrices[copies[1].src].matrix
    c.commands.insert(p, Command(CT.SET_CONST, dst=c.whole(src_matrix), alpha=0.25))
    want = copy.deepcopy(c)
    assert "read in place" not in apply_pass(splice_free_affine, nnet, c)
    assert not _block_propagates(c)
    inputs, derivs = _data(nnet, req, np.float64)
    assert_same_results(run(nnet, c, inputs, derivs, np.float64),
                        run(nnet, want, inputs, derivs, np.float64), value_rtol=0.0)
    # without the overwrite the same computation is rewritten
    del want.commands[p]
    assert apply_pass(splice_free_affine, nnet, want)
    assert _block_propagates(want)


def test_only_components_with_block_math():
    nnet = pynnet3.Nnet.from_config(LINEAR, seed=0)
    assert supports_blocks(nnet.components["lin1"]) and supports_blocks(nnet.components["affine2"])
    assert supports_blocks(nnet.components["lin1"], "backprop")
    assert not supports_blocks(nnet.components["relu1"])

    class Shifted(type(nnet.components["affine2"])):
        def propagate(self, indexes, in_value, out_value):  # other math
            return super().propagate(indexes, in_value + 1.0, out_value)

    # the block version follows a subclass's own math
    comp = Shifted(np.ones((2, 3), np.float32), np.zeros(2, np.float32))
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    want, got = np.zeros((4, 2)), np.zeros((4, 2))
    comp.propagate(None, x, want)
    comp.propagate_blocks(None, [x[:, :1], x[:, 1:]], got)
    np.testing.assert_array_equal(got, want)


def _checked_block_computation(model=True, deriv_blocks=True):
    from pynnet3.optimize import splice

    nnet, req = _tdnn(model=True)
    with pytest.MonkeyPatch.context() as m:
        if not deriv_blocks:
            m.setattr(splice, "_deriv_plan", lambda c, a, b: None)
        c = pynnet3.compile(nnet, req, optimize=True)
    i = next(i for i, cmd in enumerate(c.commands) if cmd.type is CT.PROPAGATE
             and cmd.table >= 0)
    check_computation(c, nnet)
    return nnet, c, i


@pytest.mark.parametrize("fault", ["table", "width", "rows", "in_value", "overlap", "stats",
                                   "backprop_width", "backprop_in_deriv"])
def test_checker_rejects_bad_block_tables(fault):
    nnet, c, i = _checked_block_computation(deriv_blocks=not fault.startswith("backprop"))
    if fault.startswith("backprop"):
        i = next(k for k, cmd in enumerate(c.commands) if cmd.table >= 0
                 and cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE) and cmd.in_deriv)
    cmd = c.commands[i]
    tab = c.indexes_blocks[cmd.table]
    sm = c.submatrices[int(tab[0])]
    if fault == "table":
        cmd.table = len(c.indexes_blocks)
    elif fault == "backprop_in_deriv":  # a block that is the derivative being written
        idr = c.submatrices[cmd.in_deriv]
        c.indexes_blocks[cmd.table] = tab.copy()
        c.indexes_blocks[cmd.table][0] = c.new_submatrix(idr.matrix, idr.row_offset,
                                                         idr.num_rows, idr.col_offset,
                                                         sm.num_cols)
    elif fault in ("width", "backprop_width"):
        c.indexes_blocks[cmd.table] = tab[:-1]
    elif fault == "rows":
        c.indexes_blocks[cmd.table] = tab.copy()
        c.indexes_blocks[cmd.table][0] = c.new_submatrix(sm.matrix, sm.row_offset,
                                                         sm.num_rows - 1, sm.col_offset,
                                                         sm.num_cols)
    elif fault == "in_value":
        cmd.in_value = int(tab[0])
    elif fault == "overlap":
        ov = c.submatrices[cmd.out_value]
        c.indexes_blocks[cmd.table] = tab.copy()
        c.indexes_blocks[cmd.table][0] = c.new_submatrix(ov.matrix, ov.row_offset,
                                                         ov.num_rows, ov.col_offset,
                                                         sm.num_cols)
    else:
        cmd.alpha = 2.0
    with pytest.raises(CheckError):
        check_computation(c, nnet)


@pytest.mark.parametrize("fault", ["table", "width", "rows", "overlap", "in_deriv",
                                   "propagate", "component"])
def test_checker_rejects_bad_derivative_block_tables(fault):
    nnet, c, _ = _checked_block_computation()
    i = next(k for k, cmd in enumerate(c.commands) if cmd.deriv_table >= 0)
    cmd = c.commands[i]
    tab = c.indexes_blocks[cmd.deriv_table]
    sm = c.submatrices[int(tab[0])]
    if fault == "table":
        cmd.deriv_table = len(c.indexes_blocks)
    elif fault == "width":
        c.indexes_blocks[cmd.deriv_table] = tab[:-1]
    elif fault == "rows":
        c.indexes_blocks[cmd.deriv_table] = tab.copy()
        c.indexes_blocks[cmd.deriv_table][0] = c.new_submatrix(
            sm.matrix, sm.row_offset, sm.num_rows - 1, sm.col_offset, sm.num_cols)
    elif fault == "overlap":  # a block where the backprop reads its output derivative
        od = c.submatrices[cmd.out_deriv]
        c.indexes_blocks[cmd.deriv_table] = tab.copy()
        c.indexes_blocks[cmd.deriv_table][0] = c.new_submatrix(
            od.matrix, od.row_offset, od.num_rows, od.col_offset, min(sm.num_cols,
                                                                      od.num_cols))
    elif fault == "in_deriv":
        cmd.in_deriv = int(tab[0])
    elif fault == "propagate":
        p = next(k for k, x in enumerate(c.commands) if x.type is CT.PROPAGATE
                 and x.node == cmd.node)
        c.commands[p].deriv_table = cmd.deriv_table
    else:  # a component whose backprop has math of its own
        comp = nnet.components[nnet.node_map[cmd.node].component]

        class OwnBackprop(type(comp)):
            def backprop(self, *args):
                return super().backprop(*args)

        comp.__class__ = OwnBackprop
        assert not comp.deriv_blocks
    with pytest.raises(CheckError):
        check_computation(c, nnet)


def _same_to_rounding(got, want, dtype) -> None:
    """Equal to the rounding of sums of a few hundred products."""
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@pytest.mark.parametrize("rows, inner, width, path", [
    (6, 4, 3, "whole"), (40, 3, 1, "whole"), (700, 64, 48, "direct"),
    (400, 512, 48, "direct"), (400, 1024, 100, "direct")],
    ids=["small", "one-column", "gemm-per-block", "inner-512", "inner-1024-width-100"])
def test_add_input_deriv_into_overlapping_blocks(rows, inner, width, path):
    """Block j gets columns j of ``out_deriv @ w`` added, in order: small blocks
    through the whole product, bit for bit what the spliced derivative held (BLAS
    takes other kernels for narrow products); large ones by a GEMM each straight
    into place, equal to float rounding (exactly where BLAS sums a column the same
    way wherever it stands in the product)."""
    from pynnet3.components.affine import add_input_deriv
    from pynnet3.components.blas import column_block_path, gemm_acc

    assert column_block_path(rows, inner, [width] * 3) == path
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        d = rng.standard_normal((rows, inner)).astype(dtype)
        w = rng.standard_normal((inner, 3 * width)).astype(dtype)
        got = rng.standard_normal((rows + 3, width)).astype(dtype)
        want = got.copy()
        # three row windows of one matrix, as a spliced input's offsets -2, 0, +1 give
        add_input_deriv([got[0:rows], got[2:rows + 2], got[3:rows + 3]], d, w)
        spliced = np.zeros((rows, 3 * width), dtype)
        gemm_acc(spliced, d, w)
        for k, r in enumerate((0, 2, 3)):
            want[r:r + rows] += spliced[:, k * width:(k + 1) * width]
        if path == "whole":
            np.testing.assert_array_equal(got, want)
        else:
            _same_to_rounding(got, want, dtype)
            exact = want.copy()
            for k, r in enumerate((0, 2, 3)):  # (in float64: the products' true values)
                exact[r:r + rows] = exact[r:r + rows] - spliced[:, k * width:(k + 1) * width] \
                    + (d.astype(np.float64) @ w[:, k * width:(k + 1) * width]).astype(dtype)
            _same_to_rounding(got, exact, dtype)


@pytest.mark.parametrize("dim", [160, 512], ids=["one-panel", "wide"])
def test_production_sized_layers(dim, monkeypatch):
    """Layers as wide as real ones (Kaldi's 512-1536), where the blocks take a GEMM
    each: the same outputs bit for bit (the forward pass is not touched), input
    derivatives and gradients to float rounding, in float32 and float64; less
    memory while the backprop runs."""
    config = f"""
input-node name=input dim=64
component name=a1 type=NaturalGradientAffineComponent input-dim=192 output-dim={dim}
component-node name=a1 component=a1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=r1 type=RectifiedLinearComponent dim={dim}
component-node name=r1 component=r1 input=a1
component name=a2 type=AffineComponent input-dim={dim} output-dim=8
component-node name=a2 component=a2 input=r1
output-node name=output input=a2
"""
    nnet, req = _tdnn(config, t0=-3, t1=303, o1=300, model=True)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    assert [cmd.node for cmd in _deriv_backprops(on)] == ["a1"]
    off = _without_deriv_blocks(monkeypatch, lambda: pynnet3.compile(
        nnet, req, optimize=True, check=True))
    # no spliced derivative: less memory while a1's backprop runs, no higher peak
    from pynnet3.analysis.memory import memory_profile

    def live_at_a1_backprop(c):
        i = next(i for i, cmd in enumerate(c.commands) if cmd.node == "a1"
                 and cmd.type in (CT.BACKPROP, CT.BACKPROP_NO_MODEL_UPDATE))
        return memory_profile(c).live_floats[i]

    assert live_at_a1_backprop(on) < live_at_a1_backprop(off)
    assert on.peak_memory_floats() <= off.peak_memory_floats()
    for dtype in (np.float32, np.float64):
        inputs, derivs = _data(nnet, req, dtype)
        got, want = run(nnet, on, inputs, derivs, dtype), run(nnet, off, inputs, derivs, dtype)
        np.testing.assert_array_equal(got.outputs["output"], want.outputs["output"])
        _same_to_rounding(got.input_derivs["input"], want.input_derivs["input"], dtype)
        for comp, grads in want.gradients.items():
            for p, g in grads.items():
                _same_to_rounding(got.gradients[comp][p], g, dtype)


def test_shortcut_expansion_equals_full_compile():
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=3)
    nets.to_float64(nnet)
    req = nets.request({"input": cache_frames(5, -3, 9, "t")},
                       {"output": cache_frames(5, 0, 6, "t")}, input_deriv=True,
                       output_deriv=True, model=True)
    cc = pynnet3.CachingCompiler(nnet, optimize=True, check=True)
    sc = cc.compile(req)
    assert cc.info()["shortcut"] == 1 and cc.info()["shortcut_fallbacks"] == 0
    full = pynnet3.compile(nnet, req, optimize=True)
    assert _block_propagates(sc) and len(_block_propagates(sc)) == len(_block_propagates(full))
    assert _deriv_backprops(sc) and len(_deriv_backprops(sc)) == len(_deriv_backprops(full))
    assert sc.stats()["peak_memory_floats"] == full.stats()["peak_memory_floats"]
    inputs, derivs = random_data(nnet, req)
    want = run_on_copy(nnet, pynnet3.compile(nnet, req, optimize=False), inputs, derivs)
    assert_same_cache(run_on_copy(nnet, sc, inputs, derivs), want, 1e-12, "shortcut")
    assert_same_cache(run_on_copy(nnet, full, inputs, derivs), want, 1e-12, "full")


# -- realistic networks --------------------------------------------------------------------

@needs_reference
@pytest.mark.parametrize("rel", ["realistic/tdnn_relu_bn/decode", "realistic/tdnnf_chain/decode",
                                 "realistic/tdnn_lstm/decode", "realistic/xvector/decode",
                                 "realistic/tdnn_relu_bn/train", "realistic/xvector/train"])
def test_realistic(rel):
    nnet, req, inputs, derivs = load_reference(rel)
    on = pynnet3.compile(nnet, req, optimize=True, check=True)
    off = pynnet3.compile(nnet, req, optimize=OFF)
    assert on.stats()["peak_memory_floats"] <= off.stats()["peak_memory_floats"]
    assert on.stats()["num_commands"] <= off.stats()["num_commands"]
    if rel.endswith("/train"):  # decode: multi-block splices are left alone
        assert _block_propagates(on)
        assert on.stats()["peak_memory_floats"] < off.stats()["peak_memory_floats"]
    # against Kaldi's arrays (as tests/conformance compares them; training: the
    # gradients, which depend on the sign of near-zero pre-ReLU values)
    with np.load(REF / rel / "arrays.npz") as z:
        kaldi = {k: z[k] for k in z.files if k.startswith(("output:", "grad:"))}
    got = run(nnet, on, inputs, derivs)
    for key, ref in kaldi.items():
        kind, *name = key.split(":")
        ours = got.outputs[name[0]] if kind == "output" else got.gradients[name[0]][name[1]]
        err = float(np.linalg.norm(np.asarray(ours, np.float64) - ref)
                    / max(np.linalg.norm(ref), 1e-6))
        assert err <= (1e-4 if kind == "output" else 1e-3), f"{rel} {key}: rel error {err:g}"
