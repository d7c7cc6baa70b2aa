"""The README as a newcomer meets it: its first two commands are the install-and-demo
and install-and-test lines, and its Python snippets run as written, in order, in
one namespace (so the README cannot rot)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.M | re.S)


def test_first_commands_install_then_demo_and_tests():
    text = README.read_text()
    first = re.findall(r"^```(\w+)\n(.*?)^```", text, re.M | re.S)[:2]
    assert [lang for lang, _ in first] == ["bash", "bash"]
    assert first[0][1].strip() == ("python3 -m venv .venv && .venv/bin/pip install -e . "
                                   "&& .venv/bin/pynnet3 demo")
    assert first[1][1].strip() == ("python3 -m venv .venv && .venv/bin/pip install -e "
                                   "'.[test]' && .venv/bin/python -m pytest")
    assert text.index("```bash") < text.index("## ")  # (above the first section)


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
    assert "['ivector', 'input'] ['output']" in printed
    assert ns["nnet"].context() == (13, 13)
    assert ns["res"].outputs["output"].shape == (50, 200)
    assert "(50, 200)" in printed
    assert set(ns["res"].gradients) <= set(ns["nnet"].components)
    assert (tmp_path / "compiled.cache").is_file()
    # the network optimizer's snippet
    assert len(ns["fast"].components) < len(ns["nnet"].components)
    assert (tmp_path / "fast.raw").is_file()
    assert ns["fast_res"].outputs["output"].shape == (50, 200)
    assert "fold-batchnorm-into-next-linear" in ns["net_report"].rules_applied()
    assert "no part of" in printed  # why_not's answer
