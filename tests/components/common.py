"""Helpers shared by the component tests: reference model files, byte-exact round
trips of component spans, config lines, relative errors and finite differences."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from pynnet3.components import Flags, component_class
from pynnet3.config import ConfigLine
from pynnet3.io.kaldi_stream import make_reader, make_writer
from pynnet3.io.model_file import read_component
from tests.reference import REF

# Globs below REF for the nnet files of the reference: the per-case model files and
# the collapsed realistic models.
MODEL_FILES = ("**/model.txt", "**/model.bin", "**/collapsed_all.txt")
# ... and the acoustic models (final.mdl, binary and text) too.
WITH_AM_FILES = MODEL_FILES + ("**/final.mdl", "**/final.mdl.txt")
# ... and the gzipped text dumps of training runs: every nnet file of the reference.
ALL_NNET_FILES = WITH_AM_FILES + ("**/*.txt.gz",)


def _names(type_names) -> tuple[str, ...]:
    return (type_names,) if isinstance(type_names, str) else tuple(type_names)


def nnet_bytes(path: Path) -> bytes:
    """A model file's bytes, gunzipped for ``.gz`` files."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def reference_files(type_names, patterns=MODEL_FILES) -> list[Path]:
    """Reference files matching ``patterns`` that hold a component of one of
    ``type_names`` (one name or several); empty without the reference."""
    if not REF.is_dir():
        return []
    tokens = [f"<{t}> ".encode() for t in _names(type_names)]
    files = sorted({p for pattern in patterns for p in REF.glob(pattern) if p.is_file()})
    return [f for f in files if any(tok in nnet_bytes(f) for tok in tokens)]


def same_tokens_to_a_float_step(a: bytes, b: bytes, rtol: float = 3e-7) -> bool:
    """Whether two text spans have the same tokens, numbers equal to ``rtol``."""
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if abs(fx - fy) > rtol * max(abs(fx), abs(fy)):
            return False
    return True


def roundtrip_spans(path: Path, type_names, exact: bool = True) -> int:
    """Read every component of ``type_names`` (one name or several) in ``path``,
    wherever it stands (nested ones too), and check that writing it gives back
    exactly its bytes (``exact=False``, text only: the same tokens, numbers to a
    float step). Returns how many were checked."""
    data = nnet_bytes(path)
    binary = data[:2] == b"\0B"
    checked = 0
    for type_name in _names(type_names):
        token = f"<{type_name}> ".encode()
        start = data.find(token)
        while start >= 0:
            r = make_reader(data, str(path))
            r.pos = start
            comp = read_component(r)
            w = make_writer(binary)
            comp.write(w)
            out = w.getvalue()
            where = f"{path}: {type_name} at {start}"
            if exact:
                assert data[start:start + len(out)] == out, where
                # The reader stops after the closing token; text readers before its space.
                assert r.pos == start + len(out) - (not binary), where
            else:
                assert not binary and data[:r.pos].endswith(f"</{type_name}>".encode()), where
                assert same_tokens_to_a_float_step(data[start:r.pos], out), where
            checked += 1
            start = data.find(token, start + 1)
    return checked


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def cfg(text: str) -> ConfigLine:
    """A ``component name=... type=...`` line with name/type consumed, as the Nnet
    reader hands it to ``from_config``. Bare options get ``component`` in front."""
    if "=" in text.split(None, 1)[0]:
        text = "component " + text
    line = ConfigLine(text)
    line.get_str("name")
    line.get_str("type")
    return line


def from_config(text: str, seed: int = 0):
    """A component from a whole ``component name=... type=...`` config line."""
    line = cfg(text)
    return component_class(line.values["type"]).from_config(line, np.random.default_rng(seed))


def to_float64(comp) -> None:
    """Make a component's float32 array attributes float64 in place (recursing into
    sub-components) so finite differences on parameters are precise."""
    for key, value in list(vars(comp).items()):
        if isinstance(value, np.ndarray) and value.dtype == np.float32:
            setattr(comp, key, value.astype(np.float64))
    for sub in getattr(comp, "components", []):
        to_float64(sub)


def grid(ns, ts, x=0) -> np.ndarray:
    """Indexes (n, t, x) for every n of ``ns`` and t of ``ts``, t fastest."""
    return np.array([(n, t, x) for n in ns for t in ts], dtype=np.int64)


