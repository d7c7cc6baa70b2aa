"""Declarative Kaldi file layouts: a component lists its ``<Tag> value`` fields once.

Most component bodies in a Kaldi model file are a fixed sequence of tagged values
between ``<TypeName>`` and ``</TypeName>``. A class states that sequence as its
``kaldi_fields``, in file order: :class:`Field` entries for the regular tags and
:class:`Custom` steps (a pair of method names) for the irregular parts (Kaldi quirks,
legacy layouts, derived statistics, cross-field checks). :func:`read_fields` and
:func:`write_fields` walk the list; ``Component.read`` / ``Component.write`` wrap them
in the opening and closing tokens for every class that has the list.

Invariant: reading then writing a field list reproduces a file Kaldi wrote byte for
byte; an optional field (one with a default) is accepted missing on read, and its
``write_if`` (if any) says when Kaldi writes it. Errors name the file, the
line/offset and the token at fault, like every other reader error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Sentinel: the field must be in the file.
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()

# The reader method for each kind (a double is read as a Python float, which holds it).
_READ = {"int": "read_int", "float": "read_float", "double": "read_float",
         "bool": "read_bool", "vector": "read_vector", "matrix": "read_matrix",
         "int_vector": "read_int_vector", "int_pair_vector": "read_int_pair_vector",
         "token": "read_token"}


@dataclass(frozen=True, slots=True)
class Field:
    """One ``<Tag> value`` of a component's file body.

    ``kind``: int, float, double (written as a C++ double), bool, vector, matrix,
    int_vector, int_pair_vector, token, or flag (a bare ``<Tag>`` that means True,
    written only when the attribute is true). An empty ``tag`` is a value that
    follows the previous one untagged (Kaldi's ``<RankInOut> a b``).

    ``default`` makes the field optional on read (a callable is called with the
    component, for defaults that depend on earlier fields or must be fresh arrays);
    ``write_if(comp)`` False skips writing. ``check(tag, value, comp)`` returns a
    message to refuse the value with (a scalar value is named as the token).
    ``convert`` maps the value read (e.g. to float32 precision). ``aliases`` are
    other tags accepted in its place on read (legacy names). ``finite`` names the
    parameter when NaN/inf must be refused. ``then`` are fields present exactly when
    this optional one is (read and written after it).
    """

    tag: str
    attr: str
    kind: str
    default: Any = REQUIRED
    write_if: Callable[[Any], bool] | None = None
    check: Callable[[str, Any, Any], str | None] | None = None
    convert: Callable[[Any], Any] | None = None
    aliases: tuple[str, ...] = ()
    finite: str | None = None
    then: tuple[Field, ...] = ()
    # Derived once, for speed: the tag as written, and the writer's method name.
    tag_bytes: bytes = field(init=False, repr=False, compare=False)
    writer: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag_bytes", self.tag.encode() + b" " if self.tag else b"")
        object.__setattr__(self, "writer", f"write_{self.kind}")


@dataclass(frozen=True, slots=True)
class Custom:
    """A hand-written step inside a field list. ``read`` / ``write`` name a method
    (``getattr(comp, read)(r)``) or are functions called as ``read(comp, r)`` /
    ``write(comp, w)``; None where the step does nothing that way (e.g. a read-only
    check of the fields read so far, or a legacy token only accepted on read)."""

    read: str | Callable[[Any, Any], None] | None
    write: str | Callable[[Any, Any], None] | None


def skip_optional(tag: str, kind: str) -> Custom:
    """A legacy ``<Tag> value`` Kaldi still accepts on read and no longer writes."""
    return Custom(lambda comp, r: r.read_optional(tag, kind), None)


def _skip_repeated_opening(comp, r) -> None:
    # A byte comparison, not a token read and put back: this runs for every
    # component of such a type in a model.
    start = r.token_start()
    opening = b"<" + comp.type_name.encode() + b">"
    end = start + len(opening)
    if r.data.startswith(opening, start) and r.data[end:end + 1].isspace():
        r.read_token()


# Some Kaldi readers accept the opening <TypeName> twice (ExpectOneOrTwoTokens).
REPEATED_OPENING = Custom(_skip_repeated_opening, None)


Step = Field | Custom


def pair(tag: str, attr: str, kind: str) -> tuple[Field, Field]:
    """Kaldi's ``<XInOut> a b`` (two values after one tag) into ``attr_in`` and
    ``attr_out``; splice into a field list with ``*pair(...)``."""
    return Field(tag, f"{attr}_in", kind), Field("", f"{attr}_out", kind)

# The UpdatableComponent header (learning rate and friends), shared by every
# updatable component: see UpdatableComponent.read_updatable_common.
UPDATABLE_HEADER = Custom("read_updatable_common", "write_updatable_header")


# -- checks (signature: tag, value, comp -> message or None) ---------------------------
def positive(tag: str, value, comp) -> str | None:
    return None if value > 0 else f"{tag} must be positive"


def non_negative(tag: str, value, comp) -> str | None:
    return None if value >= 0 else f"{tag} must be >= 0"


def proportion(tag: str, value, comp) -> str | None:
    """Kaldi asserts a proportion in [0, 1] before using it; refuse it when reading."""
    return None if 0.0 <= value <= 1.0 else f"{tag} must be in [0, 1], got {value!r}"


def non_empty(tag: str, value, comp) -> str | None:
    return None if len(value) else f"{comp.type_name}: empty {tag}"


def check_finite(r, name: str, arr: np.ndarray, pos: int) -> None:
    """Kaldi refuses parameters with NaN/inf; so do we, naming where they were read."""
    if arr.size and not np.all(np.isfinite(arr)):
        raise r.error(f"non-finite value in {name}", pos=pos)


# -- reading and writing -----------------------------------------------------------------
def _run_custom(hook, comp, stream) -> None:
    """One side of a Custom step: a method name, a function, or None (nothing)."""
    if type(hook) is str:
        getattr(comp, hook)(stream)
    elif hook is not None:
        hook(comp, stream)


def read_fields(r, comp, steps: tuple[Step, ...]) -> None:
    """Read ``steps`` in order from the KaldiReader ``r`` into ``comp``'s attributes."""
    for step in steps:
        if type(step) is Custom:
            _run_custom(step.read, comp, r)
        else:
            _read_field(r, comp, step)


def _read_field(r, comp, f: Field) -> None:
    pos = r.pos  # errors about the value point at its tag (as the hand-written readers did)
    if f.tag:
        # Read the tag once; when it is not this field's, put it back (an optional
        # field or flag then takes its default) or name it in the error.
        saved_tag = r.tag
        tok = r.read_token()
        if tok != f.tag and tok not in f.aliases:
            r.pos, r.tag = pos, saved_tag
            if f.kind == "flag" or f.default is not REQUIRED:
                _set_default(comp, f)
                return
            wanted = " or ".join(repr(t) for t in (f.tag, *f.aliases))
            raise r.error(f"expected {wanted}", token=tok, pos=r.token_start())
        if f.kind == "flag":
            setattr(comp, f.attr, True)
            return
    value_pos = r.pos
    value = getattr(r, _READ[f.kind])()
    if f.finite is not None:
        check_finite(r, f.finite, value, value_pos)
    if f.convert is not None:
        value = f.convert(value)
    if f.check is not None:
        problem = f.check(f.tag, value, comp)
        if problem:  # a scalar value is the token at fault; an array is named by the tag
            token = str(value) if isinstance(value, (int, float, str)) else None
            raise r.error(problem, token=token, pos=pos)
    setattr(comp, f.attr, value)
    if f.then:
        for sub in f.then:
            _read_field(r, comp, sub)


def _set_default(comp, f: Field) -> None:
    if f.kind == "flag":  # an absent flag is False
        setattr(comp, f.attr, False)
        return
    setattr(comp, f.attr, f.default(comp) if callable(f.default) else f.default)
    for sub in f.then:
        _set_default(comp, sub)


def write_fields(w, comp, steps: tuple[Step, ...]) -> None:
    """Write ``steps`` in order from ``comp``'s attributes to the KaldiWriter ``w``."""
    for step in steps:
        if type(step) is Custom:
            _run_custom(step.write, comp, w)
        else:
            _write_field(w, comp, step)


def _write_field(w, comp, f: Field) -> None:
    if f.write_if is not None and not f.write_if(comp):
        return
    value = getattr(comp, f.attr)
    if f.kind == "flag":
        if value:
            w.parts.append(f.tag_bytes)
        return
    w.parts.append(f.tag_bytes)  # what write_token(tag) writes (b"" for an untagged value)
    getattr(w, f.writer)(value)
    if f.then:
        for sub in f.then:
            _write_field(w, comp, sub)


__all__ = ["Field", "Custom", "Step", "REQUIRED", "UPDATABLE_HEADER", "REPEATED_OPENING",
           "skip_optional", "pair", "read_fields", "write_fields", "positive", "non_negative",
           "proportion", "non_empty", "check_finite"]
