"""The compile-cache file is data, not code (pynnet3.cache.persist, format 4, and
pynnet3.cache.plain): loaded computations equal freshly compiled ones and run to
the same numbers, for networks whose components precompute indexes; a file that
holds a pickle is refused without running it; hand-edited contents are a
FormatError at load, never an IndexError later."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import pickle
import struct
import warnings

import numpy as np
import pytest

import pynnet3
from pynnet3.cache import CachingCompiler, plain
from pynnet3.cache.persist import FORMAT, VERSION
from pynnet3.computation import Command, NnetComputation
from pynnet3.errors import FormatError, PynnetError
from pynnet3.testing.random_nets import case_for_seed
from tests.cache.common import assert_same_results, frames, random_data, request, run_on_copy
from tests.compiler import nets


def _net(body: str, dim: int) -> str:
    return f"input-node name=input dim={dim}\n{body}output-node name=output input=c\n"


# name -> (config, input frames [t0, t1), output frames [t0, t1)); one network per
# component type that precomputes indexes, plus the old convolution
NETS = {
    "tdnn": (_net("component name=c type=TdnnComponent input-dim=4 output-dim=3 "
                  "time-offsets=-2,0,1\ncomponent-node name=c component=c input=input\n", 4),
             (-2, 8), (0, 6)),
    "time_height_conv": (_net(
        "component name=c type=TimeHeightConvolutionComponent num-filters-in=1 "
        "num-filters-out=2 height-in=3 height-out=3 time-offsets=-1,0,1 "
        "height-offsets=-1,0,1 required-time-offsets=0\n"
        "component-node name=c component=c input=input\n", 3), (-1, 7), (0, 6)),
    "statistics": (nets.STATS, (0, 12), (0, 12)),
    "general_dropout": (_net(
        "component name=c type=GeneralDropoutComponent dim=4 block-dim=2 time-period=3 "
        "dropout-proportion=0.4\ncomponent-node name=c component=c input=input\n", 4),
        (0, 6), (0, 6)),
    "specaugment": (_net(
        "component name=c type=SpecAugmentTimeMaskComponent dim=3 zeroed-proportion=0.5 "
        "time-mask-max-frames=2\ncomponent-node name=c component=c input=input\n", 3),
        (0, 6), (0, 6)),
    "dropout": (_net("component name=c type=DropoutComponent dim=3 dropout-proportion=0.5\n"
                     "component-node name=c component=c input=input\n", 3), (0, 5), (0, 5)),
    "backprop_truncation": (_net(
        "component name=c type=BackpropTruncationComponent dim=2 clipping-threshold=0 "
        "zeroing-threshold=0.001 zeroing-interval=4 recurrence-interval=1\n"
        "component-node name=c component=c input=input\n", 2), (0, 9), (0, 9)),
    "attention": (_net(
        "component name=c type=RestrictedAttentionComponent key-dim=4 value-dim=3 "
        "num-left-inputs=2 num-right-inputs=1 num-left-inputs-required=1\n"
        "component-node name=c component=c input=input\n", 15), (-2, 8), (0, 6)),
    "convolution": (_net(
        "component name=c type=ConvolutionComponent input-x-dim=4 input-y-dim=5 "
        "input-z-dim=2 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 filt-y-step=2 "
        "num-filters=2\ncomponent-node name=c component=c input=input\n", 40),
        (0, 4), (0, 4)),
}


def _case(name: str, n_seqs: int):
    cfg, (i0, i1), (o0, o1) = NETS[name]
    nnet = pynnet3.Nnet.from_config(cfg, seed=5)
    nets.to_float64(nnet)
    outs = frames(n_seqs, o0, o1)
    if name == "statistics":
        outs = outs[np.isin(outs[:, 1], [0, 6])]
    req = request({"input": frames(n_seqs, i0, i1)}, {"output": outs},
                  input_deriv=True, output_deriv=True, model=True)
    return nnet, req


def _same_computation(a: NnetComputation, b: NnetComputation) -> None:
    """Equal listings and equal precomputed objects (as plain data)."""
    assert str(a) == str(b) and a.stats() == b.stats()
    assert [type(p) for p in a.precomputed] == [type(p) for p in b.precomputed]
    for p, q in zip(a.precomputed[1:], b.precomputed[1:], strict=True):
        da, db = p.to_data(), q.to_data()
        assert da.keys() == db.keys()
        for k in da:
            assert np.array_equal(np.asarray(da[k]), np.asarray(db[k])), k


@pytest.mark.parametrize("shortcut", [False, True])
@pytest.mark.parametrize("name", sorted(NETS))
def test_loaded_computations_equal_fresh_ones(tmp_path, name, shortcut):
    """Save, load into a new compiler: the request hits the loaded entry, whose
    listing and precomputed objects equal the fresh compile's and whose run gives
    exactly the same outputs, derivatives and gradients; with the shortcut, the
    loaded two-sequence computation expands to a new N without compiling."""
    nnet, req = _case(name, 4)
    cc = CachingCompiler(nnet, use_shortcut=shortcut)
    fresh = cc.compile(req)
    path = tmp_path / "cache"
    cc.save(path)
    other = CachingCompiler(nnet, use_shortcut=shortcut)
    assert other.load(path) == len(cc)
    loaded = other.compile(req)
    assert other.info()["hits"] == 1 and other.info()["misses"] == 0
    _same_computation(loaded, fresh)
    if name in ("tdnn", "time_height_conv", "statistics", "attention"):
        assert any(p is not None for p in loaded.precomputed)
    inputs, derivs = random_data(nnet, req)
    assert_same_results(run_on_copy(nnet, loaded, inputs, derivs),
                        run_on_copy(nnet, fresh, inputs, derivs), rtol=0.0)
    if shortcut:
        assert other.info()["shortcut"] == 0  # (served from the file, not expanded)
        _, req5 = _case(name, 5)
        five = other.compile(req5)
        assert other.info()["misses"] == 1 and other.info()["shortcut"] == 1
        inputs, derivs = random_data(nnet, req5)
        assert_same_results(run_on_copy(nnet, five, inputs, derivs),
                            run_on_copy(nnet, pynnet3.compile(nnet, req5), inputs, derivs))


@pytest.mark.parametrize("seed", range(12))
def test_random_networks_round_trip(tmp_path, seed):
    """Random networks (every descriptor and non-simple component kind, irregular
    requests), optimized and not: loaded computations equal the fresh ones."""
    layers = (None, ("attention", "ff"), ("distribute", "ff"), ("thconv", "stats"))[seed % 4]
    case = case_for_seed(seed, layers)
    nnet = case.build_nnet()
    for optimize in (True, False):
        cc = CachingCompiler(nnet, optimize=optimize)
        fresh = cc.compile(case.request)
        cc.save(tmp_path / "c")
        other = CachingCompiler(nnet, optimize=optimize)
        other.load(tmp_path / "c")
        loaded = other.compile(case.request)
        assert other.info()["misses"] == 0
        _same_computation(loaded, fresh)
        assert_same_results(run_on_copy(nnet, loaded, case.inputs, case.output_derivs),
                            run_on_copy(nnet, fresh, case.inputs, case.output_derivs),
                            rtol=0.0)


def test_every_field_of_a_computation_is_stored():
    """The plain form names every field of Command and NnetComputation: a field
    added later must be added to the file format too (this test then fails)."""
    stored = set(plain._INT_FIELDS) | {"type", "alpha", "node"}
    assert stored == {f.name for f in dataclasses.fields(Command)}
    comp_fields = {f.name for f in dataclasses.fields(NnetComputation)} - {"_whole"}
    assert comp_fields | {"whole"} == set(plain._COMPUTATION_FIELDS)


# -- files that are not what they claim -------------------------------------------------
class _Marker:
    """Unpickling this creates a file: the proof that a pickle ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _digested(version: int, payload: bytes) -> bytes:
    return f"{FORMAT} {version}\n".encode() + hashlib.sha256(payload).digest() + payload


