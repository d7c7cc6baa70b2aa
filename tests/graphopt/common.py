"""Helpers for network-optimizer tests: build a network from config text, give its
elementwise components non-trivial parameters, make a request that covers the
network's context, and check that an optimized network computes what the original
computes (also after ``nnet.write()`` and ``pynnet3.read_nnet``).

Expected values always come from the unoptimized network (or from arithmetic the
test does itself), never from the optimizer's own output."""

from __future__ import annotations

import numpy as np

import pynnet3
from pynnet3 import ComputationRequest, IoSpecification, NetworkOptions, NetworkReport
from pynnet3.graphopt.meta import PASS_ORDER

# Options with every pass off; ``only("pruning")`` turns one back on.
ALL_OFF = {name: False for name in (*PASS_ORDER, "layout")}


def only(pass_name: str, **extra) -> NetworkOptions:
    return NetworkOptions(**{**ALL_OFF, pass_name: True, **extra})


def build(config: str, seed: int = 0, randomize: bool = True) -> pynnet3.Nnet:
    """``Nnet.from_config`` of ``config`` (leading/trailing blank lines ignored); with
    ``randomize``, fixed per-element maps get random non-trivial parameters (their
    config defaults are often the identity, which pruning would remove instead)."""
    nnet = pynnet3.Nnet.from_config(config.strip(), seed=seed)
    if randomize:
        randomize_elementwise(nnet, np.random.default_rng(seed + 1000))
    return nnet


def randomize_elementwise(nnet: pynnet3.Nnet, rng: np.random.Generator) -> None:
    """Scales in +-[0.5, 1.5], biases/offsets N(0, 1), for the fixed and per-element
    scale/offset components (shapes kept: block dims stay block dims)."""
    for comp in nnet.components.values():
        t = comp.type_name
        if t in ("FixedScaleComponent", "PerElementScaleComponent",
                 "NaturalGradientPerElementScaleComponent", "ScaleAndOffsetComponent"):
            n = comp.scales.shape[0]
            comp.scales = (rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)).astype(
                np.float32)
        if t in ("FixedBiasComponent",):
            comp.bias = rng.standard_normal(comp.bias.shape[0]).astype(np.float32)
        if t in ("PerElementOffsetComponent", "ScaleAndOffsetComponent"):
            comp.offsets = rng.standard_normal(comp.offsets.shape[0]).astype(np.float32)


def request_for(nnet: pynnet3.Nnet, frames: int = 6, seqs: int = 2,
                deriv: bool = False) -> ComputationRequest:
    """Outputs t = 0..frames-1 of every output node for ``seqs`` sequences, every
    input over the network's context; ``deriv`` asks for input derivatives."""
    lc, rc = nnet.left_context, nnet.right_context
    inputs = [IoSpecification(name, np.array([[n, t, 0] for n in range(seqs)
                                              for t in range(-lc, frames + rc)]), deriv)
              for name in nnet.input_names()]
    outputs = [IoSpecification(name, np.array([[n, t, 0] for n in range(seqs)
                                               for t in range(frames)]), deriv)
               for name in nnet.output_names()]
    return ComputationRequest(inputs, outputs)


def data_for(nnet: pynnet3.Nnet, request: ComputationRequest, seed: int = 1):
    rng = np.random.default_rng(seed)
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
              for s in request.inputs}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              for s in request.outputs if s.has_deriv}
    return inputs, derivs


def rel(a, b) -> float:
    """Norm-relative error ||a - b|| / max(||b||, 1e-6)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6))


def run_net(nnet, request, inputs, derivs, dtype=np.float32):
    comp = pynnet3.compile(nnet, request, optimize=True, check=True)
    return pynnet3.run(nnet, comp, inputs, derivs, dtype=dtype)


def assert_equivalent(original, optimized, request=None, *, derivatives: bool = False,
                      tol: float = 1e-5, dtype=np.float32, frames: int = 6) -> None:
    """Outputs (and with ``derivatives`` input derivatives) of ``optimized`` equal
    those of ``original`` within ``tol`` (norm-relative), both compiled with the
    checker on."""
    request = request or request_for(original, frames, deriv=derivatives)
    inputs, derivs = data_for(original, request)
    want = run_net(original, request, inputs, derivs, dtype)
    got = run_net(optimized, request, inputs, derivs, dtype)
    assert set(got.outputs) == set(want.outputs)
    for name, value in want.outputs.items():
        err = rel(got.outputs[name], value)
        assert err <= tol, f"output {name!r}: relative error {err:.3g} > {tol}"
    if derivatives:
        assert want.input_derivs, "the request asked for no input derivatives"
        for name, value in want.input_derivs.items():
            err = rel(got.input_derivs[name], value)
            assert err <= tol, f"input derivative {name!r}: relative error {err:.3g}"


def assert_roundtrip(original, optimized, tmp_path, *, binary: bool = False,
                     tol: float = 1e-5) -> pynnet3.Nnet:
    """``optimized.write()`` gives a Kaldi model that ``read_nnet`` reads back into a
    network computing the original's outputs. Returns the read-back network."""
    path = tmp_path / ("optimized.bin" if binary else "optimized.txt")
    optimized.write(path, binary=binary)
    back = pynnet3.read_nnet(path)
    # (runtime-only fused kernels are written as the standard chain they stand for)
    parts = optimized.to_model_parts()
    assert [n.name for n in back.nodes] == [line.split()[1].removeprefix("name=")
                                            for _, line in parts.config_lines]
    assert sorted(back.components) == sorted(name for name, _ in parts.components)
    assert not any(hasattr(c, "unfused") for c in back.components.values())
    assert_equivalent(original, back, tol=tol)
    return back


def optimize(nnet, options: NetworkOptions | None = None, **kw):
    """(optimized network, report)."""
    report = NetworkReport()
    out = pynnet3.optimize_network(nnet, options, report=report, **kw)
    return out, report


def component_nodes(nnet) -> int:
    return sum(n.kind == "component-node" for n in nnet.nodes)


def types_of(nnet) -> dict[str, str]:
    """Component-node name -> its component's type name."""
    return {n.name: nnet.components[n.component].type_name for n in nnet.nodes
            if n.kind == "component-node"}


def applied(report: NetworkReport, *registries: str) -> dict[str, int]:
    """``report.rules_applied()`` restricted to the rules of the named registries
    (``fold``, ``shatter``, ``parameter``, ``fuse``): a test about one kind of rule
    stays exact when rules of other kinds are added."""
    from pynnet3.rewrite import REGISTRIES

    names = set().union(*(REGISTRIES[r].names() for r in registries))
    return {k: v for k, v in report.rules_applied().items() if k in names}
