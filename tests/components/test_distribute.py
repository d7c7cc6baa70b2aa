"""DistributeComponent."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.distribute import DistributeComponent
from pynnet3.errors import ComputeError, ConfigError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import cfg, reference_files, rel_err, roundtrip_spans
from tests.reference import REF, component_cases, load_case, ref_params, require_reference

TYPE = "DistributeComponent"


def run(comp, in_idx, out_idx, x, dy):
    ind = comp.precompute_indexes(np.asarray(in_idx), np.asarray(out_idx), True)
    y = np.zeros((len(out_idx), comp.output_dim), x.dtype)
    comp.propagate(ind, x, y)
    if dy is None:
        return y, None
    dx = np.full_like(x, np.nan)  # backprop assigns: garbage must not survive
    comp.backprop(ind, None, None, dy, None, None, dx)
    return y, dx


# -- files -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ref_params(reference_files(TYPE)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_roundtrip_reference_files(path):
    assert roundtrip_spans(path, TYPE) >= 1


def test_roundtrip_count():
    require_reference()
    assert sum(roundtrip_spans(p, TYPE) for p in reference_files(TYPE)) == 12  # 6 txt + 6 bin


def test_malformed():
    text = b"<DistributeComponent> <InputDim> 12 <OutputDim> 4 </DistributeComponent> "
    c = read_component(TextReader(text))
    assert (c.input_dim, c.output_dim, c.num_blocks) == (12, 4, 3)
    for bad in (text[:20], text[:-5], text.replace(b"<OutputDim>", b"<OutDim>"),
                text.replace(b" 4 ", b" x "), text.replace(b" 4 ", b" 5 "),
                text.replace(b" 12 ", b" 0 ")):
        with pytest.raises(FormatError):
            read_component(TextReader(bad))
    w = make_writer(True)
    c.write(w)
    data = w.getvalue()
    assert read_component(BinaryReader(data)).input_dim == 12
    with pytest.raises(FormatError):
        read_component(BinaryReader(data[:-30]))


# -- properties / config -------------------------------------------------------------------
def test_properties_and_config():
    assert component_class(TYPE) is DistributeComponent
    c = DistributeComponent.from_config(
        cfg("component name=d type=DistributeComponent input-dim=12 output-dim=4"), None)
    assert c.properties() == Flags.NONE and int(c.properties()) == 0
    assert not c.is_simple()
    for bad in ("input-dim=12", "output-dim=4", "input-dim=12 output-dim=5",
                "input-dim=12 output-dim=4 extra=1", "input-dim=0 output-dim=4"):
        with pytest.raises(ConfigError):
            DistributeComponent.from_config(
                cfg("component name=d type=DistributeComponent " + bad), None)


def test_input_indexes_floor_division():
    c = DistributeComponent(12, 4)
    deps = c.input_indexes(np.array([[0, 5, 0], [0, 5, 2], [1, 5, 3], [1, 2, -1], [0, 0, -3],
                                     [0, 0, -4]]))
    assert deps.required.all() and not deps.any_suffices
    assert deps.owner.tolist() == list(range(6))
    assert deps.indexes[:, 2].tolist() == [0, 0, 1, -1, -1, -2]
    assert deps.indexes[:, :2].tolist() == [[0, 5], [0, 5], [1, 5], [1, 2], [0, 0], [0, 0]]


def test_forward_backward_and_gaps():
    rng = np.random.default_rng(0)
    c = DistributeComponent(6, 2)
    in_idx = np.array([[0, 0, 0], [0, 1, 0], [1, 0, -1]])
    out_idx = np.array([[0, 1, 2], [0, 0, 0], [1, 0, -1], [0, 1, 1], [0, 0, 1],
                        [1, 0, -3]])
    x = rng.standard_normal((3, 6))
    dy = rng.standard_normal((6, 2))
    y, dx = run(c, in_idx, out_idx, x, dy)
    np.testing.assert_array_equal(y[0], x[1, 4:6])
    np.testing.assert_array_equal(y[1], x[0, 0:2])
    np.testing.assert_array_equal(y[2], x[2, 4:6])  # x=-1 -> input x=-1, block 2
    np.testing.assert_array_equal(y[5], x[2, 0:2])  # x=-3 -> input x=-1, block 0
    # Gaps (row 0 block 2, row 1 block 0, row 2 block 1) get derivative 0.
    expected = np.zeros_like(x)
    expected[1, 4:6], expected[0, 0:2], expected[2, 4:6] = dy[0], dy[1], dy[2]
    expected[1, 2:4], expected[0, 2:4], expected[2, 0:2] = dy[3], dy[4], dy[5]
    np.testing.assert_array_equal(dx, expected)
    with pytest.raises(ComputeError):
        c.precompute_indexes(in_idx, np.array([[5, 0, 0]]), True)


def test_gradient_check_float64():
    rng = np.random.default_rng(1)
    c = DistributeComponent(8, 2)
    in_idx = np.array([[n, t, 0] for n in range(2) for t in range(3)])
    out_idx = np.array([[n, t, x] for n in range(2) for t in range(3) for x in range(4)])
    out_idx = out_idx[rng.permutation(len(out_idx))]
    x = rng.standard_normal((6, 8))
    dy = rng.standard_normal((24, 2))
    _, dx = run(c, in_idx, out_idx, x, dy)
    num = np.zeros_like(x)
    eps = 1e-6
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            xp, xm = x.copy(), x.copy()
            xp[i, j] += eps
            xm[i, j] -= eps
            num[i, j] = (np.sum(run(c, in_idx, out_idx, xp, None)[0] * dy)
                         - np.sum(run(c, in_idx, out_idx, xm, None)[0] * dy)) / (2 * eps)
    assert rel_err(dx, num) < 1e-8
    y32, _ = run(c, in_idx, out_idx, x.astype(np.float32), None)
    assert y32.dtype == np.float32


# -- Kaldi reference cases ----------------------------------------------------------------------
def _affine_params(model_txt):
    data = model_txt.read_bytes()
    r = TextReader(data, str(model_txt), pos=data.index(b"<LinearParams>"))
    w = r.read_tagged("<LinearParams>", "matrix")
    b = r.read_tagged("<BiasParams>", "vector")
    return w, b


def _dist(case):
    data = (case / "model.txt").read_bytes()
    return read_component(TextReader(data, pos=data.index(b"<DistributeComponent>")))


def _with_x(idx, x):
    out = np.array(idx, dtype=np.int64)
    out[:, 2] = x
    return out


@pytest.mark.parametrize("case", ref_params(component_cases("Distribute_1"), "cases"),
                         ids=lambda p: p.name)
def test_reference_distribute_affine_sum(case):
    """input -> distribute -> affine 4->5 -> Sum(ReplaceIndex(affine, x, i), i<3)."""
    req, arrays, _ = load_case(case)
    d = _dist(case)
    w, b = _affine_params(case / "model.txt")
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    k = d.num_blocks
    mid = np.concatenate([_with_x(out_idx, i) for i in range(k)])
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    m, _ = run(d, in_idx, mid, x, None)
    a = m @ w.T + b
    y = a.reshape(k, len(out_idx), -1).sum(axis=0)
    da = np.tile(dy, (k, 1))
    _, dx = run(d, in_idx, mid, x, da @ w)
    assert rel_err(y, arrays["output:output"]) < 1e-4
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
    assert rel_err(da.T @ m, arrays["grad:affine:linear_params"]) < 1e-3
    assert rel_err(da.sum(0), arrays["grad:affine:bias_params"]) < 1e-3


@pytest.mark.parametrize("case", ref_params(component_cases("Distribute_2"), "cases"),
                         ids=lambda p: p.name)
def test_reference_distribute_tanh_append(case):
    """input -> distribute -> tanh -> Append(ReplaceIndex(tanh, x, 3), ..., x, 0)."""
    req, arrays, _ = load_case(case)
    d = _dist(case)
    in_idx = np.array(req["inputs"][0]["indexes"])
    out_idx = np.array(req["outputs"][0]["indexes"])
    k, od = d.num_blocks, d.output_dim
    xs = list(range(k - 1, -1, -1))
    mid = np.concatenate([_with_x(out_idx, i) for i in xs])
    x, dy = arrays["input:input"], arrays["output_deriv:output"]
    m, _ = run(d, in_idx, mid, x, None)
    h = np.tanh(m)
    rows = len(out_idx)
    y = np.concatenate([h[j * rows:(j + 1) * rows] for j in range(k)], axis=1)
    dh = np.concatenate([dy[:, j * od:(j + 1) * od] for j in range(k)])
    _, dx = run(d, in_idx, mid, x, dh * (1 - h * h))
    assert rel_err(y, arrays["output:output"]) < 1e-4
    assert rel_err(dx, arrays["input_deriv:input"]) < 1e-3