def finite_difference_check(comp, x: np.ndarray, in_idx=None, out_idx=None, seed: int = 0,
                            eps: float = 1e-6, tol: float = 1e-6, dy=None,
                            indexes=None, params: bool = True) -> None:
    """Central differences in float64 of f = sum(out * dy) w.r.t. the input and
    (``params``) every parameter, against backprop. ``dy`` defaults to normal
    draws from ``seed``; ``indexes`` are precomputed ones, or they come from
    ``in_idx``/``out_idx`` when those are given."""
    to_float64(comp)
    x = x.astype(np.float64)
    num_out = len(x) if out_idx is None else len(out_idx)
    idx = indexes
    if in_idx is not None:
        idx = comp.precompute_indexes(in_idx, out_idx, True)

    def forward():
        out = np.zeros((num_out, comp.output_dim), x.dtype)
        return out, comp.propagate(idx, x, out)

    out, memo = forward()
    assert out.dtype == np.float64
    if dy is None:
        dy = np.random.default_rng(seed).standard_normal(out.shape)
    # A derivative that is assigned must not depend on what the buffer held.
    adds = comp.properties() & Flags.BACKPROP_ADDS
    in_deriv = np.zeros_like(x) if adds else np.full_like(x, np.nan)
    grad = {k: np.zeros_like(v) for k, v in comp.params().items()} if params else None
    comp.backprop(idx, x, out, dy, memo, grad, in_deriv)

    def numeric(arr):
        num = np.zeros(arr.shape)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + eps
            plus = float(np.sum(forward()[0] * dy))
            arr[i] = old - eps
            minus = float(np.sum(forward()[0] * dy))
            arr[i] = old
            num[i] = (plus - minus) / (2 * eps)
        return num

    err = rel_err(in_deriv, numeric(x))
    assert err < tol, f"{comp.type_name} input derivative: relative error {err:.2e}"
    if params:
        for name, p in comp.params().items():
            err = rel_err(grad[name], numeric(p))
            assert err < tol, f"{comp.type_name} gradient of {name}: relative error {err:.2e}"


# Kaldi keeps BatchNorm statistics as sums and writes mean/variance from them, so its
# own read -> write moves some <StatsMean>/<StatsVar> values by a float rounding step
# (kaldi-reference/README.md: at most 1.1e-4 relative, x-vector variances).
BATCHNORM_STATS_RTOL = 1.2e-4

# Kaldi's own read -> write of the reference files (README "Text models"): how many
# BatchNorm <StatsMean>/<StatsVar> values a text round trip moves; and ("Binary
# models") how many bytes of model.bin differ from a binary write of the model read
# from model.txt. Every other file is a fixed point.
KALDI_TEXT_MOVES = {"realistic/tdnnf_chain/model.txt": 139, "realistic/tdnn_relu_bn/model.txt": 88,
                    "realistic/xvector/model.txt": 109, "components/BatchNorm_1/model.txt": 1,
                    "collapsed/tdnnf_chain/collapsed_all.txt": 120,
                    "collapsed/xvector/collapsed_all.txt": 23,
                    "training/tdnn_relu_bn/model_after_ng.txt.gz": 46,
                    "training/tdnn_relu_bn/model_after_plain.txt.gz": 46,
                    "training/tdnn_relu_bn_lr0.01/model_after_ng.txt.gz": 46,
                    "training/tdnn_relu_bn_lr0.01/model_after_plain.txt.gz": 46}
KALDI_BIN_BYTES = {"realistic/tdnnf_chain": 352, "realistic/tdnn_relu_bn": 198,
                   "realistic/xvector": 144, "components/BatchNorm_1": 3}

_STATS_TAGS = (b"<StatsMean>", b"<StatsVar>")


def same_but_batchnorm_stats(a: bytes, b: bytes, rtol: float = BATCHNORM_STATS_RTOL) -> int:
    """Assert that two model files (both text or both binary) are the same bytes except
    for BatchNorm statistics values, each within ``rtol``; return how many moved."""
    if a[:2] == b"\0B":
        return _binary_same_but_stats(a, b, rtol)
    ta, tb = a.split(), b.split()
    assert len(ta) == len(tb), "different token counts"
    moved, in_stats = 0, False
    for i, (x, y) in enumerate(zip(ta, tb, strict=True)):
        if x in _STATS_TAGS:
            in_stats = None  # (the '[' comes next)
        elif in_stats is None and x == b"[":
            in_stats = True
        elif in_stats and x == b"]":
            in_stats = False
        elif in_stats and x != y:
            fx, fy = float(x), float(y)
            assert abs(fx - fy) <= rtol * abs(fx), (i, x, y)
            moved += 1
            continue
        assert x == y, (i, x, y)
    if b"\n" in a:  # (token boundaries as well as tokens: the same layout)
        assert [len(line.split()) for line in a.splitlines()] == \
            [len(line.split()) for line in b.splitlines()]
    return moved


def _binary_same_but_stats(a: bytes, b: bytes, rtol: float) -> int:
    assert len(a) == len(b), "different lengths"
    va, vb = np.frombuffer(a, np.uint8).copy(), np.frombuffer(b, np.uint8).copy()
    moved = 0
    for tag in _STATS_TAGS:
        start = a.find(tag + b" ")
        while start >= 0:
            head = start + len(tag) + 1
            assert a[head:head + 3] == b"FV " and a[head + 3] == 4, "a float vector"
            dim = int.from_bytes(a[head + 4:head + 8], "little")
            lo, hi = head + 8, head + 8 + 4 * dim
            fa, fb = np.frombuffer(a[lo:hi], "<f4"), np.frombuffer(b[lo:hi], "<f4")
            assert np.all(np.abs(fa.astype(np.float64) - fb) <= rtol * np.abs(fa)), tag
            moved += int(np.count_nonzero(fa != fb))
            va[lo:hi] = vb[lo:hi] = 0
            start = a.find(tag + b" ", hi)
    assert np.array_equal(va, vb), "bytes differ outside BatchNorm statistics"
    return moved
