"""Chunked decoding of whole utterances: Kaldi's DecodableNnetSimple (what
``nnet3-compute`` runs; ``pynnet3 compute`` is its command line).

An utterance of ``T`` input frames has ``ceil(T / f)`` output rows (f: the
frame-subsampling factor). They are computed in chunks of ``frames_per_chunk / f``
rows (the last chunk shorter), each chunk a separate computation with no state carried
between chunks (also for recurrent networks). A chunk of output rows ``s .. s+n-1``
gives output frames ``s*f .. (s+n-1)*f`` and reads input frames from ``s*f - L`` to
``(s+n-1)*f + R``, L and R being the network's left / right context plus
``extra_left_context`` / ``extra_right_context`` (``extra_left_context_initial`` for the
first chunk and ``extra_right_context_final`` for the last one when they are >= 0).
Input frames before 0 or after the end repeat the first / last frame. The request is
shifted in time so that the chunk's first output is at ``t = 0`` (outputs at ``t = 0,
f, 2f, ...``, the iVector at ``(n=0, t=0)``), so equal-size chunks are one request and
compile once through the compiler's cache.

The chunk's iVector is the utterance's one, or (online iVectors, one row every
``online_ivector_period`` input frames) the row of the frame half-way through the
chunk's output frames, clamped to the last row (an error when that is more than 50
frames past the end). Each chunk's output gets ``- log(priors)`` (when priors are
given) and is then multiplied by ``acoustic_scale``.

Beyond Kaldi, :mod:`pynnet3.runtime.batching` runs the chunks of several
utterances together: equal-shaped chunks (:class:`ChunkPlan`) become the sequences of
one request (:func:`run_chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import limits
from ..compiler.request import ComputationRequest, request_for_frames
from ..components.fused import linear_part
from ..errors import RuntimeInputError
from .computer import NnetComputer, host_array, run_dtype


@dataclass
class SimpleOptions:
    """Kaldi's NnetSimpleComputationOptions (its defaults, except ``acoustic_scale``:
    Kaldi's class has 0.1, nnet3-compute sets 1.0, as here)."""

    frames_per_chunk: int = 50
    extra_left_context: int = 0
    extra_right_context: int = 0
    extra_left_context_initial: int = -1
    extra_right_context_final: int = -1
    frame_subsampling_factor: int = 1
    acoustic_scale: float = 1.0

    def check(self) -> None:
        if self.frames_per_chunk < 1 or self.frame_subsampling_factor < 1:
            raise RuntimeInputError("--frame-subsampling-factor and --frames-per-chunk must "
                                    "be > 0")
        if self.extra_left_context < 0 or self.extra_right_context < 0:
            raise RuntimeInputError("--extra-left-context and --extra-right-context must "
                                    "be >= 0")


