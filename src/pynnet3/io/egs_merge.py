"""Merging examples into minibatches, as Kaldi's ``nnet3-merge-egs`` does.

:func:`merge_examples` is Kaldi's ``MergeExamples``: the NnetIo of the same name of
all examples are stacked (names in sorted order), example ``i``'s indexes get
``n + i * stride`` (``stride`` = 1 + the first example's largest ``n``: 1 for single
examples, the minibatch size for merged ones, which merge again as in Kaldi), full
and compressed features become one full matrix (compressed ones with Kaldi's
decompressed values), sparse ones stay sparse; with ``compress`` the full result is
compressed again.

:class:`ExampleMerger` is Kaldi's ``ExampleMerger``: examples of the same structure
(names, indexes, feature sizes) are collected until the minibatch size for their
size (:class:`MinibatchSizeRules`, ``--minibatch-size``) is reached and written as
``merged-<count>-<size>``; :meth:`ExampleMerger.finish` writes what is left in the
largest allowed sizes and discards the rest, and keeps Kaldi's statistics.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import DimensionError, FormatError
from .egs import NnetExample, NnetIo
from .general_matrix import CompressedMatrix, SparseMatrix, general_matrix_shape, to_dense


# -- --minibatch-size ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MinibatchSizeRules:
    """A parsed ``--minibatch-size``: ``"128"``, ``"64,128"``, ``"16:32,64,128"`` (ranges
    ``lo:hi``) or per example size ``"128=64:128,256/256=32:64"``. ``rules`` holds
    ``(eg_size, ranges)``; ``eg_size`` is 0 for the single rule without ``=``."""

    text: str
    rules: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]

    @classmethod
    def parse(cls, text: str) -> MinibatchSizeRules:
        def bad(why: str = "") -> FormatError:
            return FormatError(f"invalid --minibatch-size={text}" + (f" ({why})" if why else ""))

        parts = str(text).split("/")  # (Kaldi keeps empty fields: they are errors)
        if not parts:
            raise bad()
        rules = []
        for part in parts:
            if "=" in part:
                size_text, _, set_text = part.partition("=")
                try:
                    eg_size = int(size_text)
                except ValueError:
                    raise bad() from None
            elif len(parts) != 1:
                raise bad("all rules must have eg-size specified if >1 rule")
            else:
                eg_size, set_text = 0, part
            rules.append((eg_size, cls._int_set(set_text, bad)))
        sizes = [r[0] for r in rules]
        if len(set(sizes)) != len(sizes):
            raise bad("repeated example-sizes")
        return cls(str(text), tuple(rules))

    @staticmethod
    def _int_set(text: str, bad) -> tuple[tuple[int, int], ...]:
        ranges = []
        for item in text.split(","):
            try:
                ends = [int(v) for v in item.split(":")]
            except ValueError:
                raise bad() from None
            if not 1 <= len(ends) <= 2 or ends[0] > ends[-1] or ends[0] <= 0:
                raise bad()
            ranges.append((ends[0], ends[-1]))
        if not ranges:
            raise bad()
        return tuple(ranges)

    def minibatch_size(self, eg_size: int, num_available: int, input_ended: bool) -> int:
        """Kaldi's ``ExampleMergingConfig::MinibatchSize``: the rule of the nearest
        example size; before the input ends only its largest size (0: wait for more),
        at the end the largest allowed size not above ``num_available`` (0: none)."""
        ranges = min(self.rules, key=lambda r: abs(eg_size - r[0]))[1]
        if not input_ended:
            largest = max(hi for _, hi in ranges)
            return largest if largest <= num_available else 0
        best = 0
        for lo, hi in ranges:
            if lo <= num_available:
                best = max(best, min(hi, num_available))
        return best


# -- MergeExamples ------------------------------------------------------------------------------
def merge_examples(egs: list[NnetExample], compress: bool = False) -> NnetExample:
    """Kaldi's ``MergeExamples`` (see the module doc)."""
    if not egs:
        raise FormatError("merging an empty list of examples")
    names = sorted({io.name for eg in egs for io in eg.io})
    # Kaldi's MergeIo (since 2020, chain2): an example's sequences are numbered
    # 0 .. stride-1, stride = 1 + the largest n of the first example's first NnetIo
    # (1 for single examples), and example i's n become n + i * stride, so merged
    # minibatches merge again (nnet3-merge-egs on merged egs).
    first = egs[0].io[0].indexes if egs[0].io else np.zeros((0, 3), np.int32)
    stride = 1 + max(0, int(first[:, 0].max())) if len(first) else 1
    parts: dict[str, list[tuple[int, NnetIo]]] = {name: [] for name in names}
    for n, eg in enumerate(egs):
        for io in eg.io:
            parts[io.name].append((n, io))
    merged = []
    for name in names:
        ios = parts[name]
        dims = {general_matrix_shape(io.features)[1] for _, io in ios
                if general_matrix_shape(io.features)[0]}
        if len(dims) > 1:
            raise DimensionError(f"merging examples: NnetIo {name!r} has different dims "
                                 f"{sorted(dims)}")
        for _, io in ios:
            if len(io.indexes) and (io.indexes[:, 0] >= stride).any():
                raise FormatError(f"merging examples: NnetIo {name!r} has n = "
                                  f"{int(io.indexes[:, 0].max())}, but the first example's "
                                  f"sequences are n < {stride} (Kaldi merges examples of "
                                  "the same number of sequences)")
        indexes = np.concatenate([io.indexes for _, io in ios]).astype(np.int64)
        indexes[:, 0] += stride * np.repeat([n for n, _ in ios],
                                            [len(io.indexes) for _, io in ios])
        if len(indexes) and indexes[:, 0].max() > 2**31 - 1:
            raise FormatError(f"merging examples: NnetIo {name!r}: n beyond the int32 range")
        indexes = indexes.astype(np.int32)
        feats = [io.features for _, io in ios]
        if all(isinstance(f, SparseMatrix) or general_matrix_shape(f)[0] == 0 for f in feats):
            features = SparseMatrix.append_rows([f for f in feats if isinstance(f, SparseMatrix)])
        else:
            features = np.concatenate([to_dense(f) for f in feats
                                       if general_matrix_shape(f)[0]]).astype(np.float32)
            if compress and features.size:
                features = CompressedMatrix.compress(features)
        merged.append(NnetIo(name, indexes, features))
    return NnetExample(merged)


