"""pynnet3 train (nnet3-train) on Kaldi's examples archives: the models the real
nnet3-train wrote in kaldi-reference/train-cli reproduced (parameter change of every
updatable component within 1e-3 relative of Kaldi's change), BatchNorm counts scaled
by 0.8 per minibatch with stats unchanged, and the log lines (objective per
minibatch and overall, max-change activity, natural gradient's Gram-Schmidt
warnings) as Kaldi logged them."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

from pynnet3.cli.files import read_model
from pynnet3.cli.main import main
from tests.reference import REF, ref_params, require_reference

_NG_DRIFT = (
    "not reproducible to 1e-3 by any implementation (docs/training.md, 'Where no "
    "implementation can match Kaldi exactly'): one float32 ULP up / down on the first "
    "minibatch's input moves our own change by {ulp} (max relative; "
    "test_train_cli_sensitivity.py asserts > 1e-3), so rounding other than Kaldi's cannot "
    "be expected to meet 1e-3 here. Likely amplifiers: minibatches with fewer rows than a "
    "natural-gradient rank (Kaldi logged {warnings} Gram-Schmidt fallbacks here; we take "
    "as many) and long one-sequence runs; against Kaldi: {detail}")
# (case, run) -> why the strict xfail: the runs no implementation can reproduce.
# test_train_cli_sensitivity.py tests the reason of every run listed here.
KNOWN_IRREPRODUCIBLE = {
    ("tdnn_relu_bn", "unmerged"): _NG_DRIFT.format(
        ulp="1.12 / 1.25", warnings=7, detail="objectives match Kaldi's for minibatches "
        "0-2 (6 digits), then differ from minibatch 3 on (-5.92633 vs -5.9262; ULP up: "
        "-5.92624) and the change ends 0.57-1.2 off after 32 one-sequence minibatches"),
    ("tdnn_relu_bn_lr0.01", "unmerged"): _NG_DRIFT.format(
        ulp="1.31 / 1.26", warnings=7, detail="minibatch 1's max-change factor is 0.289376 "
        "vs Kaldi's 0.289377 and the difference grows (0.269865 vs 0.27195 at minibatch "
        "4); 0.96-1.26 off after 32"),
    ("xvector", "merged"): _NG_DRIFT.format(
        ulp="6.1e-2 / 3.6e-2, in tdnn6, tdnn7, output (tdnn1-5: <= 6.7e-4)", warnings=6,
        detail="tdnn1-5 and the objectives match (<= 7.7e-4 relative change error) but "
        "tdnn6/tdnn7/output (after statistics pooling, BatchNorm on 8 rows) are 1.1e-3 to "
        "3.9e-2 off"),
}


def _run_info(case: str) -> dict:
    return json.loads((REF / "train-cli" / case / "run_info.json").read_text())


def _runs() -> list[tuple[str, str]]:
    """Every (case, run) of train-cli/ that has Kaldi's model: found from each case's
    run_info.json, not from a fixed list, so an added case is tested as it is."""
    root = REF / "train-cli"
    if not root.is_dir():
        return []
    return [(p.parent.name, kind) for p in sorted(root.glob("*/run_info.json"))
            for kind, run in json.loads(p.read_text()).get("runs", {}).items()
            if (p.parent / run["model_out"]).is_file()]


def _params(run):
    case, kind = run
    xfail = KNOWN_IRREPRODUCIBLE.get(run)
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(case, kind, marks=marks, id=f"{case}-{kind}")


# The reference criterion: ||our change - Kaldi's|| / ||Kaldi's change|| per parameter.
TOLERANCE = 1e-3


def _flags(folder) -> list[str]:
    """nnet3-train's flags of a train-cli case (its options.json)."""
    options = json.loads((folder / "options.json").read_text())
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in options.items()]


def _archive(case: str, kind: str):
    """The examples archive Kaldi's run ``kind`` of ``case`` read."""
    folder = REF / "train-cli" / case
    info = _run_info(case)
    return folder / info.get("egs_folder", ".") / info["runs"][kind]["examples"]


