"""Precomputed-index objects as plain data (for the compile-cache file).

The object a component's ``precompute_indexes`` returns is part of a compiled
computation. To store it in a file that is data, not code, its class registers
here (:func:`plain_indexes`, naming the component types that make it) and gives

* ``to_data() -> dict``: its fields as numpy arrays (int64, or float for values),
  ints, floats, bools or None, nothing else;
* ``from_data(data) -> object`` (classmethod): the object again, after checking
  every field's type, shape and range against the others (raises ValueError);
* ``check_use(component, num_in, num_out)``: raises ValueError unless the object
  fits that component and the row counts of the command using it (``num_in`` is
  None where the command names no input rows).

Only registered classes are stored or rebuilt: a file cannot name anything else.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

_CLASSES: dict[str, tuple[type, frozenset[str]]] = {}


def plain_indexes(*component_types: str) -> Callable[[type], type]:
    """Class decorator: register a precomputed-indexes class (module doc), made by
    the components of the given Kaldi type names."""

    def add(cls: type) -> type:
        for method in ("to_data", "from_data", "check_use"):
            if not callable(getattr(cls, method, None)):
                raise TypeError(f"{cls.__name__} lacks {method}()")
        _CLASSES[cls.__name__] = (cls, frozenset(component_types))
        return cls

    return add


def indexes_class(name: str) -> type | None:
    """The registered class of that name, or None."""
    entry = _CLASSES.get(name)
    return None if entry is None else entry[0]


def indexes_made_by(type_name: str) -> bool:
    """Whether components of that type make registered objects."""
    return any(type_name in types for _, types in _CLASSES.values())


def indexes_to_data(obj: object) -> tuple[str, dict] | None:
    """``(class name, fields)`` of a registered object; None for another class."""
    entry = _CLASSES.get(type(obj).__name__)
    if entry is None or entry[0] is not type(obj):
        return None
    return type(obj).__name__, obj.to_data()


def indexes_from_data(name: str, data: dict) -> object:
    """The object of registered class ``name`` rebuilt from ``data``; ValueError
    when the class is not registered or the fields are wrong."""
    cls = indexes_class(name)
    if cls is None:
        raise ValueError(f"{name!r} is not a known precomputed-indexes class")
    if not isinstance(data, dict):
        raise ValueError(f"{name}: fields are not a mapping")
    return cls.from_data(data)


def check_indexes_use(obj: object, component, num_in: int | None, num_out: int) -> None:
    """ValueError unless ``obj`` is made by ``component``'s type and fits the rows."""
    entry = _CLASSES.get(type(obj).__name__)
    if entry is None or component.type_name not in entry[1]:
        raise ValueError(f"{type(obj).__name__} is not made by {component.type_name}")
    obj.check_use(component, num_in, num_out)


# -- field checks for from_data / check_use ---------------------------------------------
def expect_fields(data: dict, names: set[str], what: str) -> None:
    if set(data) != names:
        raise ValueError(f"{what}: fields {sorted(data)}, expected {sorted(names)}")


def int_field(data: dict, name: str, lo: int = 0, hi: int = 2**62) -> int:
    v = data[name]
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
    return v


def float_field(data: dict, name: str) -> float:
    v = data[name]
    if type(v) not in (int, float) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def int_array(data: dict, name: str, shape: tuple, lo: int | None = None,
              hi: int | None = None, optional: bool = False) -> np.ndarray | None:
    """``data[name]`` as an int64 array of ``shape`` (None entries: any size),
    values in ``[lo, hi)``; None allowed when ``optional``."""
    a = data[name]
    if a is None and optional:
        return None
    if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != len(shape) \
            or any(want is not None and got != want
                   for got, want in zip(a.shape, shape, strict=True)):
        raise ValueError(f"{name} must be an int64 array of shape {shape}, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} "
                         f"{getattr(a, 'shape', '')}")
    if a.size and ((lo is not None and a.min() < lo) or (hi is not None and a.max() >= hi)):
        raise ValueError(f"{name} has values outside [{lo}, {hi})")
    return a


def float_array(data: dict, name: str, length: int, optional: bool = False
                ) -> np.ndarray | None:
    """``data[name]``: a 1-d float array of ``length`` finite values (None allowed
    when ``optional``)."""
    a = data[name]
    if a is None and optional:
        return None
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or a.shape != (length,) \
            or not np.isfinite(a).all():
        raise ValueError(f"{name} must be {length} finite floats")
    return a


def same_rows(what: str, have: int, want: int | None) -> None:
    """ValueError unless ``have == want`` (``want`` None: not known, not checked)."""
    if want is not None and have != want:
        raise ValueError(f"{what}: made for {have} rows, the command has {want}")


__all__ = ["check_indexes_use", "expect_fields", "float_array", "float_field",
           "indexes_class", "indexes_from_data", "indexes_made_by", "indexes_to_data",
           "int_array", "int_field", "plain_indexes", "same_rows"]
