"""The network: nodes wired by descriptors, plus named components.

Node kinds are Kaldi's: ``input-node``, ``component-node``, ``dim-range-node``,
``output-node``. Config reading follows ``nnet3-init``: ``component`` lines make
components, node lines make nodes; several configs can be applied in order, a
later line replacing an earlier node or component of the same name (the node then
moves to the position of its new line, as in Kaldi). Model files are read and
written through :mod:`pynnet3.io.model_file`.

Invariant after construction: every descriptor refers to existing nodes, every
component-node to an existing component, and dimensions agree.
"""

from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import limits
from .components import component_class
from .components.base import Component, check_dims
from .config import ConfigLine, is_valid_name, split_config_lines
from .descriptor import Descriptor, NodeRef, RoundOf, SwitchOf, parse_descriptor
from .errors import ConfigError, DescriptorError, DimensionError, GraphError
from .io.atomic import atomic_write  # (also importable from here, as before)
from .io.model_file import (
    ModelParts,
    gunzip_if_compressed,
    is_am_bytes,
    parse_model_bytes,
    write_model_parts,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

NODE_KINDS = ("input-node", "component-node", "dim-range-node", "output-node")


@dataclass
class Node:
    """One node. Fields used depend on ``kind``:
    input: ``dim``; component: ``component``, ``descriptor``;
    dim-range: ``source``, ``dim_offset``, ``dim``; output: ``descriptor``, ``objective``."""

    kind: str
    name: str
    descriptor: Descriptor | None = None
    component: str | None = None
    dim: int = 0
    source: str | None = None
    dim_offset: int = 0
    objective: str = "linear"

    def config_line(self) -> str:
        if self.kind == "input-node":
            return f"input-node name={self.name} dim={self.dim}"
        if self.kind == "component-node":
            return (f"component-node name={self.name} component={self.component} "
                    f"input={self.descriptor}")
        if self.kind == "dim-range-node":
            return (f"dim-range-node name={self.name} input-node={self.source} "
                    f"dim-offset={self.dim_offset} dim={self.dim}")
        return f"output-node name={self.name} input={self.descriptor} objective={self.objective}"

    def inputs(self) -> list[str]:
        """Names of the nodes this node reads (node-level graph)."""
        if self.kind == "dim-range-node":
            return [self.source]
        if self.descriptor is not None:
            return self.descriptor.node_names()
        return []


# every field of a Node, in one C-level call (Nnet._structure_key)
_NODE_FIELDS = operator.attrgetter("kind", "name", "descriptor", "component", "dim", "source",
                                   "dim_offset", "objective")


@dataclass
class Nnet:
    """A Kaldi nnet3 network."""

    nodes: list[Node] = field(default_factory=list)
    components: dict[str, Component] = field(default_factory=dict)

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_config(cls, text: str | list[str], seed: int = 0, source: str | None = None) -> Nnet:
        """Build and randomly initialize a network from config text, like ``nnet3-init``.
        A list of texts is applied in order (as with several configs)."""
        nnet = cls()
        rng = np.random.default_rng(seed)
        texts = [text] if isinstance(text, str) else list(text)
        for t in texts:
            nnet.read_config(t, rng=rng, source=source)
        return nnet

    def read_config(self, text: str, rng: np.random.Generator | None = None,
                    source: str | None = None) -> None:
        """Apply one config to this network (adds or replaces nodes and components)."""
        rng = rng if rng is not None else np.random.default_rng(0)
        lines = split_config_lines(text, source)
        if not lines:
            raise ConfigError("empty config (no component or node lines)", source=source)
        node_lines: list[ConfigLine] = []
        for cl in lines:
            if cl.first == "component":
                name = cl.get_str("name", required=True)
                type_name = cl.get_str("type", required=True)
                cls_ = component_class(type_name)
                if cls_ is None:
                    raise cl.error(f"unknown component type {type_name!r}")
                _check_name(name, cl)
                comp = cls_.from_config(cl, _SizeCheckedDraws(rng, cl))
                problem = check_dims(comp)
                if problem:
                    raise cl.error(problem)
                self.components[name] = comp
            elif cl.first in NODE_KINDS:
                node_lines.append(cl)
            else:
                raise cl.error(f"unknown config line type {cl.first!r}")
        existing = [(None, n) for n in self.nodes]
        new = [(cl, None) for cl in node_lines]
        new_names = {cl.get_str("name", required=True) for cl in node_lines}
        for cl in node_lines:
            _check_name(cl.values.get("name", ""), cl)
        # A redefined node takes the position of its last definition.
        merged = [e for e in existing if e[1].name not in new_names]
        last_def: dict[str, int] = {}
        for i, (cl, _) in enumerate(new):
            last_def[cl.values["name"]] = i
        for i, (cl, node) in enumerate(new):
            if last_def[cl.values["name"]] == i:
                merged.append((cl, node))
        names = set()
        for cl, node in merged:
            names.add(node.name if node is not None else cl.values["name"])
        nodes = []
        for cl, node in merged:
            nodes.append(node if node is not None else _node_from_config(cl, names))
        self.nodes = nodes
        self.validate()

    @classmethod
    def from_model_parts(cls, parts: ModelParts, source: str = "<model>") -> Nnet:
        nnet = cls()
        seen = set()
        for name, comp in parts.components:
            if name in seen:
                raise GraphError(f"{source}: duplicate component name {name!r}")
            seen.add(name)
            nnet.components[name] = comp
        nnet.seed_random_components(0)
        names = set()
        lines = []
        for line_no, text in parts.config_lines:
            cl = ConfigLine(text, line_no, source)
            if cl.first not in NODE_KINDS:
                raise cl.error(f"unexpected line type {cl.first!r} in model config section")
            name = cl.get_str("name", required=True)
            if name in names:
                raise cl.error(f"duplicate node name {name!r}")
            names.add(name)
            lines.append(cl)
        nnet.nodes = [_node_from_config(cl, names) for cl in lines]
        nnet.validate(source)
        return nnet

    def to_model_parts(self) -> ModelParts:
        """The config lines and components a Kaldi file holds. A runtime-only
        component (one with ``unfused``: the network optimizer's fused kernels) is
        written as the chain of standard nodes and components it stands for."""
        nodes, comps = self.nodes, self.components
        if any(_is_runtime_only(c) for c in comps.values()):
            nodes, comps = _unfused_form(self)
        return ModelParts(config_lines=[(0, n.config_line()) for n in nodes],
                          components=list(comps.items()))

    # -- files ---------------------------------------------------------------------
    def write(self, path: str | os.PathLike, binary: bool = False) -> None:
        """Write as Kaldi does (``nnet3-copy --binary=...``); atomically, removing
        temporaries that killed earlier writes left (:mod:`pynnet3.io.atomic`)."""
        atomic_write(path, self.to_bytes(binary))

    def to_bytes(self, binary: bool = False) -> bytes:
        return write_model_parts(self.to_model_parts(), binary)

    # -- queries -------------------------------------------------------------------
    def node(self, name: str) -> Node:
        n = self.node_map.get(name)
        if n is None:
            raise GraphError(f"no node named {name!r}")
        return n

    def has_node(self, name: str) -> bool:
        return name in self.node_map

    @property
    def node_map(self) -> dict[str, Node]:
        """Name -> node. Cached against the identity of every node, so replacing,
        adding or removing nodes is seen (compiler and analysis ask for it per
        command)."""
        key = tuple(map(id, self.nodes))
        cached = getattr(self, "_node_map_cache", None)
        if cached is None or cached[0] != key:
            cached = (key, {n.name: n for n in self.nodes})
            object.__setattr__(self, "_node_map_cache", cached)
        return cached[1]

    def node_dim(self, name: str) -> int:
        """Output dim of a node (for component-nodes, the component's output dim)."""
        n = self.node(name)
        if n.kind in ("input-node", "dim-range-node"):
            return n.dim
        if n.kind == "component-node":
            return self.components[n.component].output_dim
        return n.descriptor.dim(self.node_dim)

    def input_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.kind == "input-node"]

    def output_names(self) -> list[str]:
        return [n.name for n in self.nodes if n.kind == "output-node"]

    def input_dim(self, name: str) -> int:
        n = self.node(name)
        if n.kind != "input-node":
            raise GraphError(f"{name!r} is not an input node")
        return n.dim

    def output_dim(self, name: str) -> int:
        n = self.node(name)
        if n.kind != "output-node":
            raise GraphError(f"{name!r} is not an output node")
        return self.node_dim(name)

    def num_params(self) -> int:
        return sum(c.num_params() for c in self.components.values())

    def modulus(self) -> int:
        """LCM of Round() moduli and Switch() sizes: the network is invariant to
        time shifts by multiples of this. (Cached like :meth:`context`.)"""
        key = self._structure_key()
        cached = getattr(self, "_modulus_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        m = 1
        for n in self.nodes:
            if n.descriptor is None:
                continue
            for p in n.descriptor.parts:
                for v in _moduli(p):
                    m = math.lcm(m, v)  # (Python ints: no int64 overflow)
        object.__setattr__(self, "_modulus_cache", (key, m))
        return m

    def is_recurrent(self) -> bool:
        from .compiler.epochs import node_sccs

        return any(len(scc) > 1 or self.node(scc[0]).name in self.node(scc[0]).inputs()
                   for scc in node_sccs(self))

    @property
    def left_context(self) -> int:
        return self.context()[0]

    @property
    def right_context(self) -> int:
        return self.context()[1]

    def context(self) -> tuple[int, int]:
        """(left, right) context, with Kaldi's ComputeSimpleNnetContext semantics.

        Cached; the cache is keyed on every node field and the component objects, so
        that adding, replacing or editing nodes or components (``read_config``,
        rewrites) never returns a stale context. (The cache holds the components it was
        computed for: while it does, no new object can take one's id.)"""
        key = (self._structure_key(), tuple(self.components),
               tuple(map(id, self.components.values())))
        cached = getattr(self, "_context_cache", None)
        if cached is None or cached[0] != key:
            from .compiler.context import compute_simple_context

            cached = (key, compute_simple_context(self), tuple(self.components.values()))
            object.__setattr__(self, "_context_cache", cached)
        return cached[1]

    def _structure_key(self) -> tuple:
        """Every field of every node (descriptors are frozen: the same object compares
        equal at once): equal keys mean an equal graph. Far cheaper than the config
        lines (decoders ask per utterance; one C-level getter per node)."""
        return tuple(map(_NODE_FIELDS, self.nodes))

    def seed_random_components(self, seed: int) -> None:
        """Give every random component (dropout-like) its own generator, derived from
        ``seed`` and its position, so two layers never draw the same masks."""
        for i, comp in enumerate(self.components.values()):
            if hasattr(comp, "reset_generator"):
                comp.reset_generator(seed * 100003 + i)

    def set_test_mode(self, test_mode: bool = True) -> None:
        """Both :meth:`set_batchnorm_test_mode` and :meth:`set_dropout_test_mode` (and
        any other component with a test mode), as nnet3-compute wants. Training mode
        (``False``) on a network from :func:`~pynnet3.optimize_network` that folded a
        test-mode BatchNorm or Dropout into a linear or fused layer is a
        :class:`GraphError` naming them (it can only compute them in test mode):
        switch the original network instead (a test-mode dropout that pruning took out
        of the graph too)."""
        if not test_mode:
            self._refuse_folded(("BatchNormComponent", "DropoutComponent"), "set_test_mode")
        for c in self.components.values():
            c.set_test_mode(test_mode)

    def _refuse_folded(self, types: tuple[str, ...], method: str) -> None:
        """The GraphError for training mode when components of ``types`` were folded
        into others by optimize_network (graphopt/folding.py records them on the
        component folded into; a fused kernel holds its chain as it was)."""
        from .components.fused import AffineReluComponent

        found = []
        for name, c in self.components.items():
            for type_name, folded in getattr(c, "folded_test_mode", ()):
                if type_name in types:
                    found.append(f"{type_name} {folded!r} (folded into {name!r})")
            if isinstance(c, AffineReluComponent):
                found += [f"{p.component.type_name} {p.component_name!r} (fused into {name!r})"
                          for p in c._parts[1:] if p.component.type_name in types]
        # graphopt/pruning.py's record of test-mode dropout it took out of the graph
        found += [f"{type_name} {node!r} (pruned)"
                  for family, type_name, node in getattr(self, "pruned_test_mode", ())
                  if family in types]
        if found:
            raise GraphError(
                f"{method}(False): this network was optimized for inference "
                f"(pynnet3.optimize_network), which removed test-mode "
                f"{', '.join(found)}; it cannot compute them in training mode. Switch "
                f"the original network, or optimize it with the passes that removed "
                f"them off (pruning, constant_folding, fusion)")

    def set_batchnorm_test_mode(self, test_mode: bool) -> None:
        """Kaldi's SetBatchnormTestMode: every (top-level) BatchNormComponent
        (training mode after optimize_network folded one away: see
        :meth:`set_test_mode`)."""
        if not test_mode:
            self._refuse_folded(("BatchNormComponent",), "set_batchnorm_test_mode")
        for c in self.components.values():
            if c.type_name == "BatchNormComponent":
                c.set_test_mode(test_mode)

    def set_dropout_test_mode(self, test_mode: bool) -> None:
        """Kaldi's SetDropoutTestMode: every (top-level) random component (dropout,
        dropout-mask, general dropout, spec-augment; training mode after
        optimize_network folded one away: see :meth:`set_test_mode`)."""
        from .components.dropout import RandomComponent

        if not test_mode:
            self._refuse_folded(("DropoutComponent",), "set_dropout_test_mode")

        for c in self.components.values():
            if isinstance(c, RandomComponent):
                c.set_test_mode(test_mode)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Kaldi's SetLearningRate: each updatable component's learning rate becomes
        ``learning_rate * learning-rate-factor`` (a float32, as Kaldi stores it); a
        CompositeComponent hands its own rate on to its updatable sub-components."""
        for c in self.components.values():
            if c.is_updatable():
                set_underlying_learning_rate(c, learning_rate)

    # -- orphans (Kaldi's FindOrphanNodes / FindOrphanComponents) ---------------------
    def orphan_nodes(self, keep: Iterable[str] = ()) -> list[str]:
        """Names of the nodes that no output node (nor a node named in ``keep``)
        depends on, in network order; orphan input nodes included (callers decide
        whether to keep them)."""
        by_name = self.node_map
        needed: set[str] = set()
        stack = [n.name for n in self.nodes if n.kind == "output-node"]
        stack += [k for k in keep if k in by_name]
        while stack:
            name = stack.pop()
            if name in needed:
                continue
            needed.add(name)
            stack.extend(by_name[name].inputs())
        return [n.name for n in self.nodes if n.name not in needed]

    def orphan_components(self) -> list[str]:
        """Names of the components no component-node uses, in component order."""
        used = {n.component for n in self.nodes if n.kind == "component-node"}
        return [c for c in self.components if c not in used]

    def remove_orphan_nodes(self, remove_orphan_inputs: bool = False) -> list[str]:
        """Kaldi's Nnet::RemoveOrphanNodes: remove the nodes no output depends on
        (input nodes only with ``remove_orphan_inputs``); returns their names.
        Components stay (see :meth:`remove_orphan_components`)."""
        orphans = [o for o in self.orphan_nodes()
                   if remove_orphan_inputs or self.node(o).kind != "input-node"]
        if orphans:
            gone = set(orphans)
            self.nodes = [n for n in self.nodes if n.name not in gone]
        return orphans

    def remove_orphan_components(self) -> list[str]:
        """Kaldi's Nnet::RemoveOrphanComponents: remove the components no node
        uses; returns their names."""
        orphans = self.orphan_components()
        for name in orphans:
            del self.components[name]
        return orphans

    def copy(self) -> Nnet:
        import copy

        return copy.deepcopy(self)

    # -- validation ----------------------------------------------------------------
    def validate(self, source: str = "config") -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise GraphError(f"{source}: duplicate node name {dup!r}")
        nodes = {n.name: n for n in self.nodes}
        for n in self.nodes:  # (before any dims: a node may read one defined later)
            if n.kind == "component-node" and n.component not in self.components:
                raise GraphError(f"{source}: node {n.name!r} uses unknown component "
                                 f"{n.component!r}")
        for n in self.nodes:
            for src in n.inputs():
                if src not in nodes:
                    raise GraphError(f"{source}: node {n.name!r} reads unknown node {src!r}")
                if nodes[src].kind == "output-node":
                    raise GraphError(f"{source}: node {n.name!r} reads output node {src!r}")
            if n.kind == "component-node":
                comp = self.components[n.component]
                try:
                    d = n.descriptor.dim(self.node_dim)
                except DescriptorError as e:
                    raise DimensionError(f"{source}: node {n.name!r}: {e}") from None
                if d != comp.input_dim:
                    raise DimensionError(
                        f"{source}: node {n.name!r}: input descriptor has dim {d} but "
                        f"component {n.component!r} ({comp.type_name}) has input-dim "
                        f"{comp.input_dim}")
            elif n.kind == "dim-range-node":
                sd = self.node_dim(n.source)
                if n.dim <= 0 or n.dim_offset < 0 or n.dim_offset + n.dim > sd:
                    raise DimensionError(
                        f"{source}: dim-range-node {n.name!r}: dim-offset={n.dim_offset} "
                        f"dim={n.dim} exceeds the dim {sd} of {n.source!r}")
            elif n.kind == "output-node":
                try:
                    n.descriptor.dim(self.node_dim)
                except DescriptorError as e:
                    raise DimensionError(f"{source}: node {n.name!r}: {e}") from None
        if not any(n.kind == "output-node" for n in self.nodes) and self.nodes:
            raise GraphError(f"{source}: network has no output-node")
        from .compiler.epochs import zero_delay_cycle

        loop = zero_delay_cycle(self)
        if loop:
            raise GraphError(f"{source}: nodes {' -> '.join(loop)} form a loop with no time "
                             "offset: each needs the next at the same frame, so none is ever "
                             "computable (a recurrence reads an earlier frame, e.g. "
                             "Offset(node, -1))")
        problem = limits.exceeded("max_modulus", self.modulus(),
                                  "modulus (LCM of the Round() moduli and Switch() sizes)")
        if problem:
            raise GraphError(f"{source}: {problem}")

    def info(self) -> str:
        """Text like ``nnet3-info``."""
        left, right = self.context()
        lines = [f"left-context: {left}", f"right-context: {right}",
                 f"num-parameters: {self.num_params()}", f"modulus: {self.modulus()}"]
        for n in self.nodes:
            if n.kind == "input-node":
                lines.append(f"input-node name={n.name} dim={n.dim}")
            elif n.kind == "output-node":
                lines.append(f"output-node name={n.name} input={n.descriptor} "
                             f"dim={self.node_dim(n.name)} objective={n.objective}")
            elif n.kind == "dim-range-node":
                lines.append(n.config_line())
            else:
                c = self.components[n.component]
                lines.append(f"component-node name={n.name} component={n.component} "
                             f"input={n.descriptor} input-dim={c.input_dim} "
                             f"output-dim={c.output_dim}")
        for name, c in self.components.items():
            lines.append(f"component name={name} {c.info()}")
        return "\n".join(lines) + "\n"


class _SizeCheckedDraws:
    """The generator a component's ``from_config`` draws its initial parameters
    from: a draw of more than ``max_params`` values (pynnet3.limits) is a
    ConfigError naming the line, raised before anything is allocated."""

    def __init__(self, rng: np.random.Generator, cl: ConfigLine):
        self._rng, self._cl = rng, cl

    def _checked(self, size):
        shape = () if size is None else tuple(np.atleast_1d(size).tolist())
        problem = limits.exceeded("max_params", math.prod(shape),
                                  "initial parameter values (shape " + "x".join(map(str, shape))
                                  + ")")
        if problem:
            raise self._cl.error(problem)
        return size

    def standard_normal(self, size=None, *args, **kwargs):
        return self._rng.standard_normal(self._checked(size), *args, **kwargs)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._rng.normal(loc, scale, self._checked(size))

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._rng.uniform(low, high, self._checked(size))

    def random(self, size=None, *args, **kwargs):
        return self._rng.random(self._checked(size), *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):  # (copy / pickle probes: not the generator's)
            raise AttributeError(name)
        return getattr(self._rng, name)


def set_underlying_learning_rate(comp: Component, learning_rate: float) -> None:
    """Kaldi's UpdatableComponent::SetUnderlyingLearningRate on one component: its
    learning rate becomes ``learning_rate * learning-rate-factor`` (a float32, as
    Kaldi stores it); a CompositeComponent hands its own rate on to its updatable
    sub-components."""
    comp.learning_rate = float(np.float32(learning_rate)
                               * np.float32(comp.learning_rate_factor))
    for sub in getattr(comp, "sub_components", list)():
        if sub.is_updatable():
            set_underlying_learning_rate(sub, comp.learning_rate)


def _moduli(e):
    if isinstance(e, RoundOf):
        yield e.t_modulus
    if isinstance(e, SwitchOf):
        yield len(e.srcs)
    for attr in ("src", "a", "b"):
        sub = getattr(e, attr, None)
        if sub is not None:
            yield from _moduli(sub)
    for sub in getattr(e, "srcs", ()):
        yield from _moduli(sub)


def _check_name(name: str, cl: ConfigLine) -> None:
    """Kaldi's IsValidName: a letter or '_', then letters, digits, '_', '-', '.'."""
    if not is_valid_name(name):
        raise cl.error(f"invalid name {name!r} (names are a letter or '_' followed by "
                       "letters, digits, '_', '-' or '.')")


def _node_from_config(cl: ConfigLine, names: set[str]) -> Node:
    name = cl.get_str("name", required=True)
    kind = cl.first
    try:
        if kind == "input-node":
            dim = cl.get_int("dim", required=True)
            if dim <= 0:
                raise cl.error(f"input-node dim must be positive, got {dim}")
            node = Node(kind, name, dim=dim)
        elif kind == "component-node":
            node = Node(kind, name, component=cl.get_str("component", required=True),
                        descriptor=parse_descriptor(cl.get_str("input", required=True), names))
        elif kind == "dim-range-node":
            src = cl.get_str("input-node", required=True)
            if src not in names:
                raise cl.error(f"unknown node {src!r}")
            node = Node(kind, name, source=src, dim_offset=cl.get_int("dim-offset", 0),
                        dim=cl.get_int("dim", required=True))
        else:
            objective = cl.get_str("objective", "linear")
            if objective not in ("linear", "quadratic"):
                raise cl.error(f"objective must be linear or quadratic, got {objective!r}")
            node = Node(kind, name, objective=objective,
                        descriptor=parse_descriptor(cl.get_str("input", required=True), names))
    except DescriptorError as e:
        if e.line_number is not None:
            raise
        raise DescriptorError(getattr(e, "detail", str(e)), cl.line_number, cl.text,
                              cl.source) from None
    cl.check_all_used()
    return node


def read_nnet(path: str | os.PathLike) -> Nnet:
    """Read a Kaldi nnet3 model, text or binary (auto-detected by the ``\\0B`` marker):
    a raw network, or the network of an acoustic model (``final.mdl``); gzip-compressed
    files (``final.mdl.gz``) are read transparently."""
    path = os.fspath(path)  # (not pathlib: a few ms of every command's start)
    with open(path, "rb") as f:
        data = f.read()
    return nnet_from_bytes(data, str(path))


def nnet_from_bytes(data: bytes, source: str = "<bytes>") -> Nnet:
    """A network from the bytes of a Kaldi model file, text or binary, raw or an
    acoustic model (its network; :func:`pynnet3.read_am` keeps the rest); ``source``
    names it in error messages."""
    data = gunzip_if_compressed(data, source)
    if is_am_bytes(data):
        from .am import AcousticModel

        return AcousticModel.from_bytes(data, source).nnet
    return Nnet.from_model_parts(parse_model_bytes(data, source), source)


def _is_runtime_only(comp: Component) -> bool:
    """Whether files hold ``comp`` as another chain (its class has ``unfused``)."""
    return hasattr(type(comp), "unfused")


def _unfused_form(nnet: Nnet) -> tuple[list[Node], dict[str, Component]]:
    """``nnet``'s nodes and components with every node of a runtime-only component
    replaced by its ``unfused`` chain (parts first to last; the last keeps the
    node's name, so consumers need no rewiring). Names the network already uses
    for something else get a numeric suffix."""
    used_nodes = {n.name for n in nnet.nodes}
    comps = {name: c for name, c in nnet.components.items() if not _is_runtime_only(c)}
    # (each kernel's chain asked for once: ``unfused`` looks at its parameters)
    chains = {name: c.unfused for name, c in nnet.components.items() if _is_runtime_only(c)}

    def fresh(name: str, taken) -> str:
        out, k = name, 1
        while out in taken:
            k += 1
            out = f"{name}.{k}"
        return out

    nodes: list[Node] = []
    for n in nnet.nodes:
        parts = chains.get(n.component) if n.kind == "component-node" else None
        if not parts:
            nodes.append(n)
            continue
        desc = n.descriptor
        for i, part in enumerate(parts):
            cname = part.component_name
            if comps.get(cname, part.component) is not part.component:
                cname = fresh(cname, comps)
            comps[cname] = part.component
            last = i == len(parts) - 1
            name = n.name if last else fresh(part.node, used_nodes)
            used_nodes.add(name)
            nodes.append(Node("component-node", name, component=cname, descriptor=desc))
            desc = Descriptor((NodeRef(name),))
    return nodes, comps

