"""runtime/kernels.py: each bound forward kernel gives the floats of its
component's own forward-only propagate, on the same arrays, run after run; it
declines (returns False, output untouched) once a parameter array is replaced."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.components.affine import near_zero_refinement
from pynnet3.components.tdnn import OffsetGather
from pynnet3.runtime.kernels import KERNELS, bind_propagate

TDNN = ("component name=c type=TdnnComponent input-dim=12 output-dim=20 "
        "time-offsets={offsets} use-bias={bias}")
AFFINE = "component name=c type={kind} input-dim=12 output-dim=20"
LINEAR = "component name=c type=LinearComponent input-dim=12 output-dim=20"
LSTM = "component name=c type=LstmNonlinearityComponent cell-dim=6"


def _component(line: str, dim: int = 12):
    nnet = pynnet3.Nnet.from_config("\n".join(
        [line, f"input-node name=input dim={dim}", "component-node name=n component=c input=input",
         "output-node name=output input=n"]), seed=3)
    comp = nnet.components["c"]
    for value in comp.params().values():  # (a non-zero bias too)
        value[...] = np.random.default_rng(7).standard_normal(value.shape)
    return comp


def _pair(comp, pre, x, rows: int, cols: int, overwrite: bool):
    """(kernel, its output buffer, the component's own output) for input ``x``."""
    out = np.full((rows, cols), np.nan, np.float32)
    if overwrite:  # (the component writes onto undefined contents)
        want = np.full((rows, cols), np.nan, np.float32)
        own = comp.propagate_overwrite
    else:  # (PROPAGATE_ADDS: onto zeros)
        out[...] = 0.0
        want = np.zeros((rows, cols), np.float32)
        own = comp.propagate
    kernel = bind_propagate(comp, pre, x, out, overwrite)
    with near_zero_refinement(False):  # (forward only, as the arena runs)
        own(pre, x, want)
    return kernel, out, want


CASES = {
    "tdnn-2-offsets": (TDNN.format(offsets="-1,0", bias="false"), (0, 1), 12),
    "tdnn-2-offsets-bias": (TDNN.format(offsets="0,2", bias="true"), (0, 2), 12),
    "tdnn-1-offset": (TDNN.format(offsets="0", bias="false"), (0,), 12),
    "tdnn-1-offset-bias": (TDNN.format(offsets="0", bias="true"), (0,), 12),
    "affine": (AFFINE.format(kind="AffineComponent"), None, 12),
    "ng-affine": (AFFINE.format(kind="NaturalGradientAffineComponent"), None, 12),
    "linear": (LINEAR, None, 12),
}


# (AffineComponent writes its whole output: it has no propagate_overwrite)
_MODES = [(name, overwrite) for name in CASES for overwrite in (False, True)
          if not (overwrite and "affine" in name)]


@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("name, overwrite", _MODES,
                         ids=[f"{n}-{'overwrite' if o else 'adds'}" for n, o in _MODES])
def test_kernel_equals_the_components_propagate(name, rows, overwrite):
    line, starts, dim = CASES[name]
    comp = _component(line)
    assert not overwrite or hasattr(comp, "propagate_overwrite")
    rng = np.random.default_rng(rows)
    span = rows + (max(starts) if starts else 0)
    x = rng.standard_normal((span, dim)).astype(np.float32)
    pre = OffsetGather(None, span, starts=starts, num_out=rows) if starts else None
    kernel, out, want = _pair(comp, pre, x, rows, 20, overwrite)
    assert kernel is not None
    for _ in range(2):  # (the same floats; run again on new input values)
        if not overwrite:
            out[...] = 0.0
            want[...] = 0.0
        assert kernel() is True
        with near_zero_refinement(False):
            (comp.propagate_overwrite if overwrite else comp.propagate)(pre, x, want)
        np.testing.assert_array_equal(out, want)
        x[...] = rng.standard_normal(x.shape)


def test_a_replaced_parameter_array_is_declined():
    comp = _component(AFFINE.format(kind="AffineComponent"))
    x = np.random.default_rng(0).standard_normal((4, 12)).astype(np.float32)
    kernel, out, want = _pair(comp, None, x, 4, 20, False)
    comp.linear_params = comp.linear_params.copy()  # (equal values, another array)
    out[...] = 5.0
    assert kernel() is False
    assert (out == 5.0).all()  # (untouched: the arena runs the ordinary op instead)
    comp.linear_params[0, 0] += 1.0  # written in place: a new kernel sees it
    kernel, out, want = _pair(comp, None, x, 4, 20, False)
    assert kernel() is True
    np.testing.assert_array_equal(out, want)


def test_lstm_kernel_equals_the_components_propagate():
    comp = _component(LSTM, 30)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 40)).astype(np.float32)  # (a wider matrix's view)
    view = x[:, 5:35]
    out = np.empty((3, 12), np.float32)
    kernel = bind_propagate(comp, None, view, out, False)
    assert kernel is not None
    for _ in range(2):
        assert kernel() is True
        want = np.empty_like(out)
        comp.propagate(None, view, want)
        np.testing.assert_array_equal(out, want)
        x[...] = rng.standard_normal(x.shape)
    comp.params_ = comp.params_.copy()
    assert kernel() is False


def test_what_is_not_bound():
    comp = _component(AFFINE.format(kind="AffineComponent"))
    x = np.zeros((4, 12), np.float32)
    out = np.zeros((4, 20), np.float32)
    assert bind_propagate(comp, None, x.astype(np.float64), out, False) is None  # dtypes
    assert bind_propagate(comp, None, x, out, True) is None  # (no propagate_overwrite)

    class Mine(type(comp)):  # a subclass: its math may differ; no parent binder
        def propagate(self, indexes, in_value, out_value):
            out_value[...] = 1.0
    assert Mine not in KERNELS
    mine = Mine.__new__(Mine)
    mine.__dict__.update(comp.__dict__)
    assert bind_propagate(mine, None, x, out, False) is None
    lstm = _component(LSTM, 30)
    shared = np.zeros((3, 30), np.float32)
    assert bind_propagate(lstm, None, shared, shared[:, :12], False) is None  # (overlap)
