"""The README as a newcomer meets it: its first two commands are the install-and-compute
and install-and-test lines, and its Python snippets run as written, in order, in
one namespace (so the README cannot rot)."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import kaldiio

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.M | re.S)


_FIRST = ("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/pynnet3 compute ")


def test_first_commands_install_then_compute_and_tests():
    text = README.read_text()
    first = re.findall(r"^```(\w+)\n(.*?)^```", text, re.M | re.S)[:2]
    assert [lang for lang, _ in first] == ["bash", "bash"]
    assert first[0][1].startswith(_FIRST)
    assert "src/pynnet3/examples/feats.ark" in first[0][1]
    assert first[1][1].strip() == ("python3 -m venv .venv && .venv/bin/pip install -e "
                                   "'.[test]' && .venv/bin/python -m pytest")
    assert "`.venv/bin/pynnet3 demo`" in text[:text.index("## ")]
    assert text.index("```bash") < text.index("## ")  # (above the first section)


def test_the_first_command_computes_the_bundled_example(tmp_path, monkeypatch):
    """The README's first command after the install, run as written by bash in a
    folder that looks like the checkout (src/ linked, .venv/bin/pynnet3 this
    interpreter's pynnet3)."""
    block = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.M | re.S)[0]
    command = block[len(_FIRST) - len(".venv/bin/pynnet3 compute "):]
    (tmp_path / "src").symlink_to(README.parent / "src")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "pynnet3").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m '
                                      'pynnet3.cli.main "$@"\n')
    (venv_bin / "pynnet3").chmod(0o755)
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True,
                          timeout=300, check=False)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "pynnet3 compute: summary: done 6 utterances, failed 0; 1520 frames" in err
    monkeypatch.chdir(tmp_path)  # (out.scp names out.ark relative to where it ran)
    out = dict(kaldiio.load_scp("out.scp"))
    feats = dict(kaldiio.load_ark(str(README.parent / "src/pynnet3/examples/feats.ark")))
    assert list(out) == list(feats)
    assert all(out[k].shape == (len(feats[k]), 200) for k in feats)


def test_python_snippets_run_as_written(tmp_path, monkeypatch):
    blocks = _blocks("python")
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # (a snippet saves a cache file)
    ns: dict = {"__name__": "readme"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for k, code in enumerate(blocks):
            exec(compile(code, f"README.md python block {k + 1}", "exec"), ns)
    printed = out.getvalue()
    # what the snippets' comments claim
    assert "[[0, -13, 0], [1, -13, 0]]" in printed and "\n200\n" in printed
    assert "['ivector', 'input'] ['output']" in printed
    assert ns["nnet"].context() == (13, 13)
    assert ns["res"].outputs["output"].shape == (50, 200)
    assert "(50, 200)" in printed
    # the torch backend's snippet: a tensor on the device, equal to the NumPy run
    assert "torch.Size([50, 200]) True\nTrue\n" in printed
    assert set(ns["res"].gradients) <= set(ns["nnet"].components)
    assert (tmp_path / "compiled.cache").is_file()
    # the network optimizer's snippet
    assert len(ns["fast"].components) < len(ns["nnet"].components)
    assert (tmp_path / "fast.raw").is_file()
    assert ns["fast_res"].outputs["output"].shape == (50, 200)
    assert ns["net_report"].rules_applied().get("fuse-affine-relu-map") == 8  # TDNN-F layers
    assert "no part of" in printed  # why_not's answer
