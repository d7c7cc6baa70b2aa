"""Deterministic mutations of pynnet3's inputs, for :mod:`pynnet3.testing.fuzz`.

Every function takes the input and a ``numpy`` generator and returns
``(description, mutated input)``; the same generator state gives the same
mutation. Text (configs, text models) is mutated token-wise and byte-wise,
binary models also at their int/float fields (``\\x04`` + 4 bytes after a tag),
request JSON on its object tree (values, keys, shapes) and as text.
"""

from __future__ import annotations

import json
import re
import struct

import numpy as np

# Replacement values: integers beyond int32/int64, negatives, floats, garbage.
HUGE = ("2147483648", "-2147483649", "9223372036854775808", "1" + "0" * 30, "4294967296",
        "100000000", "2147483647", "-2147483648", "1048577", "65536")
NEGATIVE = ("-1", "-7", "0", "-100000000")
FLOATS = ("1.5", "-0.5", "1e30", "-1e30", "1e309", "nan", "inf", "-inf", "3.", ".5e-3")
GARBAGE = ("abc", "", "[", "]", "<Foo>", "=", "(", ")", ",", "x=y", "T", "F", "\x00", "\u00e9",
           "#", "'", "Append(", "Offset(x, 1)")
VALUES = HUGE + NEGATIVE + FLOATS + GARBAGE

_NUMBER = re.compile(rb"(?<![\w.])-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?(?![\w.])")
_INT_AFTER_TAG = re.compile(rb"<[A-Za-z]+> (-?[0-9]+)(?=\s)")
_TOKEN = re.compile(rb"[^\s=,()\[\]]+")
_TAG = re.compile(rb"<[A-Za-z/]+>")


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _blow_up(number: bytes, rng: np.random.Generator) -> bytes:
    """A number scaled by 2**10, 2**20 or 2**31 (dimension blow-ups)."""
    try:
        base = int(number)
    except ValueError:
        base = 1
    return str((base or 1) * 2 ** int(_pick(rng, (10, 20, 31)))).encode()


def _random_match(pattern: re.Pattern, data: bytes, rng: np.random.Generator,
                  group: int = 0) -> re.Match | None:
    """The first match of ``pattern`` at or after a random offset (wrapping round):
    one search, not a list of every match (models hold millions of numbers)."""
    start = int(rng.integers(len(data) + 1))
    return pattern.search(data, start) or pattern.search(data, 0)


def _replace_span(data: bytes, span: tuple[int, int], new: bytes) -> bytes:
    return data[:span[0]] + new + data[span[1]:]


