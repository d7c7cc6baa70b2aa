"""The command line's usage error, in a module of its own so that every command
raises the one class ``main()`` catches (also when main.py runs as ``__main__``
under ``python -m pynnet3.cli.main``, where a class defined in it would be a
second, different one)."""

from __future__ import annotations


class UsageError(Exception):
    """A bad command line (unknown flag, bad flag value, missing argument), worded as
    argparse words one: ``PROG: error: MESSAGE``, then ``(see PROG --help)`` with
    ``see_help``."""

    def __init__(self, prog: str, message: str, see_help: bool = False):
        super().__init__(f"{prog}: error: {message}"
                         + (f" (see {prog} --help)" if see_help else ""))
