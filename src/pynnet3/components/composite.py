"""CompositeComponent: a chain of simple components run as one.

Kaldi uses it to save memory: intermediate values live only inside one
propagate/backprop call (backprop re-runs the forward pass), and rows are
processed ``max-rows-process`` at a time. We follow that, including the row
chunking (it matters for components whose math depends on the whole batch, such
as BatchNorm in training mode).

Parameters and gradients of the sub-components. ``params()`` names them
``"<i>:<param>"`` with ``i`` the 0-based sub-component index (only updatable
sub-components appear), e.g. ``"0:linear_params"``; ``backprop`` adds into a grad
dict with those keys. At the Nnet level Kaldi (and the reference data) name
sub-component ``i`` of component ``comp`` as ``comp#<i>``: use
:meth:`CompositeComponent.sub_gradients` to turn a grad dict into
``{i: {exported_param: array}}`` and :func:`sub_component_name` for the name.
"""

from __future__ import annotations

import numpy as np

from .affine import LENIENT_HEADER
from .base import Component, Flags, UpdatableComponent, register, require
from .fields import Custom, Field
from .preconditioning import PreconditionedGrad, preconditioners
from .xp import namespace


def sub_component_name(component_name: str, i: int) -> str:
    """Kaldi's name for sub-component ``i`` in gradients: ``comp#i``."""
    return f"{component_name}#{i}"


def _parse_nested(cfg, key: str, text: str):
    """A nested config line ``type=X opt=v ...`` (ConfigLine already removed the quotes)."""
    from ..config import ConfigLine
    from ..errors import ConfigError

    text = text.strip()
    try:
        # ConfigLine wants a leading word; Kaldi's nested lines have none.
        nested = ConfigLine(f"component {text}", cfg.line_number, cfg.source)
    except ConfigError as e:
        raise cfg.error(f"{key}=: cannot parse {text!r}: {e}") from None
    return nested


