"""pynnet3.testing.fuzz: a bounded mutation fuzz of configs, models and request
JSON; every case must end successfully or with a pynnet3.errors exception.
(benchmarks/fuzz_soak.py runs the long version.)"""

from __future__ import annotations

import collections
import json
import time

import numpy as np
import pytest

from pynnet3.errors import ConfigError
from pynnet3.testing import fuzz as fz
from pynnet3.testing.mutate import mutate_binary, mutate_request, mutate_text
from tests.reference import REF


@pytest.fixture(scope="module")
def seeds():
    return fz.default_seeds(random_cases=3)


def test_bounded_fuzz_finds_nothing(seeds):
    outcomes = fz.fuzz(240, seed=14, seeds=seeds)
    findings = [o.describe() for o in outcomes if o.finding]
    assert not findings, "\n\n".join(findings[:5])
    by_kind = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.kind]["ok" if o.error is None else "error"] += 1
    assert set(by_kind) == set(fz.KINDS)
    for kind, count in by_kind.items():  # both ends are exercised, for every kind
        assert count["ok"] > 0 and count["error"] > 0, (kind, count)
    assert any(o.stage == "done" for o in outcomes)  # some mutated inputs ran through
    table = fz.summarize(outcomes)
    assert "non-pynnet3 exceptions (findings): 0" in table and "model-binary" in table


def test_cases_are_deterministic(seeds):
    def key(outcomes):
        return [(o.kind, o.seed, o.mutation, o.stage, o.error) for o in outcomes]

    assert key(fz.fuzz(16, seed=3, seeds=seeds)) == key(fz.fuzz(16, seed=3, seeds=seeds))
    assert key(fz.fuzz(16, seed=3, seeds=seeds)) != key(fz.fuzz(16, seed=4, seeds=seeds))


def test_mutations_are_seeded_and_change_the_input(seeds):
    text, binary = seeds[0].model, fz.nnet_from_bytes(seeds[0].model).to_bytes(True)
    for mutate, data in ((mutate_text, text), (mutate_binary, binary),
                         (mutate_request, seeds[0].request)):
        runs = [[mutate(data, np.random.default_rng((7, i))) for i in range(30)]
                for _ in range(2)]
        assert runs[0] == runs[1]
        changed = sum(out != data for _, out in runs[0])
        assert changed >= 25, (mutate.__name__, changed)
        assert len({desc.split()[0] for desc, _ in runs[0]}) >= 4  # several kinds of mutation
    assert json.loads(seeds[0].request)["outputs"]


def test_other_exceptions_are_findings(seeds, monkeypatch):
    def fail(exc):
        def from_config(*args, **kwargs):
            raise exc
        return from_config

    monkeypatch.setattr(fz.Nnet, "from_config", fail(KeyError("x")))
    out = fz.fuzz(1, seeds=seeds, kinds=("config",))[0]
    assert out.finding and out.error == "KeyError" and out.stage == "parse"
    assert "KeyError" in out.describe() and "Traceback" in out.message
    monkeypatch.setattr(fz.Nnet, "from_config", fail(ConfigError("bad", 3)))
    out = fz.fuzz(1, seeds=seeds, kinds=("config",))[0]
    assert not out.finding and out.error == "ConfigError"


def test_slow_case_is_a_finding(seeds, monkeypatch):
    monkeypatch.setattr(fz, "run_case", lambda *args: time.sleep(5))
    t0 = time.perf_counter()
    out = fz.fuzz(1, seeds=seeds, case_seconds=0.2)[0]
    assert time.perf_counter() - t0 < 3
    assert out.finding and out.error == "CaseTimeout"


def test_reference_seeds_when_present():
    if not (REF / "generated").is_dir():
        pytest.skip("kaldi-reference not available (the fuzz does not need it)")
    seeds = fz.default_seeds(REF, random_cases=0)
    assert len(seeds) > 1 and all(s.name.startswith(("tdnnf", "ref-")) for s in seeds)
    outcomes = fz.fuzz(24, seed=5, seeds=seeds[1:4])
    assert not [o.describe() for o in outcomes if o.finding]
