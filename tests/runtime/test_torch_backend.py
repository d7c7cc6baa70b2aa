"""The torch backend (issue 17): the array namespace contract, every backend
operation against the NumPy backend's, parameters and index tables on the device,
tensors in and out of ``pynnet3.run``, the device in the cache key, and a whole
network's forward, backward and gradients equal to the NumPy backend's (float64
to 1e-10, float32 to float32 rounding). The reference cases on torch are in
tests/conformance/test_torch_reference_cases.py."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import numpy as np
import pytest

import pynnet3
from pynnet3.components import xp, xp_numpy
from pynnet3.errors import RuntimeInputError
from pynnet3.runtime.backend import get_backend
from pynnet3.runtime.numpy_backend import NumpyBackend
from tests.compiler import nets as N
from tests.reference import REF, needs_reference

torch = pytest.importorskip("torch")

from pynnet3.components import xp_torch  # noqa: E402 - needs torch
from pynnet3.runtime.torch_backend import TorchBackend  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def rel_err(a, b) -> float:
    a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    a, b = a.astype(np.float64), b.astype(np.float64)
    assert a.shape == b.shape
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# -- the namespace ------------------------------------------------------------------------
def test_both_namespaces_provide_every_name():
    for name in xp.NAMES:
        assert hasattr(xp_numpy, name), f"xp_numpy lacks {name}"
        assert hasattr(xp_torch, name), f"xp_torch lacks {name}"


def test_namespace_picks_by_array_type():
    assert xp.namespace(np.zeros((2, 2))) is xp_numpy
    assert xp.namespace(torch.zeros(2, 2)) is xp_torch
    assert xp.namespace([np.zeros(2)]) is xp_numpy  # column blocks
    with pytest.raises(TypeError):
        xp.namespace("not an array")


def test_numpy_namespace_is_numpy_itself():
    """The NumPy path calls NumPy's own functions: no wrapper on the hot path."""
    for name in ("exp", "tanh", "maximum", "multiply", "matmul", "einsum", "sum", "where"):
        assert getattr(xp_numpy, name) is getattr(np, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_functions_match_numpy(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 6)).astype(dtype)
    b = rng.standard_normal((5, 6)).astype(dtype)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for name in ("exp", "tanh", "abs", "square", "sign", "negative"):
        assert rel_err(getattr(xp_torch, name)(ta), getattr(np, name)(a)) < 1e-6, name
    for name in ("maximum", "minimum", "add", "subtract", "multiply", "divide"):
        assert rel_err(getattr(xp_torch, name)(ta, tb), getattr(np, name)(a, b)) < 1e-6, name
        # a Python scalar on either side, and out= aliasing an input
        assert rel_err(getattr(xp_torch, name)(ta, 0.5), getattr(np, name)(a, 0.5)) < 1e-6
        assert rel_err(getattr(xp_torch, name)(0.5, tb), getattr(np, name)(0.5, b)) < 1e-6
        out = ta.clone()
        getattr(xp_torch, name)(out, tb, out=out)
        assert rel_err(out, getattr(np, name)(a, b)) < 1e-6, name
    for axis in (None, 0, 1):
        for keep in (False, True):
            assert rel_err(xp_torch.sum(ta, axis=axis, keepdims=keep),
                           np.sum(a, axis=axis, keepdims=keep)) < 1e-6
            assert rel_err(xp_torch.amax(ta, axis=axis, keepdims=keep),
                           np.amax(a, axis=axis, keepdims=keep)) == 0
    assert rel_err(xp_torch.cumsum(ta, axis=0), np.cumsum(a, axis=0)) < 1e-6
    assert rel_err(xp_torch.clip(ta, -0.5, 0.5), np.clip(a, -0.5, 0.5)) == 0
    assert rel_err(xp_torch.where(ta > 0, ta, 0.0), np.where(a > 0, a, 0.0)) == 0
    assert rel_err(xp_torch.tile(ta, (1, 3)), np.tile(a, (1, 3))) == 0
    assert rel_err(xp_torch.prod(ta, axis=1), np.prod(a, axis=1)) < 1e-6
    starts = np.array([0, 2, 3])
    assert rel_err(xp_torch.add_reduceat(ta, starts, axis=1),
                   np.add.reduceat(a, starts, axis=1)) < 1e-6
    # the same starts over a narrower axis: other group ids (not those cached above)
    assert rel_err(xp_torch.add_reduceat(ta[:, :5], starts, axis=1),
                   np.add.reduceat(a[:, :5], starts, axis=1)) < 1e-6
    c = rng.standard_normal((5, 5)).astype(dtype)
    tc = torch.from_numpy(c.copy())
    xp_torch.gemm_acc(tc, ta, tb.T, alpha=0.5)
    assert rel_err(tc, c + 0.5 * (a @ b.T)) < 1e-6
    rows = np.array([4, 0, 0, 2])
    assert rel_err(xp_torch.take(ta, xp_torch.index(rows, ta)), a[rows]) == 0
    dst, tdst = np.zeros((5, 6), dtype), torch.zeros(5, 6, dtype=ta.dtype)
    np.add.at(dst, rows, a[:4])
    xp_torch.add_at(tdst, xp_torch.index(rows, tdst), ta[:4])
    assert rel_err(tdst, dst) < 1e-6  # repeated rows accumulate


