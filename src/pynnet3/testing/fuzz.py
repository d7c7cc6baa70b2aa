"""Mutation fuzzing of pynnet3's inputs: bad input must end as a ``pynnet3.errors``
exception, never as another Python error.

A case mutates one seed input (:mod:`pynnet3.testing.mutate`): a config, a text
or binary model, or request JSON. The mutated input is parsed; when that
succeeds, the network is written back in both forms, a small request is compiled
on it and, when its matrices are small, run. The case passes when it gets through
or stops with a :class:`pynnet3.errors.PynnetError`; any other exception
(``OverflowError``, ``MemoryError``, ``KeyError``, a time-out, ...) is a
*finding*.

Cases are deterministic: case ``i`` of ``fuzz(seed=s)`` mutates with
``numpy.random.default_rng((s, i))``. Seeds are the bundled example config,
random networks of :mod:`pynnet3.testing.random_nets` and, when given, small
cases of the kaldi-reference data. Sizes are bounded twice: the run uses tight
:mod:`pynnet3.limits` (:data:`FUZZ_LIMITS`), and on Linux an address-space cap
turns a blow-up that slips past them into a ``MemoryError`` finding instead of a
swapping machine.
"""

from __future__ import annotations

import collections
import functools
import json
import signal
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .. import limits
from ..compiler import ComputationRequest, IoSpecification
from ..errors import PynnetError
from ..nnet import Nnet, nnet_from_bytes
from .mutate import mutate_binary, mutate_request, mutate_text

KINDS = ("config", "model-text", "model-binary", "request")

# Tight limits keep every case cheap; they are enforced by the same checks as the defaults.
FUZZ_LIMITS = {"max_dim": 2**14, "max_params": 2**22, "max_context": 2**14, "max_modulus": 2**6,
               "max_rows": 2**16, "max_floats": 2**24}
RUN_FLOATS = 2**20  # run a compiled case when its matrices hold at most this many floats


@dataclass(frozen=True)
class Seed:
    """One seed: a network (text model; ``config`` when it came from one) and a
    request JSON it computes."""

    name: str
    model: bytes
    request: str
    config: str | None = None


@dataclass
class Outcome:
    """How one case ended. ``stage`` is how far it got (parse, write, compile,
    run); ``error`` the exception class name (None: it got through)."""

    kind: str
    seed: str
    case: int
    mutation: str
    stage: str
    error: str | None = None
    message: str = ""
    finding: bool = False

    def describe(self) -> str:
        head = f"{self.kind} case {self.case} (seed {self.seed}, {self.mutation}) at {self.stage}"
        return f"{head}: {self.error}: {self.message}" if self.error else head + ": ok"


class CaseTimeout(Exception):
    """A case ran past its time limit (a finding: bad input must fail fast)."""


def probe_request(nnet: Nnet, frames: int = 6) -> ComputationRequest:
    """A small request: ``frames`` output frames of every output of one sequence,
    with the input frames the network's context needs."""
    left, right = nnet.context()
    inputs = []
    for name in nnet.input_names():
        ts = np.arange(-left, frames + right) if name != "ivector" else np.array([0])
        inputs.append(IoSpecification(name, np.stack(
            [np.zeros_like(ts), ts, np.zeros_like(ts)], axis=1)))
    ts = np.arange(frames)
    out = np.stack([np.zeros_like(ts), ts, np.zeros_like(ts)], axis=1)
    return ComputationRequest(inputs, [IoSpecification(n, out) for n in nnet.output_names()])


def default_seeds(reference: Path | None = None, random_cases: int = 6,
                  max_model_bytes: int = 100_000) -> list[Seed]:
    """The bundled TDNN-F example, ``random_cases`` random networks and, from
    ``reference`` (a kaldi-reference folder, optional), the ``generated`` and
    ``components`` cases (one per component type) whose text model is at most
    ``max_model_bytes``."""
    from .random_nets import case_for_seed

    config = resources.files("pynnet3.examples").joinpath("tdnnf.config").read_text()
    nnet = Nnet.from_config(config, seed=1)
    seeds = [Seed("tdnnf", nnet.to_bytes(False), json.dumps(probe_request(nnet).to_json()),
                  config)]
    for k in range(random_cases):
        case = case_for_seed(k)
        seeds.append(Seed(f"random{k}", case.build_nnet().to_bytes(False),
                          json.dumps(case.request.to_json()), case.config))
    folders = [reference / name for name in ("generated", "components")] if reference else []
    for case in sorted(c for folder in folders if folder.is_dir() for c in folder.iterdir()):
        model, request, config = case / "model.txt", case / "request.json", case / "nnet.config"
        if not (model.is_file() and request.is_file()) or (
                model.stat().st_size > max_model_bytes):
            continue
        seeds.append(Seed(f"ref-{case.name}", model.read_bytes(), request.read_text(),
                          config.read_text() if config.is_file() else None))
    return seeds