@pytest.mark.parametrize("form", ["payload", "version 3", "bare"])
def test_a_pickle_is_never_run(tmp_path, form):
    """A file carrying a pickle whose loading would create a marker file: as the
    payload of a format-4 file (FormatError), as a format-3 file (warning,
    nothing loaded) or as a bare pickle naming the format (version-2 warning):
    the marker is never created."""
    marker = tmp_path / "marker"
    evil = pickle.dumps({"format": FORMAT, "version": VERSION, "entries": [],
                         "x": _Marker(str(marker))}, protocol=pickle.HIGHEST_PROTOCOL)
    path = tmp_path / "cache"
    cc = CachingCompiler(pynnet3.Nnet.from_config(NETS["tdnn"][0]))
    if form == "payload":
        path.write_bytes(_digested(VERSION, evil))
        with pytest.raises(FormatError, match="not a pynnet3 compile cache"):
            cc.load(path)
    else:
        path.write_bytes(_digested(3, evil) if form == "version 3" else evil)
        with pytest.warns(UserWarning, match=f"version {3 if form == 'version 3' else 2} "
                                             f"is not {VERSION}"):
            assert cc.load(path) == 0
    assert not marker.exists()
    pickle.loads(evil)  # (the test's own check that the payload does what it says)
    assert marker.exists()


