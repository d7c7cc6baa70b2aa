"""Random valid nnet3 networks, requests and data, for differential testing.

:func:`random_network` draws a small network (Kaldi config text), a
:class:`~pynnet3.ComputationRequest` it can compute, random inputs and output
derivatives. The networks mix every descriptor kind (Append, Offset, Sum,
IfDefined, Failover, Round, ReplaceIndex, Switch, Const, Scale), recurrences
(plain RNN loops through dim-range nodes, Failover-to-constant starts, LSTM and
GRU nonlinearities, an LSTM built from simple components), non-simple components
(TDNN, time-height convolution, statistics extraction/pooling, attention,
distribute, constant), an optional ``ivector`` input read through
``ReplaceIndex(ivector, t, 0)`` or ``Round(ivector, m)``, and several outputs.
Requests have 1-4 sequences with irregular time sets and row orders, and random
input/output/model derivative and store-stats flags.

Invariants: every config is accepted by :meth:`Nnet.from_config`; every request
compiles (outputs are drawn among the computable cindexes, and a draw that the
compiler still rejects as uncomputable is redrawn); a case depends only on the
generator's state. Dims are 1-20 and sequences 1-15 frames, so a case compiles
and runs in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compiler import ComputationRequest, IoSpecification, compile_computation
from ..compiler.computable import Computability
from ..errors import ComputeError
from ..nnet import Nnet
from .builder import NetBuilder, component_dims
from .layers import LAYERS

_MAX_TRIES = 40


@dataclass
class RandomCase:
    """One generated test case. ``config`` and ``nnet_seed`` rebuild the network;
    ``features`` names what the generator put in (for reports only: coverage tests
    count from the config and request themselves)."""

    config: str
    request: ComputationRequest
    inputs: dict[str, np.ndarray]
    output_derivs: dict[str, np.ndarray]
    nnet_seed: int
    seed: int | None = None
    features: frozenset[str] = field(default_factory=frozenset)

    def build_nnet(self) -> Nnet:
        return Nnet.from_config(self.config, seed=self.nnet_seed)

    def describe(self) -> str:
        """Config and request as text, for failure reports."""
        return f"# seed {self.seed}\n{self.config}\n{self.request}"


def random_network(rng: np.random.Generator, layers: tuple[str, ...] | None = None
                   ) -> RandomCase:
    """Draw a random valid network + computable request + data (see module doc).
    ``layers`` restricts the layer kinds (names of :data:`LAYERS`)."""
    for _ in range(_MAX_TRIES):
        b = NetBuilder(rng, layers)
        b.build()
        config = b.config_text()
        nnet_seed = int(rng.integers(1 << 30))
        nnet = Nnet.from_config(config, seed=nnet_seed)
        for _ in range(4):
            drawn = _random_request(b, nnet, rng)
            if drawn is None:
                continue
            request, features = drawn
            try:
                compile_computation(nnet, request)
            except ComputeError as e:
                if "not computable" in str(e):
                    continue
                raise
            inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
                      for s in request.inputs}
            derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
                      for s in request.outputs if s.has_deriv}
            return RandomCase(config, request, inputs, derivs, nnet_seed,
                              features=frozenset(b.features | features))
    raise RuntimeError(f"random_network: no computable case in {_MAX_TRIES} tries")


def case_for_seed(seed: int, layers: tuple[str, ...] | None = None) -> RandomCase:
    """The case of ``seed`` (``random_network(np.random.default_rng(seed))``)."""
    case = random_network(np.random.default_rng(seed), layers)
    case.seed = seed
    return case


# -- requests ----------------------------------------------------------------------------

def _frames(rng: np.random.Generator, max_frames: int) -> dict[int, np.ndarray]:
    """Sequence number -> its input times: 1-4 sequences (n need not be contiguous),
    1-``max_frames`` frames each (at most 15), sometimes with holes."""
    if rng.random() < 0.35:  # a regular minibatch, as in training
        t0, length = int(rng.integers(-4, 3)), int(rng.integers(1, max_frames + 1))
        return {n: np.arange(t0, t0 + length) for n in range(int(rng.integers(1, 5)))}
    ns = np.sort(rng.choice(6, size=int(rng.integers(1, 5)), replace=False))
    out = {}
    for n in ns.tolist():
        t0 = int(rng.integers(-4, 3))
        ts = np.arange(t0, t0 + int(rng.integers(1, max_frames + 1)))
        if len(ts) > 4 and rng.random() < 0.2:  # a hole or two
            ts = np.delete(ts, rng.choice(np.arange(1, len(ts) - 1), size=int(rng.integers(1, 3)),
                                          replace=False))
        out[n] = ts
    return out


def _order(idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row order of a request matrix: (n, t), (t, n) or shuffled."""
    r = rng.random()
    if r < 0.5:
        return idx[np.lexsort((idx[:, 1], idx[:, 0]))]
    if r < 0.8:
        return idx[np.lexsort((idx[:, 0], idx[:, 1]))]
    return idx[rng.permutation(len(idx))]