def test_shares_memory_is_exact_for_column_blocks():
    m = torch.zeros(4, 10)
    left, right, overlap = m[:, :5], m[:, 5:], m[:, 3:7]
    assert xp_torch.may_share_memory(left, right)  # NumPy's bounds test: overlapping spans
    assert not xp_torch.shares_memory(left, right)
    assert xp_torch.shares_memory(left, overlap)
    assert not xp_torch.shares_memory(m[:2], m[2:])
    assert not xp_torch.may_share_memory(m, torch.zeros(4, 10))
    mn = m.numpy()
    assert np.shares_memory(mn[:, :5], mn[:, 3:7]) and not np.shares_memory(mn[:, :5], mn[:, 5:])


def test_scalar_type_rounds_like_the_dtype():
    t32, t64 = torch.zeros(1), torch.zeros(1, dtype=torch.float64)
    assert xp_torch.scalar_type(t32) is np.float32 and xp_torch.scalar_type(t64) is np.float64
    assert xp_numpy.scalar_type(np.zeros(1, np.float32)) is np.float32


# -- parameters and index tables on the device -----------------------------------------------
def test_cpu_param_shares_the_numpy_memory():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    like = torch.zeros(1)
    t = xp_torch.param(w, like)
    w[0, 0] = 42.0  # an in-place update of the master copy is seen at once
    assert t[0, 0].item() == 42.0
    t64 = xp_torch.param(w, torch.zeros(1, dtype=torch.float64))
    assert t64.dtype == torch.float64 and t64[0, 0].item() == 42.0
    w[0, 0] = 7.0  # the cast copy is made per call: never stale
    assert xp_torch.param(w, torch.zeros(1, dtype=torch.float64))[0, 0].item() == 7.0


def test_index_tables_are_converted_once_and_forgotten_with_the_table():
    table = np.array([3, 1, 2], dtype=np.int32)
    like = torch.zeros(1)
    a = xp_torch.index(table, like)
    assert a.dtype == torch.int64 and a.tolist() == [3, 1, 2]
    assert xp_torch.index(table, like) is a  # cached
    n = len(xp_torch._INDEXES)
    del table
    gc.collect()
    assert len(xp_torch._INDEXES) == n - 1  # the entry died with its table


def test_device_param_cache_sees_updates_between_runs():
    """Off the CPU a parameter's device copy is made once and reused within a run;
    at the next run it is compared with the host array and remade if that changed
    in place (checked on the meta device: the copies' identity tells)."""
    w = np.ones((3, 2), np.float32)
    like = torch.zeros(1, device="meta")
    xp_torch.new_run()
    t = xp_torch.param(w, like)
    assert t.device.type == "meta" and xp_torch.param(w, like) is t
    xp_torch.new_run()
    assert xp_torch.param(w, like) is t  # unchanged: the same copy
    w[1, 1] = 5.0  # written in place between runs
    assert xp_torch.param(w, like) is t  # (within a run the copy stands)
    xp_torch.new_run()
    t2 = xp_torch.param(w, like)
    assert t2 is not t and xp_torch.param(w, like) is t2
    t64 = xp_torch.param(w, torch.zeros(1, device="meta", dtype=torch.float64))
    assert t64.dtype == torch.float64 and t64 is not t2  # one copy per dtype
    w2 = w[:, ::-1]  # a strided parameter view is compared element by element
    t3 = xp_torch.param(w2, like)
    xp_torch.new_run()
    assert xp_torch.param(w2, like) is t3


