"""Test-session hooks: a parameter marked ``reference_missing`` (see
tests/reference.py, ref_params) fails with its reason instead of running; every test
gets back the BLAS thread count it started with."""

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


@pytest.fixture(autouse=True)
def _blas_threads_restored():
    """The CLI's --num-threads (compute, xvector-compute, demo run in-process here)
    sets the process's BLAS threads; each test gets back the count it started with,
    so no test runs under another's setting (train-cli's runs are sensitive to the
    BLAS's rounding: docs/training.md)."""
    from pynnet3.components import blas

    before = blas.num_threads()
    yield
    if before is not None and blas.num_threads() != before:
        blas.set_num_threads(before)
