"""The compile-cache file (pynnet3.cache.persist): what its network fingerprint
sees, and how damaged, foreign or old files are refused before any entry is used."""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import warnings

import pytest

import pynnet3
from pynnet3.cache import CachingCompiler
from pynnet3.cache.persist import FORMAT, VERSION, nnet_fingerprint
from pynnet3.errors import FormatError
from tests.cache.common import frames, request

_CONV = (
    "input-node name=input dim=3\n"
    "component name=conv type=TimeHeightConvolutionComponent num-filters-in=1 "
    "num-filters-out=2 height-in=3 height-out=3 time-offsets={} height-offsets=0 "
    "required-time-offsets=0\n"
    "component-node name=conv component=conv input=input\n"
    "output-node name=output input=conv\n")
_TDNN = """
input-node name=input dim=4
component name=a type=TdnnComponent input-dim=4 output-dim=4 time-offsets=-1,0,1
component-node name=a component=a input=input
output-node name=output input=a
"""


def _req(t0=-3, t1=9):
    return request({"input": frames(1, t0, t1)}, {"output": frames(1, 0, 6)},
                   input_deriv=True, output_deriv=True, model=True)


def _saved(tmp_path) -> tuple:
    nnet = pynnet3.Nnet.from_config(_TDNN, seed=1)
    cc = CachingCompiler(nnet, use_shortcut=False)
    cc.compile(_req(-1, 7))
    path = tmp_path / "cache.bin"
    cc.save(path)
    return nnet, path


def test_fingerprint_sees_nested_settings():
    """Convolution offsets are a list of (t, h) pairs: two networks differing only
    there are different structures, and a cache of one is not used by the other."""
    a = pynnet3.Nnet.from_config(_CONV.format("-1,0,1"), seed=1)
    b = pynnet3.Nnet.from_config(_CONV.format("-2,0,2"), seed=1)
    assert nnet_fingerprint(a) != nnet_fingerprint(b)
    assert nnet_fingerprint(a) == nnet_fingerprint(
        pynnet3.Nnet.from_config(_CONV.format("-1,0,1"), seed=2))  # weights don't count


def test_every_single_byte_change_is_refused(tmp_path):
    """Flipping any one byte of a saved cache never loads an entry: the digest (or
    the header) catches it, with a FormatError or a version warning."""
    nnet, path = _saved(tmp_path)
    data = path.read_bytes()
    assert CachingCompiler(nnet, use_shortcut=False).load(path) == 1
    bad = tmp_path / "bad.bin"
    refused = warned = 0
    for i in range(len(data)):
        b = bytearray(data)
        b[i] ^= 0x5A
        bad.write_bytes(bytes(b))
        cc = CachingCompiler(nnet, use_shortcut=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                added = cc.load(bad)
            except FormatError:
                refused += 1
                continue
        assert added == 0 and len(cc) == 0, f"byte {i}: {added} entries loaded"
        assert any("version" in str(w.message) for w in caught), f"byte {i}"
        warned += 1
    assert refused > 0.9 * len(data) and refused + warned == len(data)


def test_truncated_file_is_refused(tmp_path):
    nnet, path = _saved(tmp_path)
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 40):
        path.write_bytes(data[:cut])
        with pytest.raises(FormatError):
            CachingCompiler(nnet).load(path)


def _write(path, head: dict) -> None:
    """A format-4 file with this JSON header and no array data."""
    text = json.dumps(head).encode()
    payload = struct.pack("<Q", len(text)) + text + b"\0" * (-len(text) % 8)
    path.write_bytes(f"{FORMAT} {VERSION}\n".encode() + hashlib.sha256(payload).digest()
                     + payload)


@pytest.mark.parametrize("entries, message", [
    ("not a list", "no entry list"),
    ([{"nnet": "x"}], "entry 0 is malformed: fields missing"),
    ([{"nnet": "x", "options": "y", "pynnet3": "z", "key": [], "arrays": [0],
       "shift": [0, 0], "value": None}], "entry 0 is malformed: request indexes: no array 0"),
    ([{"nnet": "x", "options": "y", "pynnet3": "z", "key": [], "arrays": [],
       "shift": [0, 0.5], "value": None}], "entry 0 is malformed: bad shift"),
])
def test_malformed_entries_are_refused(tmp_path, entries, message):
    path = tmp_path / "c"
    _write(path, {"format": FORMAT, "version": VERSION, "arrays": [], "entries": entries})
    with pytest.raises(FormatError) as e:
        CachingCompiler(pynnet3.Nnet.from_config(_TDNN)).load(path)
    assert message in str(e.value)


def test_version_3_file_loads_nothing_with_a_warning(tmp_path):
    """Format 3 (a checksummed pickle) is not read, let alone unpickled."""
    payload = pickle.dumps({"format": FORMAT, "version": 3, "entries": []})
    path = tmp_path / "old"
    path.write_bytes(f"{FORMAT} 3\n".encode() + hashlib.sha256(payload).digest() + payload)
    with pytest.warns(UserWarning, match=f"version 3 is not {VERSION}"):
        assert CachingCompiler(pynnet3.Nnet.from_config(_TDNN)).load(path) == 0


def test_version_2_file_loads_nothing_with_a_warning(tmp_path):
    path = tmp_path / "old"
    path.write_bytes(pickle.dumps({"format": FORMAT, "version": 2, "entries": []},
                                  protocol=pickle.HIGHEST_PROTOCOL))
    cc = CachingCompiler(pynnet3.Nnet.from_config(_TDNN))
    with pytest.warns(UserWarning, match="version 2 is not"):
        assert cc.load(path) == 0


def test_other_pickles_are_refused(tmp_path):
    path = tmp_path / "other"
    path.write_bytes(pickle.dumps({"something": "else"}, protocol=pickle.HIGHEST_PROTOCOL))
    with pytest.raises(FormatError):
        CachingCompiler(pynnet3.Nnet.from_config(_TDNN)).load(path)


def test_fingerprint_ignores_the_record_of_folded_test_mode_components(tmp_path):
    """Review case: graphopt's record of what it folded is not written to model files,
    so it must not make a network written and read back miss its saved cache."""
    import pynnet3
    from pynnet3.cache.persist import nnet_fingerprint

    text = ("input-node name=input dim=6\n"
            "component name=a type=AffineComponent input-dim=6 output-dim=6\n"
            "component name=bn type=BatchNormComponent dim=6 test-mode=true\n"
            "component name=b type=AffineComponent input-dim=6 output-dim=3\n"
            "component-node name=a component=a input=input\n"
            "component-node name=bn component=bn input=a\n"
            "component-node name=b component=b input=bn\n"
            "output-node name=output input=b\n")
    opt = pynnet3.optimize_network(pynnet3.Nnet.from_config(text, seed=2))
    assert any(getattr(c, "folded_test_mode", ()) for c in opt.components.values())
    opt.write(tmp_path / "opt.mdl")
    assert nnet_fingerprint(opt) == nnet_fingerprint(pynnet3.read_nnet(tmp_path / "opt.mdl"))