@CUDA
def test_cuda_param_cache_sees_updates_between_runs():
    w = np.ones((2, 2), np.float32)
    like = torch.zeros(1, device="cuda")
    xp_torch.new_run()
    t = xp_torch.param(w, like)
    assert t.device.type == "cuda" and xp_torch.param(w, like) is t  # cached within a run
    w[...] = 3.0
    xp_torch.new_run()
    assert float(xp_torch.param(w, like)[0, 0]) == 3.0


# -- backend operations against the NumPy backend's ---------------------------------------
@pytest.fixture(params=[np.float32, np.float64])
def dtype(request):
    return request.param


def _pair(shape, rng, dtype):
    a = rng.standard_normal(shape).astype(dtype)
    return a, torch.from_numpy(a.copy())


def test_backend_ops_match_numpy(dtype):
    rng = np.random.default_rng(1)
    nb, tb = NumpyBackend(), TorchBackend("cpu")
    src, tsrc = _pair((6, 4), rng, dtype)
    table = np.array([5, -1, 0, 0, 3, -1, 2], dtype=np.int32)
    full = np.array([5, 1, 0, 0, 3, 4, 2], dtype=np.int32)
    for alpha in (1.0, -0.5):
        for tab in (table, full):
            for op in ("copy_rows", "add_rows"):
                dst, tdst = _pair((7, 4), rng, dtype)
                getattr(nb, op)(dst, src, tab, alpha)
                getattr(tb, op)(tdst, tsrc, tab, alpha)
                assert rel_err(tdst, dst) < 1e-12 if dtype == np.float64 else 1e-6, op
        # multi: rows from two sources, (-1, -1) for none
        src2, tsrc2 = _pair((3, 4), rng, dtype)
        multi = np.array([[1, 2], [2, 0], [-1, -1], [1, 5], [2, 2]], dtype=np.int32)
        for op in ("copy_rows_multi", "add_rows_multi"):
            dst, tdst = _pair((5, 4), rng, dtype)
            getattr(nb, op)(dst, {1: src, 2: src2}, multi, alpha)
            getattr(tb, op)(tdst, {1: tsrc, 2: tsrc2}, multi, alpha)
            assert rel_err(tdst, dst) < 1e-6, op
        ranges = np.array([[0, 3], [2, 2], [1, 6]], dtype=np.int32)
        dst, tdst = _pair((3, 4), rng, dtype)
        nb.add_row_ranges(dst, src, ranges, alpha)
        tb.add_row_ranges(tdst, tsrc, ranges, alpha)
        assert rel_err(tdst, dst) < 1e-6
        for op in ("copy", "add"):
            dst, tdst = _pair((6, 4), rng, dtype)
            getattr(nb, op)(dst, src, alpha)
            getattr(tb, op)(tdst, tsrc, alpha)
            assert rel_err(tdst, dst) < 1e-6, op
    dst, tdst = _pair((6, 4), rng, dtype)
    view, tview = nb.view(dst, 1, 3, 2, 2), tb.view(tdst, 1, 3, 2, 2)
    nb.set_const(view, 2.5)
    tb.set_const(tview, 2.5)
    assert rel_err(tdst, dst) == 0
    assert tb.is_finite(tdst) and not tb.is_finite(torch.tensor([[float("nan")]]))
    z = tb.zeros(2, 3, dtype)
    assert z.dtype == xp_torch.dtype_of(dtype) and z.shape == (2, 3)


def test_copy_rows_into_a_view_of_its_source():
    """A gather whose destination shares the source's matrix (in-place row moves)."""
    m = np.arange(24, dtype=np.float64).reshape(6, 4)
    tm = torch.from_numpy(m.copy())
    table = np.array([2, 3, 4], dtype=np.int32)
    NumpyBackend().copy_rows(m[:3], m, table, 1.0)
    TorchBackend("cpu").copy_rows(tm[:3], tm, table, 1.0)
    assert rel_err(tm, m) == 0


def test_get_backend_options_and_errors():
    be = get_backend("torch", device=torch.device("cpu"))
    assert isinstance(be, TorchBackend) and be.device == torch.device("cpu")
    with pytest.raises(pynnet3.errors.PynnetError, match="unknown backend"):
        get_backend("tensorflow")


