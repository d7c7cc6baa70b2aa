"""Exceptions raised by pynnet3.

Every error a user can provoke with bad input is one of these, and its message
names where the problem is: the file and line (text) or byte offset (binary) and
the offending token, or the node / component / index at fault.
"""

from __future__ import annotations


class PynnetError(Exception):
    """Base class of every pynnet3 error."""


class FormatError(PynnetError):
    """A model, matrix or archive file is malformed.

    ``source`` is the file name (or ``"<string>"``), ``line`` the 1-based line for
    text input, ``offset`` the byte offset for binary input, ``token`` the
    offending token.
    """

    def __init__(self, message: str, source: str | None = None, line: int | None = None,
                 offset: int | None = None, token: str | None = None):
        self.source = source
        self.line = line
        self.offset = offset
        self.token = token
        where = []
        if source is not None:
            where.append(str(source))
        if line is not None:
            where.append(f"line {line}")
        if offset is not None:
            where.append(f"byte {offset}")
        prefix = ":".join(where[:1]) + (", " + ", ".join(where[1:]) if len(where) > 1 else "")
        text = message
        if token is not None:
            text += f" (at token {token!r})"
        super().__init__(f"{prefix}: {text}" if prefix else text)


class ConfigError(PynnetError):
    """A config line (as read by nnet3-init) is invalid: unknown option, bad value,
    unknown component type, unknown node."""

    def __init__(self, message: str, line_number: int | None = None, line: str | None = None,
                 source: str | None = None):
        self.line_number = line_number
        self.line = line
        self.source = source
        where = source or "config"
        if line_number is not None:
            where += f", line {line_number}"
        text = f"{where}: {message}"
        if line is not None:
            text += f"\n  in: {line.strip()}"
        super().__init__(text)


class DescriptorError(ConfigError):
    """A descriptor expression (``Append(Offset(x, -1), x)`` ...) does not parse or
    refers to an unknown node."""


class DimensionError(PynnetError):
    """Dimensions do not agree: a descriptor and the component it feeds, an input
    matrix and its node, a parameter matrix and its declared size."""


class GraphError(PynnetError):
    """The network as a whole is invalid: duplicate or missing names, cycles
    without time offsets, outputs that don't exist, orphan references."""


class ComputeError(PynnetError):
    """A request cannot be compiled: an output is not computable from the given
    inputs, an input name is unknown, ..."""


class RuntimeInputError(PynnetError):
    """Inputs handed to ``pynnet3.run`` are wrong: missing, wrong shape, non-finite."""


class TrainingError(PynnetError):
    """Training cannot go on where Kaldi's trainer stops on an assertion (e.g. a
    parameter matrix under an orthonormal constraint that is no longer finite); the
    message names the component."""


class CheckError(PynnetError):
    """The computation checker found a violated invariant."""


class DependencyError(PynnetError):
    """An optional program or package a feature needs is missing (Graphviz's ``dot``
    for drawing SVG/PNG/PDF, matplotlib for plots); the message says what to install."""


class ExportError(PynnetError):
    """A network cannot be exported (``pynnet3.export``): a component type with no
    standard-op form, a training-mode random component; the message names the node
    and the component type."""


ComputationCheckError = CheckError
