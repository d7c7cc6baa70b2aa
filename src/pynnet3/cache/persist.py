"""Saving and loading a CachingCompiler's entries: a file that is data, not code.

File format (version 4): the line ``pynnet3-compile-cache 4``, the SHA-256 digest
of the rest (32 bytes), then the payload: an 8-byte little-endian length, a UTF-8
JSON header of that length, zero padding to a multiple of 8, and the raw bytes of
the arrays the header refers to by number (int64 and float arrays only, each with
its dtype, shape and offset in the header's ``arrays`` table). The header is
``{"format": "pynnet3-compile-cache", "version": 4, "arrays": [...],
"entries": [...]}``; each entry holds ``nnet`` (the structural fingerprint of the
network), ``options`` (fingerprint of the optimizer options and shortcut switch),
``pynnet3`` (package version), ``key``, ``arrays`` and ``shift`` (what the entry
answers for, see :mod:`pynnet3.cache.key`) and ``value``: a computation, or a
two-sequence computation with its snapshot, in the plain form of
:mod:`pynnet3.cache.plain`.

Loading runs nothing from the file: no pickle, arrays read with ``np.frombuffer``,
precomputed-index objects rebuilt only for classes registered in
:mod:`pynnet3.components.precomputed`. A file whose digest does not match
(corrupt, truncated), or whose contents are not of that form, is rejected with a
FormatError before any entry is used; so is an entry whose computation fails the
computation checker or reads precomputed objects its components do not make
(a hand-made or hostile file gets a FormatError, not an IndexError later). An
entry is used only when all three fingerprints match the loading compiler; every
other entry is skipped, with one warning per reason. Files of another format
version (version 3 and older were pickles, never unpickled now) load nothing,
with a warning.

The structural fingerprint covers what a computation depends on: node lines,
and per component its type, dims, property flags and non-float settings (ints,
strings, and tuples / lists of them at any depth: time offsets, convolution
offsets, periods, ...; int arrays), not trained parameters. So a cache saved for
a model stays valid after training updates its weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import warnings

import numpy as np

from ..errors import FormatError
from . import plain

FORMAT = "pynnet3-compile-cache"
VERSION = 5  # 5: Command.deriv_table (input-derivative blocks)
_HEAD = f"{FORMAT} ".encode()  # then the version and a newline
_DIGEST = 32  # bytes of SHA-256
_ENTRY_FIELDS = ("nnet", "options", "pynnet3", "key", "arrays", "shift", "value")
_BAD_DATA = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


def _plain(value):
    """``value`` as nested tuples of bool / int / str when it is made of only those
    (lists and tuples at any depth, numpy integers included), else None."""
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (tuple, list)):
        items = tuple(map(_plain, value))
        return None if any(v is None for v in items) else items
    return None


# Attributes that say nothing about what a computation does: graphopt/folding.py's
# record of the test-mode components it folded away (not written to model files, so
# a network written and read back would otherwise miss the cache saved for it).
_NOT_STRUCTURAL = frozenset(("folded_test_mode",))


def _settings(obj, depth: int = 0) -> list:
    """The non-float settings of a component (recursing one level into
    sub-objects), as sorted (name, value) pairs."""
    out = []
    for name, value in sorted(vars(obj).items()):
        if name in _NOT_STRUCTURAL:
            continue
        plain = _plain(value)
        if plain is not None:
            out.append((name, plain))
        elif isinstance(value, np.ndarray) and value.dtype.kind in "iub" and value.size <= 100000:
            out.append((name, value.dtype.str, value.shape, value.tobytes()))
        elif depth == 0 and hasattr(value, "__dict__") and not callable(value) \
                and not isinstance(value, np.random.Generator):
            out.append((name, type(value).__name__, _settings(value, depth + 1)))
    return out


def nnet_fingerprint(nnet) -> str:
    """Hex digest of the network structure (module doc)."""
    h = hashlib.sha256()
    for node in nnet.nodes:
        h.update(node.config_line().encode())
        h.update(b"\n")
    for name, comp in nnet.components.items():
        h.update(repr((name, comp.type_name, comp.input_dim, comp.output_dim,
                       int(comp.properties()), _settings(comp))).encode())
    return h.hexdigest()


def _network_fingerprint(cc) -> str:
    """The network's fingerprint, and with a network optimizer that of the copy the
    computations are compiled for (its structure depends on parameter values: a
    FixedScale of 1 is pruned, of 2 folded)."""
    fp = nnet_fingerprint(cc.nnet)
    if getattr(cc, "network_options", None) is not None:
        fp += ":" + nnet_fingerprint(cc.compiled_nnet)
    return fp


def options_fingerprint(cc) -> str:
    """Hex digest of the optimizer options, the shortcut switch and the network
    optimizer's options (computations are compiled for the network it makes)."""
    fields = dataclasses.asdict(cc.options)
    network = getattr(cc, "network_options", None)
    network = None if network is None else sorted(dataclasses.asdict(network).items())
    return hashlib.sha256(repr((sorted(fields.items()), cc.use_shortcut, network)).encode()
                          ).hexdigest()


