"""Looped (online) decoding: Kaldi's DecodableNnetSimpleLooped.

:class:`LoopedDecodingInfo` compiles, once per network and options, the looped
computation (:func:`pynnet3.compiler.looped.compile_looped`); a
:class:`DecodableNnetLooped` then runs it over one utterance chunk by chunk,
keeping the network's state between chunks, and hands out output rows in order.

Chunk k gives output frames ``k*C/f .. (k+1)*C/f - 1`` (C: the chunk size, f: the
frame-subsampling factor). Chunk 0 reads input frames ``-L .. C+R-1`` (L: left
context plus ``extra_left_context_initial``, R: right context), chunk k >= 1 the
next C frames; frames before 0 or after the end repeat the first or last frame.
Each chunk's output is multiplied by ``acoustic_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..compiler.looped import (
    compile_looped,
    create_looped_requests,
    get_chunk_size,
    has_ivector_input,
    modify_ivector_period,
)
from ..errors import RuntimeInputError
from ..optimize.options import OptimizeOptions
from .computer import NnetComputer, host_array, run_dtype

_FLAGS = {"frames-per-chunk": "frames_per_chunk",
          "frame-subsampling-factor": "frame_subsampling_factor",
          "extra-left-context-initial": "extra_left_context_initial",
          "acoustic-scale": "acoustic_scale"}


@dataclass
class LoopedOptions:
    """Kaldi's NnetSimpleLoopedComputationOptions (same defaults).

    Note: ``acoustic_scale`` defaults to 0.1, as Kaldi's does (the looped decoder
    feeds a lattice decoder), so outputs are scaled by 0.1 unless you pass
    ``acoustic_scale=1.0``. ``pynnet3 compute --looped=true`` uses 1.0 by default,
    like nnet3-compute, and passes it explicitly.
    """

    frames_per_chunk: int = 20
    frame_subsampling_factor: int = 1
    extra_left_context_initial: int = 0
    acoustic_scale: float = 0.1
    optimize: OptimizeOptions = field(default_factory=OptimizeOptions)

    @classmethod
    def from_flags(cls, flags: dict) -> LoopedOptions:
        """From Kaldi command-line flag names (``{"frames-per-chunk": 20, ...}``)."""
        unknown = set(flags) - set(_FLAGS)
        if unknown:
            raise RuntimeInputError(f"unknown looped-decoding option(s) {sorted(unknown)} "
                                    f"(known: {sorted(_FLAGS)})")
        return cls(**{_FLAGS[k]: v for k, v in flags.items()})

    def check(self) -> None:
        if self.frames_per_chunk <= 0 or self.frame_subsampling_factor <= 0:
            raise RuntimeInputError("frames_per_chunk and frame_subsampling_factor must be "
                                    "positive")
        if self.extra_left_context_initial < 0:
            raise RuntimeInputError("extra_left_context_initial must be >= 0")


class LoopedDecodingInfo:
    """What a looped decoder needs, computed once per network and options (Kaldi's
    DecodableNnetSimpleLoopedInfo): contexts, chunk size, the network with its
    iVector period set to the chunk size, the three chunk requests and the
    looped computation. ``nnet`` itself is not changed."""

    def __init__(self, nnet, options: LoopedOptions | None = None, report=None):
        options = options or LoopedOptions()
        options.check()
        self.options = options
        left, right = nnet.context()
        self.frames_left_context = left + options.extra_left_context_initial
        self.frames_right_context = right
        self.frames_per_chunk = get_chunk_size(nnet, options.frame_subsampling_factor,
                                               options.frames_per_chunk)
        self.output_dim = nnet.output_dim("output")
        self.has_ivectors = has_ivector_input(nnet)
        # The iVector period is the chunk size, as in Kaldi.
        self.nnet = (modify_ivector_period(nnet, self.frames_per_chunk)
                     if self.has_ivectors else nnet)
        self.requests = create_looped_requests(
            self.nnet, self.frames_per_chunk, options.frame_subsampling_factor,
            self.frames_per_chunk, self.frames_left_context, self.frames_right_context)
        self.computation = compile_looped(self.nnet, self.requests, options.optimize,
                                          report=report)

    def num_ivectors(self, chunk: int) -> int:
        """iVector rows the computation takes with chunk ``chunk``."""
        req = self.requests[0] if chunk == 0 else self.requests[1]
        spec = req.input("ivector")
        return 0 if spec is None else len(spec.indexes)


class DecodableNnetLooped:
    """One utterance decoded by the looped computation of ``info``. Output rows
    must be asked for in increasing order (:meth:`output_for_frame`), or all at once
    (:meth:`output`)."""

    def __init__(self, info: LoopedDecodingInfo, features, ivector=None,
                 online_ivectors=None, online_ivector_period: int = 0,
                 backend: str = "numpy", dtype=np.float32, device=None):
        self.info = info
        dtype = run_dtype(dtype)
        feats = host_array(features)
        in_dim = info.nnet.input_dim("input")
        if feats.ndim != 2 or feats.shape[1] != in_dim or len(feats) == 0:
            raise RuntimeInputError(f"features: expected a non-empty (frames, {in_dim}) "
                                    f"matrix, got shape {feats.shape}")
        if not np.isfinite(feats).all():
            raise RuntimeInputError("features: non-finite values")
        self.features = feats
        if ivector is not None and online_ivectors is not None:
            raise RuntimeInputError("give either ivector or online_ivectors, not both")
        self.ivector = None if ivector is None else host_array(ivector).reshape(-1)
        self.online_ivectors = None if online_ivectors is None else \
            host_array(online_ivectors)
        self.online_ivector_period = online_ivector_period
        if info.has_ivectors:
            iv_dim = info.nnet.input_dim("ivector")
            if self.ivector is None and self.online_ivectors is None:
                raise RuntimeInputError("the network has an 'ivector' input: give ivector "
                                        "or online_ivectors")
            if self.ivector is not None and len(self.ivector) != iv_dim:
                raise RuntimeInputError(f"ivector: expected dim {iv_dim}, got "
                                        f"{len(self.ivector)}")
            if self.online_ivectors is not None:
                oi = self.online_ivectors
                if oi.ndim != 2 or oi.shape[1] != iv_dim or len(oi) == 0:
                    raise RuntimeInputError(f"online_ivectors: expected a non-empty "
                                            f"(rows, {iv_dim}) matrix, got {oi.shape}")
                if online_ivector_period <= 0:
                    raise RuntimeInputError("online_ivectors need online_ivector_period > 0")
        fsf = info.options.frame_subsampling_factor
        self.num_frames = -(-len(feats) // fsf)
        # (the looped computation is compiled once and never modified: its stepping
        # ops are prepared once for every utterance)
        self.computer = NnetComputer(info.nnet, info.computation, backend, dtype,
                                     device=device, cache_program=True)
        self.chunks_done = 0
        self._current = np.zeros((0, info.output_dim), dtype=dtype)
        self._current_offset = 0

    def _ivector_for(self, input_frame: int) -> np.ndarray:
        """Kaldi's GetCurrentIvector: the utterance iVector, or the online iVector
        row of ``input_frame`` (clamped to the last row)."""
        if self.ivector is not None:
            return self.ivector
        row = min(input_frame // self.online_ivector_period, len(self.online_ivectors) - 1)
        return self.online_ivectors[row]

    def _advance_chunk(self) -> None:
        info = self.info
        c = info.frames_per_chunk
        if self.chunks_done == 0:
            begin, end = -info.frames_left_context, c + info.frames_right_context
        else:
            begin = self.chunks_done * c + info.frames_right_context
            end = begin + c
        rows = np.clip(np.arange(begin, end), 0, len(self.features) - 1)
        self.computer.accept_input("input", self.features[rows])
        if info.has_ivectors:
            # Every row is the iVector of the chunk's last input frame (as Kaldi does:
            # a later iVector is a better one).
            iv = self._ivector_for(end)
            self.computer.accept_input(
                "ivector", np.repeat(iv[None, :], info.num_ivectors(self.chunks_done), axis=0))
        self.computer.run_until_io()
        # (the decodable hands out NumPy rows, whatever backend computed them)
        out = self.computer.backend.to_numpy(self.computer.get_output("output"))
        if info.options.acoustic_scale != 1.0:
            out *= out.dtype.type(info.options.acoustic_scale)
        fsf = info.options.frame_subsampling_factor
        self._current = out
        self._current_offset = self.chunks_done * (c // fsf)
        self.chunks_done += 1

    def output_for_frame(self, frame: int) -> np.ndarray:
        """Output row of (subsampled) frame ``frame``; frames must not go backwards."""
        if frame < self._current_offset:
            raise RuntimeInputError(f"frame {frame}: frames must be asked for in order "
                                    f"(already past {self._current_offset})")
        if not 0 <= frame < self.num_frames:
            raise RuntimeInputError(f"frame {frame} is outside 0..{self.num_frames - 1}")
        while frame >= self._current_offset + len(self._current):
            self._advance_chunk()
        return self._current[frame - self._current_offset].copy()

    def output(self) -> np.ndarray:
        """All output rows, ``(num_frames, output_dim)``, of a fresh decodable."""
        if self.chunks_done:
            raise RuntimeInputError("output() decodes the whole utterance: call it on a "
                                    "fresh DecodableNnetLooped")
        parts, have = [], 0
        while have < self.num_frames:
            self._advance_chunk()
            parts.append(self._current)
            have += len(self._current)
        return np.concatenate(parts)[:self.num_frames]


def decode_looped(nnet, features, ivector=None, options: LoopedOptions | None = None,
                  backend: str = "numpy", dtype=np.float32, device=None) -> np.ndarray:
    """Outputs of ``nnet`` for one utterance by looped decoding, shape
    ``(ceil(frames / frame_subsampling_factor), output_dim)``.

    With ``options=None`` the outputs are multiplied by 0.1: LoopedOptions keeps
    Kaldi's default ``acoustic_scale=0.1``. Pass ``LoopedOptions(acoustic_scale=1.0)``
    for the raw network output (what ``pynnet3 compute --looped=true`` writes by
    default, like nnet3-compute). ``device``: the torch backend's (``"cuda"``, ...;
    default the CPU)."""
    info = LoopedDecodingInfo(nnet, options)
    return DecodableNnetLooped(info, features, ivector, backend=backend,
                               dtype=dtype, device=device).output()