def _change_errors(before, model, reference) -> dict[tuple[str, str], float]:
    """(component, parameter) -> ||change of model - change of reference|| / ||change
    of reference||, the changes from ``before``, for every updatable component."""
    errors = {}
    for name, comp in before.components.items():
        if comp.is_updatable():
            for key, p0 in comp.params().items():
                ref_change = reference.components[name].params()[key] - p0
                change = model.components[name].params()[key] - p0
                errors[name, key] = float(np.linalg.norm(change - ref_change)
                                          / np.linalg.norm(ref_change))
    return errors


def _kaldi_log_numbers(text: str):
    per_mb = [(int(a), float(v), float(f)) for a, v, f in re.findall(
        r"for minibatches (\d+)-\d+ is (\S+) over (\S+) frames", text)]
    overall = float(re.search(r"Overall average objective function for 'output' is (\S+)",
                              text).group(1))
    active = re.findall(r"Per-component max-change active on (\d+) / (\d+)", text)
    smallest = [float(x) for x in re.findall(r"Smallest factor=(\S+) on", text)]
    return per_mb, overall, active, smallest


@pytest.fixture(scope="module")
def kaldi_run(tmp_path_factory):
    """``kaldi_run(case, kind)``: ``(stderr, OUT)`` of ``pynnet3 train`` run as Kaldi's
    run ``kind`` of ``case`` was (its flags and archive); each run once per module,
    shared by the tests that read it."""
    done: dict[tuple[str, str], tuple[str, object]] = {}

    def run(case: str, kind: str) -> tuple[str, object]:
        if (case, kind) not in done:
            folder = REF / "train-cli" / case
            out = tmp_path_factory.mktemp(f"{case}-{kind}") / "model_after.txt"
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                status = main(["train", *_flags(folder), str(folder / "model_in.txt.gz"),
                               f"ark:{_archive(case, kind)}", str(out)])
            assert status == 0, err.getvalue()
            done[case, kind] = err.getvalue(), out
        return done[case, kind]

    return run


@pytest.mark.parametrize("case, kind", ref_params([_params(r) for r in _runs()],
                                                  "train-cli runs", 2))
def test_train_reproduces_kaldi_nnet3_train(case, kind, kaldi_run):
    folder = REF / "train-cli" / case
    info = _run_info(case)
    model_in = folder / "model_in.txt.gz"
    err, out = kaldi_run(case, kind)

    before = read_model(str(model_in))
    ours = read_model(str(out))
    kaldi = read_model(str(folder / info["runs"][kind]["model_out"]))
    num_minibatches = info["runs"][kind]["num_minibatches"]
    errors = _change_errors(before, ours, kaldi)
    assert errors
    for (name, key), rel in errors.items():
        assert rel <= TOLERANCE, (name, key, rel)
    for name, comp in before.components.items():
        if comp.type_name == "BatchNormComponent":
            mine, theirs = ours.components[name], kaldi.components[name]
            np.testing.assert_allclose(mine.count, comp.count * 0.8 ** num_minibatches,
                                       rtol=1e-6)
            np.testing.assert_allclose(mine.count, theirs.count, rtol=1e-6)
            np.testing.assert_allclose(mine.stats_sum / mine.count,
                                       comp.stats_sum / comp.count, rtol=1e-6, atol=1e-7)

    log = (folder / info["runs"][kind]["log"]).read_text()
    k_mb, k_overall, k_active, k_smallest = _kaldi_log_numbers(log)
    o_mb, o_overall, o_active, o_smallest = _kaldi_log_numbers(err)
    assert [(i, f) for i, _, f in o_mb] == [(i, f) for i, _, f in k_mb]
    np.testing.assert_allclose([v for _, v, _ in o_mb], [v for _, v, _ in k_mb], rtol=3e-6)
    assert o_overall == pytest.approx(k_overall, rel=3e-6)
    assert o_active == k_active
    np.testing.assert_allclose(o_smallest, k_smallest, rtol=1e-4)
    # --verbose=2: Kaldi's per-component lines (name, norm, max-change, factor).
    too_big = r"Parameters in (\S+) change too big: (\S+) \* 1 > max-change \* " \
              r"max-change-scale=(\S+) \* 1, scaling by (\S+)"
    k_lines, o_lines = re.findall(too_big, log), re.findall(too_big, err)
    assert [(n, m) for n, _, m, _ in o_lines] == [(n, m) for n, _, m, _ in k_lines]
    if k_lines:
        np.testing.assert_allclose(np.array([(a, f) for _, a, _, f in o_lines], float),
                                   np.array([(a, f) for _, a, _, f in k_lines], float),
                                   rtol=1e-4)
    assert f"Wrote model to {out}" in err


