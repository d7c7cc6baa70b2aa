"""Torch-vs-NumPy parity for networks whose components keep state (issue 17).

Self-repair, activation statistics, BatchNorm statistics, ClipGradient counters and
the dropout components' random generators change or read the components during a
run. Each backend therefore runs its own copy of the same network (the same
statistics and generator states beforehand): outputs, input derivatives and
gradients must agree (:data:`tests.components.torch_parity.TOL`), and so must every
component's state afterwards (statistics sums, counters, generator positions).
"""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3.components import device_stats
from tests.compiler import nets as N
from tests.components.torch_parity import compare_results, rel_err, run_torch

# the components' state after the runs: float sums in the run's precision
STATE_TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def _state(comp) -> dict:
    """A component's numeric state: float arrays and numbers, generator states
    (statistics still on a device folded in first)."""
    device_stats.flush(comp)
    out = {}
    for k, v in vars(comp).items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            out[k] = v
        elif isinstance(v, (float, int)) and not isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, np.random.Generator):
            out[k] = repr(v.bit_generator.state)
    return out


def _request(inputs: dict, outputs: dict, input_deriv: bool, model: bool, stats: bool):
    return pynnet3.ComputationRequest(
        [pynnet3.IoSpecification(k, v, input_deriv) for k, v in inputs.items()],
        [pynnet3.IoSpecification(k, v, input_deriv or model) for k, v in outputs.items()],
        need_model_derivative=model, store_component_stats=stats)


def check_copies(config: str, inputs: dict, outputs: dict, *, seed: int = 0,
                 dtypes=(np.float64, np.float32), test_mode: bool = False,
                 prepare=None, input_deriv: bool = True, model: bool = True,
                 stats: bool = True, runs: int = 2) -> None:
    """Run copies of one network ``runs`` times on each backend (state carried from
    run to run, as in training) and compare results and component state."""
    nnet = pynnet3.Nnet.from_config(config, seed=seed)
    if test_mode:
        nnet.set_test_mode(True)
    if prepare is not None:
        prepare(nnet)
    req = _request(inputs, outputs, input_deriv, model, stats)
    comp = pynnet3.compile(nnet, req, optimize=True)
    for dtype in dtypes:
        a, b = nnet.copy(), nnet.copy()
        for run in range(runs):
            rng = np.random.default_rng(seed + 1 + run)
            x = N.random_inputs(a, req, rng, dtype)
            d = {s.name: rng.standard_normal((len(s.indexes), a.output_dim(s.name)))
                 .astype(dtype) for s in req.outputs if s.has_deriv}
            ref = pynnet3.run(a, comp, dict(x), dict(d), dtype=dtype)
            got = run_torch(b, comp, x, d, dtype)
            label = f"{np.dtype(dtype).name} run {run}"
            compare_results(ref, got, dtype, label)
            tol = STATE_TOL[np.dtype(dtype)]
            for name in a.components:
                sa, sb = _state(a.components[name]), _state(b.components[name])
                assert sa.keys() == sb.keys(), name
                for k, va in sa.items():
                    vb = sb[k]
                    if isinstance(va, str):
                        assert va == vb, f"{label} {name}.{k}: generator states differ"
                    elif isinstance(va, float):
                        assert abs(va - vb) <= tol * max(1.0, abs(va)), \
                            f"{label} {name}.{k}: {va} != {vb}"
                    else:
                        assert va.shape == vb.shape and rel_err(vb, va) <= tol, \
                            f"{label} {name}.{k}"
