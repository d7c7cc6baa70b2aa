"""Edit directives on a network, as Kaldi's ``ReadEditConfig`` (nnet3/nnet-utils.h):
what ``nnet3-copy --edits-config=FILE`` / ``--edits='a; b'`` apply.

One directive per line (``#`` starts a comment; ``--edits`` separates them with
``;``), applied in order::

    convert-to-fixed-affine [name=<pattern>]
    remove-orphan-nodes [remove-orphan-inputs=(true|false)]
    remove-orphan-components
    remove-orphans [remove-orphan-inputs=(true|false)]
    set-learning-rate [name=<pattern>] learning-rate=<lr>
    set-learning-rate-factor [name=<pattern>] learning-rate-factor=<f>
    rename-node old-name=<name> new-name=<name>
    remove-output-nodes name=<pattern>
    set-dropout-proportion [name=<pattern>] proportion=<p>
    apply-svd name=<pattern> [bottleneck-dim=<d>] [energy-threshold=<e>]
              [shrinkage-threshold=<s>]
    reduce-rank name=<pattern> rank=<r>

Patterns are Kaldi's (NameMatchesPattern): ``*`` stands for any run of characters,
nothing else is special, and the whole name must match. Every pattern except
remove-output-nodes' matches component names (a default of ``*``).

As in Kaldi, a directive that matches nothing does nothing (its log line says
"0 components"); apply-svd and reduce-rank warn about matched components that are
not affine or too small. Errors are :class:`~pynnet3.errors.ConfigError` naming the
source, the line and the token: an unknown directive or option, a malformed or
missing value (all found by :func:`parse_edits` before anything changes), a
rename to an existing or from a missing node, removing every output.

Where this differs from Kaldi's source on purpose: values Kaldi would store but no
reader accepts back are refused (a negative learning rate or factor, a dropout
proportion outside [0, 1], non-finite numbers); apply-svd's shrinkage-threshold
defaults to 1.0 and may be 1.0 (Kaldi asserts < 1, so without the option it
aborts), and its per-component size check always uses the bottleneck-dim given
(Kaldi's uses the previous component's energy-threshold dimension); apply-svd
refuses node names ``<node>_a`` / ``<node>_b`` that already exist (Kaldi would
silently redefine them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from .components.affine import (
    AffineComponent,
    BlockAffineComponent,
    FixedAffineComponent,
    LinearComponent,
    NaturalGradientAffineComponent,
    RepeatedAffineComponent,
)
from .components.base import Component, UpdatableComponent
from .components.composite import CompositeComponent
from .components.dropout import DropoutComponent, DropoutMaskComponent, GeneralDropoutComponent
from .config import ConfigLine, is_valid_name, split_config_lines
from .descriptor import Descriptor, NodeRef
from .errors import ConfigError
from .nnet import Nnet, Node, set_underlying_learning_rate


class EditLog(NamedTuple):
    """One message of an edit, as Kaldi logs it: ``level`` is ``"LOG"`` or
    ``"WARNING"``."""

    level: str
    message: str


@dataclass(frozen=True)
class EditDirective:
    """One parsed directive: its name, its options converted to Python values
    (defaults filled in), and the config line it came from (for messages)."""

    directive: str
    options: dict = field(default_factory=dict)
    line: ConfigLine | None = None

    def error(self, message: str) -> ConfigError:
        if self.line is None:
            return ConfigError(f"{self.directive}: {message}")
        return self.line.error(f"{self.directive}: {message}")


# -- patterns ----------------------------------------------------------------------------


def name_matches_pattern(name: str, pattern: str) -> bool:
    """Kaldi's NameMatchesPattern: ``*`` matches any run of characters (also
    none); every other character matches itself; the whole name must match."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


# -- parsing -----------------------------------------------------------------------------


