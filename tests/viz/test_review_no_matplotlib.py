"""Review: without matplotlib, ``hasattr(pynnet3, "viz")`` is True and ``pynnet3.viz``
imports (matplotlib is imported only by the functions that plot, which raise a
DependencyError naming the extra); checked in a fresh interpreter where importing
matplotlib fails."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["matplotlib"] = None  # (import matplotlib raises ImportError)
import pynnet3
assert hasattr(pynnet3, "viz")
from pynnet3.viz import network_graph, plot_memory, plot_report
from pynnet3.errors import DependencyError
try:
    plot_report("x.png", network_report=pynnet3.NetworkReport())
except DependencyError as e:
    assert "pynnet3[viz]" in str(e), e
else:
    raise AssertionError("no DependencyError")
assert "matplotlib" not in {m for m in sys.modules if sys.modules[m] is not None}
print("ok")
"""


def test_viz_without_matplotlib():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
