"""Atomic file writes: a reader sees the old file or the new one, never a part.

:func:`atomic_write` writes the data to a temporary file beside the target, named
``.NAME.pynnet3-tmp-HOST-PID-RANDOM``, flushes it to disk and renames it over the
target. A writer killed in between leaves its temporary behind; each later write
to the same target first removes the temporaries of that target that are stale:
made on this host by a process that is no longer running, or older than
:data:`STALE_SECONDS` (made on another host sharing the folder, or by a process
whose pid has been reused). Temporaries of a running writer are left alone.
"""

from __future__ import annotations

import os
import re
import sys
import time

TAG = ".pynnet3-tmp-"
STALE_SECONDS = 24 * 3600
_NAME_CHARS = 100  # of the target's name kept in a temporary's name (NAME_MAX is 255)


def _host() -> str:
    if hasattr(os, "uname"):  # (what socket.gethostname() gives, without loading socket)
        name = os.uname().nodename
    else:
        import socket

        name = socket.gethostname()
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)[:64] or "host"


def random_hex() -> str:
    """8 random hex digits for a temporary's name (as secrets.token_hex(4), without
    loading secrets and hashlib)."""
    return os.urandom(4).hex()


def _plain_path(path: str | os.PathLike) -> str:
    """``str(pathlib.Path(path))`` without loading pathlib (a few ms of every
    command's start): repeated slashes and ``.`` parts dropped, a trailing slash
    too, ``..`` kept (folding it would be wrong past a symbolic link)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    root = "/" if text.startswith("/") else ""
    parts = [p for p in text.split("/") if p and p != "."]
    return root + "/".join(parts) if parts or root else "."


def _split(path: str | os.PathLike) -> tuple[str, str]:
    """(folder, name) of ``path`` as pathlib's parent and name: the folder "." for a
    bare name."""
    folder, name = os.path.split(_plain_path(path))
    return folder or ".", name


def temp_prefix(path: str | os.PathLike) -> str:
    """The start of the names of ``path``'s temporaries (in the same folder)."""
    return f".{_split(path)[1][:_NAME_CHARS]}{TAG}"


def temp_path(path: str | os.PathLike) -> str:
    """A new temporary's path for target ``path``: in its folder, named after it,
    this host, this process and 8 random hex digits."""
    folder, _ = _split(path)
    return os.path.join(folder, f"{temp_prefix(path)}{_host()}-{os.getpid()}-{random_hex()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # (PermissionError: alive, another user's)
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove the stale temporaries of target ``path`` (module doc); returns the
    names removed."""
    folder, _ = _split(path)
    prefix = temp_prefix(path)
    host, now, removed = _host(), time.time(), []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        dead_here = parts[0] == host and not _pid_alive(int(parts[1]))
        try:
            if dead_here or now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                os.unlink(entry.path)
                removed.append(name)
        except OSError:  # (gone already: another writer cleaned up)
            pass
    return removed


# sync_file_range(2)'s SYNC_FILE_RANGE_WRITE: start writing a range's dirty pages,
# without waiting for them
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = None  # (libc's, looked up on first use; False: not available)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` of ``fd`` from ``offset`` to disk
    now, without waiting (Linux's sync_file_range with SYNC_FILE_RANGE_WRITE);
    nothing elsewhere or on error. It does not make the data durable -- the fsync
    before a rename still does -- but that fsync then finds most of it written: a
    writer that gives its data out bit by bit while it computes (an archive of
    outputs) does not wait for all of it at the end."""
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers never see a partial file; stale
    temporaries of earlier, killed writes to ``path`` are removed first."""
    path = _plain_path(path)
    remove_stale_temporaries(path)
    while True:
        tmp = temp_path(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # the temporary is 0600; give it the mode a plain open() would (or keep the
        # mode of the file being replaced)
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["STALE_SECONDS", "TAG", "atomic_write", "remove_stale_temporaries", "temp_prefix"]