def fixed_frames_per_chunk(nnet, options: SimpleOptions) -> int:
    """Kaldi's CheckAndFixConfigs: frames-per-chunk rounded up to a multiple of
    lcm(frame-subsampling-factor, the network's modulus)."""
    options.check()
    n = int(np.lcm(options.frame_subsampling_factor, max(1, nnet.modulus())))
    return -(-options.frames_per_chunk // n) * n


def chunk_request(input_t_begin: int, num_input_frames: int, num_output_rows: int,
                  frame_subsampling_factor: int, ivector: bool,
                  num_sequences: int = 1, interleaved: bool = False) -> ComputationRequest:
    """The request of one chunk (``num_sequences`` equal-shaped chunks, one sequence
    after another, or ``interleaved`` time by time), time-shifted so that its first
    output is at t = 0: ``input`` at
    ``t = input_t_begin ..`` (``num_input_frames`` rows), ``ivector`` at t = 0 when
    ``ivector``, ``output`` at ``t = 0, f, 2f, ...`` (:func:`request_for_frames`).

    Equal arguments give the same request object (kept in a small table: a run has
    a few chunk shapes, and building one costs more than its compile-cache lookup);
    it is shared, so do not modify it."""
    # (with the max_rows limit request_for_frames checks: a shape cached under one
    # limit is built, and refused, anew under a lower one)
    key = (input_t_begin, num_input_frames, num_output_rows, frame_subsampling_factor,
           bool(ivector), num_sequences, bool(interleaved), limits.LIMITS.max_rows)
    request = _CHUNK_REQUESTS.get(key)
    if request is None:
        request = request_for_frames(range(input_t_begin, input_t_begin + num_input_frames),
                                     range(0, num_output_rows * frame_subsampling_factor,
                                           frame_subsampling_factor),
                                     num_sequences, ivector=ivector,
                                     interleaved=interleaved)
        if len(_CHUNK_REQUESTS) >= _MAX_CHUNK_REQUESTS:
            _CHUNK_REQUESTS.clear()
        _CHUNK_REQUESTS[key] = request
    return request


_CHUNK_REQUESTS: dict[tuple, ComputationRequest] = {}
_MAX_CHUNK_REQUESTS = 64


@dataclass
class ChunkPlan:
    """One chunk of an utterance, ready to run: output rows ``start ..
    start + num_rows - 1``, the feature rows it reads (edges repeated) and its
    iVector. ``shape`` is what its request depends on: chunks of equal shape (of any
    utterance) run together as the sequences of one request."""

    start: int
    num_rows: int
    input_t_begin: int
    rows: np.ndarray
    ivector: np.ndarray | None
    computed_rows: int = 0  # rows the request asks for (>= num_rows when padded)

    def __post_init__(self):
        self.computed_rows = max(self.computed_rows, self.num_rows)

    @property
    def shape(self) -> tuple[int, int, int, bool]:
        return self.input_t_begin, len(self.rows), self.computed_rows, self.ivector is not None


class DecodableNnetSimple:
    """One utterance decoded chunk by chunk (module doc). ``compiler`` has a
    ``compile(request)`` method (a :class:`pynnet3.CachingCompiler` for ``nnet``,
    shared by the utterances of a run); ``log_priors`` (one per output) is
    subtracted when not empty. ``pad_last_chunk`` (only where :func:`pads_at_end`;
    Kaldi computes it short): a short last chunk is computed full-size and
    cut back (:meth:`plan_chunk`)."""

    def __init__(self, nnet, compiler, features, options: SimpleOptions | None = None,
                 ivector=None, online_ivectors=None, online_ivector_period: int = 0,
                 log_priors=None, backend: str = "numpy", dtype=np.float32,
                 pad_last_chunk: bool = False, device=None):
        self.pad_last_chunk = pad_last_chunk
        self.device = device  # (the torch backend's device; None: its default, the CPU)
        self.nnet, self.compiler = nnet, compiler
        self.options = options or SimpleOptions()
        self.frames_per_chunk = fixed_frames_per_chunk(nnet, self.options)
        dtype = run_dtype(dtype)
        feats = host_array(features)
        in_dim = nnet.input_dim("input")
        if feats.ndim != 2 or len(feats) == 0:
            raise RuntimeInputError(f"features: expected a non-empty matrix, got shape "
                                    f"{feats.shape}")
        if feats.shape[1] != in_dim:
            raise RuntimeInputError(f"features have dim {feats.shape[1]}, but the network "
                                    f"expects input dim {in_dim}")
        self.features = feats.astype(dtype, copy=False)
        has_iv = nnet.has_node("ivector") and nnet.node("ivector").kind == "input-node"
        if ivector is not None and online_ivectors is not None:
            raise RuntimeInputError("give either an iVector or online iVectors, not both")
        if has_iv and ivector is None and online_ivectors is None:
            raise RuntimeInputError("the network expects 'ivector' features, but none were "
                                    "given (--ivectors or --online-ivectors)")
        if not has_iv and (ivector is not None or online_ivectors is not None):
            raise RuntimeInputError("iVectors were given, but the network has no 'ivector' "
                                    "input")
        self.ivector = self.online_ivectors = None
        if has_iv:
            iv_dim = nnet.input_dim("ivector")
            if ivector is not None:
                iv = host_array(ivector)
                if iv.ndim == 2 and len(iv) == 1:
                    iv = iv[0]
                if iv.ndim != 1 or len(iv) != iv_dim:
                    raise RuntimeInputError(f"iVector: expected a vector of dim {iv_dim}, "
                                            f"got shape {iv.shape}")
                self.ivector = iv.astype(dtype, copy=False)
            else:
                oi = host_array(online_ivectors)
                if oi.ndim != 2 or len(oi) == 0 or oi.shape[1] != iv_dim:
                    raise RuntimeInputError(f"online iVectors: expected a non-empty (rows, "
                                            f"{iv_dim}) matrix, got shape {oi.shape}")
                if online_ivector_period <= 0:
                    raise RuntimeInputError("online iVectors need --online-ivector-period "
                                            "> 0")
                self.online_ivectors = oi.astype(dtype, copy=False)
        self.online_ivector_period = online_ivector_period
        self.log_priors = None
        if log_priors is not None and np.size(log_priors):
            lp = np.asarray(log_priors, dtype=dtype).ravel()
            out_dim = nnet.output_dim("output")
            if len(lp) != out_dim:
                raise RuntimeInputError(f"priors have dim {len(lp)}, but the network's "
                                        f"output has dim {out_dim}")
            self.log_priors = lp
        self.left_context, self.right_context = nnet.context()
        self.backend, self.dtype = backend, dtype
        fsf = self.options.frame_subsampling_factor
        self.num_frames = -(-len(feats) // fsf)
        self.chunks_computed = 0

    def _ivector_for(self, first_output_frame: int, last_output_frame: int):
        """Kaldi's GetCurrentIvector."""
        if self.ivector is not None:
            return self.ivector
        if self.online_ivectors is None:
            return None
        frame = first_output_frame + (last_output_frame - first_output_frame) // 2
        row = frame // self.online_ivector_period
        rows = len(self.online_ivectors)
        if row >= rows:
            if (row - (rows - 1)) * self.online_ivector_period > 50:
                raise RuntimeInputError(
                    f"could not get an iVector for frame {frame}: the online iVectors have "
                    f"{rows} rows at period {self.online_ivector_period} (too few for the "
                    f"{len(self.features)} frames)")
            row = rows - 1
        return self.online_ivectors[row]

    def plan_chunk(self, start: int, pad: bool | None = None) -> ChunkPlan:
        """The chunk of output rows ``start ..`` (at most frames-per-chunk / f rows).
        ``pad``: a short last chunk is computed as a full-size one (frames past the
        end repeat the last frame) and cut back -- the same rows where
        :func:`pads_at_end`, and every chunk then has one shape."""
        o, f = self.options, self.options.frame_subsampling_factor
        n = min(self.num_frames - start, self.frames_per_chunk // f)
        if pad is None:
            pad = self.pad_last_chunk
        computed = self.frames_per_chunk // f if pad else n
        last = start + n - 1
        first_out, last_out = start * f, last * f
        extra_left = o.extra_left_context
        if first_out == 0 and o.extra_left_context_initial >= 0:
            extra_left = o.extra_left_context_initial
        extra_right = o.extra_right_context
        if last == self.num_frames - 1 and o.extra_right_context_final >= 0:
            extra_right = o.extra_right_context_final
        first_in = first_out - (self.left_context + extra_left)
        last_in = (start + computed - 1) * f + self.right_context + extra_right
        rows = np.arange(first_in, last_in + 1)
        if first_in < 0:  # (np.clip costs several times these two in-place passes)
            np.maximum(rows, 0, out=rows)
        if last_in >= len(self.features):
            np.minimum(rows, len(self.features) - 1, out=rows)
        # (the iVector is the real chunk's, as Kaldi picks it)
        return ChunkPlan(start, n, first_in - first_out, rows,
                         self._ivector_for(first_out, last_out), computed)

    def plan(self, pad: bool | None = None) -> list[ChunkPlan]:
        """Every chunk of the utterance, in order (errors such as missing online
        iVectors surface here, before anything runs); ``pad``: as :meth:`plan_chunk`
        (None: ``pad_last_chunk``)."""
        chunks, have = [], 0
        while have < self.num_frames:
            chunks.append(self.plan_chunk(have, pad))
            have += chunks[-1].num_rows
        return chunks

    def finish(self, out: np.ndarray) -> np.ndarray:
        """A chunk's network output with the priors and the acoustic scale applied."""
        if self.log_priors is not None:
            out = out - self.log_priors
        if self.options.acoustic_scale != 1.0:
            out = out * out.dtype.type(self.options.acoustic_scale)
        self.chunks_computed += 1
        return out

    def compute_chunk(self, start: int) -> np.ndarray:
        """Output rows ``start ..`` of one chunk (at most frames-per-chunk / f rows)."""
        return self.finish(run_chunks(self, [self.plan_chunk(start)])[0])

    def output(self) -> np.ndarray:
        """All ``ceil(T / f)`` output rows, chunk by chunk."""
        parts, have = [], 0
        while have < self.num_frames:
            part = self.compute_chunk(have)
            parts.append(part)
            have += len(part)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


_OPTIONAL_INPUTS = ("IfDefined", "Failover", "Switch")


def frame_local(nnet) -> bool:
    """Whether each output frame of ``nnet`` depends on a fixed set of input frames
    (its context), whatever else the chunk holds: no optional inputs (IfDefined,
    Failover, Switch: recurrences need them) and only simple components or
    TdnnComponents (all of whose time offsets are required), none in training mode
    (BatchNorm, dropout). Then a chunk padded at its end computes its real rows
    exactly as the short chunk does."""
    for node in nnet.nodes:
        if node.descriptor is not None and any(w in str(node.descriptor)
                                               for w in _OPTIONAL_INPUTS):
            return False
        if node.kind == "component-node":
            comp = nnet.components[node.component]
            if _batch_dependent(comp):
                return False
            comp = linear_part(comp)  # (a fused kernel: its linear layer's)
            if not comp.is_simple() and comp.type_name != "TdnnComponent":
                return False
    return True


def _batch_dependent(comp) -> bool:
    """A component in training mode (BatchNorm normalizing over the chunk's rows,
    dropout drawing masks for them): its rows depend on the rest of the chunk."""
    mode = getattr(comp, "test_mode", True)
    return mode is not None and not bool(mode)


# Not simple in Kaldi's sense, but row by row where pads_at_end needs it.
_ROW_WISE = ("TdnnComponent", "BackpropTruncationComponent")


def pads_at_end(nnet) -> bool:
    """Whether a chunk planned full-size past the utterance's end (the frames
    beyond repeating the last one, ``pad_last_chunk``) computes its real rows as
    the short chunk does: every :func:`frame_local` network, and recurrent ones
    (an LSTM running forward in time) whose optional inputs only look back and
    never need more future frames than what reads them.

    Why that suffices: the two chunks start alike and hold the same input frames up
    to the short chunk's end (real frames, then the repeated last one); what differs
    is the padded chunk's later frames. Required inputs of a real row lie within the
    network's right context, so both chunks have them. An optional input
    (``IfDefined(a)``, ``Failover(a, b)``) is what could differ: whether ``a`` is
    defined. Where each node ``n`` that ``a`` reads at time offset ``o <= 0`` needs
    no more future frames than the descriptor's required terms (``o + R(n) <= R``,
    ``R`` the future frames needed through required terms only), ``a`` is defined
    at a time exactly when the descriptor's own required inputs are there, alike in
    both chunks; ``n``'s own optional inputs are covered by the same rule at ``n``.
    Components must be simple, TDNN layers (whose offsets are all required), as for
    :func:`frame_local`, or BackpropTruncation (row by row in the forward pass: what
    makes it not simple, its zeroing pattern, acts in the backward pass only), none in
    training mode. Refused as well, the bound not holding there: ``Switch`` and
    ``Round`` (an offset reached at some times only) and a node other than an input
    read at a fixed time (``ReplaceIndex(., t, k)``: near the chunk's start); an
    iVector read so is fine."""
    if frame_local(nnet):
        return True
    nodes = nnet.node_map
    for node in nnet.nodes:
        if node.kind == "component-node":
            comp = nnet.components[node.component]
            if _batch_dependent(comp):
                return False
            comp = linear_part(comp)
            if not comp.is_simple() and comp.type_name not in _ROW_WISE:
                return False
        if node.descriptor is not None:
            text = str(node.descriptor)
            if "Switch(" in text or "Round(" in text:
                return False  # (an offset reached at some times only: no bound here)
            if any(o is None and nodes[n].kind != "input-node"
                   for n, o, _ in node.descriptor.time_terms()):
                return False  # (a node at a fixed time: near the chunk's start)
    right = _right_contexts(nnet)
    readers = _readers(nnet)
    for node in nnet.nodes:
        if node.descriptor is None:
            continue
        required, optional = _descriptor_right(node.descriptor, right)
        if optional and required == float("-inf"):
            required = _readers_bound(node.name, readers, right)
        if any(o > 0 or o + right[n] > required for n, o in optional):
            return False
    return True


def _readers(nnet) -> dict[str, list]:
    """node -> [(reader node, time offset or None, optional)] of every term reading it
    (a dim-range node reads its source at offset 0, required)."""
    out: dict[str, list] = {}
    for node in nnet.nodes:
        if node.kind == "dim-range-node":
            out.setdefault(node.source, []).append((node, 0, False))
        elif node.descriptor is not None:
            for n, o, opt in node.descriptor.time_terms():
                out.setdefault(n, []).append((node, o, opt))
    return out


def _readers_bound(name: str, readers: dict, right: dict) -> float:
    """For a node with only optional terms (always computable; an LSTM's recurrent
    product split from its input's, ``split-recurrent-affine``): the bound its optional
    terms must keep, taken from its readers instead of its own required terms. Each
    reader ``c`` reads it at offset ``o_c`` as a required term, so at every row of ``c``
    that is computed, ``c``'s required inputs (future frames ``R_c``) are there in both
    chunks, and the node's optional term ``(a, o)`` at that row is defined alike in
    both when ``o_c + o + R(a) <= R_c``: the bound is ``min(R_c - o_c)``. -inf (refuse)
    when a reader reads it optionally, at a fixed time, or as a dim-range node."""
    bound = float("inf")
    for reader, o, opt in readers.get(name, ()):
        if opt or o is None or reader.kind == "dim-range-node":
            return float("-inf")
        r_c = _descriptor_right(reader.descriptor, right)[0]
        bound = min(bound, r_c - o)
    return bound if bound != float("inf") else float("-inf")


def _right_contexts(nnet) -> dict[str, float]:
    """Future frames each node needs through required terms (-inf: none; inf: a
    required cycle), node by node without recursion (deep networks)."""
    nodes = nnet.node_map
    right: dict[str, float] = {}
    visiting: set[str] = set()

    def deps(node) -> list[str]:
        if node.kind == "input-node":
            return []
        if node.kind == "dim-range-node":
            return [node.source]
        return [n for n, o, opt in node.descriptor.time_terms() if not opt and o is not None]

    for root in nodes:
        stack = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if name in right:
                continue
            node = nodes[name]
            if not expanded:
                if name in visiting:  # (an ancestor on this path: a required cycle)
                    right[name] = float("inf")
                    continue
                visiting.add(name)
                stack.append((name, True))
                stack.extend((d, False) for d in deps(node) if d not in right)
                continue
            visiting.discard(name)
            if node.kind == "input-node":
                r = 0.0
            elif node.kind == "dim-range-node":
                r = right[node.source]
            else:
                r = _descriptor_right(node.descriptor, right)[0]
                if node.kind == "component-node":
                    comp = linear_part(nnet.components[node.component])
                    r += max(getattr(comp, "time_offsets", None) or [0])
            right[name] = r
    return right


def _descriptor_right(desc, right: dict) -> tuple[float, list[tuple[str, int]]]:
    """(future frames the required terms of ``desc`` need, the optional terms as
    (node, time offset)); terms at an absolute time (``ReplaceIndex(., t, k)`` of an
    input node: an iVector, given with every chunk) count in neither."""
    terms = [(n, o, opt) for n, o, opt in desc.time_terms() if o is not None]
    required = max((o + right[n] for n, o, opt in terms if not opt), default=float("-inf"))
    return required, [(n, o) for n, o, opt in terms if opt]


def _rows_of(features: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``features[rows]`` for a chunk's non-decreasing rows: a view when they are a
    plain run of frames, a gather where clipped edges repeat one."""
    first, last = int(rows[0]), int(rows[-1])
    return features[first:last + 1] if last - first == len(rows) - 1 else features[rows]


def run_chunks(d: DecodableNnetSimple, chunks: list[ChunkPlan],
                features: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Run equal-shaped ``chunks`` as the sequences of one request on ``d``'s network
    and compiler (``features[i]``: the feature matrix chunk i reads, default ``d``'s);
    one output matrix per chunk, before priors and scale."""
    c0, n = chunks[0], len(chunks)
    # several chunks: interleaved rows, the computation's own order (no reordering
    # copies of the input and output inside it)
    request = chunk_request(c0.input_t_begin, len(c0.rows), c0.computed_rows,
                            d.options.frame_subsampling_factor, c0.ivector is not None,
                            n, interleaved=n > 1)
    computation = d.compiler.compile(request)
    if features is None:
        features = [d.features] * n
    if n == 1:  # (a view where it can be: the computer copies its inputs)
        inputs = {"input": _rows_of(features[0], c0.rows)}
    else:
        dtype = np.result_type(*features)
        x = np.empty((len(c0.rows), n, features[0].shape[1]), dtype=dtype)
        for k, (f, c) in enumerate(zip(features, chunks, strict=True)):
            x[:, k, :] = _rows_of(f, c.rows)
        inputs = {"input": x.reshape(-1, x.shape[2])}
    if c0.ivector is not None:
        inputs["ivector"] = c0.ivector[None] if n == 1 else np.stack([c.ivector for c in chunks])
    # (a compiler's computations are shared and never modified: cache_program)
    computer = NnetComputer(d.nnet, computation, d.backend, d.dtype, device=d.device,
                            cache_program=True)
    result = computer.run(inputs)
    # (the decodable hands out NumPy rows, whatever backend computed them)
    out = computer.backend.to_numpy(result.outputs["output"])
    if n == 1:
        return [out[:c0.num_rows]]
    out = out.reshape(c0.computed_rows, n, out.shape[1])
    return [np.ascontiguousarray(out[:c.num_rows, k]) for k, c in enumerate(chunks)]


__all__ = ["ChunkPlan", "DecodableNnetSimple", "SimpleOptions", "chunk_request",
           "fixed_frames_per_chunk", "frame_local", "pads_at_end", "run_chunks"]
