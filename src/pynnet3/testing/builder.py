"""The random network builder (:mod:`.random_nets`): config lines, random
descriptors and simple components.

:class:`NetBuilder` grows a network layer by layer (the templates are in
:mod:`.layers`). It keeps the list of frame-level nodes a new layer may read
(``avail``: nodes that exist at x=0 for every frame their inputs allow) and builds
random descriptors over them.

Invariants that keep every network valid and every recurrence finite: a
descriptor always has at least one part that needs a real input (so no node is
computable out of nothing, and a loop through ``IfDefined(Offset(x, -k))``
stops at the edge of the input); Const only appears as a whole part or as the
first term of a Sum; a recurrence always goes through a non-zero time offset.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..components import Flags, component_class
from ..config import ConfigLine
from ..errors import ConfigError

_SCALES = ("0.5", "-1.0", "2.0", "0.25", "-0.75")
_MAX_DESC_DIM = 24


class NetBuilder:
    """Accumulates config lines; see the module docstring."""

    def __init__(self, rng: np.random.Generator, layers: tuple[str, ...] | None = None):
        self.rng = rng
        from .layers import LAYERS

        self.kinds = tuple(layers) if layers else tuple(LAYERS)
        self.lines: list[str] = []
        self.avail: list[tuple[str, int]] = []
        self.outputs: list[str] = []
        self.features: set[str] = set()
        self.ivector_dim = 0
        self.ivector_period = 0  # > 0: ivector read through Round(ivector, period)
        self._ivector_pending = False
        self._count = 0
        # Recurrences cost commands per frame: heavy ones shorten the sequences.
        self.max_frames = 15

    # -- small helpers ---------------------------------------------------------------
    def randint(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi] (inclusive)."""
        return int(self.rng.integers(lo, hi + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choose(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def fresh(self, prefix: str) -> str:
        """A new unique name: ``prefix`` + a counter (so no prefix may end in a
        digit: "i1" + "2" would be "i" + "12")."""
        assert not prefix[-1].isdigit(), prefix
        self._count += 1
        return f"{prefix}{self._count}"

    def offset(self) -> int:
        return self.choose((-2, -1, 1, 2, -3))

    def config_text(self) -> str:
        return "\n".join(self.lines) + "\n"

    # -- components and nodes ------------------------------------------------------------
    def component(self, args: str, prefix: str = "c") -> tuple[str, int, int]:
        """Add ``component name=... <args>``; returns (name, input_dim, output_dim)."""
        name = self.fresh(prefix)
        line = f"component name={name} {args}"
        din, dout = component_dims(line)
        self.lines.append(line)
        return name, din, dout

    def comp_node(self, args: str, desc: str, prefix: str = "c") -> tuple[str, int]:
        """A component and a node of the same name reading ``desc``; (name, output_dim)."""
        name, _, dout = self.component(args, prefix)
        self.lines.append(_node(name, desc))
        return name, dout

    def try_component(self, make: Callable[[], str], prefix: str) -> tuple[str, int, int]:
        """``make()`` draws component args; redraw while the config is rejected
        (only for geometry-heavy types whose validity is easiest to test by trying)."""
        for _ in range(20):
            try:
                return self.component(make(), prefix)
            except ConfigError:
                continue
        raise RuntimeError(f"could not draw a valid {prefix} component")

    def dim_range(self, source: str, offset: int, dim: int) -> str:
        name = self.fresh("dr")
        self.lines.append(f"dim-range-node name={name} input-node={source} "
                          f"dim-offset={offset} dim={dim}")
        self.features.add("dim-range")
        return name

    # -- descriptors ---------------------------------------------------------------------
    def pick(self, dim: int | None = None) -> tuple[str, int]:
        """A node to read, biased towards the newest."""
        cands = self.avail if dim is None else [a for a in self.avail if a[1] == dim]
        return cands[-1] if self.chance(0.5) else self.choose(cands)

    def fwd(self, name: str, depth: int = 0) -> str:
        """A forwarding chain on ``name`` (Offset / Scale / Round / Switch)."""
        r = self.rng.random()
        if depth > 1 or r < 0.45:
            return name
        inner = self.fwd(name, depth + 1)
        if r < 0.7:
            return f"Offset({inner}, {self.offset()})"
        if r < 0.8:
            return f"Scale({self.choose(_SCALES)}, {inner})"
        if r < 0.9:
            return f"Round({inner}, {self.randint(2, 3)})"
        other = self.pick(dict(self.avail)[name])[0]
        srcs = [inner, self.fwd(other, depth + 1)] + ([name] if self.chance(0.3) else [])
        return "Switch(" + ", ".join(srcs) + ")"

    def required_part(self) -> tuple[str, int]:
        """A descriptor part that needs real input (never computable from nothing)."""
        name, d = self.pick()
        r = self.rng.random()
        if r < 0.55:
            return self.fwd(name), d
        if r < 0.8:
            other = self.pick(d)[0]
            first = f"Const({self.choose(_SCALES)}, {d})" if self.chance(0.2) else \
                self.fwd(other)
            terms = [first, self.fwd(name)] + ([f"Offset({name}, 1)"] if self.chance(0.2)
                                               else [])
            return "Sum(" + ", ".join(terms) + ")", d
        return f"Failover(Offset({name}, {self.offset()}), {self.fwd(name)})", d

    def optional_part(self) -> tuple[str, int]:
        """A part that may be computable without (some of) its input."""
        if self._ivector_pending or (self.ivector_dim and self.chance(0.15)):
            self._ivector_pending = False
            return self.ivector_part()
        name, d = self.pick()
        r = self.rng.random()
        if r < 0.45:
            return f"IfDefined({self.fwd(name)})" if self.chance(0.3) else \
                f"IfDefined(Offset({name}, {self.offset()}))", d
        if r < 0.65:
            return f"IfDefined(ReplaceIndex({name}, t, {self.randint(-1, 2)}))", d
        if r < 0.85:
            dc = self.randint(1, 3)
            return f"Const({self.choose(_SCALES)}, {dc})", dc
        return f"IfDefined(Sum(Offset({name}, {self.offset()}), {self.fwd(name)}))", d

    def ivector_part(self) -> tuple[str, int]:
        d = self.ivector_dim
        base = (f"Round(ivector, {self.ivector_period})" if self.ivector_period
                else "ReplaceIndex(ivector, t, 0)")
        r = self.rng.random()
        if r < 0.3:
            return base, d
        if r < 0.45:
            return f"Scale(0.4, {base})", d
        if r < 0.75:
            return f"IfDefined({base})", d
        return f"Failover({base}, Const(0.0, {d}))", d

    def splice(self) -> tuple[str, int]:
        """Kaldi's TDNN splicing: Append(Offset(x, -a), x, Offset(x, b)) of one node."""
        name, d = self.pick()
        offsets = sorted(self.rng.choice(np.arange(-2, 3), size=self.randint(2, 3),
                                         replace=False).tolist())
        offsets = [o for o in offsets if d * len(offsets) <= _MAX_DESC_DIM] or [0]
        parts = [name if o == 0 else f"Offset({name}, {o})" for o in offsets]
        return ("Append(" + ", ".join(parts) + ")" if len(parts) > 1 else parts[0],
                d * len(parts))

    def desc(self, max_parts: int = 3) -> tuple[str, int]:
        """A random node input: a splice, or an Append of one required part and
        optional others."""
        if not self._ivector_pending and self.chance(0.25):
            return self.splice()
        parts = [self.required_part()]
        for _ in range(self.randint(0, max_parts - 1)):
            parts.append(self.required_part() if self.chance(0.5) else self.optional_part())
        if self._ivector_pending:
            self._ivector_pending = False
            parts.append(self.ivector_part())
        while len(parts) > 1 and sum(d for _, d in parts) > _MAX_DESC_DIM:
            parts.pop(int(self.rng.integers(1, len(parts))))
        self.rng.shuffle(parts)
        dim = sum(d for _, d in parts)
        if len(parts) == 1:
            return parts[0][0], dim
        return "Append(" + ", ".join(p for p, _ in parts) + ")", dim

    # -- building blocks of layers ---------------------------------------------------------
    def dim(self, lo: int = 2, hi: int = 12) -> int:
        return self.randint(lo, hi)

    def affine(self, desc: str, din: int, dout: int, prefix: str = "affine") -> tuple[str, int]:
        """A trainable (or fixed) d -> o transform of ``desc``."""
        r = self.rng.random()
        base = f"input-dim={din} output-dim={dout}"
        if r < 0.3:
            return self.comp_node(f"type=AffineComponent {base}", desc, prefix)
        if r < 0.5:
            return self.comp_node(f"type=NaturalGradientAffineComponent {base}", desc, prefix)
        if r < 0.6:
            return self.comp_node(f"type=LinearComponent {base}", desc, prefix)
        if r < 0.68:
            return self.comp_node(f"type=FixedAffineComponent {base}", desc, prefix)
        if r < 0.8:
            blocks = self.choose([b for b in (1, 2, 3) if din % b == 0])
            out = blocks * max(1, dout // blocks)
            kind = self.choose(("BlockAffineComponent num-blocks",
                                "RepeatedAffineComponent num-repeats",
                                "NaturalGradientRepeatedAffineComponent num-repeats"))
            t, key = kind.split()
            self.features.add(t)
            return self.comp_node(f"type={t} input-dim={din} output-dim={out} {key}={blocks}",
                                  desc, prefix)
        if r < 0.86:
            self.features.add("ConstantFunctionComponent")
            return self.comp_node(f"type=ConstantFunctionComponent {base} output-stddev=1.0",
                                  desc, prefix)
        if r < 0.93:
            sub, _ = simple_args(self, dout)
            while not _composite_ok(sub):
                sub, _ = simple_args(self, dout)
            self.features.add("CompositeComponent")
            return self.comp_node(
                f"type=CompositeComponent num-components=2 "
                f"component1='type=AffineComponent {base}' component2='{sub}'", desc, prefix)
        self.features.add("TdnnComponent")
        return self.comp_node(f"type=TdnnComponent {base} time-offsets=0", desc, "tdnn")

    def chain(self, name: str, dim: int, lo: int = 0, hi: int = 2) -> tuple[str, int]:
        """0-2 simple components after ``name``."""
        for _ in range(self.randint(lo, hi)):
            args, _ = simple_args(self, dim)
            name, dim = self.comp_node(args, name, "s")
        return name, dim

    # -- the whole network ---------------------------------------------------------------
    def build(self) -> None:
        d = self.dim(2, 8)
        self.lines.append(f"input-node name=input dim={d}")
        self.avail.append(("input", d))
        if self.chance(0.5):
            self.ivector_dim = self.dim(2, 5)
            self.ivector_period = self.randint(2, 3) if self.chance(0.25) else 0
            self.lines.append(f"input-node name=ivector dim={self.ivector_dim}")
            self._ivector_pending = True
        from .layers import LAYER_WEIGHTS, LAYERS

        weights = np.array([LAYER_WEIGHTS[k] for k in self.kinds], dtype=float)
        for _ in range(self.randint(1, 4)):
            kind = self.kinds[int(self.rng.choice(len(self.kinds), p=weights / weights.sum()))]
            LAYERS[kind](self)
            self.features.add("layer:" + kind)
        self._outputs()

    def _outputs(self) -> None:
        for name in ("output", "output-xent", "output2")[:self.randint(1, 3)]:
            src, d = self.avail[-1] if self.chance(0.6) else self.choose(self.avail)
            r = self.rng.random()
            if r < 0.5:
                desc = self.fwd(src)
            elif r < 0.7:
                other = self.pick(d)[0]
                desc = f"Sum({self.fwd(src)}, {self.fwd(other)})"
            else:
                desc = self.desc(2)[0]
            objective = "quadratic" if self.chance(0.3) else "linear"
            self.lines.append(f"output-node name={name} input={desc} objective={objective}")
            self.outputs.append(name)


def _node(name: str, desc: str) -> str:
    """The config line of a component-node running component ``name`` (same name)."""
    return f"component-node name={name} component={name} input={desc}"


def component_dims(line: str) -> tuple[int, int]:
    """(input_dim, output_dim) of a ``component ...`` config line (validates it)."""
    cl = ConfigLine(line)
    cl.get_str("name")  # used by the network, not the component
    comp = component_class(cl.get_str("type", required=True)).from_config(
        cl, np.random.default_rng(0))
    return comp.input_dim, comp.output_dim


def _composite_ok(args: str) -> bool:
    """Whether a CompositeComponent accepts this sub-component (simple, not random)."""
    cl = ConfigLine(f"component {args}")
    comp = component_class(cl.get_str("type")).from_config(cl, np.random.default_rng(0))
    props = comp.properties()
    return bool(props & Flags.SIMPLE) and not props & Flags.RANDOM


def simple_args(b: NetBuilder, d: int) -> tuple[str, int]:
    """Config args of a random simple component reading dim ``d``; (args, out_dim)."""
    divisors = [g for g in (2, 3, 4) if d % g == 0 and d // g >= 1]
    options: list[tuple[str, int]] = [
        (f"type=TanhComponent dim={d}", d),
        (f"type=SigmoidComponent dim={d}", d),
        (f"type=RectifiedLinearComponent dim={d}", d),
        (f"type=SoftmaxComponent dim={d}", d),
        (f"type=LogSoftmaxComponent dim={d}", d),
        (f"type=NormalizeComponent input-dim={d}", d),
        (f"type=NormalizeComponent input-dim={d} add-log-stddev=true", d + 1),
        (f"type=BatchNormComponent dim={d} test-mode=true", d),
        (f"type=BatchNormComponent dim={d}", d),
        (f"type=PerElementScaleComponent dim={d} param-stddev=0.5", d),
        (f"type=NaturalGradientPerElementScaleComponent dim={d} param-stddev=0.5", d),
        (f"type=PerElementOffsetComponent dim={d} param-stddev=0.5", d),
        (f"type=ScaleAndOffsetComponent dim={d}", d),
        (f"type=FixedScaleComponent dim={d} scale=0.7", d),
        (f"type=FixedBiasComponent dim={d}", d),
        (f"type=NoOpComponent dim={d}", d),
        (f"type=NoOpComponent dim={d} backprop-scale=0.5", d),
        (f"type=ClipGradientComponent dim={d} clipping-threshold=100.0", d),
        (f"type=BackpropTruncationComponent dim={d}", d),
        (f"type=DropoutComponent dim={d} dropout-proportion=0.5 test-mode=true", d),
        (f"type=PermuteComponent column-map={','.join(map(str, b.rng.permutation(d)))}", d),
    ]
    for g in divisors:
        options += [
            (f"type=PnormComponent input-dim={d} output-dim={d // g}", d // g),
            (f"type=SumGroupComponent input-dim={d} output-dim={d // g}", d // g),
            (f"type=SumBlockComponent input-dim={d} output-dim={d // g} scale=0.5", d // g),
            (f"type=ElementwiseProductComponent input-dim={d} output-dim={d // g}", d // g),
            (f"type=MaxpoolingComponent input-x-dim=1 input-y-dim=1 input-z-dim={d} "
             f"pool-x-size=1 pool-y-size=1 pool-z-size={g} pool-x-step=1 pool-y-step=1 "
             f"pool-z-step={g}", d // g),
        ]
    if d >= 2:
        f = b.randint(1, min(3, d))
        step = b.choose([s for s in (1, 2) if (d - f) % s == 0])
        n = b.randint(1, 3)
        options.append((f"type=ConvolutionComponent input-x-dim={d} input-y-dim=1 "
                        f"input-z-dim=1 filt-x-dim={f} filt-y-dim=1 filt-x-step={step} "
                        f"filt-y-step=1 num-filters={n}", ((d - f) // step + 1) * n))
    args, out = b.choose(options)
    b.features.add(args.split()[0].removeprefix("type="))
    return args, out
