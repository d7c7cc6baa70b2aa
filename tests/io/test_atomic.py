"""Atomic writes (pynnet3.io.atomic): temporaries that a killed writer leaves are
removed by the next write to the same target; others' temporaries are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import pynnet3
from pynnet3.io import atomic
from pynnet3.io.atomic import atomic_write, temp_prefix

_NET = ("input-node name=input dim=2\n"
        "component name=a type=AffineComponent input-dim=2 output-dim=2\n"
        "component-node name=a component=a input=input\n"
        "output-node name=output input=a\n")


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(folder, target: str, pid: int, host: str | None = None, age: float = 0.0):
    path = folder / f"{temp_prefix(target)}{host or atomic._host()}-{pid}-0a1b2c3d"
    path.write_bytes(b"partial")
    if age:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


def test_stale_temporaries_of_the_target_are_removed(tmp_path):
    target = tmp_path / "final.raw"
    dead = _temp(tmp_path, "final.raw", _dead_pid())
    live = _temp(tmp_path, "final.raw", os.getppid())  # (a running process)
    other_target = _temp(tmp_path, "other.raw", _dead_pid())
    other_host = _temp(tmp_path, "final.raw", _dead_pid(), host="elsewhere")
    old_other_host = _temp(tmp_path, "final.raw", 1, host="elsewhere",
                           age=atomic.STALE_SECONDS + 60)
    unrelated = tmp_path / ".final.raw.notes"
    unrelated.write_text("mine")
    atomic_write(target, b"data")
    assert target.read_bytes() == b"data"
    assert not dead.exists() and not old_other_host.exists()
    assert live.exists() and other_target.exists() and other_host.exists()
    assert unrelated.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if atomic.TAG in p.name) == sorted(
        [live.name, other_target.name, other_host.name])


def test_a_killed_write_leaves_a_temporary_that_the_next_write_removes(tmp_path):
    """A process killed between writing its temporary and renaming it (os.replace
    made to exit) leaves ``.NAME.pynnet3-tmp-...``; Nnet.write removes it."""
    target = tmp_path / "model.raw"
    code = ("import os, sys\n"
            "from pynnet3.io import atomic\n"
            "atomic.os.replace = lambda a, b: os._exit(9)\n"
            "atomic.atomic_write(sys.argv[1], b'half')\n")
    done = subprocess.run([sys.executable, "-c", code, str(target)], check=False)
    assert done.returncode == 9
    left = [p for p in tmp_path.iterdir() if p.name.startswith(temp_prefix(target))]
    assert len(left) == 1 and not target.exists()
    pynnet3.Nnet.from_config(_NET).write(target, binary=True)
    assert list(tmp_path.iterdir()) == [target]
    assert pynnet3.read_nnet(target).info()


def test_cache_save_removes_stale_temporaries(tmp_path):
    nnet = pynnet3.Nnet.from_config(_NET)
    stale = _temp(tmp_path, "cache.bin", _dead_pid())
    pynnet3.CachingCompiler(nnet).save(tmp_path / "cache.bin")
    assert not stale.exists() and (tmp_path / "cache.bin").exists()


def test_a_failed_write_removes_its_own_temporary(tmp_path, monkeypatch):
    def fail(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / "x", b"data")
    assert list(tmp_path.iterdir()) == []


def test_old_import_location_still_works():
    from pynnet3.nnet import atomic_write as from_nnet

    assert from_nnet is atomic_write


def test_dotdot_past_a_symbolic_link_is_not_folded(tmp_path):
    """'LINK/../out' is the folder above the link's target, as pathlib (and the
    system) see it: the temporary goes there, not beside LINK (review: a lexical
    normpath put it in another folder, across file systems a failed rename)."""
    real = tmp_path / "real" / "sub"
    real.mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(real)
    atomic_write(str(tmp_path / "lnk" / ".." / "out.bin"), b"hello")
    assert (tmp_path / "real" / "out.bin").read_bytes() == b"hello"
    assert not (tmp_path / "out.bin").exists()
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["out.bin", "sub"]


def test_a_trailing_slash_names_the_file_as_pathlib_does(tmp_path):
    atomic_write(str(tmp_path / "name") + "/", b"x")
    assert (tmp_path / "name").read_bytes() == b"x"
