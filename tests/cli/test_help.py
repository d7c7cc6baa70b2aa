"""What a newcomer sees first: ``pynnet3 --version`` and the --help of every command
(plain words, no docstring markup, every argument and option explained, the
optimizer options with their defaults)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

import pynnet3
from pynnet3.cli.main import build_parser, main
from pynnet3.optimize import OptimizeOptions

_COMMANDS = ["info", "init", "copy", "optimize-network", "show-computation", "demo",
             "am-info", "am-copy", "compute", "xvector-compute",
             "draw", "export", "merge-egs", "train", "average"]
_MARKUP = re.compile(r"`|:(class|func|mod|meth|attr):|\*\*")


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"pynnet3 {pynnet3.__version__}\n"


def test_version_of_the_installed_command():
    done = subprocess.run([sys.executable, "-m", "pynnet3.cli.main", "--version"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"pynnet3 {pynnet3.__version__}"


def test_main_help_lists_every_command(capsys):
    out = _help([], capsys)
    assert not _MARKUP.search(out), _MARKUP.search(out)
    assert set(_subparsers()) == set(_COMMANDS)
    for name in _COMMANDS:
        assert re.search(rf"^\s+{re.escape(name)}\s", out, re.M), name
    assert "--version" in out


@pytest.mark.parametrize("command", _COMMANDS)
def test_every_argument_and_option_is_explained(command, capsys):
    out = _help([command], capsys)
    assert not _MARKUP.search(out), _MARKUP.search(out)
    parser = _subparsers()[command]
    assert parser.description and parser.description.strip()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        shown = action.option_strings[0] if action.option_strings else action.metavar
        assert action.help and action.help.strip(), f"{command} {shown}: no help"
        assert shown in out, f"{command} {shown}: not in --help"


def test_optimization_options_show_their_defaults(capsys):
    out = " ".join(_help(["show-computation"], capsys).split())
    defaults = OptimizeOptions()
    for name in OptimizeOptions.field_names():
        value = getattr(defaults, name)
        spelled = "unset" if value is None else str(value).lower()
        flag = "--optimization." + name.replace("_", "-")
        m = re.search(re.escape(flag) + r" (true\|false|INT) ((?:(?!--optimization\.).)*?)"
                      r"\(default: (\w+)\)", out)
        assert m, flag
        assert m.group(3) == spelled, (flag, m.group(3))


@pytest.mark.parametrize("columns", [None, "100", "37", "0", "wide"])
def test_help_width_is_the_terminals(monkeypatch, columns):
    """The formatter finds the width as shutil.get_terminal_size does (without
    loading shutil)."""
    import shutil

    from pynnet3.cli.main import _terminal_columns

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert _terminal_columns() == shutil.get_terminal_size().columns


def test_building_the_parser_loads_no_shutil():
    import subprocess
    import sys

    code = ("import sys\nfrom pynnet3.cli.main import build_parser\nbuild_parser()\n"
            "print('shutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
