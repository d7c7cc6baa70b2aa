"""TrainerOptions: Kaldi's NnetTrainerOptions, with nnet3-train's flag names.

Defaults are Kaldi's (``NnetTrainerOptions()``), including the two that surprise:
``zero_component_stats`` and ``store_component_stats`` are True.
:meth:`TrainerOptions.from_flags` takes the names nnet3-train registers
(``"max-param-change"``, ``"momentum"``, ...) so scripts port over; an unknown flag
or a value of the wrong kind is a :class:`~pynnet3.errors.ConfigError` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import ConfigError

# Flags nnet3-train accepts that change nothing in a training step (compile cache
# files, output format, logging, the GPU, the optimizer/compiler/allocator
# sub-options): accepted so command lines and options files port.
_IGNORED_PREFIXES = ("optimization.", "compiler.", "computation.", "cuda-")
_IGNORED = {"read-cache", "write-cache", "binary-write-cache", "debug-computation",
            "use-gpu", "binary", "verbose", "config", "print-args", "help"}


@dataclass
class TrainerOptions:
    """What NnetTrainer does around each minibatch (see :class:`~pynnet3.train.Trainer`).

    Invariants checked by :meth:`validate` (Kaldi's asserts, and every float
    finite): ``momentum >= 0``,
    ``max_param_change >= 0``, ``backstitch_training_interval > 0``,
    ``0 <= batchnorm_stats_scale <= 1``, ``print_interval > 0``.
    ``srand`` seeds the trainer's own generator (ConstrainOrthonormal's coin and
    the backstitch phase), as nnet3-train's ``--srand`` seeds Kaldi's.
    ``learning_rate`` (flag ``learning-rate``; not nnet3-train's, but what the
    kaldi-reference options files give and what ``nnet3-copy --learning-rate`` does
    to the model first): when set, the trainer starts with
    ``nnet.set_learning_rate(learning_rate)``.
    ``random_stats`` (pynnet3's): Kaldi's draws in the nonlinearities (Sigmoid, Tanh,
    RectifiedLinear, ClipGradient), from the trainer's generator: statistics stored on
    about every other minibatch (always the first), backprop statistics on three in
    four, self-repair on half of them at twice the scale, so its expected strength is
    the configured one. False: all of them on every minibatch (deterministic, with
    twice Kaldi's expected self-repair).
    """

    zero_component_stats: bool = True
    store_component_stats: bool = True
    print_interval: int = 100
    momentum: float = 0.0
    l2_regularize_factor: float = 1.0
    backstitch_training_scale: float = 0.0
    backstitch_training_interval: int = 1
    batchnorm_stats_scale: float = 0.8
    max_param_change: float = 2.0
    srand: int = 0
    learning_rate: float | None = None
    random_stats: bool = True

    @classmethod
    def from_flags(cls, flags: dict) -> TrainerOptions:
        """Options from ``{flag-name: value}`` with nnet3-train's names; values may
        be Python values or the strings a command line gives (``"true"``, ``"0.5"``)."""
        by_flag = {f.name.replace("_", "-"): f for f in fields(cls)}
        kwargs = {}
        for name, value in flags.items():
            key = _normalized_flag(name)
            if key in _IGNORED or key.startswith(_IGNORED_PREFIXES):
                continue
            f = by_flag.get(key)
            if f is None:
                raise ConfigError(f"unknown trainer option --{key} (known: "
                                  f"{', '.join(sorted(by_flag))})")
            kwargs[f.name] = _convert(key, f.type, value)
        opts = cls(**kwargs)
        opts.validate()
        return opts

    def validate(self) -> None:
        for f in fields(self):  # (NaN passes or fails the comparisons below by accident)
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"trainer options: {f.name.replace('_', '-')} must be "
                                  f"finite, got {value}")
        checks = (
            (self.momentum >= 0.0, "momentum must be >= 0"),
            (self.max_param_change >= 0.0, "max-param-change must be >= 0"),
            (self.backstitch_training_interval > 0, "backstitch-training-interval must be > 0"),
            (0.0 <= self.batchnorm_stats_scale <= 1.0,
             "batchnorm-stats-scale must be in [0, 1]"),
            (self.print_interval > 0, "print-interval must be > 0"),
            (self.learning_rate is None or self.learning_rate >= 0.0,
             "learning-rate must be >= 0"),
            # (Kaldi asserts this where it backstitches, only for a scale > 0; a
            # scale <= 0 trains without backstitch, any momentum)
            (self.backstitch_training_scale <= 0.0 or self.momentum == 0.0,
             "backstitch training is incompatible with momentum > 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"trainer options: {message}")


def _normalized_flag(name) -> str:
    """A flag name as Kaldi's ParseOptions::NormalizeArgName sees it: without the
    leading dashes, ``_`` read as ``-``, lower case (``--max_param_change`` is
    ``--max-param-change``)."""
    return str(name).lstrip("-").replace("_", "-").lower()


def _convert(flag: str, kind, value):
    """A flag value as the field's type (dataclass field types are strings here)."""
    kind = kind if isinstance(kind, str) else kind.__name__
    if kind == "float | None":
        kind = "float"
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "t", "1", ""):  # (Kaldi's ToBool: a bare --x is true)
                return True
            if text in ("false", "f", "0"):
                return False
            raise ValueError(value)
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"trainer option --{flag}: bad {kind} value {value!r}") from None