def run_case(kind: str, seed: Seed, case: int, rng: np.random.Generator) -> Outcome:
    """Mutate ``seed`` for ``kind`` and push the result as far as it goes."""
    out = Outcome(kind, seed.name, case, "", "parse")
    try:
        if kind == "request":
            out.mutation, text = mutate_request(seed.request, rng)
            nnet = _seed_network(seed).copy()
            request = ComputationRequest.from_json_text(text, "<fuzz request>")
        else:
            nnet = _mutated_nnet(kind, seed, out, rng)
            out.stage = "write"
            # (text writing is slow on big models: it formats every float)
            for binary in (True, False) if nnet.num_params() <= 20_000 else (True,):
                nnet_from_bytes(nnet.to_bytes(binary), "<rewritten>")
            nnet.info()
            request = ComputationRequest.from_json_text(seed.request, f"<{seed.name} request>")
        _compile_and_run(nnet, request, out, rng, optimize=bool(case % 2))
    except PynnetError as e:
        out.error, out.message = type(e).__name__, str(e)
    except Exception as e:  # every other exception is what we look for
        out.error, out.finding = type(e).__name__, True
        out.message = f"{e}\n" + "".join(traceback.format_exc(limit=-6))
    return out


def _mutated_nnet(kind: str, seed: Seed, out: Outcome, rng: np.random.Generator) -> Nnet:
    if kind == "config":
        text = seed.config if seed.config is not None else _config_lines(seed.model)
        out.mutation, data = mutate_text(text.encode(), rng)
        return Nnet.from_config(data.decode("utf-8", errors="replace"), seed=0,
                                source="<fuzz config>")
    if kind == "model-text":
        out.mutation, data = mutate_text(seed.model, rng)
    else:
        out.mutation, data = mutate_binary(_seed_binary(seed), rng)
    return nnet_from_bytes(data, "<fuzz model>")


@functools.lru_cache(maxsize=64)
def _seed_network(seed: Seed) -> Nnet:
    """The seed's network, parsed once (callers copy it before running)."""
    return nnet_from_bytes(seed.model, f"<{seed.name}>")


@functools.lru_cache(maxsize=64)
def _seed_binary(seed: Seed) -> bytes:
    return _seed_network(seed).to_bytes(True)


def _config_lines(model: bytes) -> str:
    """The node lines of a text model (a config seed for models read from files)."""
    return model.split(b"\n\n", 1)[0].split(b"\n", 1)[1].decode()


def _compile_and_run(nnet: Nnet, request: ComputationRequest, out: Outcome,
                     rng: np.random.Generator, optimize: bool) -> None:
    from .. import compile as compile_request
    from ..runtime.computer import run

    out.stage = "compile"
    computation = compile_request(nnet, request, optimize=optimize)
    if sum(r * c for r, c in _matrix_sizes(computation)) > RUN_FLOATS:
        return
    out.stage = "run"
    inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
              for s in request.inputs if nnet.has_node(s.name)}
    derivs = {s.name: rng.standard_normal((len(s.indexes), nnet.output_dim(s.name)))
              for s in request.outputs if s.has_deriv}
    run(nnet, computation, inputs, derivs)
    out.stage = "done"


def _matrix_sizes(computation) -> list[tuple[int, int]]:
    return [(int(m.rows), int(m.cols)) for m in computation.matrices]


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the block after ``seconds`` (main thread, Unix)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"case ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def memory_cap(extra_gib: float) -> Iterator[None]:
    """Cap the address space at its current size plus ``extra_gib`` GiB (Linux),
    so that a runaway allocation is a MemoryError; restored afterwards."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * resource.getpagesize()
    except (ImportError, OSError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = current + int(extra_gib * 2**30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def fuzz(cases: int, seed: int = 0, kinds: tuple[str, ...] = KINDS,
         seeds: list[Seed] | None = None, case_seconds: float = 30.0,
         memory_gib: float | None = 4.0, tight_limits: bool = True,
         first: int = 0) -> list[Outcome]:
    """Run cases ``first .. first + cases - 1`` (kinds and seeds taken in turn);
    one Outcome per case."""
    seeds = default_seeds() if seeds is None else seeds
    outcomes = []
    cap = memory_cap(memory_gib) if memory_gib else nullcontext()
    lim = limits.override(**FUZZ_LIMITS) if tight_limits else nullcontext()
    with cap, lim, np.errstate(all="ignore"):
        for i in range(first, first + cases):
            kind = kinds[i % len(kinds)]
            s = seeds[(i // len(kinds)) % len(seeds)]
            rng = np.random.default_rng((seed, i))
            try:
                with time_limit(case_seconds):
                    outcomes.append(run_case(kind, s, i, rng))
            except CaseTimeout as e:
                outcomes.append(Outcome(kind, s.name, i, "?", "?", "CaseTimeout", str(e), True))
    return outcomes


def summarize(outcomes: list[Outcome]) -> str:
    """A table: cases per kind, how they ended (by error class), findings."""
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.kind][o.error or "ok"] += 1
    classes = sorted({c for cnt in by_kind.values() for c in cnt})
    width = max([12] + [len(c) for c in classes])
    lines = [f"{'kind':14}{'cases':>7}  " + "  ".join(f"{c:>{width}}" for c in classes)]
    for kind, cnt in by_kind.items():
        lines.append(f"{kind:14}{sum(cnt.values()):>7}  "
                     + "  ".join(f"{cnt.get(c, 0):>{width}}" for c in classes))
    findings = [o for o in outcomes if o.finding]
    lines.append(f"non-pynnet3 exceptions (findings): {len(findings)}")
    return "\n".join(lines)
