"""Evidence for the strict xfails of test_train_cli.py (KNOWN_IRREPRODUCIBLE): on those
runs a float32-rounding-sized change of the input moves our own result by more than
the 1e-3 criterion of the Kaldi comparison, so an implementation whose float32
rounding differs from Kaldi's (other BLAS kernels, other summation orders) cannot be
held to 1e-3 there. The control run, trained the same way, moves by far less: the
perturbation is not large enough to fail any run.

The perturbation: every entry of the first minibatch's input one float32 ULP up (or
down), np.nextafter: 6e-8-1.2e-7 relative, the size of one float32 rounding.
Everything else (archive bytes, model, flags) is the Kaldi run's. Numbers measured
here (max over components of ||change_perturbed - change|| / ||change||, ULP up / down):
tdnn_relu_bn unmerged 1.12 / 1.25; tdnn_relu_bn_lr0.01 unmerged 1.31 / 1.26; xvector
merged 6.1e-2 / 3.6e-2 (tdnn6, tdnn7, output; tdnn1-5 <= 6.7e-4); control
tdnn_relu_bn_lr0.01 merged 3.2e-5 / 3.3e-5.

(tdnn_relu_bn merged is not the control: it passes against Kaldi, but one ULP down
moves its tdnn1-5 by 3.5e-3-6.6e-3 here: the ReLU kink at its last minibatch that
docs/training.md describes.)"""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.cli.files import read_model
from pynnet3.cli.main import main
from tests.cli.test_train_cli import (
    KNOWN_IRREPRODUCIBLE,
    TOLERANCE,
    _archive,
    _change_errors,
    _flags,
    _run_info,
)
from tests.reference import REF, ref_params

# A run that reproduces Kaldi's and stays within the tolerance under the perturbation.
CONTROL = ("tdnn_relu_bn_lr0.01", "merged")
# Far less than the tolerance: what "does not move" means for the control.
CONTROL_BOUND = TOLERANCE / 10


def _cases() -> list:
    """Every KNOWN_IRREPRODUCIBLE run (an xfail added there is tested here too), then
    the control."""
    return [pytest.param(case, kind, id=f"{case}-{kind}")
            for case, kind in [*sorted(KNOWN_IRREPRODUCIBLE), CONTROL]]


def _perturbed_archive(case: str, kind: str, direction: float, tmp_path):
    """The run's archive with the first example's input one ULP towards ``direction``;
    checks that an unperturbed copy written the same way is the original's bytes."""
    from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo, read_examples

    original = _archive(case, kind)
    copy, perturbed = tmp_path / "copy.ark", tmp_path / "perturbed.ark"
    with ExampleWriter(f"ark:{copy}") as same, ExampleWriter(f"ark:{perturbed}") as other:
        for i, (key, eg) in enumerate(read_examples(f"ark:{original}")):
            same.write(key, eg)
            if i == 0:
                x = eg["input"].features
                assert isinstance(x, np.ndarray) and x.dtype == np.float32
                y = np.nextafter(x, np.float32(direction))
                rel = np.abs(y.astype(np.float64) - x) / np.abs(x)
                assert (y != x).all() and rel.max() <= 2.0 ** -23
                eg = NnetExample([NnetIo(io.name, io.indexes, y) if io.name == "input"
                                  else io for io in eg.io])
            other.write(key, eg)
    assert copy.read_bytes() == original.read_bytes()
    return perturbed


def _train(case: str, archive, out) -> object:
    folder = REF / "train-cli" / case
    assert main(["train", *_flags(folder), str(folder / "model_in.txt.gz"),
                 f"ark:{archive}", str(out)]) == 0
    return read_model(str(out))


@pytest.mark.parametrize("case, kind", ref_params(_cases(), "train-cli runs", 2))
def test_rounding_sized_input_change_moves_our_result(case, kind, tmp_path, capsys):
    """Our own run, unperturbed and with the first input one ULP up, then down: on
    every KNOWN_IRREPRODUCIBLE run some parameter's change moves by more than
    TOLERANCE; on the control no parameter's change moves by CONTROL_BOUND."""
    assert _run_info(case)["runs"][kind]  # (the run exists)
    before = read_model(str(REF / "train-cli" / case / "model_in.txt.gz"))
    base = _train(case, _archive(case, kind), tmp_path / "base.txt")
    for direction, name in ((np.inf, "up"), (-np.inf, "down")):
        folder = tmp_path / name
        folder.mkdir()
        moved = _train(case, _perturbed_archive(case, kind, direction, folder),
                       folder / "model.txt")
        capsys.readouterr()
        errors = _change_errors(before, moved, base)
        worst = max(errors, key=errors.get)
        if (case, kind) == CONTROL:
            assert errors[worst] < CONTROL_BOUND, (name, worst, errors[worst])
        else:
            assert errors[worst] > TOLERANCE, (name, worst, errors[worst])
