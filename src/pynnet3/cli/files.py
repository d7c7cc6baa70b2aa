"""How the command line reads and writes its files: ``-`` is stdin / stdout, as in
Kaldi's tools; a file that cannot be read or decoded is a pynnet3 error naming it."""

from __future__ import annotations

import sys

from ..errors import ConfigError, FormatError
from ..nnet import Nnet, nnet_from_bytes

STDIO = "-"


def read_bytes(path: str) -> tuple[bytes, str]:
    """The contents of ``path`` (stdin for ``-``) and the name to use in messages."""
    if path == STDIO:
        return sys.stdin.buffer.read(), "<stdin>"
    with open(path, "rb") as f:
        return f.read(), path


def read_model(path: str) -> Nnet:
    """A Kaldi model, text or binary, from ``path`` or stdin; gzip-compressed
    (``model.txt.gz``) is read transparently."""
    data, name = read_bytes(path)
    if data[:2] == b"\x1f\x8b":
        import gzip
        import zlib

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise FormatError(f"broken gzip data: {e}", name) from None
    if not data:
        raise FormatError("empty model file", name)
    return nnet_from_bytes(data, name)


def read_config(path: str) -> tuple[str, str]:
    """Config text (UTF-8) from ``path`` or stdin, and its name for messages."""
    data, name = read_bytes(path)
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"not UTF-8 text (byte {e.start})", line, source=name) from None


def write_model(nnet: Nnet, path: str, binary: bool) -> None:
    """Write ``nnet`` to ``path`` (atomically) or to stdout for ``-``."""
    if path == STDIO:
        sys.stdout.buffer.write(nnet.to_bytes(binary))
        sys.stdout.flush()
    else:
        nnet.write(path, binary=binary)
