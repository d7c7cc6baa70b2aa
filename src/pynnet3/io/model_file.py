"""The layout of a Kaldi nnet3 model file (``<Nnet3>`` ... ``</Nnet3>``).

A model is the network's config lines (plain text, even in binary files), a blank
line, ``<NumComponents> k`` and k ``<ComponentName> name <Type> ... </Type>``
entries. This module reads and writes that layout; the :class:`~pynnet3.nnet.Nnet`
turns it into a network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..components import component_class
from ..components.base import Component, check_dims
from ..errors import FormatError
from .kaldi_stream import KaldiReader, KaldiWriter, make_reader, make_writer


@dataclass
class ModelParts:
    """What a model file holds, before it becomes an Nnet."""

    config_lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, text)
    components: list[tuple[str, Component]] = field(default_factory=list)
    binary: bool = False


def read_component(r: KaldiReader) -> Component:
    """Read one component starting at its ``<TypeName>`` token."""
    start = r.token_start()
    tok = r.read_token()
    if not (tok.startswith("<") and tok.endswith(">")):
        raise r.error("expected a component type token like <AffineComponent>", token=tok,
                      pos=start)
    cls = component_class(tok[1:-1])
    if cls is None:
        raise r.error("unknown component type", token=tok, pos=start)
    comp = cls.read(r)
    problem = check_dims(comp)
    if problem:
        raise r.error(problem, token=tok, pos=start)
    return comp


def write_component(w: KaldiWriter, comp: Component) -> None:
    comp.write(w)


def read_model_parts(r: KaldiReader) -> ModelParts:
    """Read ``<Nnet3> ... </Nnet3>`` from ``r`` (positioned at ``<Nnet3>``)."""
    parts = ModelParts(binary=r.binary)
    r.expect_token("<Nnet3>")
    # Config lines follow, one per line, up to a blank line.
    r.read_line()  # rest of the <Nnet3> line
    while True:
        if r.pos >= len(r.data):
            raise r.error("unexpected end of file in the config section of <Nnet3>")
        line_no = r.data.count(b"\n", 0, r.pos) + 1
        line = r.read_line()
        if not line.strip():
            break
        parts.config_lines.append((line_no, line))
    r.expect_token("<NumComponents>")
    start = r.token_start()
    n = r.read_int()
    if n < 0:
        raise r.error("negative <NumComponents>", token=str(n), pos=start)
    for _ in range(n):
        r.expect_token("<ComponentName>")
        name = r.read_token()
        parts.components.append((name, read_component(r)))
    r.expect_token("</Nnet3>")
    return parts


def write_model_parts(parts: ModelParts, binary: bool) -> bytes:
    w = make_writer(binary)
    if binary:
        w.raw(b"\0B")
    w.write_token("<Nnet3>")
    w.raw("\n")
    for _, line in parts.config_lines:
        w.raw(line + "\n")
    w.raw("\n")
    w.write_token("<NumComponents>")
    w.write_int(len(parts.components))
    if not binary:
        w.raw("\n")
    for name, comp in parts.components:
        w.write_token("<ComponentName>")
        w.write_token(name)
        comp.write(w)
        if not binary:
            w.raw("\n")
    w.write_token("</Nnet3>")
    return w.getvalue()


def parse_model_bytes(data: bytes, source: str = "<string>") -> ModelParts:
    return read_model_parts(make_reader(data, source))


# An acoustic model (final.mdl) starts with its transition model; the acoustic-model
# file format itself lives in io/am_file.py (this test is here, with the network's
# reading, so that reading a raw network does not load that module).
AM_TOKEN = "<TransitionModel>"


def is_am_bytes(data: bytes) -> bool:
    """Whether ``data`` (a model file's bytes) is an acoustic model, not a raw nnet."""
    r = make_reader(data)
    return r.token_start() < len(data) and r.peek_token() == AM_TOKEN


def gunzip_if_compressed(data: bytes, source: str) -> bytes:
    """``data`` gunzipped when it is gzip-compressed (``final.mdl.gz``: Kaldi's tools
    read those through ``gunzip -c |``), else as it is; broken gzip data is a
    FormatError naming ``source``."""
    if data[:2] != b"\x1f\x8b":
        return data
    import gzip
    import zlib

    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise FormatError(f"broken gzip data: {e}", source) from None