def _rows(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.array([[n, t, 0] for n, t in pairs], dtype=np.int64).reshape(-1, 3)


def _random_request(b: NetBuilder, nnet: Nnet, rng: np.random.Generator
                    ) -> tuple[ComputationRequest, set[str]] | None:
    """A request on ``nnet`` whose outputs are computable, or None when the drawn
    frames leave no output computable."""
    frames = _frames(rng, b.max_frames)
    features: set[str] = set()
    inputs = {"input": _rows([(n, t) for n, ts in frames.items() for t in ts.tolist()])}
    if b.ivector_dim:
        if b.ivector_period:  # Round(ivector, m): one ivector every m frames
            m = b.ivector_period
            lo = min(int(ts.min()) for ts in frames.values()) - 2 * m
            hi = max(int(ts.max()) for ts in frames.values()) + 2 * m
            ts_iv = [t for t in range(lo, hi + 1) if t % m == 0]
            inputs["ivector"] = _rows([(n, t) for n in frames for t in ts_iv])
        else:  # ReplaceIndex(ivector, t, 0): one per sequence, at t=0
            inputs["ivector"] = _rows([(n, 0) for n in frames])
        if rng.random() < 0.4:  # try without: fine when descriptors make it optional
            trial = {"input": inputs["input"]}
            comp = Computability(nnet, trial)
            if any(comp.computable(o, _candidates(frames)).any() for o in b.outputs):
                inputs = trial
                features.add("ivector-absent")
        if "ivector" in inputs:
            features.add("ivector-present")
    comp = Computability(nnet, inputs)
    cand = _candidates(frames)
    names = [o for o in b.outputs if rng.random() < 0.8] or [b.outputs[0]]
    outputs = []
    for name in names:
        ok = comp.computable(name, cand)
        idx = cand[ok]
        if not len(idx):
            continue
        if rng.random() < 0.5:  # an irregular subset
            keep = rng.random(len(idx)) < 0.6
            keep[rng.integers(len(idx))] = True
            idx = idx[keep]
        outputs.append(IoSpecification(name, _order(idx, rng), bool(rng.random() < 0.6)))
    if not outputs:
        return None
    input_specs = [IoSpecification(name, _order(idx, rng), bool(rng.random() < 0.35))
                   for name, idx in inputs.items()]
    need_model = bool(rng.random() < 0.5)
    if (need_model or any(s.has_deriv for s in input_specs)) and not any(
            o.has_deriv for o in outputs):
        outputs[int(rng.integers(len(outputs)))].has_deriv = True
    req = ComputationRequest(input_specs, outputs, need_model, bool(rng.random() < 0.4))
    return req, features


def _candidates(frames: dict[int, np.ndarray]) -> np.ndarray:
    """Output candidates: the input frames of each sequence, widened by 2."""
    pairs = []
    for n, ts in frames.items():
        pairs += [(n, t) for t in range(int(ts.min()) - 2, int(ts.max()) + 3)]
    return _rows(pairs)


from .differential import Finding, Variant, default_variants, run_differential  # noqa: E402

__all__ = ["LAYERS", "Finding", "RandomCase", "Variant", "case_for_seed", "component_dims",
           "default_variants", "random_network", "run_differential"]
