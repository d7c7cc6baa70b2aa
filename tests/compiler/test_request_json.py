"""Request JSON is read strictly: known keys, JSON types, integer index triples, the
JSON path of the bad field in the message (docs/request-json.md). The cases
marked "fuzz" are findings of pynnet3.testing.fuzz (exceptions that were not
pynnet3 errors, or requests read as something else)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from pynnet3 import ComputationRequest, limits
from pynnet3.errors import ComputeError, FormatError

GOOD = {"inputs": [{"name": "input", "indexes": [[0, -1, 0], [0, 0, 0], [0, 1, 0]],
                    "has_deriv": False}],
        "outputs": [{"name": "output", "indexes": [[0, 0, 0]], "has_deriv": True}],
        "need_model_derivative": True, "store_component_stats": False}


def _with(path: tuple, value) -> dict:
    obj = copy.deepcopy(GOOD)
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return obj


def test_good_request_and_defaults():
    req = ComputationRequest.from_json(GOOD)
    assert req.need_model_derivative and not req.store_component_stats
    assert req.outputs[0].has_deriv and not req.inputs[0].has_deriv
    np.testing.assert_array_equal(req.inputs[0].indexes, GOOD["inputs"][0]["indexes"])
    minimal = ComputationRequest.from_json({"outputs": [{"name": "o", "indexes": [[0, 0, 0]]}]})
    assert minimal.inputs == [] and not minimal.need_model_derivative
    assert not minimal.outputs[0].has_deriv
    assert ComputationRequest.from_json(req.to_json()).to_json() == req.to_json()


@pytest.mark.parametrize("path,value,where,what", [
    # fuzz: OverflowError from numpy on ints beyond int64
    (("outputs", 0, "indexes", 0, 1), 10**30, r"outputs\[0\]\.indexes\[0\]\[1\]",
     "out of range"),
    (("inputs", 0, "indexes", 2, 2), 2**63, r"inputs\[0\]\.indexes\[2\]\[2\]", "out of range"),
    (("outputs", 0, "indexes", 0, 1), 10**9, r"outputs\[0\]\.indexes\[0\]\[1\]",
     r"t must lie in \[-33554432, 33554432\)"),
    (("inputs", 0, "indexes", 1, 0), -(2**18) - 1, r"inputs\[0\]\.indexes\[1\]\[0\]",
     "n must lie"),
    # was read as an integer (truncated / converted)
    (("inputs", 0, "indexes", 1, 1), 1.7, r"inputs\[0\]\.indexes\[1\]\[1\]",
     "expected an integer, got 1.7"),
    (("inputs", 0, "indexes", 1, 1), 1.0, r"inputs\[0\]\.indexes\[1\]\[1\]",
     "expected an integer"),
    (("inputs", 0, "indexes", 1, 1), "3", r"inputs\[0\]\.indexes\[1\]\[1\]",
     'expected an integer, got "3"'),
    (("inputs", 0, "indexes", 1, 1), True, r"inputs\[0\]\.indexes\[1\]\[1\]",
     "expected an integer, got true"),
    (("inputs", 0, "indexes", 1), [0, 1], r"inputs\[0\]\.indexes\[1\]",
     r"three integers \[n, t, x\]"),
    (("inputs", 0, "indexes", 1), 5, r"inputs\[0\]\.indexes\[1\]", "three integers"),
    (("inputs", 0, "indexes"), 2**63, r"inputs\[0\]\.indexes", "a list of"),  # fuzz
    (("inputs", 0, "indexes"), {"n": 0}, r"inputs\[0\]\.indexes", "a list of"),
    # "false" was true
    (("outputs", 0, "has_deriv"), "false", r"outputs\[0\]\.has_deriv", "true or false"),
    (("outputs", 0, "has_deriv"), 0, r"outputs\[0\]\.has_deriv", "true or false"),
    (("outputs", 0, "has_deriv"), None, r"outputs\[0\]\.has_deriv", "true or false, got null"),
    (("need_model_derivative",), "true", "need_model_derivative", "true or false"),
    (("store_component_stats",), 1, "store_component_stats", "true or false"),
    # fuzz: TypeError (unhashable name; int not iterable)
    (("outputs", 0, "name"), [0, 0], r"outputs\[0\]\.name", "node name"),
    (("outputs", 0, "name"), "", r"outputs\[0\]\.name", "node name"),
    (("outputs",), -1, "outputs", "a list"),
    (("inputs",), 1.5, "inputs", "a list"),
    (("outputs", 0), "output", r"outputs\[0\]", "a JSON object"),
    (("outputs",), [], "outputs", "at least one output"),
])
def test_bad_field_is_named_by_its_json_path(path, value, where, what):
    with pytest.raises(ComputeError, match=f"req.json: {where}: .*{what}"):
        ComputationRequest.from_json(_with(path, value), "req.json")


@pytest.mark.parametrize("mutate,where", [
    (lambda o: o.update(output=o.pop("outputs")), "output: unknown key"),  # was an empty request
    (lambda o: o.pop("outputs"), "outputs: missing"),
    (lambda o: o.update(extra=1), "extra: unknown key"),
    (lambda o: o["inputs"][0].update(hasDeriv=True), r"inputs\[0\]\.hasDeriv: unknown key"),
    (lambda o: o["outputs"][0].pop("indexes"), r"outputs\[0\]\.indexes: missing"),
    (lambda o: o["inputs"][0].pop("name"), r"inputs\[0\]\.name: missing"),
])
def test_keys_are_checked(mutate, where):
    obj = copy.deepcopy(GOOD)
    mutate(obj)
    with pytest.raises(ComputeError, match=where):
        ComputationRequest.from_json(obj)


@pytest.mark.parametrize("top", [[GOOD], "request", 3, None])
def test_top_level_must_be_an_object(top):  # fuzz: a list was an AttributeError
    with pytest.raises(ComputeError, match=r"\(top level\): expected a JSON object"):
        ComputationRequest.from_json(top)
    with pytest.raises(ComputeError, match="expected a JSON object"):
        ComputationRequest.from_json_text(json.dumps(top))


def test_from_json_text():
    req = ComputationRequest.from_json_text(json.dumps(GOOD).encode(), "r.json")
    assert req.to_json() == ComputationRequest.from_json(GOOD).to_json()
    with pytest.raises(FormatError, match="r.json, line 2: not valid JSON"):
        ComputationRequest.from_json_text('{"outputs":\n [}', "r.json")
    with pytest.raises(FormatError, match="not valid JSON"):
        ComputationRequest.from_json_text(b"\xff\xfe{", "r.json")
    with pytest.raises(FormatError, match="nested too deeply"):
        ComputationRequest.from_json_text("[" * 100000 + "]" * 100000, "r.json")


def test_io_specification_name_must_be_a_string():  # fuzz: TypeError in the compiler
    from pynnet3 import IoSpecification

    with pytest.raises(ComputeError, match="name must be a string"):
        IoSpecification(["output"], [[0, 0, 0]])


def test_number_of_indexes_is_limited():
    with limits.override(max_rows=2):
        with pytest.raises(ComputeError, match=r"inputs\[0\]\.indexes: number of indexes = 3 "
                                               "exceeds the limit max_rows = 2"):
            ComputationRequest.from_json(GOOD)