def _parts(path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    payload = data.partition(b"\n")[2][32:]
    (size,) = struct.unpack_from("<Q", payload)
    return json.loads(payload[8:8 + size]), payload[8 + size + (-size % 8):]


def _write(path, head: dict, blob: bytes) -> None:
    text = json.dumps(head).encode()
    path.write_bytes(_digested(VERSION, struct.pack("<Q", len(text)) + text
                               + b"\0" * (-len(text) % 8) + blob))


def _saved(tmp_path, name="tdnn", shortcut=True):
    nnet, req = _case(name, 4)
    cc = CachingCompiler(nnet, use_shortcut=shortcut)
    cc.compile(req)
    cc.save(tmp_path / "cache")
    return nnet, req, tmp_path / "cache"


def _load_error(nnet, path, shortcut=True, optimize=True) -> str:
    with pytest.raises(FormatError) as e:
        CachingCompiler(nnet, optimize=optimize, use_shortcut=shortcut).load(path)
    return str(e.value)[len(str(path)) + 2:]  # (without the file name)


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["entries"][0]["value"]["mini"]["precomputed"].__setitem__(
        1, ["Popen", {"args": 1}]), "not a known precomputed-indexes class"),
    (lambda h: h["entries"][0]["value"]["mini"]["commands"]["types"].__setitem__(
        0, "kRunShell"), "unknown command type"),
    (lambda h: h["arrays"][0].__setitem__(0, "|O"), "bad table entry"),
    (lambda h: h["arrays"][0].__setitem__(1, [10**9]), "past the end"),
    (lambda h: h["entries"][0]["value"].__setitem__("computation", {}), "neither"),
    (lambda h: h["entries"][0].__setitem__("key", {"a": 1}), "holds a dict"),
    (lambda h: h["entries"][0]["value"]["mini"]["matrices"]["node"].pop(), "matrix fields"),
    (lambda h: h.__setitem__("entries", "x"), "no entry list"),
])
def test_edited_headers_are_refused(tmp_path, edit, message):
    nnet, _, path = _saved(tmp_path)
    head, blob = _parts(path)
    edit(head)
    _write(path, head, blob)
    assert message in _load_error(nnet, path)


def _array_of(head, blob, ref) -> np.ndarray:
    dtype, shape, offset = head["arrays"][ref]
    return np.frombuffer(blob, dtype=dtype, count=int(np.prod(shape)), offset=offset
                         ).reshape(shape)


def _with_array(path, head, blob, ref, new: np.ndarray) -> None:
    """The file with array ``ref`` replaced by ``new`` (appended at the end)."""
    head = copy.deepcopy(head)
    blob = blob + b"\0" * (-len(blob) % 8)
    head["arrays"][ref] = [new.dtype.str, list(new.shape), len(blob)]
    _write(path, head, blob + new.tobytes())


@pytest.mark.parametrize("name, field, change, message", [
    ("tdnn", "src", lambda a: a + 100, "values outside"),  # rows past the input
    ("tdnn", "src", lambda a: a[:1], "time offsets"),  # offsets the component lacks
    ("statistics", "lo", lambda a: a[:-1], "shape"),
    ("statistics", "perm", lambda a: a - 5, "values outside"),
    ("attention", "context_rows", lambda a: a[:, :2], "context of 2"),
    ("general_dropout", "output_indexes", lambda a: a[:-1], "made for"),
])
def test_bad_precomputed_indexes_are_refused(tmp_path, name, field, change, message):
    """Precomputed objects are checked against their own fields, the component
    reading them and the rows of its commands."""
    nnet, _, path = _saved(tmp_path, name, shortcut=False)
    head, blob = _parts(path)
    pre = head["entries"][0]["value"]["computation"]["precomputed"]
    if field == "src" and all("starts" in d[1] for d in pre[1:]):
        field = "starts"  # (the TDNN's rows are runs: it stores their starts)
    data = next(d for d in pre if d is not None and field in d[1])[1]
    ref = data[field]["array"]
    _with_array(path, head, blob, ref, np.ascontiguousarray(change(_array_of(head, blob, ref))))
    assert message in _load_error(nnet, path, shortcut=False)


