"""Sanity limits on the sizes that a model, a config or a request may ask for.

Input names sizes (a dimension, a time offset or period, a number of indexes)
and pynnet3 allocates from them. Each size is checked against a limit here
*before* anything is allocated, so that bad input ends as a
:mod:`pynnet3.errors` exception naming the place at fault, never as a
``MemoryError`` or a machine that swaps.

====================  ========  ====================================================
limit                 default   what it bounds
====================  ========  ====================================================
``max_dim``           2**20     one dimension: a node or component dim, the rows or
                                columns of a parameter, a count of blocks, filters,
                                repeats or heads
``max_params``        2**28     floats in one parameter array (1 GiB in float32)
``max_context``       2**20     frames: a time offset, context, period or interval
                                (descriptors and components)
``max_modulus``       2**10     a Round() modulus and the network's modulus (the LCM
                                of those and of Switch() sizes): the context
                                search tries every time shift below it
``max_rows``          2**24     indexes: of one input or output of a request, and of
                                one dependency table built while compiling
``max_floats``        2**31     floats in one matrix of a compiled computation
                                (8 GiB in float32), checked before running it
====================  ========  ====================================================

Raise a limit for the process with the environment variable named like it in
upper case with a ``PYNNET3_`` prefix (``PYNNET3_MAX_DIM=4194304``, read at
import), at run time with ``pynnet3.limits.LIMITS.max_dim = ...``, or for a block
with ``with pynnet3.limits.override(max_dim=...):``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass
class Limits:
    """The limits in force; :data:`LIMITS` is the one instance pynnet3 reads."""

    max_dim: int = 2**20
    max_params: int = 2**28
    max_context: int = 2**20
    max_modulus: int = 2**10
    max_rows: int = 2**24
    max_floats: int = 2**31

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Limits:
        """Defaults, overridden by ``PYNNET3_<NAME>`` environment variables."""
        env = os.environ if environ is None else environ
        given = {}
        for f in fields(cls):
            text = env.get("PYNNET3_" + f.name.upper())
            if text is None:
                continue
            try:
                value = int(text.replace("_", ""), 0)
            except ValueError:
                raise ValueError(f"PYNNET3_{f.name.upper()}={text!r}: expected an integer"
                                 ) from None
            if value <= 0:
                raise ValueError(f"PYNNET3_{f.name.upper()}={text!r}: must be positive")
            given[f.name] = value
        return cls(**given)


LIMITS = Limits.from_env()


@contextmanager
def override(**values: int) -> Iterator[Limits]:
    """Set some limits for the duration of a ``with`` block (then restore them)."""
    saved = replace(LIMITS)
    for name, value in values.items():
        if not hasattr(saved, name):
            raise AttributeError(f"no limit named {name!r}")
        setattr(LIMITS, name, int(value))
    try:
        yield LIMITS
    finally:
        for f in fields(Limits):
            setattr(LIMITS, f.name, getattr(saved, f.name))


def exceeded(limit: str, value: int, what: str) -> str | None:
    """None when ``abs(value)`` is within ``limit`` (a field name of :class:`Limits`),
    else the message to raise: what was asked, the limit and how to raise it."""
    bound = getattr(LIMITS, limit)
    if abs(value) <= bound:
        return None
    return (f"{what} = {value} exceeds the limit {limit} = {bound} (raise it with "
            f"PYNNET3_{limit.upper()} or pynnet3.limits.LIMITS.{limit}, see pynnet3.limits)")


# Integer options of component configs (and the same fields of model files, whose
# tags are these names in CamelCase: <InputDim>) that size something, by limit.
_DIMENSIONS = (
    "dim input-dim output-dim block-dim cell-dim recurrent-dim key-dim value-dim dim-offset "
    "input-x-dim input-y-dim input-z-dim filt-x-dim filt-y-dim filt-x-step filt-y-step "
    "num-filters num-filters-in num-filters-out num-blocks num-repeats num-heads "
    "num-components height-in height-out height-subsample-out height-offsets rank rank-in "
    "rank-out rank-in-out num-log-count-features sizes column-map specaugment-max-regions")
_FRAMES = (
    "input-period output-period left-context right-context time-period time-stride "
    "num-left-inputs num-right-inputs num-left-inputs-required num-right-inputs-required "
    "zeroing-interval recurrence-interval time-mask-max-frames time-offsets "
    "required-time-offsets offsets")
OPTION_LIMITS = {**dict.fromkeys(_DIMENSIONS.split(), "max_dim"),
                 **dict.fromkeys(_FRAMES.split(), "max_context")}


@functools.lru_cache(maxsize=1024)
def option_limit(name: str) -> str | None:
    """The limit on an integer option (``input-dim``) or model field (``<InputDim>``),
    None when it sizes nothing."""
    if name.startswith("<"):
        name = re.sub(r"(?<!^)([A-Z])", r"-\1", name.strip("<>")).lower()
    return OPTION_LIMITS.get(name)


def check_option(name: str, value: int) -> str | None:
    """None when an integer option ``name`` may hold ``value``, else why not:
    outside int32 (as Kaldi reads it) or beyond its limit (magnitude)."""
    if out_of_int32(value):
        return f"{name} = {value} is out of the int32 range"
    limit = option_limit(name)
    return exceeded(limit, value, name) if limit else None


def out_of_int32(value: int) -> bool:
    """Whether ``value`` is outside Kaldi's int32 (the type of every integer it reads)."""
    return not INT32_MIN <= value <= INT32_MAX