# -- whole runs ------------------------------------------------------------------------------
CONFIG = """
input-node name=input dim=6
component name=affine1 type=NaturalGradientAffineComponent input-dim=18 output-dim=10
component-node name=affine1 component=affine1 input=Append(Offset(input,-1),input,Offset(input,1))
component name=relu1 type=RectifiedLinearComponent dim=10 self-repair-scale=1e-05
component-node name=relu1 component=relu1 input=affine1
component name=bn1 type=BatchNormComponent dim=10 target-rms=1.0
component-node name=bn1 component=bn1 input=relu1
component name=scale1 type=PerElementScaleComponent dim=10
component-node name=scale1 component=scale1 input=bn1
component name=tanh1 type=TanhComponent dim=10
component-node name=tanh1 component=tanh1 input=scale1
component name=lin1 type=LinearComponent input-dim=20 output-dim=8
component-node name=lin1 component=lin1 input=Append(tanh1, Offset(relu1, -2))
component name=norm1 type=NormalizeComponent dim=8 target-rms=1.0
component-node name=norm1 component=norm1 input=lin1
component name=out type=AffineComponent input-dim=8 output-dim=5
component-node name=out component=out input=norm1
component name=lsm type=LogSoftmaxComponent dim=5
component-node name=lsm component=lsm input=out
output-node name=output input=lsm objective=linear
"""


def _network_case(dtype, seed=0):
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=seed)
    req = N.request({"input": N.frames(-3, 12, n=2)}, {"output": N.frames(0, 8, n=2)},
                    True, True, True)
    comp = pynnet3.compile(nnet, req, optimize=True)
    rng = np.random.default_rng(seed + 1)
    x = N.random_inputs(nnet, req, rng, dtype)
    d = N.random_output_derivs(nnet, req, rng, dtype)
    return nnet, comp, x, d


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_network_forward_backward_gradients_equal_numpy(dtype, tol):
    nnet, comp, x, d = _network_case(dtype)
    ref = pynnet3.run(nnet, comp, dict(x), dict(d), dtype=dtype)
    got = pynnet3.run(nnet, comp, dict(x), dict(d), backend="torch", dtype=dtype)
    assert set(got.outputs) == set(ref.outputs) == {"output"}
    assert set(got.input_derivs) == set(ref.input_derivs) == {"input"}
    assert set(got.gradients) == set(ref.gradients)
    assert len(ref.gradients) == 4  # affine1, scale1, lin1, out
    assert got.outputs["output"].dtype == xp_torch.dtype_of(dtype)
    assert rel_err(got.outputs["output"], ref.outputs["output"]) < tol
    assert rel_err(got.input_derivs["input"], ref.input_derivs["input"]) < tol
    for c, g in ref.gradients.items():
        assert set(got.gradients[c]) == set(g)
        for p, v in g.items():
            assert isinstance(got.gradients[c][p], torch.Tensor)
            assert rel_err(got.gradients[c][p], v) < tol, f"{c}:{p}"


def test_tensor_inputs_are_used_and_left_unchanged():
    """Torch tensors in (no NumPy round trip), tensors out; a component running in
    place never writes into the caller's tensor."""
    nnet = pynnet3.Nnet.from_config("""
input-node name=input dim=4
component name=relu type=RectifiedLinearComponent dim=4
component-node name=relu component=relu input=input
output-node name=output input=relu
""")
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]] * 3)
    keep = x.clone()
    req = N.request({"input": N.frames(0, 3)}, {"output": N.frames(0, 3)})
    res = pynnet3.run(nnet, req, {"input": x}, backend="torch", device="cpu")
    assert torch.equal(x, keep)
    assert isinstance(res.outputs["output"], torch.Tensor)
    assert torch.equal(res.outputs["output"], torch.clamp(keep, min=0))