def test_a_computation_that_fails_the_checker_is_refused(tmp_path):
    """A well-formed file whose computation is wrong (a matrix's allocation made a
    deallocation) is a FormatError naming the checker's finding."""
    nnet = pynnet3.Nnet.from_config(nets.TDNN, seed=1)
    req = request({"input": frames(1, -3, 9)}, {"output": frames(1, 0, 6)})
    cc = CachingCompiler(nnet, optimize=False)
    cc.compile(req)
    cc.save(tmp_path / "c")
    head, blob = _parts(tmp_path / "c")
    commands = head["entries"][0]["value"]["computation"]["commands"]
    ref = commands["type_node"]
    codes = _array_of(head, blob, ref).copy()
    alloc = codes[:, 0] == commands["types"].index("kAllocMatrix")
    codes[np.argmax(alloc), 0] = commands["types"].index("kDeallocMatrix")
    _with_array(tmp_path / "c", head, blob, ref, codes)
    assert "computation check failed" in _load_error(nnet, tmp_path / "c", optimize=False)


def test_random_edits_give_a_format_error_or_a_working_cache(tmp_path):
    """Change one number at a time (an int in the header's entries or an element of
    an int array) with the digest fixed up: loading either raises FormatError, or
    succeeds and the loaded cache compiles and runs (expanding its two-sequence
    computation too) with no error other than a pynnet3 one."""
    nnet, req, path = _saved(tmp_path, "tdnn")
    head, blob = _parts(path)
    slots = []  # the path of every int in the entries

    def walk(x, steps):
        for k, v in (enumerate(x) if isinstance(x, list) else x.items()):
            if type(v) is int:
                slots.append((*steps, k))
            elif isinstance(v, (list, dict)):
                walk(v, (*steps, k))

    walk(head["entries"], ())
    ints = [k for k, spec in enumerate(head["arrays"]) if spec[0] == "<i8"
            and np.prod(spec[1]) > 0]
    rng = np.random.default_rng(0)
    _, req5 = _case("tdnn", 5)
    inputs, derivs = random_data(nnet, req5)
    outcomes = {"refused": 0, "loaded": 0}
    for trial in range(150):
        h, b = copy.deepcopy(head), bytearray(blob)
        if trial % 2:
            *steps, k = slots[rng.integers(len(slots))]
            where = h["entries"]
            for step in steps:
                where = where[step]
            where[k] = int(where[k] + rng.choice([-2, -1, 1, 7, 10**6]))
        else:
            ref = ints[rng.integers(len(ints))]
            dtype, shape, offset = h["arrays"][ref]
            pos = offset + 8 * int(rng.integers(int(np.prod(shape))))
            value = int(np.frombuffer(b, "<i8", 1, pos)[0]) + int(rng.choice([-3, -1, 1, 50]))
            b[pos:pos + 8] = np.int64(value).tobytes()
        _write(path, h, bytes(b))
        cc = CachingCompiler(nnet)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cc.load(path)
        except FormatError:
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        for r, (i, d) in ((req, random_data(nnet, req)), (req5, (inputs, derivs))):
            try:
                pynnet3.run(nnet, cc.compile(r), i, d)
            except PynnetError:
                pass
    assert outcomes["refused"] > 20 and outcomes["loaded"] > 20, outcomes


def test_an_entry_that_cannot_be_stored_is_left_out_with_a_warning(tmp_path):
    """A precomputed object of a class that is not registered as plain data (a
    user's component) is not written; the other entries are."""
    nnet, req = _case("tdnn", 1)
    cc = CachingCompiler(nnet, use_shortcut=False)
    comp = cc.compile(req)
    cc.compile(_case("tdnn", 2)[1])
    comp.precomputed[1] = type("Private", (), {})()
    with pytest.warns(UserWarning, match="1 compile-cache entry not saved: .*Private"):
        cc.save(tmp_path / "c")
    assert CachingCompiler(nnet, use_shortcut=False).load(tmp_path / "c") == 1


def test_the_file_is_not_executable_data(tmp_path):
    """No pickle opcode stream anywhere: the payload is a JSON header and arrays."""
    _, _, path = _saved(tmp_path)
    head, blob = _parts(path)
    assert head["format"] == FORMAT and head["version"] == VERSION
    assert {spec[0] for spec in head["arrays"]} <= {"<i8", "<f8", "<f4"}
    assert os.path.getsize(path) > len(blob)