def _finite(line: ConfigLine, key: str, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise line.error(f"option {key}={line.values[key]!r}: expected a finite number")
    return value


def _required_float(line: ConfigLine, key: str) -> float:
    if not line.has(key):
        raise line.error(f"expected {key}= to be set (at token {line.first!r})")
    return _finite(line, key, line.get_float(key))


def _parse_options(line: ConfigLine) -> dict:
    """The typed options of one directive line; raises on anything Kaldi rejects."""
    d = line.first
    if d == "convert-to-fixed-affine":
        return {"name": line.get_str("name", "*")}
    if d in ("remove-orphan-nodes", "remove-orphans"):
        return {"remove_orphan_inputs": line.get_bool("remove-orphan-inputs", False)}
    if d == "remove-orphan-components":
        return {}
    if d == "set-learning-rate":
        lr = _required_float(line, "learning-rate")
        if lr < 0:
            raise line.error(f"learning-rate={lr:g} must be >= 0")
        return {"name": line.get_str("name", "*"), "learning_rate": lr}
    if d == "set-learning-rate-factor":
        f = _required_float(line, "learning-rate-factor")
        if f < 0:
            raise line.error(f"learning-rate-factor={f:g} must be >= 0")
        return {"name": line.get_str("name", "*"), "learning_rate_factor": f}
    if d == "rename-node":
        if not (line.has("old-name") and line.has("new-name")):
            raise line.error("could not make sense of this rename-node directive (expect "
                             "old-name=xxx new-name=xxx)")
        new = line.get_str("new-name")
        if not is_valid_name(new):
            raise line.error(f"node name {new!r} is not allowed (names are a letter or '_' "
                             "followed by letters, digits, '_', '-' or '.')")
        return {"old_name": line.get_str("old-name"), "new_name": new}
    if d == "remove-output-nodes":
        if not line.has("name"):
            raise line.error("remove-output-nodes needs name=<pattern>")
        return {"name": line.get_str("name")}
    if d == "set-dropout-proportion":
        p = _required_float(line, "proportion")
        if not 0.0 <= p <= 1.0:
            raise line.error(f"proportion={p:g} must be in [0, 1]")
        return {"name": line.get_str("name", "*"), "proportion": p}
    if d == "apply-svd":
        if not line.has("name"):
            raise line.error("apply-svd requires name= to be specified")
        opts = {"name": line.get_str("name"),
                "bottleneck_dim": line.get_int("bottleneck-dim", -1),
                "energy_threshold": _finite(line, "energy-threshold",
                                            line.get_float("energy-threshold", -1.0)),
                "shrinkage_threshold": _finite(line, "shrinkage-threshold",
                                               line.get_float("shrinkage-threshold", 1.0))}
        if opts["bottleneck_dim"] <= 0 and opts["energy_threshold"] <= 0:
            raise line.error("either bottleneck-dim (> 0) or energy-threshold (in (0, 1)) "
                             "must be set in apply-svd")
        if opts["energy_threshold"] >= 1.0:
            raise line.error(f"energy-threshold={opts['energy_threshold']:g} must be < 1")
        if not 0.0 < opts["shrinkage_threshold"] <= 1.0:
            raise line.error(f"shrinkage-threshold={opts['shrinkage_threshold']:g} must be in "
                             "(0, 1]")
        return opts
    if d == "reduce-rank":
        if not (line.has("name") and line.has("rank")):
            raise line.error("reduce-rank requires name= and rank= to be specified")
        rank = line.get_int("rank")
        if rank <= 0:
            raise line.error(f"rank={rank} must be positive")
        return {"name": line.get_str("name"), "rank": rank}
    raise line.error(f"directive {d!r} is not supported (known: {', '.join(_DIRECTIVES)})")


def parse_edits(text: str, source: str = "<edits>") -> list[EditDirective]:
    """Parse an edits config (Kaldi's ReadEditConfig format; one directive per line,
    ``#`` comments). Every error of syntax, unknown directive or option, and missing
    or malformed value is raised here, as a :class:`ConfigError` naming ``source``,
    the line and the token."""
    out = []
    for line in split_config_lines(text, source):
        options = _parse_options(line)
        bad = line.unused()
        if bad:
            raise line.error(f"could not interpret {' '.join(f'{k}=' for k in bad)} "
                             f"(unknown option(s) of {line.first})")
        out.append(EditDirective(line.first, options, line))
    return out


def edits_from_option(text: str) -> str:
    """The text of an ``--edits`` option as a config: semicolons become newlines
    (as nnet3-copy does)."""
    return text.replace(";", "\n")


# -- applying -----------------------------------------------------------------------------


def apply_edits(nnet: Nnet, edits: str | Sequence[EditDirective],
                source: str = "<edits>") -> list[EditLog]:
    """Apply edit directives to ``nnet`` **in place**, in order, as Kaldi's
    ReadEditConfig does; ``edits`` is config text (parsed with :func:`parse_edits`,
    so a bad line changes nothing) or already parsed directives. Returns the log
    and warning lines Kaldi would print. A directive that cannot be carried out
    (renaming a missing node, removing every output) raises a :class:`ConfigError`
    naming its line; the network then holds the edits before it."""
    directives = parse_edits(edits, source) if isinstance(edits, str) else list(edits)
    log: list[EditLog] = []
    for d in directives:
        _APPLY[d.directive](nnet, d, log)
    nnet.validate(source)
    return log


def _components(nnet: Nnet, pattern: str, want: Callable[[Component], bool]):
    """(name, component) of the components whose name matches and that ``want``."""
    return [(name, c) for name, c in list(nnet.components.items())
            if name_matches_pattern(name, pattern) and want(c)]


def _is_affine(c: Component) -> bool:
    """Kaldi's dynamic_cast<AffineComponent*>: AffineComponent and
    NaturalGradientAffineComponent (Kaldi's FixedAffineComponent is no subclass)."""
    return isinstance(c, AffineComponent) and not isinstance(c, FixedAffineComponent)


def _is_updatable_class(c: Component) -> bool:
    """Kaldi's dynamic_cast<UpdatableComponent*> (by class, not by the updatable flag)."""
    return isinstance(c, UpdatableComponent) and not isinstance(c, FixedAffineComponent)


def _convert_to_fixed_affine(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    found = _components(nnet, d.options["name"], _is_affine)
    for name, c in found:  # (same name, same place in the component list)
        nnet.components[name] = FixedAffineComponent(c.linear_params.copy(),
                                                     c.bias_params.copy())
    log.append(EditLog("LOG", f"Converted {len(found)} components to FixedAffineComponent."))


def _remove_orphan_nodes(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    gone = nnet.remove_orphan_nodes(d.options["remove_orphan_inputs"])
    log.append(EditLog("LOG", f"Removed {len(gone)} orphan nodes."))


def _remove_orphan_components(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    gone = nnet.remove_orphan_components()
    log.append(EditLog("LOG", f"Removing {len(gone)} orphan components."))


def _remove_orphans(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    _remove_orphan_nodes(nnet, d, log)
    _remove_orphan_components(nnet, d, log)


def _set_learning_rate(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    found = _components(nnet, d.options["name"], _is_updatable_class)
    for _, c in found:
        set_underlying_learning_rate(c, d.options["learning_rate"])
    log.append(EditLog("LOG", f"Set learning rates for {len(found)} components."))


def _set_learning_rate_factor(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    found = _components(nnet, d.options["name"], _is_updatable_class)
    for _, c in found:
        c.learning_rate_factor = float(np.float32(d.options["learning_rate_factor"]))
    log.append(EditLog("LOG", f"Set learning rate factors for {len(found)} components."))


def _rename_node(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    old, new = d.options["old_name"], d.options["new_name"]
    if not nnet.has_node(old):
        raise d.error(f"could not rename node from {old!r} to {new!r} because there is "
                      f"no node called {old!r}")
    if nnet.has_node(new):
        raise d.error(f"cannot rename node {old!r} to {new!r}: a node called {new!r} "
                      "exists")
    nnet.nodes = _renamed_nodes(nnet.nodes, {old: new})


def _renamed_nodes(nodes: list[Node], names: dict[str, str]) -> list[Node]:
    """``nodes`` with the nodes of ``names`` renamed and every reference to them
    (descriptors, dim-range sources) following."""
    out = []
    for n in nodes:
        n = _rewired(n, names)
        out.append(replace(n, name=names[n.name]) if n.name in names else n)
    return out


def _rewired(n: Node, names: dict[str, str]) -> Node:
    """Node ``n`` reading ``names[x]`` wherever it read a node ``x`` of ``names``."""
    changes = {}
    if n.descriptor is not None and any(x in names for x in n.descriptor.node_names()):
        changes["descriptor"] = n.descriptor.map_nodes(lambda x: names.get(x, x))
    if n.source in names:
        changes["source"] = names[n.source]
    return replace(n, **changes) if changes else n


def _remove_output_nodes(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    outputs = nnet.output_names()
    gone = {o for o in outputs if name_matches_pattern(o, d.options["name"])}
    log.append(EditLog("LOG", f"Removing {len(gone)} output nodes."))
    if len(gone) == len(outputs):
        raise d.error(f"all outputs were removed (name={d.options['name']} matches "
                      f"{', '.join(outputs)})")
    if gone:
        nnet.nodes = [n for n in nnet.nodes if n.name not in gone]


def _set_dropout_proportion(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    kinds = (DropoutComponent, DropoutMaskComponent, GeneralDropoutComponent)
    found = _components(nnet, d.options["name"], lambda c: isinstance(c, kinds))
    for _, c in found:
        c.dropout_proportion = float(np.float32(d.options["proportion"]))
    log.append(EditLog("LOG", f"Set dropout proportions for {len(found)} components."))


def _sorted_svd(w: np.ndarray):
    """``U, s, Vt`` of ``w`` (float64, singular values from greatest to least)."""
    u, s, vt = np.linalg.svd(np.asarray(w, np.float64), full_matrices=False)
    order = np.argsort(-s, kind="stable")  # (numpy sorts them already; Kaldi's SortSvd)
    return u[:, order], s[order], vt[order]


def _affine_to_change(nnet: Nnet, pattern: str, dim: int, what: str,
                      log: list[EditLog]) -> list[tuple[str, AffineComponent]]:
    """The affine components matching ``pattern`` whose both dims exceed ``dim``,
    with Kaldi's warnings for the other matches."""
    out = []
    for name, c in _components(nnet, pattern, lambda c: True):
        if not _is_affine(c):
            log.append(EditLog("WARNING", f"Not {what} component {name} as it is not an "
                                          "AffineComponent."))
        elif c.input_dim <= dim or c.output_dim <= dim:
            log.append(EditLog("WARNING", f"Not {what} component {name} with SVD to rank "
                                          f"{dim} because its dimension is {c.input_dim} -> "
                                          f"{c.output_dim}"))
        else:
            out.append((name, c))
    return out


def _reduce_rank(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    rank = d.options["rank"]
    found = _affine_to_change(nnet, d.options["name"], rank, "reducing rank of", log)
    for name, c in found:
        u, s, vt = _sorted_svd(c.linear_params)
        log.append(EditLog("LOG", f"For component {name} singular value sum changed by "
                                  f"reduce-rank command {s[rank:].sum():g} (from {s.sum():g} "
                                  f"to {s[:rank].sum():g})"))
        c.linear_params = ((u[:, :rank] * s[:rank]) @ vt[:rank]).astype(np.float32)
    log.append(EditLog("LOG", f"Reduced rank of parameters of {len(found)} components."))


def _svd_dim(s: np.ndarray, energy_threshold: float) -> int:
    """The fewest leading singular values whose squares reach ``energy_threshold``
    times the sum of all squares (Kaldi's GetReducedDimension)."""
    s2 = s * s
    reached = np.flatnonzero(np.cumsum(s2) >= energy_threshold * s2.sum())
    return int(reached[0]) + 1 if len(reached) else len(s)


def _apply_svd(nnet: Nnet, d: EditDirective, log: list[EditLog]) -> None:
    o = d.options
    found = _affine_to_change(nnet, o["name"], o["bottleneck_dim"], "decomposing", log)
    split: dict[str, tuple[str, str]] = {}  # component -> (its _a, its _b)
    for name, c in found:
        u, s, vt = _sorted_svd(c.linear_params)
        dim = (_svd_dim(s, o["energy_threshold"]) if o["energy_threshold"] > 0
               else o["bottleneck_dim"])
        ratio = (np.float32(dim * (c.input_dim + c.output_dim))
                 / np.float32(c.input_dim * c.output_dim))
        if ratio > np.float32(o["shrinkage_threshold"]):
            log.append(EditLog("LOG", f"Shrinkage ratio {ratio:g} greater than threshold : "
                                      f"{o['shrinkage_threshold']:g} Skipping SVD for this "
                                      f"layer ({name})."))
            continue
        for part in (name + "_a", name + "_b"):
            if part in nnet.components:
                raise d.error(f"the network already has a component named {part!r}")
        root = np.sqrt(s[:dim])  # (the singular values shared equally by both factors)
        a = LinearComponent((vt[:dim] * root[:, None]).astype(np.float32))
        b = NaturalGradientAffineComponent((u[:, :dim] * root).astype(np.float32),
                                           c.bias_params.copy())
        b.rank_in, b.rank_out = 20, 80  # (Kaldi's constructor's natural-gradient settings)
        b.orthonormal_constraint = 0.0
        for part in (a, b):  # Kaldi's SetUpdatableConfigs
            for attr in ("learning_rate", "learning_rate_factor", "l2_regularize",
                         "is_gradient", "max_change"):
                setattr(part, attr, getattr(c, attr))
        nnet.components[name + "_a"] = a
        nnet.components[name + "_b"] = b
        split[name] = (name + "_a", name + "_b")
        s2 = s * s
        log.append(EditLog("LOG", f"For component {name} singular value squared sum changed "
                                  f"by {s2[dim:].sum():g} (from {s2.sum():g} to "
                                  f"{s2[:dim].sum():g}); dimension reduced from "
                                  f"({c.input_dim},{c.output_dim}) to [({c.input_dim},{dim}), "
                                  f"({dim},{c.output_dim})]"))
    if split:
        _split_nodes(nnet, split, d)
    log.append(EditLog("LOG", f"Decomposed {len(split)} components with SVD."))


def _split_nodes(nnet: Nnet, split: dict[str, tuple[str, str]], d: EditDirective) -> None:
    """Each component-node ``x`` of a split component becomes ``x_a`` (its input,
    the first factor) then ``x_b`` (the second), and whatever read ``x`` reads
    ``x_b``; then orphans go, as Kaldi's SvdApplier::ModifyTopology (node order:
    input nodes, then the others in their order, as Kaldi's re-read config leaves
    it)."""
    targets = {n.name for n in nnet.nodes
               if n.kind == "component-node" and n.component in split}
    for name in targets:
        for new in (name + "_a", name + "_b"):
            if nnet.has_node(new):
                raise d.error(f"cannot split node {name!r}: a node called {new!r} exists")
    renames = {name: name + "_b" for name in targets}
    nodes = [n for n in nnet.nodes if n.kind == "input-node"]
    for n in nnet.nodes:
        if n.kind == "input-node":
            continue
        n = _rewired(n, renames)
        if n.name not in targets:
            nodes.append(n)
            continue
        comp_a, comp_b = split[n.component]
        nodes.append(Node("component-node", n.name + "_a", component=comp_a,
                          descriptor=n.descriptor))
        nodes.append(Node("component-node", n.name + "_b", component=comp_b,
                          descriptor=Descriptor((NodeRef(n.name + "_a"),))))
    nnet.nodes = nodes
    nnet.remove_orphan_nodes()  # (the split components too, and any other orphans,
    nnet.remove_orphan_components()  # as Kaldi's)


_APPLY: dict[str, Callable[[Nnet, EditDirective, list[EditLog]], None]] = {
    "convert-to-fixed-affine": _convert_to_fixed_affine,
    "remove-orphan-nodes": _remove_orphan_nodes,
    "remove-orphan-components": _remove_orphan_components,
    "remove-orphans": _remove_orphans,
    "set-learning-rate": _set_learning_rate,
    "set-learning-rate-factor": _set_learning_rate_factor,
    "rename-node": _rename_node,
    "remove-output-nodes": _remove_output_nodes,
    "set-dropout-proportion": _set_dropout_proportion,
    "apply-svd": _apply_svd,
    "reduce-rank": _reduce_rank,
}
_DIRECTIVES = tuple(_APPLY)


# -- nnet3-am-copy --convert-repeated-to-block ----------------------------------------------


def _block_from_repeated(c: RepeatedAffineComponent) -> BlockAffineComponent:
    """Kaldi's BlockAffineComponent(const RepeatedAffineComponent&): the block's
    parameters repeated num_repeats times, stacked, and the learning-rate settings."""
    block = BlockAffineComponent(np.tile(c.linear_params, (c.num_repeats, 1)),
                                 np.tile(c.bias_params, c.num_repeats), c.num_repeats)
    for attr in ("learning_rate", "learning_rate_factor", "is_gradient", "max_change",
                 "l2_regularize"):
        setattr(block, attr, getattr(c, attr))
    return block


def convert_repeated_to_block(nnet: Nnet) -> int:
    """Kaldi's ConvertRepeatedToBlockAffine, in place: every RepeatedAffineComponent
    and NaturalGradientRepeatedAffineComponent, also inside a CompositeComponent,
    becomes the BlockAffineComponent computing the same function. Returns how many
    were converted."""
    count = 0
    for name, c in list(nnet.components.items()):
        if isinstance(c, RepeatedAffineComponent):
            nnet.components[name] = _block_from_repeated(c)
            count += 1
        elif isinstance(c, CompositeComponent):
            for i, sub in enumerate(c.components):
                if isinstance(sub, RepeatedAffineComponent):
                    c.components[i] = _block_from_repeated(sub)
                    count += 1
    return count

__all__ = ["EditDirective", "EditLog", "apply_edits", "convert_repeated_to_block",
           "edits_from_option",
           "name_matches_pattern", "parse_edits"]
