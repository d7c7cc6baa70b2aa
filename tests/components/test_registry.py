"""The component registry: the families few networks use are imported when one of
their types is first asked for; every type is still found by its Kaldi name, and a
user's @register keeps working (components/__init__.py)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pynnet3.components as components
from pynnet3.components import component_class, component_types
from pynnet3.components.base import _ON_DEMAND, Component


def _registered_by(module_name: str) -> set[str]:
    """The type names the classes of a family module register (its classes that
    component_class finds under their own type_name)."""
    module = importlib.import_module(f"pynnet3.components.{module_name}")
    return {cls.type_name for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__ and issubclass(cls, Component)
            and component_class(cls.type_name) is cls}


def test_the_on_demand_table_names_each_familys_types():
    for family in set(_ON_DEMAND.values()):
        assert _registered_by(family) == {t for t, f in _ON_DEMAND.items() if f == family}
    for family in components._FAMILIES:  # (imported with the package: not in the table)
        assert _registered_by(family)
        assert not _registered_by(family) & set(_ON_DEMAND)


def test_component_types_lists_every_family():
    types = component_types()
    assert set(_ON_DEMAND) <= set(types)
    assert len(types) >= 46
    for name, cls in types.items():
        assert component_class(name) is cls


def _fresh(code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()


def test_a_family_is_imported_when_a_type_is_first_asked_for():
    out = _fresh(
        "import sys\n"
        "from pynnet3.components import component_class\n"
        "loaded = lambda m: f'pynnet3.components.{m}' in sys.modules\n"
        "print(loaded('statistics'), loaded('convolution'), loaded('affine'))\n"
        "print(component_class('NoSuchComponent'), loaded('statistics'))\n"
        "cls = component_class('StatisticsPoolingComponent')\n"
        "print(cls.__module__, cls.type_name, loaded('statistics'), loaded('convolution'))\n")
    assert out == ["False", "False", "True", "None", "False",
                   "pynnet3.components.statistics", "StatisticsPoolingComponent", "True",
                   "False"]


def test_a_users_type_registered_before_its_family_is_imported_stays():
    out = _fresh(
        "from pynnet3.components import component_class, component_types, register\n"
        "from pynnet3.components.base import Component\n"
        "@register\n"
        "class Mine(Component):\n"
        "    type_name = 'DistributeComponent'\n"
        "@register\n"
        "class Other(Component):\n"
        "    type_name = 'MyOwnComponent'\n"
        "print(component_class('DistributeComponent') is Mine,\n"
        "      component_types()['DistributeComponent'] is Mine,\n"
        "      component_class('MyOwnComponent') is Other,\n"
        "      component_class('StatisticsPoolingComponent').__name__)\n")
    assert out == ["True", "True", "True", "StatisticsPoolingComponent"]


def test_a_family_imported_directly_keeps_the_users_class():
    """pynnet3.train (for one) imports the composite family itself: a type the user
    registered before still wins, as when every family loaded with the package."""
    out = _fresh(
        "from pynnet3.components import component_class, register\n"
        "from pynnet3.components.base import Component\n"
        "@register\n"
        "class Mine(Component):\n"
        "    type_name = 'CompositeComponent'\n"
        "import pynnet3.components.composite as composite\n"
        "print(component_class('CompositeComponent') is Mine,\n"
        "      composite.CompositeComponent is not Mine)\n")
    assert out == ["True", "True"]


def test_registering_a_builtin_class_again_restores_it():
    out = _fresh(
        "from pynnet3.components import component_class, register\n"
        "orig = component_class('AffineComponent')\n"
        "@register\n"
        "class MyAffine(orig):\n"
        "    type_name = 'AffineComponent'\n"
        "a = component_class('AffineComponent').__name__\n"
        "register(orig)\n"
        "print(a, component_class('AffineComponent') is orig)\n")
    assert out == ["MyAffine", "True"]