def test_bad_tensor_inputs_are_named():
    nnet, comp, x, d = _network_case(np.float32)
    bad = torch.from_numpy(x["input"]).clone()
    bad[3, 2] = float("inf")
    with pytest.raises(RuntimeInputError, match=r"non-finite value at row 3, column 2"):
        pynnet3.run(nnet, comp, {"input": bad}, dict(d), backend="torch")
    with pytest.raises(RuntimeInputError, match="expected shape"):
        pynnet3.run(nnet, comp, {"input": bad[:, :3]}, dict(d), backend="torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_clear_error():
    nnet, comp, x, d = _network_case(np.float32)
    with pytest.raises(RuntimeInputError, match="no CUDA device"):
        pynnet3.run(nnet, comp, x, d, backend="torch", device="cuda")
    with pytest.raises(RuntimeInputError, match="device 'gpu0'"):
        pynnet3.run(nnet, comp, x, d, backend="torch", device="gpu0")


def test_numpy_backend_refuses_a_gpu_device():
    nnet, comp, x, d = _network_case(np.float32)
    with pytest.raises(RuntimeInputError, match="CPU only"):
        pynnet3.run(nnet, comp, x, d, device="cuda")


def test_cache_key_holds_the_device():
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=0)
    req = N.request({"input": N.frames(-3, 12)}, {"output": N.frames(0, 8)})
    cc = pynnet3.CachingCompiler(nnet)
    a = cc.compile(req, backend="torch", device="cpu")
    b = cc.compile(req, backend="torch", device="cuda:0")  # compiling needs no GPU
    c = cc.compile(req, backend="torch", device="cuda:0")
    assert cc.info()["misses"] == 2 and cc.info()["hits"] == 1
    assert b is c and a is not b


def test_numpy_users_never_import_torch():
    code = (
        "import sys, numpy as np, pynnet3\n"
        "from tests.compiler import nets as N\n"
        "nnet = pynnet3.Nnet.from_config('input-node name=input dim=2\\n"
        "component name=t type=TanhComponent dim=2\\n"
        "component-node name=t component=t input=input\\noutput-node name=output input=t')\n"
        "req = N.request({'input': N.frames(0, 2)}, {'output': N.frames(0, 2)})\n"
        "pynnet3.run(nnet, req, {'input': np.ones((2, 2), np.float32)})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(
        __import__("pathlib").Path(__file__).resolve().parents[2]))


def test_stepping_api_hands_out_tensors():
    nnet, comp, x, d = _network_case(np.float32)
    from pynnet3.runtime.computer import NnetComputer

    ref = pynnet3.run(nnet, comp, dict(x), dict(d))
    nc = NnetComputer(nnet, comp, backend="torch", device="cpu")
    nc.accept_input("input", torch.from_numpy(x["input"]))
    nc.run_until_io()
    out = nc.get_output("output")
    assert isinstance(out, torch.Tensor)
    assert rel_err(out, ref.outputs["output"]) < 1e-5


@CUDA
def test_network_on_cuda_equals_numpy():
    nnet, comp, x, d = _network_case(np.float64)
    ref = pynnet3.run(nnet, comp, dict(x), dict(d), dtype=np.float64)
    tx = {k: torch.from_numpy(v).cuda() for k, v in x.items()}
    td = {k: torch.from_numpy(v).cuda() for k, v in d.items()}
    got = pynnet3.run(nnet, comp, tx, td, backend="torch", dtype=np.float64, device="cuda")
    assert got.outputs["output"].device.type == "cuda"
    assert rel_err(got.outputs["output"], ref.outputs["output"]) < 1e-10
    assert rel_err(got.input_derivs["input"], ref.input_derivs["input"]) < 1e-10
    for c, g in ref.gradients.items():
        for p, v in g.items():
            assert got.gradients[c][p].device.type == "cuda"
            assert rel_err(got.gradients[c][p], v) < 1e-10, f"{c}:{p}"


def test_cpu_pool_reuses_only_matrices_nobody_holds():
    from pynnet3.runtime.torch_backend import CPU_POOL

    CPU_POOL._free.clear()
    CPU_POOL._bytes = 0
    be = TorchBackend("cpu")
    m = {1: be.zeros(7, 3, np.float32)}
    m[1].fill_(5.0)
    be.release_matrix(m, 1)
    assert 1 not in m and CPU_POOL._bytes == 7 * 3 * 4
    again = be.zeros(7, 3, np.float32)  # the pooled buffer, cleared
    assert CPU_POOL._bytes == 0 and torch.count_nonzero(again) == 0
    # a matrix a view (e.g. a memo) still reads is dropped, never reused
    m = {2: again}
    view = again[2:]
    del again
    be.release_matrix(m, 2)
    assert CPU_POOL._bytes == 0
    fresh = be.zeros(7, 3, np.float32)
    fresh.fill_(1.0)
    assert torch.count_nonzero(view) == 0  # not the same memory
    # a result handed out is a copy
    out = be.copy_out(fresh)
    fresh.fill_(2.0)
    assert torch.all(out == 1.0)