@register
class CompositeComponent(UpdatableComponent):
    """A sequence of simple components; see the module docstring."""

    type_name = "CompositeComponent"

    def __init__(self, components: list[Component], max_rows_process: int = 4096):
        super().__init__()
        self.components = list(components)
        self.max_rows_process = int(max_rows_process)

    def sub_components(self) -> list[Component]:
        """The sub-components in order (live references)."""
        return self.components

    @property
    def input_dim(self) -> int:
        return self.components[0].input_dim

    @property
    def output_dim(self) -> int:
        return self.components[-1].output_dim

    def properties(self) -> Flags:
        first, last = self.components[0].properties(), self.components[-1].properties()
        # The input is always needed: backprop re-runs the forward pass.
        flags = (Flags.SIMPLE | Flags.BACKPROP_NEEDS_INPUT
                 | (last & (Flags.PROPAGATE_ADDS | Flags.BACKPROP_NEEDS_OUTPUT
                            | Flags.OUTPUT_CONTIGUOUS))
                 | (first & (Flags.BACKPROP_ADDS | Flags.INPUT_CONTIGUOUS)))
        if any(c.is_updatable() for c in self.components):
            flags |= Flags.UPDATABLE
        if last & Flags.STORES_STATS:  # Kaldi never reports STORES_STATS itself
            flags |= Flags.BACKPROP_NEEDS_OUTPUT
        return flags

    # -- config and files ----------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, rng: np.random.Generator) -> CompositeComponent:
        from . import component_class

        max_rows = cfg.get_int("max-rows-process", 4096)
        n = cfg.get_int("num-components", required=True)
        require(n >= 1, cfg, "num-components must be >= 1")
        components = []
        for i in range(1, n + 1):
            key = f"component{i}"
            nested = _parse_nested(cfg, key, cfg.get_str(key, required=True))
            type_name = nested.get_str("type", required=True)
            sub_cls = component_class(type_name)
            require(sub_cls is not None, cfg, f"{key}=: unknown component type {type_name!r}")
            require(sub_cls is not cls, cfg, f"{key}=: CompositeComponent cannot be nested")
            sub = sub_cls.from_config(nested, rng)
            props = sub.properties()
            require(bool(props & Flags.SIMPLE) and not props & Flags.RANDOM, cfg,
                    f"{key}=: {type_name} is not allowed in a CompositeComponent "
                    "(must be simple and not random)")
            if components:
                require(sub.input_dim == components[-1].output_dim, cfg,
                        f"{key}=: input-dim {sub.input_dim} != previous output-dim "
                        f"{components[-1].output_dim}")
            components.append(sub)
        cfg.check_all_used()
        return cls(components, max_rows)

    kaldi_fields = (
        LENIENT_HEADER,
        Field("<MaxRowsProcess>", "max_rows_process", "int"),
        Custom("_read_components", "_write_components"),
    )

    @classmethod
    def empty_for_read(cls) -> CompositeComponent:
        return cls([], 0)

    def _read_components(self, r) -> None:
        """``<NumComponents> n`` and the n sub-components, each a whole component."""
        from ..io.model_file import read_component

        start = r.pos
        n = r.read_tagged("<NumComponents>", "int")
        if not 0 < n <= 100000:
            raise r.error("bad <NumComponents> in CompositeComponent", token=str(n), pos=start)
        for _ in range(n):
            pos = r.pos
            sub = read_component(r)
            if not sub.is_simple():
                raise r.error("CompositeComponent holds a non-simple component",
                              token=sub.type_name, pos=pos)
            if self.components and sub.input_dim != self.components[-1].output_dim:
                raise r.error("CompositeComponent: sub-component dims do not chain",
                              token=sub.type_name, pos=pos)
            self.components.append(sub)

    def _write_components(self, w) -> None:
        w.write_tagged("<NumComponents>", "int", len(self.components))
        for c in self.components:
            c.write(w)

    def info(self) -> str:
        subs = ", ".join(f"sub-component{i + 1} = {{ {c.info()} }}"
                         for i, c in enumerate(self.components))
        return (f"type={self.type_name}, input-dim={self.input_dim}, "
                f"output-dim={self.output_dim}, max-rows-process={self.max_rows_process}, "
                + subs)

    # -- parameters ----------------------------------------------------------------------
    def params(self) -> dict[str, np.ndarray]:
        return {f"{i}:{k}": v for i, c in enumerate(self.components) if c.is_updatable()
                for k, v in c.params().items()}

    def _sub_grad(self, grad, i: int) -> dict[str, np.ndarray] | None:
        """The part of ``grad`` belonging to sub-component ``i``, under its own names
        (the same arrays, so the sub-component's ``+=`` lands in ``grad``)."""
        if grad is None:
            return None
        prefix = f"{i}:"
        sub = {k[len(prefix):]: v for k, v in grad.items() if k.startswith(prefix)}
        pre = preconditioners(grad)  # a trainer's natural gradient: sub-component i's own
        if pre is not None and pre.get(i) is not None:
            sub = PreconditionedGrad(sub, pre[i])
        return sub

    def sub_gradients(self, grad: dict[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        """``{i: sub-component i's exported gradient}`` for updatable sub-components."""
        return {i: c.export_gradient(self._sub_grad(grad, i))
                for i, c in enumerate(self.components) if c.is_updatable()}

    def export_gradient(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {f"{i}:{k}": v for i, g in self.sub_gradients(grad).items() for k, v in g.items()}

    def set_test_mode(self, test_mode: bool) -> None:
        for c in self.components:
            c.set_test_mode(test_mode)

    def zero_stats(self) -> None:
        for c in self.components:
            c.zero_stats()

    # -- math ------------------------------------------------------------------------
    def _chunks(self, num_rows: int):
        step = self.max_rows_process
        if step <= 0 or num_rows <= step:
            return [slice(0, num_rows)]
        return [slice(a, min(a + step, num_rows)) for a in range(0, num_rows, step)]

    @staticmethod
    def _buffer(rows: int, dim: int, like, zero: bool):
        """A [rows, dim] matrix of ``like``'s backend, dtype and device (zeroed when
        the sub-component adds into it)."""
        xp = namespace(like)
        return xp.zeros((rows, dim), like=like) if zero else xp.empty((rows, dim), like=like)

    def _forward(self, in_value, out_last):
        """Run every sub-component; returns (values, memos) with values[i] the input of
        sub-component i and values[-1] the final output (written into ``out_last``
        when given)."""
        values, memos = [in_value], []
        for i, c in enumerate(self.components):
            last = i + 1 == len(self.components)
            out = out_last if last and out_last is not None else self._buffer(
                len(in_value), c.output_dim, in_value,
                bool(c.properties() & Flags.PROPAGATE_ADDS))
            memos.append(c.propagate(None, values[-1], out))
            values.append(out)
        return values, memos

    def propagate(self, indexes, in_value, out_value):
        for rows in self._chunks(len(in_value)):
            self._forward(in_value[rows], out_value[rows])
        return None

    def backprop(self, indexes, in_value, out_value, out_deriv, memo, grad, in_deriv) -> None:
        if grad is None and in_deriv is None:
            return
        for rows in self._chunks(len(in_value)):
            self._backprop_rows(in_value[rows], out_deriv[rows], grad,
                                None if in_deriv is None else in_deriv[rows])

    def _backprop_rows(self, in_value, out_deriv, grad, in_deriv) -> None:
        # Re-run the forward pass (including the last component, so its output is
        # its own even when the composite's output was added to).
        values, memos = self._forward(in_value, None)
        deriv = out_deriv
        for i in range(len(self.components) - 1, -1, -1):
            c = self.components[i]
            sub_grad = self._sub_grad(grad, i) if c.is_updatable() else None
            if i > 0:
                d_in = self._buffer(len(in_value), c.input_dim, out_deriv,
                                    bool(c.properties() & Flags.BACKPROP_ADDS))
            else:
                d_in = in_deriv
            if d_in is None and not sub_grad:
                continue  # Kaldi skips the first backprop when nothing needs it
            c.backprop(None, values[i], values[i + 1], deriv, memos[i], sub_grad, d_in)
            deriv = d_in
