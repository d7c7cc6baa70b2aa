"""Kaldi acoustic models (``final.mdl``): a transition model, the network and the
priors, as ``nnet3-am-init`` writes them and ``nnet3-am-copy`` copies them.

:func:`read_am` reads one (text or binary, detected); :meth:`AcousticModel.write`
writes it back byte for byte as Kaldi would. :func:`pynnet3.read_nnet` also accepts
a ``final.mdl`` and returns its network. The file layout is in
:mod:`pynnet3.io.am_file`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import FormatError, GraphError
from .io.am_file import AmParts, TransitionModel, parse_am_bytes, write_am_parts
from .io.atomic import atomic_write
from .io.model_file import gunzip_if_compressed
from .nnet import Nnet


@dataclass
class AcousticModel:
    """Kaldi's ``TransitionModel`` + ``AmNnetSimple``. ``priors`` is empty or has one
    value per pdf (the dim of the network's ``output``). ``left_context`` and
    ``right_context`` are what the file stores; None (when built in code) means the
    network's own context, as ``AmNnetSimple::SetContext`` computes it."""

    transition_model: TransitionModel
    nnet: Nnet
    priors: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    left_context: int | None = None
    right_context: int | None = None

    def __post_init__(self):
        self.priors = np.asarray(self.priors, dtype=np.float32).ravel()
        if self.left_context is None or self.right_context is None:
            left, right = self.nnet.context()
            self.left_context = left if self.left_context is None else self.left_context
            self.right_context = right if self.right_context is None else self.right_context
        problem = self.problem()
        if problem:
            raise GraphError(problem)

    def problem(self) -> str | None:
        """Why the priors do not fit the network (None when they do)."""
        if self.priors.size and self.priors.size != self.num_pdfs:
            return (f"<Priors> has dim {self.priors.size}, but the network's output "
                    f"has dim {self.num_pdfs}")
        return None

    @property
    def num_pdfs(self) -> int:
        """``AmNnetSimple::NumPdfs``: the dim of the network's ``output`` node."""
        return self.nnet.output_dim("output") if "output" in self.nnet.output_names() else -1

    # -- files -----------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> AcousticModel:
        """An acoustic model from a ``final.mdl``'s bytes, text or binary; ``source``
        names it in error messages."""
        parts = parse_am_bytes(data, source)
        am = cls.__new__(cls)
        am.transition_model = parts.transition_model
        am.nnet = Nnet.from_model_parts(parts.model, source)
        am.priors = parts.priors
        am.left_context, am.right_context = parts.left_context, parts.right_context
        problem = am.problem()
        if problem:
            raise FormatError(problem, source, token="<Priors>")
        return am

    def to_bytes(self, binary: bool = True) -> bytes:
        return write_am_parts(AmParts(self.transition_model, self.nnet.to_model_parts(),
                                      self.left_context, self.right_context, self.priors),
                              binary)

    def write(self, path: str | os.PathLike, binary: bool = True) -> None:
        """Write as ``nnet3-am-copy --binary=...`` does; atomically
        (:mod:`pynnet3.io.atomic`)."""
        atomic_write(path, self.to_bytes(binary))

    # -- summary ---------------------------------------------------------------------
    def info(self) -> str:
        """Text like ``nnet3-am-info``, after a summary of the transition model."""
        tm = self.transition_model
        nnet = self.nnet
        inputs = nnet.input_names()
        lines = ["# transition model",
                 f"topology: {'hmm' if tm.is_hmm else 'separate self-loop pdf classes'} "
                 f"({len(tm.topology.entries)} entries)",
                 f"num-phones: {tm.num_phones}",
                 f"num-pdfs: {tm.num_pdfs}",
                 f"num-transition-states: {tm.num_transition_states}",
                 f"num-transition-ids: {tm.num_transition_ids}",
                 "# acoustic model",
                 f"input-dim: {nnet.input_dim('input') if 'input' in inputs else -1}",
                 f"ivector-dim: {nnet.input_dim('ivector') if 'ivector' in inputs else -1}",
                 f"num-pdfs: {self.num_pdfs}",
                 f"left-context: {self.left_context}",
                 f"right-context: {self.right_context}",
                 f"prior-dimension: {self.priors.size}"]
        if self.priors.size:
            lines += [f"prior-sum: {float(self.priors.sum(dtype=np.float64)):.6g}",
                      f"prior-min: {float(self.priors.min()):.6g}",
                      f"prior-max: {float(self.priors.max()):.6g}"]
        lines.append("# nnet info follows")
        return "\n".join(lines) + "\n" + nnet.info()


def read_am(path: str | os.PathLike) -> AcousticModel:
    """Read a Kaldi acoustic model (``final.mdl``), text or binary (detected; also
    gzip-compressed)."""
    path = Path(path)
    return AcousticModel.from_bytes(gunzip_if_compressed(path.read_bytes(), str(path)),
                                    str(path))
