"""Saving and loading a CachingCompiler's entries.

File format (version 3): the line ``pynnet3-compile-cache 3``, the SHA-256 digest
of the rest (32 bytes), then a pickle of ``{"format": "pynnet3-compile-cache",
"version": 3, "entries": [...]}`` where each entry is a dict with ``nnet`` (the
structural fingerprint of the network), ``options`` (fingerprint of the
optimizer options and shortcut switch), ``pynnet3`` (package version), ``key``,
``arrays`` and ``shift`` (what the entry answers for, see
:mod:`pynnet3.cache.key`) and ``value`` (an NnetComputation, or a two-sequence
computation with its snapshot).
On load a file whose digest does not match (corrupt, truncated) or whose entries
are not of that form is rejected with a FormatError, before any entry is used;
an entry is used only when all three fingerprints match the loading compiler;
every other entry is skipped, with one warning per reason. Files of another
format version (version 2 was the bare pickle) load nothing, with a warning.

The structural fingerprint covers what a computation depends on: node lines,
and per component its type, dims, property flags and non-float settings (ints,
strings, and tuples / lists of them at any depth: time offsets, convolution
offsets, periods, ...; int arrays), not trained parameters. So a cache saved for
a model stays valid after training updates its weights.

Pickle runs code when loading: load only cache files you wrote yourself (the
digest catches accidents, not forgeries).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import warnings

import numpy as np

from ..errors import FormatError

FORMAT = "pynnet3-compile-cache"
VERSION = 3
_HEAD = f"{FORMAT} ".encode()  # then the version and a newline
_DIGEST = 32  # bytes of SHA-256
_ENTRY_FIELDS = ("nnet", "options", "pynnet3", "key", "arrays", "shift", "value")


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


def _settings(obj, depth: int = 0) -> list:
    """The non-float settings of a component (recursing one level into
    sub-objects), as sorted (name, value) pairs."""
    out = []
    for name, value in sorted(vars(obj).items()):
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


def options_fingerprint(cc) -> str:
    fields = dataclasses.asdict(cc.options)
    return hashlib.sha256(repr((sorted(fields.items()), cc.use_shortcut)).encode()).hexdigest()


def save_cache(cc, path) -> None:
    """Write ``cc``'s entries to ``path`` atomically."""
    from .. import __version__
    from ..nnet import atomic_write

    cc._check_network()  # (entries made for a network since changed are dropped)
    with cc._lock:
        items = list(cc._entries.values())
    nfp, ofp = nnet_fingerprint(cc.nnet), options_fingerprint(cc)
    entries = [{"nnet": nfp, "options": ofp, "pynnet3": __version__, "key": e.key,
                "arrays": e.arrays, "shift": e.shift, "value": e.value} for e in items]
    payload = pickle.dumps({"format": FORMAT, "version": VERSION, "entries": entries},
                           protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write(path, _HEAD + f"{VERSION}\n".encode() + hashlib.sha256(payload).digest() + payload)


def _unpickle(data: bytes, path) -> object:
    try:
        return pickle.loads(data)
    except Exception as e:  # a damaged pickle fails in many ways; all mean "not a cache"
        raise FormatError(f"not a pynnet3 compile cache: {type(e).__name__}: {e}",
                          str(path)) from None


def _read(path) -> dict | None:
    """The checked contents of a cache file, or None (with a warning) for a file of
    another format version."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(_HEAD):
        line, sep, rest = data.partition(b"\n")
        version = line[len(_HEAD):].decode("ascii", "replace")
        if not sep or version != str(VERSION):
            warnings.warn(f"{path}: compile cache format version {version} is not "
                          f"{VERSION}; nothing loaded", stacklevel=4)
            return None
        digest, payload = rest[:_DIGEST], rest[_DIGEST:]
        if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
            raise FormatError("compile cache is corrupt or truncated (checksum mismatch)",
                              str(path))
        obj = _unpickle(payload, path)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT \
                or obj.get("version") != VERSION:
            raise FormatError("not a pynnet3 compile cache", str(path))
        return obj
    if data[:1] == b"\x80":  # a bare pickle: version 2 wrote those
        obj = _unpickle(data, path)
        if isinstance(obj, dict) and obj.get("format") == FORMAT:
            warnings.warn(f"{path}: compile cache format version {obj.get('version')} is "
                          f"not {VERSION}; nothing loaded", stacklevel=4)
            return None
    raise FormatError("not a pynnet3 compile cache", str(path))


def _check_entries(obj: dict, path) -> list:
    """The entries of a loaded file, each checked for the form :func:`save_cache`
    writes (so a damaged file fails here, not in a later compile)."""
    from ..computation import NnetComputation
    from .caching_compiler import _MiniEntry

    entries = obj.get("entries")
    if not isinstance(entries, list):
        raise FormatError("compile cache has no entry list", str(path))
    for i, e in enumerate(entries):
        ok = isinstance(e, dict) and all(f in e for f in _ENTRY_FIELDS) \
            and isinstance(e["key"], tuple) and isinstance(e["arrays"], list) \
            and all(isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[1] == 3
                    and a.dtype == np.int64 for a in e["arrays"]) \
            and isinstance(e["shift"], (tuple, list)) and len(e["shift"]) == 2 \
            and all(isinstance(v, int) for v in e["shift"]) \
            and isinstance(e["value"], (NnetComputation, _MiniEntry))
        if not ok:
            raise FormatError(f"compile cache entry {i} is malformed", str(path))
    return entries


def load_cache(cc, path) -> int:
    """Add the matching entries of ``path`` to ``cc`` (module doc); returns how many."""
    from .. import __version__

    obj = _read(path)
    if obj is None:
        return 0
    entries = _check_entries(obj, path)
    cc._check_network()
    nfp, ofp = nnet_fingerprint(cc.nnet), options_fingerprint(cc)
    skipped: dict[str, int] = {}
    added = 0
    for e in entries:
        reason = ("another network structure" if e["nnet"] != nfp else
                  "other optimize options" if e["options"] != ofp else
                  f"pynnet3 version {e['pynnet3']}" if e["pynnet3"] != __version__
                  else None)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        cc._store(e["key"], e["arrays"], tuple(e["shift"]), e["value"])
        added += 1
    for reason, count in skipped.items():
        warnings.warn(f"{path}: skipped {count} compile-cache entr"
                      f"{'y' if count == 1 else 'ies'} made for {reason}", stacklevel=3)
    return added
