"""Review of the torch backend (issue 17): what a PyTorch user hands ``pynnet3.run``
(torch dtypes, devices torch cannot use, tensors of odd layouts) gets computed or
named in a :class:`pynnet3.errors.RuntimeInputError`, never a raw error from deep
inside a run."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.errors import RuntimeInputError
from pynnet3.runtime.computer import run_dtype
from tests.compiler import nets as N

CONFIG = """input-node name=input dim=4
component name=affine type=AffineComponent input-dim=12 output-dim=5
component-node name=affine component=affine input=Append(Offset(input, -1), input, Offset(input, 1))
component name=tanh type=TanhComponent dim=5
component-node name=tanh component=tanh input=affine
output-node name=output input=tanh
"""


def _case(seed: int = 0):
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=seed)
    req = N.request({"input": N.frames(-1, 7)}, {"output": N.frames(0, 6)}, True, True)
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 4))
    d = rng.standard_normal((6, 5))
    return nnet, comp, x, d, req


def _independent_forward(nnet, x: np.ndarray) -> np.ndarray:
    """tanh(W [x(t-1), x(t), x(t+1)] + b) in float64, written from the config."""
    a = nnet.components["affine"]
    spliced = np.concatenate([x[0:6], x[1:7], x[2:8]], axis=1)
    return np.tanh(spliced @ np.asarray(a.linear_params, np.float64).T
                   + np.asarray(a.bias_params, np.float64))


def test_run_dtype_maps_numpy_and_torch_names():
    assert run_dtype(np.float32) == np.float32
    assert run_dtype("float64") == np.float64
    with pytest.raises(RuntimeInputError, match="floating point"):
        run_dtype(np.int32)
    with pytest.raises(RuntimeInputError, match="not a dtype"):
        run_dtype("no-such-type")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_torch_dtypes_are_run_dtypes(backend):
    """dtype=torch.float64 used to be a TypeError ("Cannot interpret 'torch.float64'
    as a data type") on both backends, compiled-computation and request paths."""
    torch = pytest.importorskip("torch")
    nnet, comp, x, d, req = _case()
    want = _independent_forward(nnet, x)
    for computation in (comp, req):  # (a request: compiled through the cache)
        res = pynnet3.run(nnet, computation, {"input": x}, {"output": d}, backend=backend,
                          dtype=torch.float64)
        out = res.outputs["output"]
        out = out.numpy() if isinstance(out, torch.Tensor) else out
        assert out.dtype == np.float64
        assert np.abs(out - want).max() < 1e-12
    res = pynnet3.run(nnet, comp, {"input": x}, {"output": d}, backend=backend,
                      dtype=torch.float32)
    out = res.outputs["output"]
    out = out.numpy() if isinstance(out, torch.Tensor) else out
    assert out.dtype == np.float32
    assert np.abs(out - want).max() < 1e-5


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_integer_dtype_is_named(backend):
    """dtype=np.int32 used to fail inside a component (a UFuncTypeError on NumPy, a
    torch RuntimeError on torch)."""
    if backend == "torch":
        pytest.importorskip("torch")
    nnet, comp, x, d, req = _case()
    with pytest.raises(RuntimeInputError, match="dtype int32"):
        pynnet3.run(nnet, comp, {"input": x}, {"output": d}, backend=backend, dtype=np.int32)


def test_device_torch_cannot_use_is_named():
    """device="mps" on a torch without MPS used to raise torch's RuntimeError from the
    first tensor made there (inside the run), not a RuntimeInputError."""
    torch = pytest.importorskip("torch")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        pytest.skip("this torch can use MPS")
    nnet, comp, x, d, req = _case()
    with pytest.raises(RuntimeInputError, match="device 'mps'"):
        pynnet3.run(nnet, comp, {"input": x}, {"output": d}, backend="torch", device="mps")
    if not hasattr(torch, "hpu"):  # (torch.hpu missing: the first tensor's ImportError)
        with pytest.raises(RuntimeInputError, match="device 'hpu'"):
            pynnet3.run(nnet, comp, {"input": x}, {"output": d}, backend="torch",
                        device="hpu")


def test_odd_tensor_inputs_equal_the_independent_forward():
    """Non-contiguous views, float64 tensors into a float32 run, tensors that require
    grad: all computed as the plain array (and the caller's tensor untouched)."""
    torch = pytest.importorskip("torch")
    nnet, comp, x, d, req = _case(1)
    want = _independent_forward(nnet, x)
    wide = torch.zeros(8, 8, dtype=torch.float64)
    wide[:, ::2] = torch.from_numpy(x)
    leaf = torch.from_numpy(x).float().requires_grad_(True)
    for given in (wide[:, ::2], torch.from_numpy(x), leaf, torch.from_numpy(x.T.copy()).t()):
        keep = given.detach().clone()
        res = pynnet3.run(nnet, comp, {"input": given}, {"output": torch.from_numpy(d)},
                          backend="torch", device=torch.device("cpu"))
        out = res.outputs["output"]
        assert out.dtype == torch.float32 and not out.requires_grad
        assert np.abs(out.numpy() - want).max() < 1e-5
        assert torch.equal(given.detach(), keep)


def test_decodables_take_tensors_and_torch_dtypes():
    """Looped and chunked decoding read their features on the host: a tensor that
    requires grad used to be torch's "Can't call numpy() on Tensor that requires
    grad" RuntimeError, and dtype=torch.float64 a TypeError in np.zeros. Both now
    decode exactly as NumPy arrays with dtype=np.float64 do."""
    torch = pytest.importorskip("torch")
    from pynnet3.runtime.looped import LoopedOptions, decode_looped
    from pynnet3.runtime.simple import DecodableNnetSimple, SimpleOptions

    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=5)
    rng = np.random.default_rng(4)
    feats = rng.standard_normal((19, nnet.input_dim("input")))
    iv = rng.standard_normal(nnet.input_dim("ivector"))
    t_feats = torch.from_numpy(feats).requires_grad_(True)
    t_iv = torch.from_numpy(iv).requires_grad_(True)
    opts = LoopedOptions(frames_per_chunk=5, frame_subsampling_factor=1, acoustic_scale=1.0)
    want = decode_looped(nnet, feats, iv, opts, backend="torch", dtype=np.float64)
    got = decode_looped(nnet, t_feats, t_iv, opts, backend="torch", dtype=torch.float64)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    assert np.array_equal(got, want)

    sopts = SimpleOptions(frames_per_chunk=8)
    want = DecodableNnetSimple(nnet, pynnet3.CachingCompiler(nnet), feats, sopts, ivector=iv,
                               backend="torch", dtype=np.float64).output()
    got = DecodableNnetSimple(nnet, pynnet3.CachingCompiler(nnet), t_feats, sopts,
                              ivector=t_iv, backend="torch", dtype=torch.float64).output()
    assert got.dtype == np.float64 and np.array_equal(got, want)


