"""ComputationRequest: what a computation must do.

Which indexes of which inputs are supplied, which outputs are wanted (and with
which derivatives), whether model derivatives are wanted and whether component
statistics are stored. The JSON form is that of kaldi-reference ``request.json``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .. import limits
from ..errors import ComputeError, FormatError
from ..index import INDEX_LIMITS, as_indexes, check_range, describe


@dataclass
class IoSpecification:
    """One input or output: node name, its indexes (row order of the matrix) and
    whether its derivative is involved."""

    name: str
    indexes: np.ndarray
    has_deriv: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ComputeError(f"IoSpecification: the name must be a string, got {self.name!r}")
        try:
            self.indexes = as_indexes(self.indexes)
            check_range(self.indexes)
        except (ValueError, TypeError, OverflowError) as e:
            raise ComputeError(f"IoSpecification {self.name!r}: {e}") from None

    def to_json(self) -> dict:
        return {"name": self.name, "has_deriv": self.has_deriv,
                "indexes": self.indexes.tolist()}

    @classmethod
    def from_json(cls, obj: dict, path: str = "io", source: str = "request"
                  ) -> IoSpecification:
        """One element of ``inputs`` / ``outputs`` (see :meth:`ComputationRequest.from_json`);
        ``path`` names it in errors."""
        fields = _object(obj, path, source, required=("name", "indexes"),
                         optional=("has_deriv",))
        name = fields["name"]
        if not isinstance(name, str) or not name:
            raise _error(source, f"{path}.name", "expected a node name (a non-empty string)",
                         name)
        has_deriv = fields.get("has_deriv", False)
        if type(has_deriv) is not bool:
            raise _error(source, f"{path}.has_deriv", "expected true or false", has_deriv)
        return cls(name, _indexes(fields["indexes"], f"{path}.indexes", source), has_deriv)


_REQUEST_KEYS = ("inputs", "outputs", "need_model_derivative", "store_component_stats")


@dataclass
class ComputationRequest:
    inputs: list[IoSpecification] = field(default_factory=list)
    outputs: list[IoSpecification] = field(default_factory=list)
    need_model_derivative: bool = False
    store_component_stats: bool = False

    @classmethod
    def from_json(cls, obj: dict, source: str = "request") -> ComputationRequest:
        """A request from its JSON object (kaldi-reference ``request.json``)::

            {"inputs":  [{"name": "input", "indexes": [[n, t, x], ...], "has_deriv": false}],
             "outputs": [{"name": "output", "indexes": [[0, 0, 0]], "has_deriv": true}],
             "need_model_derivative": false, "store_component_stats": false}

        Read strictly: only these keys; ``outputs`` (non-empty), ``name`` and
        ``indexes`` required, the rest default to ``[]`` / false; booleans are JSON
        booleans; an index is three JSON integers (no floats, strings or booleans)
        within the index range; at most ``pynnet3.limits`` ``max_rows`` indexes per
        input or output. A violation is a ComputeError naming ``source`` and the
        JSON path of the field (``outputs[0].indexes[3]``). docs/request-json.md
        has the full description."""
        fields = _object(obj, "(top level)", source, required=("outputs",),
                         optional=_REQUEST_KEYS)
        specs = {}
        for key in ("inputs", "outputs"):
            items = fields.get(key, [])
            if not isinstance(items, list):
                raise _error(source, key, "expected a list of inputs/outputs", items)
            if key == "outputs" and not items:
                raise _error(source, key, "a request must name at least one output", items)
            specs[key] = [IoSpecification.from_json(o, f"{key}[{i}]", source)
                          for i, o in enumerate(items)]
        flags = {}
        for key in ("need_model_derivative", "store_component_stats"):
            flags[key] = fields.get(key, False)
            if type(flags[key]) is not bool:
                raise _error(source, key, "expected true or false", flags[key])
        return cls(specs["inputs"], specs["outputs"], **flags)

    @classmethod
    def from_json_text(cls, text: str | bytes, source: str = "request") -> ComputationRequest:
        """Parse request JSON text (a file's contents); ``source`` names it in errors
        (FormatError for text that is not JSON, else as :meth:`from_json`)."""
        import json  # (loaded when used: a decoding run never parses JSON)

        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            line = getattr(e, "lineno", None)
            raise FormatError(f"not valid JSON: {getattr(e, 'msg', e)}", source, line=line
                              ) from None
        except RecursionError:
            raise FormatError("JSON nested too deeply", source) from None
        return cls.from_json(obj, source)

    @classmethod
    def from_frames(cls, input_frames, output_frames, num_sequences: int = 1, **kwargs
                    ) -> ComputationRequest:
        """The request of a decoding or training chunk given by frame ranges: see
        :func:`request_for_frames` (the same arguments)."""
        return request_for_frames(input_frames, output_frames, num_sequences, **kwargs)

    def to_json(self) -> dict:
        return {"inputs": [i.to_json() for i in self.inputs],
                "outputs": [o.to_json() for o in self.outputs],
                "need_model_derivative": self.need_model_derivative,
                "store_component_stats": self.store_component_stats}

    def input(self, name: str) -> IoSpecification | None:
        return next((i for i in self.inputs if i.name == name), None)

    def output(self, name: str) -> IoSpecification | None:
        return next((o for o in self.outputs if o.name == name), None)

    def need_derivatives(self) -> bool:
        return self.need_model_derivative or any(i.has_deriv for i in self.inputs) or any(
            o.has_deriv for o in self.outputs)

    def __str__(self) -> str:
        lines = ["# Computation request:"]
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for k, s in enumerate(specs):
                lines.append(f"{kind}-{k}: name={s.name}, has-deriv={str(s.has_deriv).lower()}, "
                             f"indexes=[{describe(s.indexes, 8)}]")
        lines.append(f"need-model-derivative: {str(self.need_model_derivative).lower()}")
        lines.append(f"store-component-stats: {str(self.store_component_stats).lower()}")
        return "\n".join(lines)


_NO_VALUE = object()


def _error(source: str, path: str, message: str, value=_NO_VALUE) -> ComputeError:
    got = "" if value is _NO_VALUE else f", got {_short(value)}"
    return ComputeError(f"{source}: {path}: {message}{got}")


def _short(value) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(obj, path: str, source: str, required: tuple[str, ...],
            optional: tuple[str, ...]) -> dict:
    """``obj`` checked to be a JSON object with the ``required`` keys and no key
    outside ``required + optional``."""
    if not isinstance(obj, dict):
        raise _error(source, path, "expected a JSON object", obj)
    prefix = "" if path == "(top level)" else path + "."
    for key in obj:
        if key not in required and key not in optional:
            known = ", ".join(dict.fromkeys(required + optional))
            raise _error(source, prefix + str(key), f"unknown key (known keys: {known})")
    for key in required:
        if key not in obj:
            raise _error(source, prefix + key, "missing (required)")
    return obj


def _indexes(value, path: str, source: str) -> np.ndarray:
    """A JSON list of ``[n, t, x]`` integer triples as a ``(k, 3)`` int64 array."""
    if not isinstance(value, list):
        raise _error(source, path, "expected a list of [n, t, x] triples", value)
    problem = limits.exceeded("max_rows", len(value), "number of indexes")
    if problem:
        raise _error(source, path, problem)
    if not value:
        return np.zeros((0, 3), dtype=np.int64)
    # C-level passes over the rows and values; the per-element scan only finds
    # the culprit once something is wrong.
    if set(map(type, value)) != {list} or set(map(len, value)) != {3}:
        i = next(i for i, row in enumerate(value) if type(row) is not list or len(row) != 3)
        raise _error(source, f"{path}[{i}]", "expected three integers [n, t, x]", value[i])
    if set(map(type, itertools.chain.from_iterable(value))) != {int}:
        i, j = next((i, j) for i, row in enumerate(value) for j, v in enumerate(row)
                    if type(v) is not int)
        raise _error(source, f"{path}[{i}][{j}]", "expected an integer", value[i][j])
    try:
        arr = np.array(value, dtype=np.int64)
    except OverflowError:  # beyond int64
        i, j = next((i, j) for i, row in enumerate(value) for j, v in enumerate(row)
                    if not -2**63 <= v < 2**63)
        raise _error(source, f"{path}[{i}][{j}]", "integer out of range", value[i][j]) from None
    bad = (arr < -INDEX_LIMITS) | (arr >= INDEX_LIMITS)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        lim = int(INDEX_LIMITS[j])
        raise _error(source, f"{path}[{i}][{j}]", f"{'ntx'[j]} must lie in [{-lim}, {lim})",
                     value[i][j])
    return arr


def _frames(value, what: str) -> np.ndarray:
    """A range or a sequence of integer frame times as a 1-d int64 array."""
    if isinstance(value, range):
        return np.arange(value.start, value.stop, value.step, dtype=np.int64)
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ComputeError(f"request_for_frames: {what} must be a range or a list of "
                           f"integer times, got {_short(np.asarray(value).tolist())}")
    return arr.astype(np.int64)


def _repeats(t: np.ndarray) -> bool:
    """Whether a 1-d array holds some value twice (a strictly monotone one, as a
    range gives, is checked in one pass; np.unique would also load numpy.ma)."""
    if len(t) < 2:
        return False
    step = t[1:] - t[:-1]
    if (step > 0).all() or (step < 0).all():
        return False
    s = np.sort(t)
    return bool((s[1:] == s[:-1]).any())


def request_for_frames(input_frames, output_frames, num_sequences: int = 1, *,
                       ivector: bool = False, input_name: str = "input",
                       output_name: str = "output", ivector_name: str = "ivector",
                       input_deriv: bool = False, output_deriv: bool = False,
                       need_model_derivative: bool = False,
                       interleaved: bool = False) -> ComputationRequest:
    """The request for ``num_sequences`` sequences that all have the same frames:
    ``input_name`` at the times ``input_frames`` and ``output_name`` at the times
    ``output_frames`` (each a ``range`` or a list of ints; x = 0), plus one
    ``ivector_name`` row per sequence at t = 0 when ``ivector``. What ``pynnet3
    compute`` builds for each chunk (``range(-left, frames + right)`` in,
    ``range(0, frames, frame_subsampling_factor)`` out); e.g. for a network with 13
    frames of context each side::

        req = ComputationRequest.from_frames(range(-13, 63), range(50), ivector=True)

    Rows go one sequence after another (rows ``k*F .. (k+1)*F - 1`` of a matrix of
    F rows per sequence are sequence ``n = k``), so input matrices are the
    sequences' matrices stacked and outputs split back with a reshape; such a
    request is regular, so the :class:`pynnet3.CachingCompiler` builds it for any
    ``num_sequences`` from a two-sequence compile (its shortcut). ``interleaved``:
    rows go time by time instead, the sequences of each time side by side (row
    ``i*N + k`` is sequence ``k`` at its ``i``-th time; N = ``num_sequences``), the
    order in which the compiled computation keeps its rows (and Kaldi its merged
    examples): an input is then ``np.stack(matrices, axis=1).reshape(-1, dim)``
    and needs no reordering copies inside the computation. ``input_deriv`` /
    ``output_deriv`` set ``has_deriv`` (the derivative w.r.t. the input is wanted /
    an output derivative is supplied); ``need_model_derivative`` asks for gradients.
    Bad arguments (no output frame, a time repeated, ``num_sequences < 1``) are a
    :class:`pynnet3.errors.ComputeError`."""
    t_in = _frames(input_frames, "input_frames")
    t_out = _frames(output_frames, "output_frames")
    if type(num_sequences) is not int and not isinstance(num_sequences, np.integer):
        raise ComputeError(f"request_for_frames: num_sequences must be an int, got "
                           f"{num_sequences!r}")
    num_sequences = int(num_sequences)
    if num_sequences < 1:
        raise ComputeError(f"request_for_frames: num_sequences must be >= 1, got "
                           f"{num_sequences}")
    if not len(t_out):
        raise ComputeError("request_for_frames: no output frames")
    for what, t in (("input_frames", t_in), ("output_frames", t_out)):
        if _repeats(t):
            raise ComputeError(f"request_for_frames: {what} lists a time twice")
        problem = limits.exceeded("max_rows", len(t) * num_sequences, f"rows of {what}")
        if problem:
            raise ComputeError(f"request_for_frames: {problem}")

    def rows(t: np.ndarray) -> np.ndarray:
        idx = np.zeros((num_sequences, len(t), 3), dtype=np.int64)
        idx[:, :, 0] = np.arange(num_sequences)[:, None]
        idx[:, :, 1] = t[None, :]
        if interleaved:
            idx = np.ascontiguousarray(idx.transpose(1, 0, 2))
        return idx.reshape(-1, 3)

    inputs = [IoSpecification(input_name, rows(t_in), input_deriv)] if len(t_in) else []
    if ivector:
        inputs.append(IoSpecification(ivector_name, rows(np.zeros(1, dtype=np.int64))))
    return ComputationRequest(inputs, [IoSpecification(output_name, rows(t_out), output_deriv)],
                              need_model_derivative=need_model_derivative)
