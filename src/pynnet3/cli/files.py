"""How the command line reads and writes its files: ``-`` is stdin / stdout and
``"command |"`` the output of a shell command, as in Kaldi's rxfilenames; models may
be gzip-compressed. A file that cannot be read or decoded, or a command that fails,
is a pynnet3 error naming it."""

from __future__ import annotations

import sys

from ..errors import ConfigError, FormatError
from ..io.model_file import gunzip_if_compressed
from ..nnet import Nnet, nnet_from_bytes

STDIO = "-"


def is_pipe(path: str) -> bool:
    """A Kaldi input pipe: ``"command |"`` (the command's standard output is read)."""
    return path.rstrip().endswith("|") and len(path.rstrip()) > 1


def _run_pipe(path: str) -> bytes:
    """The standard output of the shell command of ``"command |"``; its stderr goes
    to ours (as Kaldi's popen). A command that cannot start or exits non-zero is a
    FormatError naming it and its exit status."""
    import subprocess  # (loaded when a pipe is read: ~4 ms of every command's start)

    command = path.rstrip()[:-1].strip()
    try:
        done = subprocess.run(command, shell=True, stdout=subprocess.PIPE, check=False)
    except OSError as e:
        raise FormatError(f"cannot run the command: {e.strerror or e}", path) from None
    if done.returncode != 0:
        how = (f"killed by signal {-done.returncode}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise FormatError(f"the command failed ({how})", path)
    return done.stdout


def read_bytes(path: str) -> tuple[bytes, str]:
    """The contents of the rxfilename ``path`` (a file, ``-`` for stdin, or
    ``"command |"``) and the name to use in messages."""
    if path == STDIO:
        return sys.stdin.buffer.read(), "<stdin>"
    if is_pipe(path):
        return _run_pipe(path), path
    with open(path, "rb") as f:
        return f.read(), path


def read_model_bytes(path: str) -> tuple[bytes, str]:
    """A model file's bytes as :func:`read_bytes`, gunzipped when gzip-compressed
    (``final.mdl.gz``); an empty file is a FormatError."""
    data, name = read_bytes(path)
    data = gunzip_if_compressed(data, name)
    if not data:
        raise FormatError("empty model file", name)
    return data, name


def read_model(path: str) -> Nnet:
    """A Kaldi model, text or binary, from the rxfilename ``path`` (a file, ``-``,
    ``"gunzip -c final.mdl.gz |"``); gzip-compressed files are read transparently."""
    return nnet_from_bytes(*read_model_bytes(path))


def read_config(path: str) -> tuple[str, str]:
    """Config text (UTF-8) from ``path`` or stdin, and its name for messages."""
    data, name = read_bytes(path)
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"not UTF-8 text (byte {e.start})", line, source=name) from None


def read_model_or_am(path: str):
    """``(network, acoustic model or None)`` from the model file ``path`` (read once:
    it may be stdin), for commands that change a network and write it back: given
    an acoustic model (final.mdl) they write one (:func:`write_model` with ``am``),
    where writing the bare network would silently drop the transition model and
    priors from an ``out.mdl``."""
    from ..am import AcousticModel
    from ..io.model_file import is_am_bytes

    data, name = read_model_bytes(path)
    if is_am_bytes(data):
        am = AcousticModel.from_bytes(data, name)
        return am.nnet, am
    return nnet_from_bytes(data, name), None


def write_model(nnet: Nnet, path: str, binary: bool, am=None) -> None:
    """Write ``nnet`` to ``path`` (atomically) or to stdout for ``-``; with ``am`` (an
    AcousticModel) as an acoustic model: its transition model and priors, ``nnet``.
    The bytes are those Kaldi's tools write: BatchNorm statistics written from their
    sums, not as they were read (components/batchnorm.py)."""
    for comp in nnet.components.values():
        for part in (comp, *(getattr(comp, "components", None) or ())):
            forget = getattr(part, "forget_file_stats", None)
            if forget is not None:
                forget()
    if am is not None:
        from ..am import AcousticModel

        am = AcousticModel(am.transition_model, nnet, am.priors, am.left_context,
                           am.right_context)
    if path == STDIO:
        sys.stdout.buffer.write((am or nnet).to_bytes(binary))
        sys.stdout.flush()
    else:
        (am or nnet).write(path, binary=binary)
