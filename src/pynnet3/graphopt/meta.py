"""The network-level meta-optimizer (seed 003's design on nnet3 networks).

:func:`optimize_network` copies the network and runs the passes in a fixed
order -- pruning, shatter, constant folding, arithmetic simplification,
parameter fusion, fusion -- each switchable by a :class:`NetworkOptions` field,
repeating the sequence until an iteration changes nothing (at most
``max_iterations``; a warning when the cap is hit), then sets the weights'
memory layout (``layout``: no values change). Every pass mutates only
through one :class:`~pynnet3.rewrite.NetworkRewriter`, and the network is
validated after each pass (a failing pass is named). The :class:`NetworkReport`
lists, pass by pass and rule by rule, what was applied (and what a rule
declined, with its reason) and the component, node and parameter counts after.

Every pass is exact up to float rounding for the network's outputs in its
current modes; with ``keep_derivatives`` also for input derivatives. Model
gradients are not preserved (parameters are re-expressed): optimize a network
for inference, not before training it.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field

from ..errors import GraphError, PynnetError
from ..nnet import Nnet
from ..rewrite.engine import RewriteLog, rewrite_to_fixed_point
from ..rewrite.rewriter import NetworkRewriter
from ..rewrite.rules import REGISTRIES
from . import folding as _folding  # noqa: F401  (registers the fold rules)
from . import fusion as _fusion  # noqa: F401  (registers the fuse / parameter rules)
from . import relu_fusion as _relu_fusion  # noqa: F401  (registers the fuse-affine-relu rules)
from . import shatter as _shatter  # noqa: F401  (registers the shatter rules)
from .arithmetic import simplify
from .layout import column_major_weights
from .pruning import prune


@dataclass(frozen=True)
class NetworkOptions:
    """One field per network pass (all on by default: each is exact for inference).

    ``layout`` (seed 003's layout optimizer) rewrites no node: once the passes are
    done, it stores each linear layer's weights column-major, the layout BLAS
    multiplies fastest by few rows (:mod:`pynnet3.graphopt.layout`).
    ``memory`` (seed 003's memory optimizer) rewrites no network: for training
    requests it has the compiler free cheap forward values between the passes and
    recompute them exactly during backprop where that lowers the peak memory (the
    command-level pass :mod:`pynnet3.optimize.recompute`, which a
    :class:`~pynnet3.CachingCompiler` given these options switches on through
    ``OptimizeOptions.recompute_cheap_values``; nothing changes for inference).
    ``keep_derivatives``: keep input derivatives exact too (BackpropTruncation,
    NoOp backprop scales and test-mode Dropout's backprop stay).
    ``max_iterations``: cap on repetitions of the whole pass sequence;
    ``max_rule_steps``: cap on match-and-rewrite steps of one rule pass;
    ``enable_rules`` / ``disable_rules``: rule names to run although they are off by
    default (``split-recurrent-affine``) / to skip."""

    pruning: bool = True
    shatter: bool = True
    constant_folding: bool = True
    arithmetic: bool = True
    parameter_fusion: bool = True
    fusion: bool = True
    layout: bool = True
    memory: bool = True
    keep_derivatives: bool = False
    max_iterations: int = 10
    max_rule_steps: int = 20
    enable_rules: tuple[str, ...] = ()
    disable_rules: tuple[str, ...] = ()

    def key(self) -> tuple:
        """A hashable fingerprint (for cache keys)."""
        return tuple(sorted(asdict(self).items()))


PASS_ORDER = ("pruning", "shatter", "constant_folding", "arithmetic", "parameter_fusion",
              "fusion")
_REGISTRY_OF = {"shatter": "shatter", "constant_folding": "fold",
                "parameter_fusion": "parameter", "fusion": "fuse"}


@dataclass
class PassRecord:
    """One pass run: what it changed and the network's size after it. ``declined``
    lists the rules' reasons not already given by an earlier run of the pass."""

    name: str
    iteration: int
    changes: int
    applied: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    num_components: int = 0
    num_component_nodes: int = 0
    num_nodes: int = 0
    num_parameters: int = 0
    seconds: float = 0.0


@dataclass
class NetworkReport:
    """Filled by :func:`optimize_network`: the network's size before, then one
    :class:`PassRecord` per pass run."""

    before: dict[str, int] = field(default_factory=dict)
    passes: list[PassRecord] = field(default_factory=list)
    iterations: int = 0
    hit_iteration_limit: bool = False

    def rules_applied(self) -> dict[str, int]:
        """Rule name -> times applied, over all passes."""
        out: dict[str, int] = {}
        for p in self.passes:
            for k, v in p.applied.items():
                out[k] = out.get(k, 0) + v
        return out

    def __str__(self) -> str:
        b = self.before
        lines = [f"{'pass':<18} {'iter':>4} {'changes':>7} {'comps':>6} {'cnodes':>6} "
                 f"{'nodes':>6} {'params':>9} {'ms':>7}",
                 f"{'(before)':<18} {'':>4} {'':>7} {b.get('num_components', 0):>6} "
                 f"{b.get('num_component_nodes', 0):>6} {b.get('num_nodes', 0):>6} "
                 f"{b.get('num_parameters', 0):>9} {'':>7}"]
        for p in self.passes:
            lines.append(f"{p.name:<18} {p.iteration:>4} {p.changes:>7} {p.num_components:>6} "
                         f"{p.num_component_nodes:>6} {p.num_nodes:>6} {p.num_parameters:>9} "
                         f"{p.seconds * 1e3:>7.1f}")
            for rule, n in p.applied.items():
                lines.append(f"    {rule}: {n}")
            for note in p.notes:
                lines.append(f"    {note}")
            for d in p.declined:
                lines.append(f"    declined: {d}")
        if self.hit_iteration_limit:
            lines.append("(stopped at the iteration limit)")
        return "\n".join(lines)


def network_counts(nnet: Nnet) -> dict[str, int]:
    """Components, component nodes, nodes and parameters (Kaldi's NumParameters)."""
    return {"num_components": len(nnet.components),
            "num_component_nodes": sum(n.kind == "component-node" for n in nnet.nodes),
            "num_nodes": len(nnet.nodes),
            "num_parameters": int(sum(c.num_params() for c in nnet.components.values()))}


def optimize_network(nnet: Nnet, options: NetworkOptions | None = None, *,
                     preserve: tuple[str, ...] | list[str] = (),
                     report: NetworkReport | None = None) -> Nnet:
    """A new network equivalent to ``nnet`` for its outputs (and the nodes named in
    ``preserve``), rewritten by the enabled passes; ``nnet`` is not changed."""
    options = options or NetworkOptions()
    known = {r.name for reg in REGISTRIES.values() for r in reg}
    for name in (*options.enable_rules, *options.disable_rules):
        if name not in known:
            raise PynnetError(f"NetworkOptions: no rule named {name!r}; rules are "
                              f"{', '.join(sorted(known))}")
    for name in preserve:
        if not nnet.has_node(name):
            raise GraphError(f"preserve: no node named {name!r}")
    work = nnet.copy()
    rewriter = NetworkRewriter(work, frozenset(preserve))
    report = report if report is not None else NetworkReport()
    report.before = network_counts(nnet)
    for iteration in range(1, options.max_iterations + 1):
        before = len(rewriter.changes)
        for pass_name in PASS_ORDER:
            if getattr(options, pass_name):
                _run_pass(pass_name, rewriter, options, iteration, report)
        report.iterations = iteration
        if len(rewriter.changes) == before:
            break
    else:
        report.hit_iteration_limit = True
        warnings.warn(f"optimize_network: still changing after {options.max_iterations} "
                      "iterations", RuntimeWarning, stacklevel=2)
    if options.layout:
        start = time.perf_counter()
        changed = column_major_weights(work)
        rec = PassRecord("layout", report.iterations, 0, notes=[
            f"{len(changed)} weight matrices stored column-major"] if changed else [])
        rec.seconds = time.perf_counter() - start
        for k, v in network_counts(work).items():
            setattr(rec, k, v)
        report.passes.append(rec)
    return work


def enabled_rules(options: NetworkOptions) -> frozenset[str]:
    """The names of the rules ``options`` runs, over every pass that is on."""
    return frozenset(
        r.name for pass_name, reg in _REGISTRY_OF.items() if getattr(options, pass_name)
        for r in REGISTRIES[reg]
        if (r.enabled_by_default or r.name in options.enable_rules)
        and r.name not in options.disable_rules)


def _run_pass(name: str, rewriter: NetworkRewriter, options: NetworkOptions, iteration: int,
              report: NetworkReport) -> None:
    start = time.perf_counter()
    n0 = len(rewriter.changes)
    rec = PassRecord(name, iteration, 0)
    if name == "pruning":
        rec.notes = prune(rewriter, options.keep_derivatives)
    elif name == "arithmetic":
        rec.notes = simplify(rewriter)
    else:
        rules = [r for r in REGISTRIES[_REGISTRY_OF[name]]
                 if (r.enabled_by_default or r.name in options.enable_rules)
                 and r.name not in options.disable_rules]
        log = rewrite_to_fixed_point(rewriter, rules,
                                     max_steps=options.max_rule_steps,
                                     keep_derivatives=options.keep_derivatives,
                                     log=RewriteLog(), enabled_rules=enabled_rules(options))
        rec.applied = log.counts()
        said = {d for p in report.passes if p.name == name for d in p.declined}
        rec.declined = [text for text in (f"{d.rule} at {d.nodes[0]}: {d.declined}"
                                          for d in log.declined) if text not in said]
        rewriter.remove_orphans()
    try:
        rewriter.validate()
    except Exception as e:  # name the pass that broke the network
        raise GraphError(f"network pass {name!r} produced an invalid network: {e}") from e
    rec.changes = len(rewriter.changes) - n0
    rec.seconds = time.perf_counter() - start
    for k, v in network_counts(rewriter.nnet).items():
        setattr(rec, k, v)
    report.passes.append(rec)
