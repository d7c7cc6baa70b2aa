"""``pynnet3 show-computation`` compiles through the cache; --use-shortcut=false
gives the same computation as the default shortcut path."""

from __future__ import annotations

import json

from pynnet3.cli.main import main
from tests.reference import REF, needs_reference

CASE = REF / "generated" / "case_3"  # four identical sequences: the shortcut applies


@needs_reference
def test_show_computation_with_and_without_shortcut(capsys):
    stats = {}
    for flag in ("true", "false"):
        rc = main(["show-computation", str(CASE / "model.txt"), "--request",
                   str(CASE / "request.json"), f"--use-shortcut={flag}", "--check=true"])
        out = capsys.readouterr().out
        assert rc == 0
        line = next(ln for ln in out.splitlines() if ln.startswith("# stats: "))
        stats[flag] = json.loads(line[len("# stats: "):])
    assert stats["true"] == stats["false"]
