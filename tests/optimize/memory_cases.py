# ruff: noqa: E501  (network configs are long lines)
"""Shared by the zeroing / sizing / compression pass tests: reference cases, small
ReLU networks, a backend whose fresh allocations are NaN, and a run-and-compare
helper.

The "undefined" backend makes a read of data that no command defined visible:
our ALLOC_MATRIX gives zeros, which would hide a wrongly removed zeroing, while
Kaldi's leaves garbage. With NaN-filled allocations any such read poisons the
results.
"""

from __future__ import annotations

import copy
import functools

import numpy as np

import pynnet3
from pynnet3.analysis import check_computation
from pynnet3.computation import CommandType as CT
from pynnet3.computation import NnetComputation
from pynnet3.optimize.renumber import renumber
from pynnet3.runtime.backend import register_backend
from pynnet3.runtime.numpy_backend import NumpyBackend
from tests.compiler import nets
from tests.reference import REF, load_case, require_reference

UNDEFINED = "numpy-nan-alloc"  # not differential.py's "numpy-undefined" (finite garbage)


class _UndefinedBackend(NumpyBackend):
    name = UNDEFINED

    def zeros(self, rows, cols, dtype):
        return np.full((rows, cols), np.nan, dtype=dtype)

    alloc = zeros  # (ALLOC_MATRIX asks for alloc)


register_backend(UNDEFINED, _UndefinedBackend)

# A small ReLU network with an in-place-able chain, a Sum descriptor (adds) and
# a dim-range node, trained: every ReLU output is read again by its backprop.
RELU = """
input-node name=input dim=4
component name=affine1 type=AffineComponent input-dim=12 output-dim=6
component-node name=affine1 component=affine1 input=Append(Offset(input, -1), input, Offset(input, 1))
component name=relu1 type=RectifiedLinearComponent dim=6
component-node name=relu1 component=relu1 input=affine1
component name=affine2 type=AffineComponent input-dim=6 output-dim=5
component-node name=affine2 component=affine2 input=Sum(Offset(relu1, -1), relu1)
component name=relu2 type=RectifiedLinearComponent dim=5
component-node name=relu2 component=relu2 input=affine2
dim-range-node name=part input-node=relu2 dim-offset=1 dim=3
component name=affine3 type=AffineComponent input-dim=3 output-dim=3
component-node name=affine3 component=affine3 input=part
output-node name=output input=affine3
"""

REALISTIC = sorted(str(p.parent.relative_to(REF)) for p in (REF / "realistic").rglob(
    "request.json")) if REF.is_dir() else []


@functools.cache
def reference_case(rel: str):
    """(nnet, request, inputs, output_derivs, kaldi stats) of a reference case."""
    case = require_reference() / rel
    base = case if (case / "model.txt").exists() else case.parent
    nnet = pynnet3.read_nnet(base / "model.txt")
    reqj, arrays, stats = load_case(case)
    req = pynnet3.ComputationRequest.from_json(reqj)
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    derivs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("output_deriv:")}
    return nnet, req, inputs, derivs, stats


def small_case(config: str = RELU, n: int = 2, train: bool = True, seed: int = 3):
    """(nnet, request, inputs, output_derivs) for a config from :mod:`tests.compiler.nets`
    (or :data:`RELU`), float32, ``n`` sequences of 6 output frames."""
    nnet = pynnet3.Nnet.from_config(config, seed=seed)
    left, right = nnet.left_context, nnet.right_context
    inputs = {"input": nets.frames(-left - 1, 6 + right + 1, n=n)}
    if "ivector" in config:
        inputs["ivector"] = nets.frames(0, 1, n=n)
    req = nets.request(inputs, {"output": nets.frames(0, 6, n=n)}, input_deriv=train,
                       output_deriv=train, model=train)
    rng = np.random.default_rng(seed)
    return (nnet, req, nets.random_inputs(nnet, req, rng, np.float32),
            nets.random_output_derivs(nnet, req, rng, np.float32))


def apply(c: NnetComputation, nnet, *passes, options=None) -> list[str]:
    """Apply passes in order as the driver does (renumber after a change), checking
    the computation after each; returns their descriptions."""
    out = []
    for p in passes:
        msg = p(c, nnet, options or pynnet3.OptimizeOptions())
        if msg:
            renumber(c)
        check_computation(c, nnet, context=f"after {p.__name__}")
        out.append(msg)
    return out


def run(nnet, c: NnetComputation, inputs, derivs, backend: str = UNDEFINED):
    """Run on a copy of ``nnet`` (runs may store stats in components)."""
    return pynnet3.run(copy.deepcopy(nnet), c, inputs=dict(inputs), output_derivs=dict(derivs),
                       backend=backend)


def assert_same_results(ref, got, exact: bool = False) -> None:
    """Outputs / input derivatives to float32 rounding, gradients to rel 1e-4
    (``exact``: bitwise)."""
    for what in ("outputs", "input_derivs"):
        a, b = getattr(ref, what), getattr(got, what)
        assert a.keys() == b.keys(), what
        for k in a:
            assert np.isfinite(b[k]).all(), f"{what}[{k}] not finite (read of undefined data?)"
            if exact:
                assert np.array_equal(a[k], b[k]), f"{what}[{k}] differs"
            else:
                np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6 * (
                    1 + np.abs(a[k]).max()), err_msg=f"{what}[{k}]")
    assert ref.gradients.keys() == got.gradients.keys()
    for comp, params in ref.gradients.items():
        for p, a in params.items():
            b = got.gradients[comp][p]
            assert np.isfinite(b).all(), f"gradient {comp}.{p} not finite"
            if exact:
                assert np.array_equal(a, b), f"gradient {comp}.{p} differs"
            else:
                err = np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-12)
                assert err <= 1e-4, f"gradient {comp}.{p}: relative error {err}"


def peak_memory_bytes(c: NnetComputation) -> int:
    """Kaldi's GetMaxMemoryUse (4 bytes a float, a compressed element
    ``bytes_per_element(kind)``)."""
    return 4 * c.peak_memory_floats()


def count(c: NnetComputation, t: CT) -> int:
    return sum(cmd.type is t for cmd in c.commands)


def kaldi_histogram(stats: dict) -> dict:
    return stats["optimized"]["command_histogram"]