def save_cache(cc, path) -> None:
    """Write ``cc``'s entries to ``path`` atomically. An entry that cannot be stored
    as plain data (a precomputed object of an unregistered class) is left out, with
    a warning."""
    from .. import __version__
    from ..io.atomic import atomic_write

    cc._check_network()  # (entries made for a network since changed are dropped)
    with cc._lock:
        items = list(cc._entries.values())
    nfp, ofp = _network_fingerprint(cc), options_fingerprint(cc)
    w = plain.ArrayWriter()
    entries, left_out = [], []
    for e in items:
        try:
            value = _value_to_data(e.value, w)
        except TypeError as err:
            left_out.append(str(err))
            continue
        entries.append({"nnet": nfp, "options": ofp, "pynnet3": __version__,
                        "key": plain.key_to_data(e.key),
                        "arrays": [w.add(a) for a in e.arrays], "shift": list(e.shift),
                        "value": value})
    if left_out:
        warnings.warn(f"{path}: {len(left_out)} compile-cache entr"
                      f"{'y' if len(left_out) == 1 else 'ies'} not saved: {left_out[0]}",
                      stacklevel=3)
    table, blob = w.pack()
    head = json.dumps({"format": FORMAT, "version": VERSION, "arrays": table,
                       "entries": entries}, separators=(",", ":")).encode()
    payload = struct.pack("<Q", len(head)) + head + b"\0" * (-len(head) % 8) + blob
    atomic_write(path, _HEAD + f"{VERSION}\n".encode() + hashlib.sha256(payload).digest()
                 + payload)


def _value_to_data(value, w) -> dict:
    from .caching_compiler import _MiniEntry

    if isinstance(value, _MiniEntry):
        return {"mini": plain.computation_to_data(value.computation, w),
                "snapshot": plain.snapshot_to_data(value.snapshot, w)}
    return {"computation": plain.computation_to_data(value, w)}


def _read(path) -> tuple[dict, plain.ArrayReader] | None:
    """The header and arrays of a cache file, or None (with a warning) for a file
    of another format version. The file is read into one buffer that the arrays
    then view (no copies of a large file)."""
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        data = data[:f.readinto(data)]
    if not data.startswith(_HEAD):
        if data[:1] == b"\x80" and FORMAT.encode() in data[:200]:
            # a bare pickle that names our format: what version 2 wrote (not unpickled)
            warnings.warn(f"{path}: compile cache format version 2 is not {VERSION}; "
                          f"nothing loaded", stacklevel=4)
            return None
        raise FormatError("not a pynnet3 compile cache", str(path))
    end = data.find(b"\n", 0, 100)
    version = bytes(data[len(_HEAD):end if end >= 0 else 100]).decode("ascii", "replace")
    if end < 0 or version != str(VERSION):
        warnings.warn(f"{path}: compile cache format version {version[:20]} is not "
                      f"{VERSION}; nothing loaded", stacklevel=4)
        return None
    view = memoryview(data)
    digest, payload = bytes(view[end + 1:end + 1 + _DIGEST]), view[end + 1 + _DIGEST:]
    if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
        raise FormatError("compile cache is corrupt or truncated (checksum mismatch)",
                          str(path))
    try:
        (size,) = struct.unpack_from("<Q", payload)
        start = 8 + size + (-size % 8)
        if start > len(payload):
            raise ValueError("header runs past the end of the file")
        head = json.loads(bytes(payload[8:8 + size]).decode("utf-8"),
                          parse_constant=_no_constant)
        if not isinstance(head, dict) or head.get("format") != FORMAT \
                or head.get("version") != VERSION:
            raise ValueError("no pynnet3 compile-cache header")
        return head, plain.ArrayReader(head.get("arrays"), payload[start:])
    except (*_BAD_DATA, struct.error, UnicodeDecodeError) as e:
        raise FormatError(f"not a pynnet3 compile cache: {e}", str(path)) from None


