"""The pynnet3 package: its public names load on first use (PEP 562), so a program
imports only what it uses."""

from __future__ import annotations

import subprocess
import sys

import pynnet3


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_every_public_name_resolves():
    for name in pynnet3.__all__:
        assert getattr(pynnet3, name) is not None, name
    assert set(pynnet3.__all__) <= set(dir(pynnet3))
    assert pynnet3.Nnet.__module__ == "pynnet3.nnet"
    assert pynnet3.export.__name__ == "pynnet3.export"
    assert pynnet3.check_computation.__module__.startswith("pynnet3.analysis")


def test_star_import_gives_the_public_names():
    namespace: dict = {}
    exec("from pynnet3 import *", namespace)
    assert {"Nnet", "compile", "run", "export", "train"} <= set(namespace)


def test_submodules_are_attributes_and_unknown_names_are_errors():
    assert pynnet3.graphopt.optimize_network is pynnet3.optimize_network
    for name in ("no_such_thing", "_private"):
        try:
            getattr(pynnet3, name)
        except AttributeError as e:
            assert name in str(e)
        else:
            raise AssertionError(name)


def test_import_pynnet3_loads_nothing_heavy():
    loaded = _modules_after("import pynnet3")
    assert "numpy" not in loaded
    assert not {m for m in loaded if m.startswith("pynnet3.")} - {"pynnet3.errors"}


def test_the_command_line_does_not_load_export_training_or_drawing():
    loaded = _modules_after("import pynnet3.cli.main")
    assert not {m for m in loaded
                if m.startswith(("pynnet3.export", "pynnet3.train", "pynnet3.viz"))}


def test_lower_layers_do_not_load_higher_ones():
    """DESIGN's layers import downward only: the network, the optimizer and the
    runtime load no compile cache (``pynnet3.run`` of a request lives above both, in
    ``cache/running.py``), and the analysis no runtime."""
    for module, higher in (("pynnet3.nnet", ("pynnet3.cache", "pynnet3.runtime")),
                           ("pynnet3.optimize.splice", ("pynnet3.cache", "pynnet3.runtime")),
                           ("pynnet3.analysis.memory", ("pynnet3.cache", "pynnet3.runtime")),
                           ("pynnet3.runtime.computer", ("pynnet3.cache",))):
        loaded = _modules_after(f"import {module}")
        assert not {m for m in loaded if m.startswith(higher)}, module


def test_the_runtime_runs_computations_and_pynnet3_run_compiles_requests():
    import numpy as np
    import pytest

    from pynnet3.errors import RuntimeInputError
    from pynnet3.runtime.computer import run as run_computation

    nnet = pynnet3.Nnet.from_config("input-node name=input dim=2\n"
                                    "component name=a type=AffineComponent input-dim=2 "
                                    "output-dim=3\ncomponent-node name=a component=a input=input\n"
                                    "output-node name=output input=a\n", seed=0)
    idx = np.stack([np.zeros(4, np.int64), np.arange(4), np.zeros(4, np.int64)], axis=1)
    req = pynnet3.ComputationRequest(inputs=[pynnet3.IoSpecification("input", idx)],
                                     outputs=[pynnet3.IoSpecification("output", idx)])
    x = {"input": np.arange(8, dtype=np.float32).reshape(4, 2)}
    with pytest.raises(RuntimeInputError, match="pynnet3.run compiles a request"):
        run_computation(nnet, req, x)
    want = run_computation(nnet, pynnet3.compile(nnet, req), x).outputs["output"]
    np.testing.assert_array_equal(pynnet3.run(nnet, req, x).outputs["output"], want)
    comp = pynnet3.compile(nnet, req)
    with pytest.raises(RuntimeInputError, match="network_optimize"):
        pynnet3.run(nnet, comp, x, network_optimize=True)
