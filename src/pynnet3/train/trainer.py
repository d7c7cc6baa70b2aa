"""Trainer: one minibatch at a time, as Kaldi's NnetTrainer::Train.

A step: compile the request (a CachingCompiler, so equal minibatch shapes
compile once); forward; each output node's objective and derivative
(:mod:`~pynnet3.train.objective`); backward, where every updatable component
adds its (natural-gradient preconditioned, where Kaldi's type does that) gradient
into a target the trainer owns; ``delta = momentum * delta + lr * gradient``; L2;
per-component max-change and global max-param-change; BatchNorm stats scaling;
ConstrainOrthonormal; ``delta *= momentum``. Everything Kaldi's trainer carries
between minibatches lives here: the preconditioners (one per matrix side of each
natural-gradient component, keyed by component name), the momentum delta, the
compile cache, the random generator, the minibatch counter and objective totals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..cache import CachingCompiler
from ..components.fused import AffineReluComponent
from ..components.preconditioning import PreconditionedGrad
from ..computation import CommandType as CT
from ..errors import RuntimeInputError
from ..runtime.computer import NnetComputer
from .objective import compute_objective
from .options import TrainerOptions
from .preconditioners import make_preconditioners, skips_update
from .progress import MaxChangeCounts, ObjectiveInfo
from .stored_stats import StoredStats
from .update import (
    add_backprop_stats,
    apply_l2_regularization,
    constrain_orthonormal,
    learning_rates,
    scale_batchnorm_stats,
    updatable_components,
    update_with_max_change,
)


@dataclass
class OutputObjective:
    """One output node's totals for a minibatch (Kaldi's tot_objf / tot_weight)."""

    objective: float
    weight: float


@dataclass
class TrainStats:
    """What one :meth:`Trainer.train_step` did. ``objective`` / ``weight``: totals over
    the output nodes (``objective / weight`` is Kaldi's per-frame figure);
    ``max_change_scales[name]``: the per-component max-change factor (1.0 = not
    limited); ``global_scale``: the max-param-change factor; ``applied``: False
    when the change was not finite and nothing was added; ``message``: Kaldi's
    max-change log line ('' when neither max-change was active);
    ``orthonormal_constrained``: components constrained this step; ``log_lines``:
    what Kaldi's trainer logs during this step (a phase's average objective when
    one ended, the max-change line); ``verbose_lines``: what it logs at --verbose=2
    (a line per component whose max-change was active, each update of the step);
    ``warnings``: what it warns of (a change not applied, the orthonormal
    constraint's eigenvalue ratio); ``backward_warnings``: what Kaldi warns of during
    the backward pass, before the update (the natural-gradient preconditioners'
    Gram-Schmidt fallback, one line per event, in order). With
    backstitch, the objectives are the first pass's, ``backstitch_outputs`` the
    second's, and the max-change figures the second update's."""

    objective: float = 0.0
    weight: float = 0.0
    outputs: dict[str, OutputObjective] = field(default_factory=dict)
    max_change_scales: dict[str, float] = field(default_factory=dict)
    global_scale: float = 1.0
    applied: bool = True
    message: str = ""
    orthonormal_constrained: list[str] = field(default_factory=list)
    backstitch_outputs: dict[str, OutputObjective] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    verbose_lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    backward_warnings: list[str] = field(default_factory=list)

    @property
    def num_frames(self) -> float:
        return self.weight

    @property
    def objective_per_frame(self) -> float:
        return self.objective / self.weight if self.weight else 0.0


class Trainer:
    """Trains ``nnet`` in place, one minibatch per :meth:`train_step` (Kaldi's
    NnetTrainer). ``options``: a :class:`TrainerOptions` (default Kaldi's).
    ``backend`` / ``device``: where the forward and backward passes run (``"numpy"``,
    or ``"torch"`` on ``device``); the preconditioning, the update and the parameters
    stay on the host, as pynnet3's networks keep them."""

    def __init__(self, nnet, options: TrainerOptions | None = None, *,
                 compiler: CachingCompiler | None = None, backend: str = "numpy",
                 device=None):
        self.nnet = nnet
        self.backend, self.device = backend, device
        self.options = options or TrainerOptions()
        self.options.validate()
        if compiler is not None and (compiler.nnet is not nnet
                                     or getattr(compiler, "network_options", None) is not None):
            raise RuntimeInputError(
                "Trainer: the compiler must compile for the network being trained "
                "(a CachingCompiler of this nnet without network_optimize: a "
                "network-optimized compiler's computations are for its compiled_nnet, "
                "which may be trained itself with a compiler of its own)")
        self.compiler = (compiler if compiler is not None
                         else CachingCompiler(nnet, optimize=True))
        self.rng = np.random.default_rng(self.options.srand)
        self.srand_seed = int(self.rng.integers(0, 100001))  # Kaldi: RandInt(0, 100000)
        # (the nonlinearities' coins: a generator of their own, so that the network's
        # shape does not change the orthonormal constraint's draws)
        self.stats_rng = np.random.default_rng([self.options.srand, 1])
        self.num_minibatches_processed = 0
        self.preconditioners: dict[str, dict] = {}
        self.delta: dict[str, dict[str, np.ndarray]] = {}
        # the statistics Kaldi's delta network collects in backprop (LstmNonlinearity):
        # added to the model with the parameter delta's factor, carried like it
        self.delta_stats: dict[str, dict] = {}
        # (the other components store theirs in the model, as Kaldi's; this puts them
        # back when a pass fails)
        self.stored_stats = StoredStats()
        self.objective_info: dict[str, ObjectiveInfo] = {}
        self.max_change_counts = MaxChangeCounts()
        self._comps = None  # the updatable components, while a step runs
        if self.options.learning_rate is not None:
            nnet.set_learning_rate(self.options.learning_rate)
        if self.options.zero_component_stats:
            for comp in nnet.components.values():
                comp.zero_stats()

    # -- natural gradient state ----------------------------------------------------------
    def _preconditioners_for(self, name: str, comp) -> dict | None:
        if name not in self.preconditioners:
            pre = make_preconditioners(comp)
            _name_preconditioners(pre, f"component {name!r}")
            self.preconditioners[name] = pre
        return self.preconditioners[name]

    def freeze_natural_gradient(self, frozen: bool) -> None:
        """Kaldi's FreezeNaturalGradient: every preconditioner of the network (made
        now if it does not exist yet, as Kaldi's exist from the start)."""
        for name, comp in updatable_components(self.nnet):
            for p in _each_preconditioner(self._preconditioners_for(name, comp)):
                p.freeze(frozen)

    def _take_preconditioner_warnings(self) -> list[str]:
        """What the preconditioners warned of since the last call (Kaldi logs each
        when it happens; they print nothing themselves)."""
        return [line for pre in self.preconditioners.values()
                for p in _each_preconditioner(pre) for line in p.take_warnings()]

    # -- one minibatch ---------------------------------------------------------------
    def train_step(self, request, inputs: dict, supervision: dict,
                   orthonormal_constraint_applied_to=None) -> TrainStats:
        """One NnetTrainer::Train on the minibatch ``request`` (its output indexes in
        the row order of ``supervision[name]``; every output node of the request needs
        supervision). Updates the network in place; returns :class:`TrainStats`.
        ``orthonormal_constraint_applied_to``: component names that get the
        orthonormal constraint in this step (None: Kaldi's random choice)."""
        opts = self.options
        request = self._training_request(request)
        missing = [o.name for o in request.outputs if o.name not in supervision]
        if missing:
            raise RuntimeInputError(f"no supervision given for output node(s) {missing}")
        extra = set(supervision) - {o.name for o in request.outputs}
        if extra:
            raise RuntimeInputError(f"supervision given for nodes that are not outputs of "
                                    f"the request: {sorted(extra)}")
        computation = self.compiler.compile(request)
        num_n = _num_sequences(request)
        stats = TrainStats()
        self._comps = updatable_components(self.nnet)  # (this step's, looked up once)
        backstitch = (opts.backstitch_training_scale > 0.0 and
                      self.num_minibatches_processed % opts.backstitch_training_interval
                      == self.srand_seed % opts.backstitch_training_interval)
        if backstitch:
            s = opts.backstitch_training_scale
            self.freeze_natural_gradient(True)
            self._reseed_random_components()
            stats.outputs = self._forward_backward(computation, inputs, supervision)
            stats.backward_warnings += self._take_preconditioner_warnings()
            self._record(stats, stats.outputs)
            self._update(stats, num_n, max_change_scale=s, scale=-s, l2=False)
            stats.orthonormal_constrained = constrain_orthonormal(
                self.nnet, self.rng, orthonormal_constraint_applied_to, stats.warnings)
            self._zero_delta()
            self.freeze_natural_gradient(False)
            self._reseed_random_components()
            stats.backstitch_outputs = self._forward_backward(computation, inputs, supervision)
            stats.backward_warnings += self._take_preconditioner_warnings()
            self._record(stats, stats.backstitch_outputs, "_backstitch")
            self._update(stats, num_n, max_change_scale=1.0 + s, scale=1.0 + s, l2=True,
                         l2_scale=1.0 / (1.0 + s))
            scale_batchnorm_stats(self.nnet, opts.batchnorm_stats_scale)
            self._zero_delta()
        else:
            stats.outputs = self._forward_backward(computation, inputs, supervision)
            stats.backward_warnings += self._take_preconditioner_warnings()
            self._record(stats, stats.outputs)
            self._update(stats, num_n, max_change_scale=1.0, scale=1.0 - opts.momentum,
                         l2=True)
            scale_batchnorm_stats(self.nnet, opts.batchnorm_stats_scale)
            stats.orthonormal_constrained = constrain_orthonormal(
                self.nnet, self.rng, orthonormal_constraint_applied_to, stats.warnings)
            if stats.applied and opts.momentum != 0.0:
                for d in self.delta.values():
                    for a in d.values():
                        a *= np.float32(opts.momentum)
                for collected in self.delta_stats.values():
                    for key in collected:
                        collected[key] = collected[key] * opts.momentum
            else:
                self._zero_delta()
        stats.objective = sum(o.objective for o in stats.outputs.values())
        stats.weight = sum(o.weight for o in stats.outputs.values())
        self.num_minibatches_processed += 1
        self._comps = None
        return stats

    def total_stats_lines(self) -> list[str]:
        """What Kaldi's NnetTrainer::PrintTotalStats logs: each output's overall
        average objective (names sorted) and how often max-change was enforced."""
        lines = []
        for name in sorted(self.objective_info):
            lines += self.objective_info[name].total_lines(name)
        return lines + self.max_change_counts.lines()

    def _record(self, stats: TrainStats, outputs: dict, suffix: str = "") -> None:
        """Kaldi's ProcessOutputs bookkeeping: totals and phase lines per output."""
        for name, o in outputs.items():
            info = self.objective_info.setdefault(name + suffix, ObjectiveInfo())
            stats.log_lines += info.update(name + suffix, self.options.print_interval,
                                           self.num_minibatches_processed, o.weight,
                                           o.objective)

    def _training_request(self, request):
        """The request as Kaldi's GetComputationRequest makes it for training: model
        derivative, a derivative for every output, stats as the options say."""
        outputs = [o if o.has_deriv else dataclasses.replace(o, has_deriv=True)
                   for o in request.outputs]
        return dataclasses.replace(request, outputs=outputs, need_model_derivative=True,
                                   store_component_stats=self.options.store_component_stats)

    def _reseed_random_components(self) -> None:
        # Kaldi: srand(srand_seed + minibatches) and ResetGenerators, so both
        # backstitch passes draw the same dropout masks.
        self.nnet.seed_random_components(self.srand_seed + self.num_minibatches_processed)

    def _forward_backward(self, computation, inputs: dict, supervision: dict) -> dict:
        """Run the computation with gradient targets that accumulate
        ``momentum * delta + lr * (preconditioned) gradient`` into ``self.delta``."""
        self.stored_stats.begin(self.nnet)
        drawing = _drawing_components(self.nnet) if self.options.random_stats else []
        for comp in drawing:  # (Kaldi's coins for stats and self-repair, this step only)
            comp.rng = self.stats_rng
        try:
            outputs = self._run_passes(computation, inputs, supervision)
        except BaseException:
            self.stored_stats.abort(self.nnet)
            raise
        finally:
            for comp in drawing:
                comp.rng = None
        self.stored_stats.commit()
        return outputs

    def _run_passes(self, computation, inputs: dict, supervision: dict) -> dict:
        nnet = self.nnet
        # (the compiler's computations are shared and never modified: the calls of
        # their commands are prepared once, kept with each computation)
        computer = NnetComputer(nnet, computation, self.backend, np.float32,
                                device=self.device, cache_program=True)
        be = computer.backend
        zeros = getattr(be, "zeros_shaped", None) or (lambda shape, dt: np.zeros(shape, dt))
        targets = {}
        comps = self._step_components()
        for name, comp in comps:
            pre = None if skips_update(comp) else self._preconditioners_for(name, comp)
            stats = (self.delta_stats.setdefault(name, {})
                     if comp.type_name == "LstmNonlinearityComponent" else None)
            target = PreconditionedGrad(((k, zeros(v.shape, np.float32))
                                         for k, v in comp.params().items()), pre, stats)
            targets[name] = computer.grads[name] = target
        for spec in computation.request.inputs if computation.request else []:
            if spec.name not in inputs:
                raise RuntimeInputError(f"no value given for input {spec.name!r}")
        for name, value in inputs.items():
            computer.accept_input(name, value)
        # (the forward's stats stay in the model: the backward's self-repair reads
        # them, as Kaldi's, whose computer stores them in nnet_ itself)
        computer.run_until_io()
        outputs = {}
        request = computation.request
        # (a network with no updatable component compiles without a backward pass:
        # no derivative to give; Kaldi's would take one and do nothing with it)
        takes_deriv = {cmd.node for cmd in computation.commands
                       if cmd.type is CT.ACCEPT_INPUT and cmd.is_deriv}
        for spec in request.outputs:
            out = np.asarray(be.to_numpy(computer.get_output(spec.name)))
            objective_type = nnet.node(spec.name).objective
            objf, weight, deriv = compute_objective(objective_type, out,
                                                    supervision[spec.name], spec.name)
            outputs[spec.name] = OutputObjective(objf, weight)
            if spec.name in takes_deriv:
                computer.accept_input(spec.name, deriv, is_deriv=True)
        while not computer.finished:
            computer.run_until_io()
        for name, comp in comps:
            lrs = learning_rates(comp)
            delta = self.delta.get(name)
            if delta is None:
                delta = self.delta[name] = {k: np.zeros(v.shape, np.float32)
                                            for k, v in comp.params().items()}
            for key, g in targets[name].items():
                lr = np.float32(lrs[key])
                if lr != 0.0:
                    grad = np.asarray(be.to_numpy(g), np.float32)
                    if grad is g:  # (this step's own target: scaled in place)
                        grad *= lr
                        delta[key] += grad
                    else:
                        delta[key] += lr * grad
        return outputs

    def _update(self, stats: TrainStats, num_n: int, *, max_change_scale: float,
                scale: float, l2: bool, l2_scale: float = 1.0) -> None:
        opts = self.options
        comps = self._step_components()
        if l2:
            apply_l2_regularization(self.nnet, l2_scale * num_n * opts.l2_regularize_factor,
                                    self.delta, comps, self.delta_stats)
        result = update_with_max_change(self.nnet, self.delta, opts.max_param_change,
                                        max_change_scale, scale, comps)
        stats.max_change_scales = result.scales
        stats.verbose_lines += result.verbose_lines
        stats.global_scale = result.global_scale
        if result.applied:
            for name, collected in self.delta_stats.items():
                add_backprop_stats(self.nnet.components[name], result.factors[name],
                                   collected)
        stats.applied = result.applied
        stats.message = result.message
        if result.message:  # (Kaldi warns when it does not apply the change)
            (stats.log_lines if result.applied else stats.warnings).append(result.message)
        self.max_change_counts.add(result.scales, result.global_scale)

    def _step_components(self) -> list:
        """The network's updatable components as this step's start found them."""
        comps = self._comps
        return comps if comps is not None else updatable_components(self.nnet)

    def _zero_delta(self) -> None:
        for d in self.delta.values():
            for a in d.values():
                a[...] = 0.0
        self.delta_stats.clear()


def _drawing_components(nnet) -> list:
    """The components whose statistics and self-repair Kaldi decides by a random draw
    (those with an ``rng`` slot, left None outside a step), a fused kernel's ReLU and
    a composite's parts included."""
    out = []
    for comp in nnet.components.values():
        parts = [comp, *(getattr(comp, "components", None) or ())]
        relu = comp._relu() if isinstance(comp, AffineReluComponent) else None
        if relu is not None:
            parts.append(relu)
        out += [p for p in parts if "rng" in vars(p) and p.rng is None]
    return out


def _num_sequences(request) -> int:
    """Kaldi's GetNumNvalues(io, exhaustive=false): the last index's n + 1."""
    values = {int(np.asarray(s.indexes)[-1, 0]) + 1
              for s in list(request.inputs) + list(request.outputs) if len(s.indexes)}
    if len(values) > 1:
        raise RuntimeInputError(f"inputs/outputs of the request have different numbers of "
                                f"n values: {sorted(values)}")
    return values.pop() if values else 1


def _each_preconditioner(pre):
    """Every preconditioner of ``pre`` (a make_preconditioners result, nested for a
    CompositeComponent's sub-components)."""
    for p in (pre or {}).values():
        if isinstance(p, dict):
            yield from _each_preconditioner(p)
        elif p is not None:
            yield p


def _name_preconditioners(pre, where: str) -> None:
    """Label every preconditioner of ``pre`` (a make_preconditioners result, nested
    for composite components) with what it preconditions, for error messages."""
    for slot, p in (pre or {}).items():
        if isinstance(p, dict):
            _name_preconditioners(p, f"{where} part {slot}")
        elif p is not None:
            p.name = f"{where} ({slot})"