def _no_constant(name: str):
    raise ValueError(f"{name} in the header")


def _entries(head: dict, r: plain.ArrayReader, path) -> list[dict]:
    """The entries of a file, rebuilt with their structure checked, so that a
    damaged or hand-made file fails here, not in a later compile or run."""
    entries = head.get("entries")
    if not isinstance(entries, list):
        raise FormatError("compile cache has no entry list", str(path))
    out = []
    for i, e in enumerate(entries):
        try:
            out.append(_entry(e, r))
        except _BAD_DATA as err:
            raise FormatError(f"compile cache entry {i} is malformed: {err}",
                              str(path)) from None
    return out


def _entry(e, r: plain.ArrayReader) -> dict:
    from .caching_compiler import _MiniEntry

    if not isinstance(e, dict) or set(e) != set(_ENTRY_FIELDS) \
            or not all(isinstance(e[f], str) for f in ("nnet", "options", "pynnet3")):
        raise ValueError("fields missing or of the wrong type")
    shift = e["shift"]
    if not (isinstance(shift, list) and len(shift) == 2
            and all(type(v) is int for v in shift)):
        raise ValueError("bad shift")
    key = plain.key_from_data(e["key"])
    if not isinstance(key, tuple) or not isinstance(e["arrays"], list):
        raise ValueError("the key or its index arrays are not lists")
    out = {"nnet": e["nnet"], "options": e["options"], "pynnet3": e["pynnet3"],
           "key": key, "shift": tuple(shift),
           "arrays": [r.get(a, "request indexes", ndim=2, cols=3) for a in e["arrays"]]}
    value = e["value"]
    if not isinstance(value, dict) or set(value) not in ({"computation"},
                                                         {"mini", "snapshot"}):
        raise ValueError("the value is neither a computation nor a mini computation")
    if "computation" in value:
        out["value"] = plain.computation_from_data(value["computation"], r)
    else:
        comp = plain.computation_from_data(value["mini"], r)
        out["value"] = _MiniEntry(comp, plain.snapshot_from_data(value["snapshot"], r, comp))
    return out


def load_cache(cc, path) -> int:
    """Add the matching entries of ``path`` to ``cc`` (module doc); returns how many."""
    from .. import __version__
    from .caching_compiler import _MiniEntry

    read = _read(path)
    if read is None:
        return 0
    entries = _entries(*read, path)
    cc._check_network()
    nfp, ofp = _network_fingerprint(cc), options_fingerprint(cc)
    # (the network computations are made for: cc.nnet, or its network-optimized copy)
    compiled_for = getattr(cc, "compiled_nnet", cc.nnet)
    skipped: dict[str, int] = {}
    usable = []
    for i, e in enumerate(entries):
        reason = ("another network structure" if e["nnet"] != nfp else
                  "other optimize options" if e["options"] != ofp else
                  f"pynnet3 version {e['pynnet3']}" if e["pynnet3"] != __version__
                  else None)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        value = e["value"]
        try:
            plain.check_for_network(value.computation if isinstance(value, _MiniEntry)
                                    else value, compiled_for)
        except _BAD_DATA as err:
            raise FormatError(f"compile cache entry {i} does not fit the network: {err}",
                              str(path)) from None
        usable.append(e)
    for e in usable:
        cc._store(e["key"], e["arrays"], e["shift"], e["value"])
    for reason, count in skipped.items():
        warnings.warn(f"{path}: skipped {count} compile-cache entr"
                      f"{'y' if count == 1 else 'ies'} made for {reason}", stacklevel=3)
    return len(usable)