def mutate_text(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One mutation of a config or text model."""
    op = _pick(rng, ("number", "number", "tag-int", "token", "blow-up", "byte", "truncate",
                     "dup-line", "drop-line", "swap-lines", "nest"))
    if op in ("number", "blow-up", "tag-int"):
        m = _random_match(_INT_AFTER_TAG if op == "tag-int" else _NUMBER, data, rng)
        if m is not None:
            span = m.span(1) if op == "tag-int" else m.span()
            old = data[span[0]:span[1]]
            new = _blow_up(old, rng) if op == "blow-up" else _pick(rng, VALUES).encode()
            return f"{op} {old[:20]!r}->{new[:20]!r} at {span[0]}", _replace_span(data, span, new)
        op = "token"
    if op == "token":
        m = _random_match(_TOKEN, data, rng)
        if m is None:
            return "truncate 0", b""
        new = _pick(rng, VALUES).encode()
        return f"token {m.group()[:20]!r}->{new!r} at {m.start()}", _replace_span(
            data, m.span(), new)
    if op == "byte" and data:
        i = int(rng.integers(len(data)))
        b = int(rng.integers(256))
        return f"byte {i}={b}", data[:i] + bytes([b]) + data[i + 1:]
    if op == "truncate" or not data:
        i = int(rng.integers(len(data) + 1))
        return f"truncate {i}", data[:i]
    lines = data.split(b"\n")
    i, j = int(rng.integers(len(lines))), int(rng.integers(len(lines)))
    if op == "dup-line":
        lines.insert(j, lines[i])
    elif op == "drop-line":
        del lines[i]
    elif op == "swap-lines":
        lines[i], lines[j] = lines[j], lines[i]
    else:  # nest: wrap a descriptor in many functions (parser recursion)
        m = re.search(rb"input=(\S+)", data)
        if m is None:
            return "truncate half", data[:len(data) // 2]
        depth = int(_pick(rng, (50, 400, 3000)))
        fn = _pick(rng, (b"Append(", b"IfDefined(", b"Sum("))
        new = fn * depth + m.group(1) + b")" * depth
        return f"nest {fn.decode()}x{depth}", _replace_span(data, m.span(1), new)
    return f"{op} {i},{j}", b"\n".join(lines)


_BIN_INT = re.compile(rb"(?:> |F[MV] |D[MV] |\x04....)\x04(....)", re.S)


def mutate_binary(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One mutation of a binary model: its int/float fields, bytes, tokens, length."""
    op = _pick(rng, ("int", "int", "int", "float", "long-int", "byte", "truncate", "token",
                     "dup-span", "header"))
    if op in ("int", "float", "long-int"):
        m = _random_match(_BIN_INT, data, rng)
        if m is not None:
            if op == "float":
                value = float(_pick(rng, (np.nan, np.inf, -np.inf, 3.4e38, -1.0)))
                new = struct.pack("<f", value)
            else:
                value = int(_pick(rng, (2**31 - 1, -(2**31), -1, 0, 2**20, 2**24 + 1, 10**8,
                                        65536, 3)))
                new = struct.pack("<i", value)
            if op == "long-int":  # an 8-byte integer: size byte 8, int64
                value = int(_pick(rng, (2**40, -(2**40), 2**63 - 1, 5)))
                return f"long-int {value} at {m.start(1)}", (
                    data[:m.start(1) - 1] + b"\x08" + struct.pack("<q", value) + data[m.end(1):])
            return f"{op} {value} at {m.start(1)}", _replace_span(data, m.span(1), new)
        op = "byte"
    if op == "header":  # the config lines are text even in binary models
        end = data.find(b"\n\n")
        if end > 0:
            desc, head = mutate_text(data[:end], rng)
            return "header " + desc, head + data[end:]
        op = "byte"
    if op == "token":
        m = _random_match(_TAG, data, rng)
        if m is not None:
            new = _pick(rng, (b"<Foo>", b"", b"<Dim>", b"</Nnet3>", m.group() + m.group()))
            return f"token {m.group()!r}->{new!r}", _replace_span(data, m.span(), new)
        op = "byte"
    if op == "dup-span" and len(data) > 8:
        i = int(rng.integers(len(data) - 4))
        n = int(rng.integers(1, min(64, len(data) - i)))
        return f"dup-span {i}+{n}", data[:i + n] + data[i:]
    if op == "truncate" or len(data) < 3:
        i = int(rng.integers(len(data) + 1))
        return f"truncate {i}", data[:i]
    i = int(rng.integers(2, len(data)))  # keep the \0B marker
    b = int(rng.integers(256))
    return f"byte {i}={b}", data[:i] + bytes([b]) + data[i + 1:]


# JSON values a request field may be replaced with.
JSON_VALUES = (2**31, 2**63, 10**30, -1, 1.7, "3", "false", "true", True, False, None, [], {},
               [[0, 0, 0]], "output", 1e308, float("nan"), [0, 0], [[0, 0, 0, 0]], 10**7)


def _paths(obj, path=()):
    """Every (path, value) of a JSON tree, containers included."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, path + (k,))
    elif isinstance(obj, list):
        items = list(enumerate(obj))
        for i, v in (items[:6] + items[-2:] if len(items) > 8 else items):
            yield from _paths(v, path + (i,))


def _value_at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _set(obj, path, value):
    if not path:
        return value
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return obj


def mutate_request(text: str, rng: np.random.Generator) -> tuple[str, str]:
    """One mutation of request JSON: a value, a key, a shape, or the text itself."""
    op = _pick(rng, ("value", "value", "value", "key", "drop", "extra", "dup", "top", "text",
                     "spread", "rows", "rows", "flip", "flip"))
    if op == "text":
        desc, data = mutate_text(text.encode(), rng)
        return "text " + desc, data.decode("utf-8", errors="replace")
    obj = json.loads(text)
    paths = list(_paths(obj))
    path, value = _pick(rng, paths)
    if op == "top":
        new = _pick(rng, ([obj], "request", 3, None, {"output": obj.get("outputs")}))
        return f"top {type(new).__name__}", json.dumps(new)
    if op == "value" or (op in ("key", "drop", "extra") and not isinstance(value, dict)) or (
            op == "dup" and not isinstance(value, list)):
        new = _pick(rng, JSON_VALUES)
        return f"value {_path_text(path)}={new!r}", json.dumps(_set(obj, path, new))
    if op == "rows":  # a valid variation: fewer or reordered rows of one io
        ios = [p for p, v in paths if len(p) == 3 and p[2] == "indexes" and len(v) > 1]
        if ios:
            p = _pick(rng, ios)
            rows = _value_at(obj, p)
            keep = sorted(rng.choice(len(rows), int(rng.integers(1, len(rows) + 1)),
                                     replace=False).tolist())
            if p[0] == "inputs" or rng.random() < 0.5:
                keep = rng.permutation(len(rows)).tolist()  # inputs: all rows, reordered
            return f"rows {_path_text(p)}", json.dumps(_set(obj, p, [rows[i] for i in keep]))
        return "none", text
    if op == "flip":  # a valid variation: another boolean
        flags = [p for p, v in paths if isinstance(v, bool)]
        if flags:
            p = _pick(rng, flags)
            return f"flip {_path_text(p)}", json.dumps(_set(obj, p, not _value_at(obj, p)))
        return "none", text
    if op == "spread":  # one index far away: a long time span or many sequences
        idx = [p for p, v in paths if len(p) == 4 and p[2] == "indexes"]
        if idx:
            p = _pick(rng, idx)
            col = int(rng.integers(3))
            new = int(_pick(rng, (10**6, -(10**6), 2**25, 10**9)))
            return f"spread {_path_text(p)}[{col}]={new}", json.dumps(_set(obj, p + (col,), new))
        return "none", text
    if op == "dup":
        if value:
            value.insert(int(rng.integers(len(value) + 1)), value[int(rng.integers(len(value)))])
        return f"dup {_path_text(path)}", json.dumps(obj)
    keys = list(value)
    if op == "extra" or not keys:
        value[_pick(rng, ("output", "has-deriv", "extra", "indices"))] = 1
        return f"extra key in {_path_text(path)}", json.dumps(obj)
    key = _pick(rng, keys)
    if op == "drop":
        del value[key]
        return f"drop {_path_text(path + (key,))}", json.dumps(obj)
    new_key = {"outputs": "output", "inputs": "input", "has_deriv": "hasDeriv",
               "indexes": "index"}.get(key, key + "_")
    value[new_key] = value.pop(key)
    return f"rename {_path_text(path + (key,))}->{new_key}", json.dumps(obj)


def _path_text(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "<top>"
