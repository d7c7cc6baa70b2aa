"""Component types, registered by their Kaldi type names.

Importing this package imports the family modules of the common types, which
register them; ``component_class("AffineComponent")`` then finds the class. The
families few networks use (convolution, recurrent, attention, statistics, ...) are
imported when one of their types is first asked for (``component_class``;
``component_types()`` imports them all): ~5 ms less start-up for every program that
reads a model. Users add their own types with the ``@register`` decorator. A type
states its Kaldi file layout as a ``kaldi_fields`` list (fields.py), which the
default ``read``/``write`` walk.
"""

from __future__ import annotations

import importlib

from .base import (
    _ON_DEMAND,
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
    "affine", "scale_offset", "batchnorm", "tdnn",
)
# The other families, by the types they register (tests/components/test_registry.py
# checks the table against the modules).
_ON_DEMAND.update({
    "CompositeComponent": "composite",
    "ConvolutionComponent": "convolution", "MaxpoolingComponent": "convolution",
    "LstmNonlinearityComponent": "recurrent", "GruNonlinearityComponent": "recurrent",
    "OutputGruNonlinearityComponent": "recurrent",
    "TimeHeightConvolutionComponent": "time_height_conv",
    "StatisticsExtractionComponent": "statistics",
    "StatisticsPoolingComponent": "statistics",
    "RestrictedAttentionComponent": "attention",
    "DistributeComponent": "distribute",
})

for _name in _FAMILIES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:  # a family not written yet
        if _e.name != f"{__name__}.{_name}":
            raise

__all__ = ["Component", "Flags", "InputDeps", "UpdatableComponent", "component_class",
           "component_types", "register"]