def test_numpy_backend_takes_a_tensor_that_requires_grad():
    """The NumPy backend takes CPU tensors as inputs and output derivatives; one that
    requires grad used to be torch's "Can't call numpy() on Tensor that requires
    grad" RuntimeError."""
    torch = pytest.importorskip("torch")
    nnet, comp, x, d, req = _case(2)
    want = _independent_forward(nnet, x)
    tx = torch.from_numpy(x).requires_grad_(True)
    td = torch.from_numpy(d).requires_grad_(True)
    res = pynnet3.run(nnet, comp, {"input": tx}, {"output": td}, dtype=np.float64)
    assert isinstance(res.outputs["output"], np.ndarray)
    assert np.abs(res.outputs["output"] - want).max() < 1e-12
    ref = pynnet3.run(nnet, comp, {"input": x}, {"output": d}, dtype=np.float64)
    assert np.array_equal(res.input_derivs["input"], ref.input_derivs["input"])


def test_index_tables_are_uploaded_once_not_every_run(monkeypatch):
    """Each run makes a new TorchBackend; its plans of the computation's index tables
    were per instance, so every run uploaded every table again (on a GPU a copy from
    pageable host memory that makes the host wait: against "no per-command host
    synchronisation"). Now a device's plans are shared while the table lives."""
    torch = pytest.importorskip("torch")
    from pynnet3.runtime import torch_backend as tb

    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=5)
    req = N.request({"input": N.frames(-4, 12), "ivector": N.frames(0, 1)},
                    {"output": N.frames(0, 8)})
    comp = pynnet3.compile(nnet, req)
    rng = np.random.default_rng(0)
    inputs = {"input": rng.standard_normal((16, nnet.input_dim("input"))),
              "ivector": rng.standard_normal((1, nnet.input_dim("ivector")))}
    uploads = []
    real = tb.TorchBackend._dev
    monkeypatch.setattr(tb.TorchBackend, "_dev", lambda self, a: uploads.append(1)
                        or real(self, a))
    want = pynnet3.run(nnet, comp, dict(inputs), dtype=np.float64)
    first = pynnet3.run(nnet, comp, dict(inputs), backend="torch", dtype=np.float64)
    made = len(uploads)
    assert made > 0  # (the case has row tables: the ivector repeated over frames)
    again = pynnet3.run(nnet, comp, dict(inputs), backend="torch", dtype=torch.float64)
    assert len(uploads) == made
    for res in (first, again):
        assert np.abs(res.outputs["output"].numpy() - want.outputs["output"]).max() < 1e-12


