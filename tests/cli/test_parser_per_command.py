"""main() parses a command line with a parser holding only the command it names
(build_parser(command)): each command's parser is the full parser's, and a command
loads none of the other commands' modules; help and errors stay the full parser's."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from pynnet3.cli.main import build_parser, main


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


_ALL = list(_choices(build_parser()))


def test_the_full_parser_for_no_or_an_unknown_command():
    assert len(_ALL) == 15
    for name in (None, "nosuch", "--help", "-h", "comp"):
        assert list(_choices(build_parser(name))) == _ALL


@pytest.mark.parametrize("command", _ALL)
def test_a_commands_parser_is_the_full_parsers(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    full = _choices(build_parser())[command]
    alone = _choices(build_parser(command))
    assert command in alone and set(alone) <= set(_ALL)
    assert alone[command].format_help() == full.format_help()
    assert alone[command].prog == full.prog == f"pynnet3 {command}"


def test_unknown_command_lists_every_command(capsys):
    assert main(["nosuch"]) == 1
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err
    assert "(choose from " + ", ".join(repr(c) for c in _ALL) + ")" in err


def test_a_usage_error_names_the_command(capsys):
    assert main(["compute", "--frames-per-chunk=x", "m", "ark:f", "ark:o"]) == 1
    assert capsys.readouterr().err.startswith("pynnet3 compute: error: argument "
                                              "--frames-per-chunk")


def test_a_command_loads_no_other_commands_module():
    code = ("import sys\nfrom pynnet3.cli.main import build_parser\n"
            "build_parser('compute').parse_args(['compute', 'm', 'scp:f', 'ark:o'])\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('pynnet3.cli.')"
            " or m == 'pynnet3.am')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert "pynnet3.cli.compute" in out
    for other in ("am", "average", "draw", "egs", "export", "train", "xvector"):
        assert f"pynnet3.cli.{other}" not in out
    assert "pynnet3.am" not in out
