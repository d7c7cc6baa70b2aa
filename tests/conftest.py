"""Test-session hooks: a parameter marked ``reference_missing`` (see
tests/reference.py, ref_params) fails with its reason instead of running."""

from __future__ import annotations

import pytest


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "reference_missing(reason): the reference folder is present but a "
        "listing of it found nothing; the test fails with the reason")


def pytest_runtest_setup(item) -> None:
    mark = item.get_closest_marker("reference_missing")
    if mark is not None:
        pytest.fail(mark.kwargs["reason"], pytrace=False)
