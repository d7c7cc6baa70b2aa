"""Kaldi config lines: ``component name=affine1 type=AffineComponent input-dim=10 ...``.

A :class:`ConfigLine` holds the first word and the ``key=value`` pairs of one
line. Values may contain spaces when they are descriptor expressions
(``input=Append(Offset(x, -1), x)``): a value runs until the whitespace before
the next ``key=``. As in Kaldi's ``ConfigLine::ParseLine``, a value may also be
quoted, ``key='a b'`` or ``key="a b"`` (no escaping; the quotes are dropped), which
is how a ``CompositeComponent`` line nests whole component configs. Everything
after ``#`` is a comment. Getters convert with Kaldi's rules and remember which keys
were used, so that :meth:`check_all_used` can reject unknown options like Kaldi does.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from . import limits
from .errors import ConfigError
from .limits import check_option

# Kaldi's IsValidName: a letter or '_', then letters, digits, '_', '-', '.'.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*\Z")


def is_valid_name(name: str) -> bool:
    """Kaldi's ``IsValidName`` (used for config keys and first words)."""
    return _NAME.match(name) is not None


class ConfigLine:
    """One parsed config line. ``first`` is the leading word (``component``,
    ``input-node``, ...); ``values`` maps keys to raw strings."""

    def __init__(self, text: str, line_number: int | None = None, source: str | None = None):
        self.text = text
        self.line_number = line_number
        self.source = source
        body = text.split("#", 1)[0].strip()
        parts = body.split(None, 1)
        if not parts:
            raise self.error("empty config line")
        self.first = parts[0]
        if "=" in self.first:
            raise self.error(f"config line must start with a word, not {self.first!r}")
        rest = parts[1] if len(parts) > 1 else ""
        self.values: dict[str, str] = {}
        for key, value in self._pairs(rest):
            if key in self.values:
                # Kaldi's ParseLine keeps the first value silently (std::map::insert),
                # and its own xconfig writes some lines that way (an output-layer with
                # bottleneck-dim repeats max-change): accepted, but said.
                if value != self.values[key]:
                    where = f"{source or 'config'}" + (
                        f" line {line_number}" if line_number is not None else "")
                    warnings.warn(f"{where}: option {key!r} given twice; the first value "
                                  f"{self.values[key]!r} is used (as Kaldi does), not "
                                  f"{value!r}", stacklevel=3)
                continue
            self.values[key] = value
        self.used: set[str] = set()

    def _pairs(self, rest: str):
        """Yield ``(key, value)`` as Kaldi's ``ConfigLine::ParseLine`` splits them."""
        pos, size = 0, len(rest)
        while pos < size:
            if rest[pos].isspace():
                pos += 1
                continue
            eq = rest.find("=", pos)
            if eq < 0:
                raise self.error(f"expected key=value, got {rest[pos:].split()[0]!r}")
            key = rest[pos:eq]
            if not is_valid_name(key):
                words = key.split()
                if not words:
                    raise self.error(f"expected key=value, got {rest[pos:].split()[0]!r}")
                if len(words) > 1:
                    raise self.error(f"unexpected text {words[0]!r} (expected key=value)")
                raise self.error(f"invalid option name {key!r}")
            if eq + 1 < size and rest[eq + 1] in "'\"":
                quote = rest[eq + 1]
                close = rest.find(quote, eq + 2)
                if close < 0:
                    raise self.error(f"option {key}=: no matching {quote} for the opening "
                                     f"quote of {rest[eq + 1:eq + 21]!r}")
                yield key, rest[eq + 2:close]
                pos = close + 1
                continue
            # Unquoted: the value runs to the last whitespace before the next '='.
            end = size
            nxt = rest.find("=", eq + 1)
            if nxt >= 0:
                space = max(rest.rfind(" ", 0, nxt), rest.rfind("\t", 0, nxt))
                if space > eq:
                    end = space
            yield key, rest[eq + 1:end].strip()
            pos = end

    def error(self, message: str) -> ConfigError:
        return ConfigError(message, self.line_number, self.text, self.source)

    # -- getters ------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.values

    def _raw(self, key: str, default, required: bool):
        if key not in self.values:
            if required:
                raise self.error(f"missing required option {key}=")
            return None
        self.used.add(key)
        return self.values[key]

    def get_str(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        raw = self._raw(key, default, required)
        return default if raw is None else raw

    def get_int(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        raw = self._raw(key, default, required)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected an integer") from None
        problem = check_option(key, value)
        if problem:
            raise self.error(f"option {key}=: {problem}")
        return value

    def get_float(self, key: str, default: float | None = None,
                  required: bool = False) -> float | None:
        raw = self._raw(key, default, required)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected a number") from None

    def get_bool(self, key: str, default: bool | None = None,
                 required: bool = False) -> bool | None:
        raw = self._raw(key, default, required)
        if raw is None:
            return default
        low = raw.lower()
        if low in ("true", "t", "1"):
            return True
        if low in ("false", "f", "0"):
            return False
        raise self.error(f"option {key}={raw!r}: expected true or false")

    def get_int_list(self, key: str, default=None, required: bool = False,
                     sep: str = ",") -> list[int] | None:
        raw = self._raw(key, default, required)
        if raw is None:
            return default
        try:
            values = [int(v) for v in raw.split(sep) if v.strip() != ""]
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected integers separated by "
                             f"{sep!r}") from None
        problem = values and (check_option(key, min(values)) or check_option(key, max(values)))
        if problem:
            raise self.error(f"option {key}=: {problem}")
        problem = limits.exceeded("max_dim", len(values), f"number of values in {key}=")
        if problem:
            raise self.error(problem)
        return values

    def get_float_list(self, key: str, default=None, required: bool = False,
                       sep: str = ",") -> list[float] | None:
        raw = self._raw(key, default, required)
        if raw is None:
            return default
        try:
            return [float(v) for v in raw.replace(":", sep).split(sep) if v.strip() != ""]
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected numbers") from None

    def get_vector(self, key: str, default=None, required: bool = False) -> np.ndarray | None:
        vals = self.get_float_list(key, None, required)
        return default if vals is None else np.array(vals, dtype=np.float32)

    def unused(self) -> list[str]:
        return [k for k in self.values if k not in self.used]

    def check_all_used(self) -> None:
        """Kaldi rejects options a component does not know; so do we."""
        bad = self.unused()
        if bad:
            raise self.error("unknown option(s) " + ", ".join(f"{k}=" for k in bad))


def split_config_lines(text: str, source: str | None = None) -> list[ConfigLine]:
    """Parse a whole config text; blank lines and ``#`` comments are skipped."""
    lines = []
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.split("#", 1)[0].strip():
            continue
        lines.append(ConfigLine(raw, i, source))
    return lines
