"""Kaldi config lines: ``component name=affine1 type=AffineComponent input-dim=10 ...``.

A :class:`ConfigLine` holds the first word and the ``key=value`` pairs of one
line. Values may contain spaces when they are descriptor expressions
(``input=Append(Offset(x, -1), x)``): a value runs until the whitespace before
the next ``key=``. Getters convert with Kaldi's rules and remember which keys were
used, so that :meth:`check_all_used` can reject unknown options like Kaldi does.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import ConfigError

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_\-.]*)=")


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
        matches = list(_KEY.finditer(rest))
        if matches and rest[:matches[0].start()].strip():
            raise self.error(f"unexpected text {rest[:matches[0].start()].strip()!r}")
        if not matches and rest.strip():
            raise self.error(f"expected key=value, got {rest.strip()!r}")
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(rest)
            key = m.group(1)
            value = rest[m.end():end].strip()
            if key in self.values:
                raise self.error(f"option {key!r} given twice")
            self.values[key] = value
        self.used: set[str] = set()

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
            return int(raw)
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected an integer") from None

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
            return [int(v) for v in raw.split(sep) if v.strip() != ""]
        except ValueError:
            raise self.error(f"option {key}={raw!r}: expected integers separated by "
                             f"{sep!r}") from None

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