def _run_on_meta(nnet, comp):
    """Run every command with the matrices on torch's ``meta`` device, where
    tensors have shapes but no data: any read of a value on the host (``.item()``,
    ``bool(t)``, a boolean mask, ``.cpu()``) raises. What runs here runs on a GPU
    without waiting for it. (Input validation reads the inputs once per run by
    design; it is stepped over.)"""
    from pynnet3.components.affine import near_zero_refinement
    from pynnet3.computation import CommandType as CT
    from pynnet3.runtime.computer import NnetComputer, RunResult

    nc = NnetComputer(nnet, comp, backend="torch", device="meta")
    given = {}
    for cmd in comp.commands:
        if cmd.type is CT.ACCEPT_INPUT:
            sm = comp.submatrices[cmd.dst]
            given[(cmd.is_deriv, cmd.node)] = torch.zeros(sm.num_rows, sm.num_cols,
                                                          device="meta")
    res = RunResult()
    with near_zero_refinement(nc._has_backward):
        nc._run_all(given, res)
    return res


def test_forward_reads_nothing_back_from_the_device():
    """Decoding makes no host synchronisation: the whole forward computation of a
    network with every common layer type runs on the meta device."""
    nnet = pynnet3.Nnet.from_config(CONFIG, seed=0)
    nnet.set_test_mode(True)
    req = N.request({"input": N.frames(-3, 12, n=2)}, {"output": N.frames(0, 8, n=2)})
    for optimize in (False, True):
        comp = pynnet3.compile(nnet, req, optimize=optimize)
        res = _run_on_meta(nnet, comp)
        assert tuple(res.outputs["output"].shape) == (16, 5)
        assert res.outputs["output"].device.type == "meta"


@needs_reference
@pytest.mark.parametrize("net", ["tdnnf_chain", "tdnn_lstm", "tdnn_relu_bn", "xvector"])
@pytest.mark.parametrize("shape", ["decode", "train"])
def test_realistic_cases_read_nothing_back_from_the_device(net, shape):
    """The reference decode and training computations (the training ones with
    output and model derivatives) of the four realistic networks."""
    nnet = pynnet3.read_nnet(REF / "realistic" / net / "model.txt")
    nnet.set_test_mode(shape == "decode")
    req = pynnet3.ComputationRequest.from_json(
        json.loads((REF / "realistic" / net / shape / "request.json").read_text()))
    comp = pynnet3.compile(nnet, req, optimize=True)
    res = _run_on_meta(nnet, comp)
    assert res.outputs and all(v.device.type == "meta" for v in res.outputs.values())


@pytest.mark.parametrize("kind", [1, 2, 3, 4])
@pytest.mark.parametrize("rng_range", [0.0, 10.0])
def test_compression_on_the_device_equals_numpy(kind, rng_range):
    from pynnet3.runtime.compression import compress, decompress

    x = np.random.default_rng(kind).standard_normal((9, 7)).astype(np.float32) * 4
    x[0, :3] = [0.0, 1e9, -1e9]  # zero, and values clamped at both ends
    ref, got = compress(x, kind, rng_range), compress(torch.from_numpy(x), kind, rng_range)
    assert isinstance(got.data, torch.Tensor) and got.scale == ref.scale
    assert np.array_equal(got.data.numpy().astype(np.int64), ref.data.astype(np.int64))
    out, tout = np.empty_like(x), torch.zeros(9, 7)
    decompress(ref, out)
    decompress(got, tout)
    assert np.array_equal(tout.numpy(), out)


