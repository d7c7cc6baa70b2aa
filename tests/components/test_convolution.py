"""Tests of the old 3-D ConvolutionComponent and MaxpoolingComponent."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.components.convolution import ConvolutionComponent, MaxpoolingComponent
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader, make_writer
from pynnet3.io.model_file import read_component
from tests.components.common import WITH_AM_FILES, cfg, reference_files, rel_err, roundtrip_spans
from tests.reference import REF, load_case, load_components, ref_params, require_reference

TYPES = ("ConvolutionComponent", "MaxpoolingComponent")
FILES = reference_files(TYPES, WITH_AM_FILES)


def make_conv(order="zyx", seed=0, **overrides) -> ConvolutionComponent:
    opts = dict(input_x_dim=4, input_y_dim=5, input_z_dim=2, filt_x_dim=2, filt_y_dim=3,
                filt_x_step=1, filt_y_step=2, num_filters=3)
    opts.update(overrides)
    text = " ".join(f"{k.replace('_', '-')}={v}" for k, v in opts.items())
    return ConvolutionComponent.from_config(
        cfg(f"{text} input-vectorization-order={order}"), np.random.default_rng(seed))


def make_pool(**overrides) -> MaxpoolingComponent:
    opts = dict(input_x_dim=3, input_y_dim=4, input_z_dim=4, pool_x_size=2, pool_y_size=2,
                pool_z_size=2, pool_x_step=1, pool_y_step=2, pool_z_step=1)
    opts.update(overrides)
    text = " ".join(f"{k.replace('_', '-')}={v}" for k, v in opts.items())
    return MaxpoolingComponent.from_config(cfg(text), np.random.default_rng(0))


def conv_reference(comp: ConvolutionComponent, x: np.ndarray) -> np.ndarray:
    """Plain-loop convolution, written from the layout description."""
    X, Y, Z = comp.input_x_dim, comp.input_y_dim, comp.input_z_dim
    rows = x.shape[0]
    if comp.input_vectorization == 1:  # zyx: z fastest
        t = x.reshape(rows, X, Y, Z)
    else:  # yzx: y fastest
        t = x.reshape(rows, X, Z, Y).transpose(0, 1, 3, 2)
    K = comp.num_filters
    w = comp.filter_params.reshape(K, comp.filt_x_dim, comp.filt_y_dim, Z)
    out = np.zeros((rows, comp.num_x_steps, comp.num_y_steps, K))
    for i in range(comp.num_x_steps):
        for j in range(comp.num_y_steps):
            xs, ys = i * comp.filt_x_step, j * comp.filt_y_step
            patch = t[:, xs:xs + comp.filt_x_dim, ys:ys + comp.filt_y_dim, :]
            out[:, i, j, :] = np.einsum("rabz,kabz->rk", patch, w) + comp.bias_params
    return out.reshape(rows, -1)


def pool_reference(comp: MaxpoolingComponent, x: np.ndarray) -> np.ndarray:
    rows = x.shape[0]
    t = x.reshape(rows, comp.input_x_dim, comp.input_y_dim, comp.input_z_dim)
    npx, npy, npz = comp._num_pools()
    out = np.zeros((rows, npx, npy, npz))
    for a in range(npx):
        for b in range(npy):
            for c in range(npz):
                xs, ys, zs = a * comp.pool_x_step, b * comp.pool_y_step, c * comp.pool_z_step
                block = t[:, xs:xs + comp.pool_x_size, ys:ys + comp.pool_y_size,
                          zs:zs + comp.pool_z_size]
                out[:, a, b, c] = block.reshape(rows, -1).max(axis=1)
    return out.reshape(rows, -1)


# ----------------------------------------------------------------------------------
# (a) round trips
@pytest.mark.parametrize("path", ref_params(FILES), ids=lambda p: str(p.relative_to(REF)))
def test_roundtrip_reference_components(path):
    assert roundtrip_spans(path, TYPES) > 0


def test_roundtrip_whole_models():
    require_reference()
    from pynnet3.io.model_file import parse_model_bytes, write_model_parts

    for folder in ("components/Convolution_1", "components/Convolution_2",
                   "components/Maxpooling_1", "components/Maxpooling_2", "generated/case_26"):
        for fname, binary in (("model.txt", False), ("model.bin", True)):
            data = (REF / folder / fname).read_bytes()
            assert write_model_parts(parse_model_bytes(data), binary) == data


@pytest.mark.parametrize("binary", [False, True])
def test_roundtrip_optional_header_tokens(binary):
    comp = make_conv()
    comp.learning_rate_factor, comp.max_change, comp.l2_regularize = 0.5, 0.75, 1e-4
    comp.is_gradient = True
    w = make_writer(binary)
    comp.write(w)
    data = (b"\0B" if binary else b"") + w.getvalue()
    back = read_component(make_reader(data))
    assert back.is_gradient and back.max_change == pytest.approx(0.75)
    w2 = make_writer(binary)
    back.write(w2)
    assert w2.getvalue() == w.getvalue()


# ----------------------------------------------------------------------------------
# (c) reference arrays
@pytest.mark.parametrize("name", ["Convolution_1", "Convolution_2", "Maxpooling_1",
                                  "Maxpooling_2"])
def test_reference_case(name):
    require_reference()
    case = REF / "components" / name
    comp = load_components(case / "model.txt")["comp"]
    req, arr, _ = load_case(case)
    assert req["inputs"][0]["indexes"] == req["outputs"][0]["indexes"]
    x, od = arr["input:input"], arr["output_deriv:output"]
    y = np.zeros((x.shape[0], comp.output_dim), np.float32)
    comp.propagate(None, x, y)
    assert rel_err(y, arr["output:output"]) < 1e-4
    ind = np.zeros_like(x)
    grad = {k: np.zeros_like(v) for k, v in comp.params().items()}
    comp.backprop(None, x, y, od, None, grad, ind)
    assert rel_err(ind, arr["input_deriv:input"]) < 1e-3
    grads = comp.export_gradient(grad)
    expected = {k.split(":")[2]: v for k, v in arr.items() if k.startswith("grad:comp:")}
    assert grads.keys() == expected.keys()
    for k in grads:
        assert rel_err(grads[k], expected[k]) < 1e-3


def test_reference_generated_case_26():
    """input -> conv -> output with context: output rows are a subset of input rows."""
    require_reference()
    case = REF / "generated" / "case_26"
    conv = load_components(case / "model.txt")["conv"]
    req, arr, _ = load_case(case)
    in_idx = [tuple(i) for i in req["inputs"][0]["indexes"]]
    rows = [in_idx.index(tuple(o)) for o in req["outputs"][0]["indexes"]]
    x = arr["input:input"][rows]
    y = np.zeros((len(rows), conv.output_dim), np.float32)
    conv.propagate(None, x, y)
    assert rel_err(y, arr["output:output"]) < 1e-4
    ind = np.zeros_like(arr["input:input"])
    sub = np.zeros_like(x)
    grad = {k: np.zeros_like(v) for k, v in conv.params().items()}
    conv.backprop(None, x, y, arr["output_deriv:output"], None, grad, sub)
    ind[rows] = sub
    assert rel_err(ind, arr["input_deriv:input"]) < 1e-3
    for k in grad:
        assert rel_err(grad[k], arr[f"grad:conv:{k}"]) < 1e-3


# ----------------------------------------------------------------------------------
# math against plain loops; adds semantics; dtypes
@pytest.mark.parametrize("order", ["zyx", "yzx"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_against_loops(order, dtype):
    comp = make_conv(order)
    x = np.random.default_rng(1).standard_normal((7, comp.input_dim)).astype(dtype)
    y = np.ones((7, comp.output_dim), dtype)  # propagate ADDS
    comp.propagate(None, x, y)
    assert y.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert rel_err(y - 1.0, conv_reference(comp, x.astype(np.float64))) < tol


@pytest.mark.parametrize("overrides", [
    {}, dict(pool_x_step=2, input_x_dim=4), dict(pool_z_size=1, pool_z_step=1),
])
def test_pool_against_loops(overrides):
    comp = make_pool(**overrides)
    x = np.random.default_rng(2).standard_normal((5, comp.input_dim))
    y = np.full((5, comp.output_dim), 7.0)  # propagate SETS
    comp.propagate(None, x, y)
    np.testing.assert_array_equal(y, pool_reference(comp, x))


def test_pool_backprop_adds_and_ties():
    comp = make_pool(input_x_dim=1, input_y_dim=1, input_z_dim=3, pool_x_size=1,
                     pool_y_size=1, pool_z_size=2, pool_x_step=1, pool_y_step=1,
                     pool_z_step=1)
    x = np.array([[1.0, 3.0, 3.0]])
    y = np.zeros((1, 2))
    comp.propagate(None, x, y)
    np.testing.assert_array_equal(y, [[3.0, 3.0]])
    ind = np.full((1, 3), 10.0)
    comp.backprop(None, x, y, np.array([[1.0, 2.0]]), None, None, ind)
    # element 1 is the max of both pools, element 2 ties in pool 2
    np.testing.assert_array_equal(ind, [[10.0, 13.0, 12.0]])


def test_conv_backprop_adds():
    comp = make_conv()
    x = np.random.default_rng(3).standard_normal((4, comp.input_dim))
    od = np.random.default_rng(4).standard_normal((4, comp.output_dim))
    y = np.zeros((4, comp.output_dim))
    comp.propagate(None, x, y)
    a = np.zeros_like(x)
    comp.backprop(None, x, y, od, None, None, a)
    b = np.ones_like(x)
    comp.backprop(None, x, y, od, None, None, b)
    np.testing.assert_allclose(b, a + 1.0)


# ----------------------------------------------------------------------------------
# (b) finite differences (float64)
def _fd(comp, x, eps=1e-6):
    rng = np.random.default_rng(9)

    def f(inp):
        out = np.zeros((inp.shape[0], comp.output_dim))
        comp.propagate(None, inp, out)
        return out

    y = f(x)
    d = rng.standard_normal(y.shape)
    ind = np.zeros_like(x)
    grad = {k: np.zeros(v.shape) for k, v in comp.params().items()}
    comp.backprop(None, x, y, d, None, grad if grad else None, ind)
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        num[idx] = (np.sum(f(xp) * d) - np.sum(f(xm) * d)) / (2 * eps)
    assert rel_err(ind, num) < 1e-6
    for name, p in comp.params().items():
        p64 = p.astype(np.float64)
        setattr_name = name  # filter_params / bias_params attributes
        num_g = np.zeros(p.shape)
        for idx in np.ndindex(*p.shape):
            pp, pm = p64.copy(), p64.copy()
            pp[idx] += eps
            pm[idx] -= eps
            setattr(comp, setattr_name, pp)
            fp = np.sum(f(x) * d)
            setattr(comp, setattr_name, pm)
            fm = np.sum(f(x) * d)
            num_g[idx] = (fp - fm) / (2 * eps)
        setattr(comp, setattr_name, p)
        assert rel_err(grad[name], num_g) < 1e-6, name


@pytest.mark.parametrize("order", ["zyx", "yzx"])
def test_fd_conv(order):
    comp = make_conv(order, filt_x_step=2, input_x_dim=5, filt_x_dim=3)
    x = np.random.default_rng(5).standard_normal((3, comp.input_dim))
    _fd(comp, x)


def test_fd_pool():
    comp = make_pool()
    x = np.random.default_rng(6).standard_normal((3, comp.input_dim))
    _fd(comp, x)


# ----------------------------------------------------------------------------------
# (d) properties and config
def test_properties():
    assert make_conv().properties() == (
        Flags.SIMPLE | Flags.UPDATABLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_ADDS
        | Flags.PROPAGATE_ADDS)
    assert make_pool().properties() == (
        Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT | Flags.BACKPROP_NEEDS_OUTPUT
        | Flags.BACKPROP_ADDS)
    assert component_class("ConvolutionComponent") is ConvolutionComponent
    assert component_class("MaxpoolingComponent") is MaxpoolingComponent


def test_config_init():
    comp = make_conv()
    assert comp.input_dim == 40
    assert comp.output_dim == 3 * 2 * 3  # x steps 3, y steps 2, 3 filters
    assert comp.filter_params.shape == (3, 12) and comp.bias_params.shape == (3,)
    # (BaseFloat: the learning rate as float32 holds it)
    assert comp.input_vectorization == 1 and comp.learning_rate == float(np.float32(0.001))
    big = make_conv(num_filters=400, seed=1)
    assert big.filter_params.std() == pytest.approx(1 / np.sqrt(12), rel=0.05)
    assert big.bias_params.std() == pytest.approx(1.0, rel=0.15)
    c = ConvolutionComponent.from_config(
        cfg("input-x-dim=2 input-y-dim=2 input-z-dim=1 filt-x-dim=1 filt-y-dim=1 "
            "filt-x-step=1 filt-y-step=1 num-filters=2 param-stddev=0 bias-stddev=0 "
            "learning-rate=0.1 max-change=0.5"), np.random.default_rng(0))
    assert np.all(c.filter_params == 0) and np.all(c.bias_params == 0)
    assert c.learning_rate == float(np.float32(0.1)) and c.max_change == 0.5
    pool = make_pool()
    assert pool.input_dim == 48 and pool.output_dim == 2 * 2 * 3


def test_config_matrix_file(tmp_path):
    mat = np.arange(3 * 13, dtype=np.float32).reshape(3, 13)
    w = make_writer(False)
    w.write_matrix(mat)
    path = tmp_path / "filters.mat"
    path.write_bytes(w.getvalue())
    c = ConvolutionComponent.from_config(
        cfg("input-x-dim=4 input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=3 "
            f"filt-x-step=1 filt-y-step=2 matrix={path}"), np.random.default_rng(0))
    np.testing.assert_array_equal(c.filter_params, mat[:, :12])
    np.testing.assert_array_equal(c.bias_params, mat[:, 12])


@pytest.mark.parametrize("text", [
    "input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 filt-y-step=2 "
    "num-filters=3",                                                        # missing x dim
    "input-x-dim=4 input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 "
    "filt-y-step=2",                                                        # no num-filters
    "input-x-dim=4 input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=2 filt-x-step=1 "
    "filt-y-step=2 num-filters=3",                                          # y not divisible
    "input-x-dim=4 input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 "
    "filt-y-step=2 num-filters=3 input-vectorization-order=xyz",
    "input-x-dim=4 input-y-dim=5 input-z-dim=2 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 "
    "filt-y-step=2 num-filters=3 bogus=2",
])
def test_conv_config_errors(text):
    with pytest.raises(ConfigError):
        ConvolutionComponent.from_config(cfg(text), np.random.default_rng(0))


@pytest.mark.parametrize("overrides", [
    dict(pool_x_size=4), dict(pool_y_step=3), dict(pool_z_step=0), dict(input_y_dim=5),
])
def test_pool_config_errors(overrides):
    with pytest.raises(ConfigError):
        make_pool(**overrides)
    with pytest.raises(ConfigError):
        MaxpoolingComponent.from_config(cfg("input-x-dim=3"), np.random.default_rng(0))


# ----------------------------------------------------------------------------------
# (e) malformed files
def _text(comp) -> bytes:
    w = make_writer(False)
    comp.write(w)
    return w.getvalue()


@pytest.mark.parametrize("which", ["conv", "pool"])
def test_malformed(which):
    comp = make_conv() if which == "conv" else make_pool()
    good = _text(comp)
    assert _text(read_component(make_reader(good))) == good
    cut = good.rfind(b"</")
    bads = [good[:cut], good[:len(good) // 2], good[:cut] + b"<Garbage> " + good[cut:],
            good.replace(b"<InputYDim>", b"<InputQDim>")]
    for bad in bads:
        with pytest.raises(FormatError):
            read_component(make_reader(bad))
    wb = make_writer(True)
    comp.write(wb)
    data = b"\0B" + wb.getvalue()
    for n in (len(data) - 3, len(data) // 2, 30):
        with pytest.raises(FormatError):
            read_component(make_reader(data[:n]))


def test_malformed_values():
    good = _text(make_conv())
    bads = [
        good.replace(b"<InputXDim> 4", b"<InputXDim> 0"),
        good.replace(b"<InputVectorization> 1", b"<InputVectorization> 7"),
        good.replace(b"<FiltYStep> 2", b"<FiltYStep> 3"),     # geometry does not divide
        good.replace(b"<BiasParams>  [ ", b"<BiasParams>  [ 1 "),  # wrong bias dim
    ]
    rows = good.split(b"\n")
    rows[1] = rows[1].replace(rows[1].split()[0], b"nan", 1)  # a NaN filter value
    bads.append(b"\n".join(rows))
    for bad in bads:
        assert bad != good
        with pytest.raises(FormatError):
            read_component(make_reader(bad))
    pool = _text(make_pool())
    with pytest.raises(FormatError):
        read_component(make_reader(pool.replace(b"<PoolXStep> 1", b"<PoolXStep> 5")))