# Kaldi's OnlineNaturalGradient::ReorthogonalizeRt1 warnings (natural-gradient-online.cc)
_NG_WARNINGS = ("Cholesky out of expected range, reorthogonalizing with Gram-Schmidt",
                "Cholesky or Invert() failed while re-orthogonalizing R_t. "
                "Re-orthogonalizing on CPU.")


def _warning_places(text: str, phrase: str) -> list[int]:
    """For each WARNING line of the log ``text`` that says ``phrase``: how many
    'Average objective' lines came before it (where in the run it was logged)."""
    places, phases = [], 0
    for line in text.splitlines():
        if line.startswith("WARNING") and phrase in line:
            places.append(phases)
        elif "Average objective function" in line:
            phases += 1
    return places


@pytest.mark.parametrize("case, kind", ref_params(_runs(), "train-cli runs", 2))
def test_train_logs_natural_gradient_fallbacks_as_kaldi(case, kind, kaldi_run):
    """Every re-orthogonalization that falls back to Gram-Schmidt is one WARNING line,
    as Kaldi's: as many as Kaldi logged in the same run (7, 7 and 6 in the unmerged
    TDNN runs and the x-vector run, none in the merged TDNN runs), logged in the same
    minibatch (counted in the objective lines before it). This holds in the runs
    whose models drift from Kaldi's (the xfails above): every fallback happens in the
    first minibatch, before any drift."""
    log = (REF / "train-cli" / case / _run_info(case)["runs"][kind]["log"]).read_text()
    err, _ = kaldi_run(case, kind)
    for phrase in _NG_WARNINGS:
        assert _warning_places(err, phrase) == _warning_places(log, phrase), phrase
    assert not [line for line in err.splitlines()
                if line.startswith("WARNING") and not any(p in line for p in _NG_WARNINGS)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small network and a merged archive with a learnable mapping."""
    from pynnet3 import Nnet
    from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo
    from pynnet3.io.egs_merge import merge_examples

    folder = tmp_path_factory.mktemp("tiny")
    config = "\n".join([
        "input-node name=input dim=4",
        "component name=affine type=NaturalGradientAffineComponent input-dim=8 output-dim=3 "
        "learning-rate=0.05",
        "component-node name=affine component=affine input=Append(Offset(input, -1), input)",
        "component name=sm type=LogSoftmaxComponent dim=3",
        "component-node name=sm component=sm input=affine",
        "output-node name=output input=sm objective=linear"])
    nnet = Nnet.from_config(config, seed=1)
    nnet.write(folder / "in.mdl", binary=True)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3))
    with ExampleWriter(f"ark:{folder / 'egs.ark'}") as writer:
        for b in range(6):
            egs = []
            for _ in range(8):
                feats = rng.standard_normal((6, 4)).astype(np.float32)
                labels = (feats[1:] @ w).argmax(1)
                egs.append(NnetExample([NnetIo.from_matrix("input", -1, feats),
                                        NnetIo.from_labels("output", 3, 0, labels)]))
            writer.write(f"mb{b}", merge_examples(egs))
    return folder


def test_training_improves_a_learnable_task(tiny, tmp_path, capsys):
    out = tmp_path / "out.mdl"
    assert main(["train", "--print-interval=2", "--srand=0", str(tiny / "in.mdl"),
                 f"ark:{tiny / 'egs.ark'}", str(out)]) == 0
    err = capsys.readouterr().err
    phases = [float(v) for v in re.findall(r"minibatches \d+-\d+ is (\S+) over 80 frames", err)]
    assert len(phases) == 2  # phases 0-1 and 2-3 printed; 4-5 only in the overall figure
    assert "log-prob-per-frame=" in err and "WARNING" in err  # --use-gpu=yes by default
    assert read_model(str(out)).components["affine"].params()["linear_params"].shape == (3, 8)
    # A second pass from the trained model does better than the first did.
    assert main(["train", "--print-interval=2", str(out), f"ark:{tiny / 'egs.ark'}",
                 str(tmp_path / "out2.mdl")]) == 0
    again = [float(v) for v in re.findall(r"minibatches \d+-\d+ is (\S+) over 80 frames",
                                          capsys.readouterr().err)]
    assert again[0] > phases[0] + 0.05


def test_train_bad_example_names_the_node(tiny, tmp_path, capsys):
    from pynnet3.io.egs import ExampleWriter, NnetExample, NnetIo

    bad = tmp_path / "bad.ark"
    with ExampleWriter(f"ark:{bad}") as w:
        w.write("k", NnetExample([NnetIo.from_matrix("feats", 0, np.zeros((3, 4), np.float32)),
                                  NnetIo.from_labels("output", 3, 0, [0])]))
    out = tmp_path / "o.mdl"
    assert main(["train", "--use-gpu=no", str(tiny / "in.mdl"), f"ark:{bad}", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "'feats'" in err[-1] and "no such input or output node" in err[-1]
    assert not out.exists()


def test_trainer_flags_only_what_was_given():
    from pynnet3.cli.main import build_parser
    from pynnet3.cli.train import trainer_flags

    args = build_parser().parse_args(["train", "--momentum=0.5", "--srand=3",
                                      "--store-component-stats=false", "m", "ark:e", "o"])
    assert trainer_flags(args) == {"momentum": 0.5, "srand": 3, "store-component-stats": False}


@pytest.mark.parametrize("case", ref_params(["tdnn_relu_bn", "tdnn_relu_bn_lr0.01"],
                                            "train-cli cases"))
def test_unmerged_runs_start_as_kaldi(case, tmp_path, capsys):
    """The part of the unmerged runs that is not yet lost to natural-gradient drift
    (see the xfails above): the first two one-sequence minibatches' objectives and the
    first update's max-change factors as Kaldi logged them."""
    from pynnet3.io.egs import ExampleWriter, read_examples

    folder = REF / "train-cli" / case
    first = tmp_path / "first3.ark"
    with ExampleWriter(f"ark:{first}") as w:
        for i, (key, eg) in enumerate(read_examples(
                f"ark:{REF / 'train-cli' / 'tdnn_relu_bn' / 'egs.ark'}")):
            if i < 3:
                w.write(key, eg)
    options = json.loads((folder / "options.json").read_text())
    flags = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in options.items()]
    assert main(["train", *flags, str(folder / "model_in.txt.gz"), f"ark:{first}",
                 str(tmp_path / "out.txt")]) == 0
    err = capsys.readouterr().err
    log = (folder / "log_nnet3-train_unmerged.txt").read_text()
    k_mb, _, _, k_smallest = _kaldi_log_numbers(log)
    o_mb, _, _, o_smallest = _kaldi_log_numbers(err)
    assert len(o_mb) == 2
    np.testing.assert_allclose([v for _, v, _ in o_mb], [v for _, v, _ in k_mb[:2]], rtol=3e-6)
    too_big = r"Parameters in (\S+) change too big: (\S+) \* 1 .*scaling by (\S+)"
    first_update = err[:err.index("minibatches 0-0")]
    k_first = log[:log.index("minibatches 0-0")]
    ours, kaldis = re.findall(too_big, first_update), re.findall(too_big, k_first)
    assert [n for n, _, _ in ours] == [n for n, _, _ in kaldis]
    if kaldis:
        np.testing.assert_allclose(np.array([x[1:] for x in ours], float),
                                   np.array([x[1:] for x in kaldis], float), rtol=1e-5)
        np.testing.assert_allclose(o_smallest[0], k_smallest[0], rtol=1e-5)