@pytest.mark.parametrize("config", ["IVECTOR", "LOOPED_RNN"])
def test_looped_decoding_on_torch_equals_numpy(config):
    """A looped computation (GOTO_LABEL, the state carried across chunks) steps
    through the torch backend as through NumPy's."""
    from pynnet3.runtime.looped import LoopedOptions, decode_looped
    from tests.runtime.test_looped_decoding import LOOPED_RNN

    nnet = pynnet3.Nnet.from_config(LOOPED_RNN if config == "LOOPED_RNN" else N.IVECTOR,
                                    seed=5)
    N.to_float64(nnet)
    rng = np.random.default_rng(3)
    feats = rng.standard_normal((23, nnet.input_dim("input")))
    iv = rng.standard_normal(nnet.input_dim("ivector"))
    opts = LoopedOptions(frames_per_chunk=5, frame_subsampling_factor=1, acoustic_scale=1.0)
    ref = decode_looped(nnet, feats, iv, opts, dtype=np.float64)
    got = decode_looped(nnet, feats, iv, opts, backend="torch", dtype=np.float64)
    assert isinstance(got, np.ndarray) and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


TRAIN_CONFIG = """
input-node name=input dim=6
component name=a1 type=NaturalGradientAffineComponent input-dim=18 output-dim=8
component-node name=a1 component=a1 input=Append(Offset(input,-1),input,Offset(input,1))
component name=relu type=RectifiedLinearComponent dim=8 self-repair-scale=1e-05
component-node name=relu component=relu input=a1
component name=a2 type=AffineComponent input-dim=8 output-dim=8
component-node name=a2 component=a2 input=relu
component name=sig type=SigmoidComponent dim=8 self-repair-scale=1e-05
component-node name=sig component=sig input=a2
component name=tanh type=TanhComponent dim=8 self-repair-scale=1e-05
component-node name=tanh component=tanh input=sig
component name=bn type=BatchNormComponent dim=8
component-node name=bn component=bn input=tanh
component name=out type=AffineComponent input-dim=8 output-dim=5
component-node name=out component=out input=bn
component name=lsm type=LogSoftmaxComponent dim=5
component-node name=lsm component=lsm input=out
output-node name=output input=lsm objective=linear
"""


def test_training_step_reads_nothing_back_from_the_device():
    """A training step with statistics stored and self-repair running (statistics
    that make it repair) runs on the meta device: the sums stay on the device and
    self-repair reads them there. Reading the statistics afterwards is the wait."""
    nnet = pynnet3.Nnet.from_config(TRAIN_CONFIG, seed=0)
    for name in ("relu", "sig", "tanh"):
        c = nnet.components[name]
        c.count = 10.0
        c.value_sum = np.full(8, 3.0)
        c.deriv_sum = np.linspace(0.0, 10.0, 8)
    req = pynnet3.ComputationRequest(
        [pynnet3.IoSpecification("input", N.frames(-1, 9, n=2), True)],
        [pynnet3.IoSpecification("output", N.frames(0, 8, n=2), True)],
        need_model_derivative=True, store_component_stats=True)
    comp = pynnet3.compile(nnet, req, optimize=True)
    res = _run_on_meta(nnet, comp)
    assert res.input_derivs["input"].device.type == "meta"
    relu = nnet.components["relu"]
    assert set(relu.__dict__["_pending_stats"]) == {"value_sum", "deriv_sum", "oderiv_sumsq",
                                                     "num_dims_self_repaired"}
    assert relu.count == 26.0  # (counts are shapes: known on the host)
    bn = nnet.components["bn"]
    assert set(bn.__dict__["_pending_stats"]) == {"stats_sum", "stats_sumsq"}


def test_chunked_decoding_on_torch_equals_numpy():
    """DecodableNnetSimple (nnet3-compute's chunking) computes its chunks on the
    torch backend and hands out the same NumPy rows."""
    from pynnet3.runtime.simple import DecodableNnetSimple, SimpleOptions

    nnet = pynnet3.Nnet.from_config(N.IVECTOR, seed=5)
    N.to_float64(nnet)
    rng = np.random.default_rng(4)
    feats = rng.standard_normal((31, nnet.input_dim("input")))
    iv = rng.standard_normal(nnet.input_dim("ivector"))
    opts = SimpleOptions(frames_per_chunk=8)
    outs = [DecodableNnetSimple(nnet, pynnet3.CachingCompiler(nnet), feats, opts, ivector=iv,
                                backend=be, dtype=np.float64).output()
            for be in ("numpy", "torch")]
    assert isinstance(outs[1], np.ndarray)
    assert outs[1].shape == outs[0].shape == (31, nnet.output_dim("output"))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12, atol=1e-12)