# -- the merger ---------------------------------------------------------------------------------
@dataclass
class _SizeStats:
    num_discarded: int = 0
    written: dict[int, int] = field(default_factory=dict)  # minibatch size -> count


class ExampleMerger:
    """Kaldi's ExampleMerger. Feed examples with :meth:`accept` (it returns the merged
    minibatch an example completed), then call :meth:`finish`; both give
    ``(key, merged_example)`` pairs. :meth:`merge_all` does both over a stream."""

    def __init__(self, minibatch_size: str | MinibatchSizeRules = "256", compress: bool = False):
        self.rules = (minibatch_size if isinstance(minibatch_size, MinibatchSizeRules)
                      else MinibatchSizeRules.parse(minibatch_size))
        self.compress = compress
        self.num_written = 0
        self._pending: dict[tuple, list[NnetExample]] = {}
        self._stats: dict[tuple, _SizeStats] = {}  # (eg size, structure) -> stats

    def accept(self, eg: NnetExample) -> list[tuple[str, NnetExample]]:
        """Take one example; returns the minibatch it completed (or nothing)."""
        key = eg.structure_key()
        pending = self._pending.setdefault(key, [])
        pending.append(eg)
        size = self.rules.minibatch_size(eg.size(), len(pending), input_ended=False)
        if not size:
            return []
        del self._pending[key]
        return [self._write(key, pending)]

    def finish(self) -> list[tuple[str, NnetExample]]:
        """The input ended: the minibatches made of what is left (the rest is
        discarded and counted)."""
        out = []
        pending, self._pending = self._pending, {}
        for key, egs in pending.items():
            eg_size = egs[0].size()
            while egs:
                size = self.rules.minibatch_size(eg_size, len(egs), input_ended=True)
                if not size:
                    break
                batch, egs = egs[:size], egs[size:]
                out.append(self._write(key, batch))
            if egs:
                self._stat(key, eg_size).num_discarded += len(egs)
        return out

    def merge_all(self, egs: Iterable[NnetExample]) -> Iterator[tuple[str, NnetExample]]:
        """All minibatches of ``egs``, as they complete, then :meth:`finish`'s."""
        for eg in egs:
            yield from self.accept(eg)
        yield from self.finish()

    def _stat(self, key: tuple, eg_size: int) -> _SizeStats:
        return self._stats.setdefault((eg_size, key), _SizeStats())

    def _write(self, key: tuple, egs: list[NnetExample]) -> tuple[str, NnetExample]:
        stats = self._stat(key, egs[0].size())
        stats.written[len(egs)] = stats.written.get(len(egs), 0) + 1
        name = f"merged-{self.num_written}-{len(egs)}"
        self.num_written += 1
        return name, merge_examples(egs, self.compress)

    def stats_lines(self) -> list[str]:
        """Kaldi's PrintSpecificStats and PrintAggregateStats lines (same wording)."""
        specific = []
        n_in = n_disc = size_in = n_mb = n_kept = n_types = 0
        for (eg_size, _), st in sorted(self._stats.items(), key=lambda kv: kv[0][0]):
            # (Kaldi prints its unordered_map<int32, int32>: libstdc++, with which Kaldi
            # is built, lists up to 13 keys newest first, i.e. the sizes in the reverse
            # order of their first minibatch; beyond 13 in hash order, not reproduced)
            sizes = "".join(f"{mb}->{count}," for mb, count in reversed(st.written.items()))
            specific.append(f"{eg_size}={{{sizes}d={st.num_discarded}}}")
            n_disc += st.num_discarded
            size_in += st.num_discarded * eg_size
            for mb, count in st.written.items():
                n_types += 1
                n_mb += count
                n_kept += count * mb
                size_in += count * mb * eg_size
        n_in = n_disc + n_kept
        avg_size = size_in / n_in if n_in else float("nan")
        percent = n_disc * 100.0 / n_in if n_in else float("nan")
        avg_mb = n_kept / n_mb if n_mb else float("nan")
        return ["Merged specific eg types as follows [format: <eg-size1>={<mb-size1>->"
                "<num-minibatches1>,<mbsize2>-><num-minibatches2>.../d=<num-discarded>},"
                "<egs-size2>={...},... (note,egs-size == number of input frames including "
                "context).",
                ",".join(specific),
                f"Processed {n_in} egs of avg. size {avg_size:.4g} into {n_mb} minibatches, "
                f"discarding {percent:.4g}% of egs.  Avg minibatch size was {avg_mb:.4g}, "
                f"#distinct types of egs/minibatches was {len(self._stats)}/{n_types}"]


__all__ = ["ExampleMerger", "MinibatchSizeRules", "merge_examples"]
