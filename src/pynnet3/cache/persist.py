"""Saving and loading a CachingCompiler's entries.

File format (version 2): a pickle of ``{"format": "pynnet3-compile-cache",
"version": 2, "entries": [...]}`` where each entry is a dict with ``nnet`` (the
structural fingerprint of the network), ``options`` (fingerprint of the
optimizer options and shortcut switch), ``pynnet3`` (package version), ``key``,
``arrays`` and ``shift`` (what the entry answers for, see
:mod:`pynnet3.cache.key`) and ``value`` (an NnetComputation, or a two-sequence
computation with its snapshot).
On load an entry is used only when all three fingerprints match the loading
compiler; every other entry is skipped, with one warning per reason.

The structural fingerprint covers what a computation depends on: node lines,
and per component its type, dims, property flags and non-float settings (ints,
strings, int arrays: time offsets, periods, ...), not trained parameters. So a
cache saved for a model stays valid after training updates its weights.

Pickle runs code when loading: load only cache files you wrote yourself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import warnings

import numpy as np

from ..errors import FormatError

FORMAT = "pynnet3-compile-cache"
VERSION = 2


def _settings(obj, depth: int = 0) -> list:
    """The non-float settings of a component (recursing one level into
    sub-objects), as sorted (name, value) pairs."""
    out = []
    for name, value in sorted(vars(obj).items()):
        if isinstance(value, (bool, int, str)) and not isinstance(value, np.floating):
            out.append((name, value))
        elif isinstance(value, (tuple, list)) and all(
                isinstance(v, (bool, int, str)) for v in value):
            out.append((name, tuple(value)))
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

    with cc._lock:
        items = list(cc._entries.values())
    nfp, ofp = nnet_fingerprint(cc.nnet), options_fingerprint(cc)
    entries = [{"nnet": nfp, "options": ofp, "pynnet3": __version__, "key": e.key,
                "arrays": e.arrays, "shift": e.shift, "value": e.value} for e in items]
    data = pickle.dumps({"format": FORMAT, "version": VERSION, "entries": entries},
                        protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write(path, data)


def load_cache(cc, path) -> int:
    """Add the matching entries of ``path`` to ``cc`` (module doc); returns how many."""
    from .. import __version__

    try:
        with open(path, "rb") as f:
            obj = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
            TypeError, ValueError) as e:
        raise FormatError(f"not a pynnet3 compile cache: {type(e).__name__}: {e}",
                          str(path)) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise FormatError("not a pynnet3 compile cache", str(path))
    if obj.get("version") != VERSION:
        warnings.warn(f"{path}: compile cache format version {obj.get('version')} is not "
                      f"{VERSION}; nothing loaded", stacklevel=3)
        return 0
    cc._check_network()
    nfp, ofp = nnet_fingerprint(cc.nnet), options_fingerprint(cc)
    skipped: dict[str, int] = {}
    added = 0
    for e in obj.get("entries", []):
        reason = ("another network structure" if e.get("nnet") != nfp else
                  "other optimize options" if e.get("options") != ofp else
                  f"pynnet3 version {e.get('pynnet3')}" if e.get("pynnet3") != __version__
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
