"""The ``pynnet3`` command line: info, init, copy, show-computation, and errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.nnet import read_nnet

from ..reference import REF, require_reference

CONFIG = """\
# a small TDNN
input-node name=input dim=5
component name=affine1 type=AffineComponent input-dim=15 output-dim=4
component-node name=affine1 component=affine1 input=Append(Offset(input,-1), input, Offset(input,2))
component name=relu1 type=RectifiedLinearComponent dim=4
component-node name=relu1 component=relu1 input=affine1
component name=final type=AffineComponent input-dim=4 output-dim=3
component-node name=final component=final input=relu1
output-node name=output input=final
"""


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *fragments):
    assert rc == 1
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "error" in lines[0] and "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "net.config"
    path.write_text(CONFIG)
    return path


def test_init_copy_round_trip(tmp_path, config, capsys):
    out_txt = tmp_path / "a.txt"
    out_bin = tmp_path / "b.bin"
    back = tmp_path / "c.txt"
    assert run(["init", config, out_txt, "--binary=false", "--srand=3"], capsys)[0] == 0
    text = out_txt.read_bytes()
    assert text.startswith(b"<Nnet3> \n")
    assert run(["copy", out_txt, out_bin, "--binary=true"], capsys)[0] == 0
    assert out_bin.read_bytes().startswith(b"\0B<Nnet3> ")
    assert run(["copy", out_bin, back, "--binary=false"], capsys)[0] == 0
    assert back.read_bytes() == text
    # default output is binary, as in Kaldi
    default = tmp_path / "d.mdl"
    assert run(["init", config, default], capsys)[0] == 0
    assert default.read_bytes()[:2] == b"\0B"
    # --srand changes the parameters; the same seed reproduces them
    again = tmp_path / "e.txt"
    assert run(["init", config, again, "--binary=false", "--srand=3"], capsys)[0] == 0
    assert again.read_bytes() == text
    assert run(["init", config, again, "--binary=false", "--srand=4"], capsys)[0] == 0
    assert again.read_bytes() != text


def test_copy_set_test_mode(tmp_path, capsys):
    src = REF / "components" / "BatchNorm_3" / "model.txt"
    require_reference()
    assert b"<TestMode> F" in src.read_bytes()
    out = tmp_path / "bn.txt"
    assert run(["copy", src, out, "--binary=false", "--set-test-mode=true"], capsys)[0] == 0
    assert b"<TestMode> T" in out.read_bytes()
    assert run(["copy", src, out, "--binary=false"], capsys)[0] == 0
    assert out.read_bytes() == src.read_bytes()


def test_info(tmp_path, config, capsys):
    model = tmp_path / "m.mdl"
    run(["init", config, model], capsys)
    rc, out, err = run(["info", model], capsys)
    assert rc == 0 and err == ""
    assert "left-context: 1" in out and "right-context: 2" in out
    assert "num-parameters: 79" in out
    assert "input-node name=input dim=5" in out
    assert "output-node name=output input=final dim=3 objective=linear" in out
    assert "component name=affine1" in out


def test_info_on_reference_model(capsys):
    model = REF / "realistic" / "tdnn_lstm" / "model.txt"
    require_reference()
    stats = json.loads((REF / "realistic" / "tdnn_lstm" / "decode" / "stats.json").read_text())
    rc, out, _ = run(["info", model], capsys)
    assert rc == 0
    assert f"left-context: {stats['left_context']}" in out
    assert f"right-context: {stats['right_context']}" in out


@pytest.mark.parametrize("optimize", ["false", "true"])
def test_show_computation(optimize, capsys):
    case = REF / "components" / "Affine_1"
    require_reference()
    rc, out, err = run(["show-computation", case / "model.txt", "--request",
                        case / "request.json", f"--optimize={optimize}"], capsys)
    assert rc == 0 and err == ""
    assert out.startswith("# Computation request:")
    stats_line = [ln for ln in out.splitlines() if ln.startswith("# stats: ")]
    assert len(stats_line) == 1
    stats = json.loads(stats_line[0][len("# stats: "):])
    assert stats["num_commands"] > 0 and "kPropagate" in stats["command_types"]
    # the CLI prints what the library compiles
    nnet = read_nnet(case / "model.txt")
    req = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    comp = pynnet3.compile(nnet, req, optimize=optimize == "true")
    assert stats == json.loads(json.dumps(comp.stats()))
    assert str(comp) in out


def test_show_computation_report_and_options(capsys):
    case = REF / "realistic" / "tdnnf_chain" / "decode"
    require_reference()
    model = case.parent / "model.txt"
    rc, out, err = run(["show-computation", model, "--request", case / "request.json",
                        "--report", "--check=true"], capsys)
    assert rc == 0 and err == ""
    report = out[out.index("# optimization report"):].splitlines()
    assert report[1].split()[:2] == ["pass", "commands"]
    rows = {ln.split()[0]: ln.split() for ln in report[2:]}
    assert "(unoptimized)" in rows and "variable_merging" in rows
    stats = json.loads([ln for ln in out.splitlines() if ln.startswith("# stats: ")][0][9:])
    last = report[-1].split()
    assert int(last[1]) == stats["num_commands"] and int(last[4]) == stats["peak_memory_floats"]
    # Kaldi's option flags switch passes: without sizing moves the peak is far higher
    rc, out2, _ = run(["show-computation", model, "--request", case / "request.json",
                       "--optimization.move-sizing-commands=false"], capsys)
    stats2 = json.loads([ln for ln in out2.splitlines() if ln.startswith("# stats: ")][0][9:])
    assert rc == 0 and stats2["peak_memory_floats"] > 2 * stats["peak_memory_floats"]


# ----------------------------------------------------------------------------------
# Errors: exit status 1, one line on stderr, no traceback
# ----------------------------------------------------------------------------------

def test_missing_file(tmp_path, capsys):
    rc, _, err = run(["info", tmp_path / "nope.mdl"], capsys)
    assert_one_line_error(rc, err, "pynnet3 info", "nope.mdl")


def test_malformed_model(tmp_path, config, capsys):
    model = tmp_path / "m.txt"
    run(["init", config, model, "--binary=false"], capsys)
    model.write_bytes(model.read_bytes().replace(b"<BiasParams>", b"<Garbage>"))
    rc, _, err = run(["copy", model, tmp_path / "out.mdl"], capsys)
    assert_one_line_error(rc, err, "m.txt", "line", "<Garbage>")
    assert not (tmp_path / "out.mdl").exists()


def test_truncated_binary_model(tmp_path, config, capsys):
    model = tmp_path / "m.bin"
    run(["init", config, model], capsys)
    data = model.read_bytes()
    model.write_bytes(data[:len(data) // 2])
    rc, _, err = run(["info", model], capsys)
    assert_one_line_error(rc, err, "m.bin", "byte")


def test_bad_config_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.config"
    bad.write_text(CONFIG.replace("input=affine1", "input=Offset(affine1)"))
    rc, _, err = run(["init", bad, tmp_path / "out.mdl"], capsys)
    assert_one_line_error(rc, err, "bad.config", "line 6", "Offset(affine1)")
    assert not (tmp_path / "out.mdl").exists()
    bad.write_text(CONFIG.replace("type=RectifiedLinearComponent",
                                  "type=RectifiedLinearComponent bogus=1"))
    rc, _, err = run(["init", bad, tmp_path / "out.mdl"], capsys)
    assert_one_line_error(rc, err, "bogus=")


def test_bad_request(tmp_path, config, capsys):
    model = tmp_path / "m.mdl"
    run(["init", config, model], capsys)
    req = tmp_path / "req.json"
    req.write_text("{not json")
    rc, _, err = run(["show-computation", model, "--request", req], capsys)
    assert_one_line_error(rc, err, "req.json")
    req.write_text("[1, 2]")
    rc, _, err = run(["show-computation", model, "--request", req], capsys)
    assert_one_line_error(rc, err, "req.json")
    req.write_text(json.dumps({"inputs": [{"name": "input", "indexes": [[0, 0]]}],
                               "outputs": []}))
    rc, _, err = run(["show-computation", model, "--request", req], capsys)
    assert_one_line_error(rc, err)
    # an output that is not computable from the inputs given
    req.write_text(json.dumps({
        "inputs": [{"name": "input", "indexes": [[0, t, 0] for t in range(3)]}],
        "outputs": [{"name": "output", "indexes": [[0, 5, 0]]}]}))
    rc, _, err = run(["show-computation", model, "--request", req], capsys)
    assert_one_line_error(rc, err, "output")


@pytest.mark.parametrize("argv, fragment", [
    (["copy", "a", "b", "--binary=maybe"], "maybe"),
    (["copy", "a"], "required"),
    (["frobnicate"], "frobnicate"),
    ([], "required"),
    (["info", "m", "--bogus"], "--bogus"),
])
def test_usage_errors(argv, fragment, capsys):
    rc, _, err = run(argv, capsys)
    assert_one_line_error(rc, err, fragment)


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    assert ei.value.code == 0
    assert "show-computation" in capsys.readouterr().out


def _entry_point() -> list[str]:
    exe = shutil.which("pynnet3", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the pynnet3 entry point is not installed")
    return [exe]


def test_installed_entry_point(tmp_path, config):
    exe = _entry_point()
    out = tmp_path / "m.txt"
    res = subprocess.run(exe + ["init", str(config), str(out), "--binary=false"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert read_nnet(out).output_dim("output") == 3
    res = subprocess.run(exe + ["info", str(tmp_path / "missing.mdl")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_exit_without_teardown_flushes_and_ends_the_process():
    res = _python("import sys, pynnet3.cli.main as m\n"
                  "print('out', end=''); print('err', end='', file=sys.stderr)\n"
                  "m._exit_without_teardown(3)\nprint('not reached')")
    assert (res.returncode, res.stdout, res.stderr) == (3, "out", "err")


def test_exit_without_teardown_leaves_atexit_callbacks_and_threads_their_exit():
    res = _python("import atexit, pynnet3.cli.main as m\n"
                  "atexit.register(lambda: print('atexit ran'))\n"
                  "m._exit_without_teardown(3)\nprint('returned')")
    assert (res.returncode, res.stdout) == (0, "returned\natexit ran\n")
    res = _python("import threading, time, pynnet3.cli.main as m\n"
                  "t = threading.Thread(target=lambda: (time.sleep(0.5), print('thread done')))\n"
                  "t.start()\nm._exit_without_teardown(3)\nprint('returned')")
    assert res.returncode == 0 and sorted(res.stdout.split("\n")) == ["", "returned",
                                                                      "thread done"]


def test_a_profiled_run_still_writes_its_profile(tmp_path):
    script, out = tmp_path / "run.py", tmp_path / "prof.out"
    script.write_text("import pynnet3.cli.main as m\n"
                      "m._exit_without_teardown(0)\nprint('returned')\n")
    res = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), str(script)],
                         capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stdout) == (0, "returned\n"), res.stderr
    assert out.is_file() and out.stat().st_size > 0


def test_usage_error_is_one_line_also_under_python_m(tmp_path):
    """Run as ``python -m pynnet3.cli.main``, main.py is ``__main__``: a command's
    usage error must still be the class main() catches (one line, status 1)."""
    res = subprocess.run([sys.executable, "-m", "pynnet3.cli.main", "average", "m.raw"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "pynnet3 average: error: give at least one model to read and the model to write "
        "(see pynnet3 average --help)"]