def test_optimization_flags_shape_the_training_computation(tiny, tmp_path, capsys):
    """--optimization.min-deriv-time (Kaldi's, used for RNNs) reaches the compiler:
    dropping the derivatives of frames t < 2 changes the update; a bound below every
    frame changes nothing."""
    def train(*flags):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.mdl"
        assert main(["train", "--use-gpu=no", *flags, str(tiny / "in.mdl"),
                     f"ark:{tiny / 'egs.ark'}", str(out)]) == 0
        return read_model(str(out)).components["affine"].params()["linear_params"]

    plain = train()
    np.testing.assert_array_equal(train("--optimization.min-deriv-time=-100"), plain)
    assert np.abs(train("--optimization.min-deriv-time=2") - plain).max() > 1e-4
    capsys.readouterr()


def test_xvector_run_matches_kaldi_where_it_can(tmp_path, capsys):
    """The x-vector run's reproducible part (the strict xfail above has the full
    criterion): the layers before statistics pooling change as Kaldi's (1e-3), the
    printed objectives match, and the layers after pooling (N=8 rows < rank) stay within
    10% of Kaldi's change."""
    folder = require_reference() / "train-cli" / "xvector"
    options = json.loads((folder / "options.json").read_text())
    flags = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
             for k, v in options.items()]
    out = tmp_path / "out.txt"
    model_in = folder / "model_in.txt.gz"
    assert main(["train", *flags, str(model_in), f"ark:{folder / 'merged.ark'}",
                 str(out)]) == 0
    err = capsys.readouterr().err
    before, ours = read_model(str(model_in)), read_model(str(out))
    kaldi = read_model(str(folder / "model_after.txt.gz"))
    for name, comp in before.components.items():
        if not comp.is_updatable():
            continue
        bound = 1e-3 if name in {f"tdnn{i}.affine" for i in range(1, 6)} else 0.1
        for key, p0 in comp.params().items():
            kaldi_change = kaldi.components[name].params()[key] - p0
            rel = (np.linalg.norm(ours.components[name].params()[key] - p0 - kaldi_change)
                   / np.linalg.norm(kaldi_change))
            assert rel <= bound, (name, key, rel)
    k_mb, k_overall, _, _ = _kaldi_log_numbers((folder / "log_nnet3-train_merged.txt")
                                               .read_text())
    o_mb, o_overall, _, _ = _kaldi_log_numbers(err)
    np.testing.assert_allclose([v for _, v, _ in o_mb], [v for _, v, _ in k_mb], rtol=5e-6)
    assert o_overall == pytest.approx(k_overall, rel=1e-5)


def test_torch_backend_trains_the_same_model(tiny, tmp_path, capsys):
    """--backend=torch (the CPU; a CUDA device is taken with --use-gpu when there is
    one): the same parameters as the NumPy backend, up to float rounding."""
    pytest.importorskip("torch")
    models = {}
    for backend in ("numpy", "torch"):
        out = tmp_path / f"{backend}.mdl"
        assert main(["train", "--use-gpu=no", f"--backend={backend}", "--srand=0",
                     str(tiny / "in.mdl"), f"ark:{tiny / 'egs.ark'}", str(out)]) == 0, \
            capsys.readouterr().err
        models[backend] = read_model(str(out)).components["affine"].params()
    before = read_model(str(tiny / "in.mdl")).components["affine"].params()
    for name, want in models["numpy"].items():
        change = want - before[name]
        assert np.abs(change).max() > 1e-3  # (it trained)
        np.testing.assert_allclose(models["torch"][name] - before[name], change,
                                   rtol=0, atol=1e-4 * np.abs(change).max())
