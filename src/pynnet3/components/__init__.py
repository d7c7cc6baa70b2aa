"""Component types, registered by their Kaldi type names.

Importing this package imports every family module, which registers its types;
``component_class("AffineComponent")`` then finds the class. Users add their own
types with the ``@register`` decorator. A type states its Kaldi file layout as a
``kaldi_fields`` list (fields.py), which the default ``read``/``write`` walk.
"""

from __future__ import annotations

import importlib

from .base import (
    Component,
    Flags,
    InputDeps,
    UpdatableComponent,
    component_class,
    component_types,
    register,
)

_FAMILIES = (
    "nonlinear", "simple_misc", "dropout",
    "affine", "scale_offset", "batchnorm", "composite", "convolution",
    "recurrent", "tdnn", "time_height_conv",
    "statistics", "attention", "distribute",
)

for _name in _FAMILIES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:  # a family not written yet
        if _e.name != f"{__name__}.{_name}":
            raise

__all__ = ["Component", "Flags", "InputDeps", "UpdatableComponent", "component_class",
           "component_types", "register"]