def test_decode_looped_takes_the_device():
    """decode_looped(backend="torch") had no device argument: looped decoding could
    not be put on a GPU through it (DecodableNnetLooped takes one)."""
    torch = pytest.importorskip("torch")
    from pynnet3.runtime.looped import LoopedOptions, decode_looped

    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=5)
    rng = np.random.default_rng(6)
    feats = rng.standard_normal((13, nnet.input_dim("input")))
    iv = rng.standard_normal(nnet.input_dim("ivector"))
    opts = LoopedOptions(frames_per_chunk=4, frame_subsampling_factor=1, acoustic_scale=1.0)
    want = decode_looped(nnet, feats, iv, opts, dtype=np.float64)
    got = decode_looped(nnet, feats, iv, opts, backend="torch", dtype=np.float64,
                        device=torch.device("cpu"))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeInputError, match="no CUDA device"):
            decode_looped(nnet, feats, iv, opts, backend="torch", device="cuda")


def test_reversed_numpy_views_as_inputs_and_parameters():
    """x[::-1] (time reversal) as an input or output derivative, and a parameter that
    is a reversed view, used to be torch's ValueError "At least one stride in the
    given numpy array is negative" on the torch backend (NumPy's took them)."""
    pytest.importorskip("torch")
    nnet, comp, x, d, req = _case(3)
    a = nnet.components["affine"]
    a.linear_params = np.ascontiguousarray(a.linear_params[::-1])[::-1]  # same values
    assert a.linear_params.strides[0] < 0
    rev_x = np.ascontiguousarray(x[::-1])[::-1]
    rev_d = np.ascontiguousarray(d[::-1])[::-1]
    want = _independent_forward(nnet, x)
    ref = pynnet3.run(nnet, comp, {"input": x}, {"output": d}, dtype=np.float64)
    for dtype in (np.float64, np.float32):
        res = pynnet3.run(nnet, comp, {"input": rev_x}, {"output": rev_d}, backend="torch",
                          dtype=dtype)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert np.abs(res.outputs["output"].numpy() - want).max() < tol
        got = res.input_derivs["input"].numpy()
        assert np.abs(got - ref.input_derivs["input"]).max() < tol * 10


def test_big_endian_arrays_as_inputs_and_parameters():
    """Arrays of non-native byte order ('>f4', e.g. from np.load of such a file) used
    to be torch's ValueError "given numpy array has byte order different from the
    native byte order" on the torch backend (NumPy's took them)."""
    pytest.importorskip("torch")
    nnet, comp, x, d, req = _case(4)
    a = nnet.components["affine"]
    swapped = ">" if np.little_endian else "<"
    a.linear_params = a.linear_params.astype(a.linear_params.dtype.newbyteorder(swapped))
    assert not a.linear_params.dtype.isnative
    want = _independent_forward(nnet, x)
    for dtype in (np.float64, np.float32):
        res = pynnet3.run(nnet, comp, {"input": x.astype(swapped + "f8")},
                          {"output": d.astype(swapped + "f4")}, backend="torch", dtype=dtype)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert np.abs(res.outputs["output"].numpy() - want).max() < tol
