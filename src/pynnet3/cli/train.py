"""``pynnet3 train``: Kaldi's nnet3-train (one model trained on an examples table).

``pynnet3 train [flags] MODEL EGS-RSPECIFIER OUT`` reads the model, trains it on
every example of the table in order (each example is one minibatch: merge them
with ``pynnet3 merge-egs`` first, as Kaldi's recipes pipe nnet3-merge-egs into
nnet3-train) with one :class:`pynnet3.train.Trainer` (natural-gradient state and
the momentum delta carry over), logs what Kaldi's trainer logs (the average
objective every ``--print-interval`` minibatches, max-change activity, the overall
objective), and writes the model atomically. Flags are nnet3-train's.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import PynnetError
from .jobs import (
    USE_GPU_CHOICES,
    add_backend_flag,
    cuda_available,
    sigterm_stops,
    stopped,
)
from .kaldi_options import (
    add_binary_option,
    add_optimize_flags,
    add_standard_options,
    bool_option,
    caching_compiler_from_args,
    kaldi_log,
)

# nnet3-train flags that go to TrainerOptions (as given on the command line; unset
# unless given, so the others keep Kaldi's defaults, which their help gives), in the
# order --help lists them: (flag, type, help).
_TRAINER_FLAGS = (
    ("momentum", float, "momentum constant (the update is scaled by 1 - momentum so the "
                        "effective learning rate stays the same) (default: 0)"),
    ("max-param-change", float, "the most the whole parameter vector may change in one "
                                "minibatch (2-norm), with per-component max-change applied "
                                "first; 0: no limit (default: 2)"),
    ("l2-regularize-factor", float, "factor on the components' l2-regularize values "
                                    "(default: 1)"),
    ("batchnorm-stats-scale", float, "BatchNorm stats are scaled by this after each "
                                     "minibatch (default: 0.8)"),
    ("backstitch-training-scale", float, "backstitch training scale (0: off) (default: 0)"),
    ("backstitch-training-interval", int, "backstitch every this many minibatches "
                                          "(default: 1)"),
    ("store-component-stats", bool, "store component statistics (nonlinearity stats, ReLU "
                                    "self-repair) during training (default: true)"),
    ("zero-component-stats", bool, "zero the component statistics before training "
                                   "(default: true)"),
    ("srand", int, "seed of the trainer's random choices (orthonormal constraint, "
                   "backstitch phase) (default: 0)"),
    ("print-interval", int, "log the average objective every this many minibatches "
                            "(default: 100)"),
)


def _log(message: str, kind: str = "LOG") -> None:
    kaldi_log("train", kind, message)


class _Progress:
    """Minibatches done and the running objective, on stderr when it is a terminal."""

    def __init__(self):
        self.active = sys.stderr.isatty()
        self.count = 0

    def update(self, key: str, objective_per_frame: float) -> None:
        self.count += 1
        if self.active:
            sys.stderr.write(f"\r{self.count} minibatches ({key}), objective "
                             f"{objective_per_frame:.6g}\x1b[K")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.active and self.count:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def trainer_flags(args) -> dict:
    """The TrainerOptions flags given on the command line (the rest keep Kaldi's
    defaults)."""
    return {flag: getattr(args, flag.replace("-", "_")) for flag, _, _ in _TRAINER_FLAGS
            if getattr(args, flag.replace("-", "_")) is not None}


def _add_trainer_flags(g) -> None:
    """The :data:`_TRAINER_FLAGS` on the argument group ``g``."""
    for flag, kind, text in _TRAINER_FLAGS:
        if kind is bool:
            bool_option(g, "--" + flag, None, text)
        else:
            g.add_argument("--" + flag, dest=flag.replace("-", "_"), type=kind, default=None,
                           metavar="FLOAT" if kind is float else "INT", help=text)


def _cmd_train(args) -> int:
    from ..io.egs import read_examples
    from ..train import Trainer, TrainerOptions
    from ..train.examples import example_minibatch
    from .files import read_model_or_am, write_model

    backend, device = ("torch", "cpu") if args.backend == "torch" else ("numpy", None)
    if args.use_gpu != "no" and cuda_available():
        backend, device = "torch", "cuda"
    elif args.use_gpu in ("yes", "wait"):
        # (Kaldi's nnet3-train defaults to yes and stops without a GPU; we warn and train
        # on the CPU, so the default works on any machine)
        _log(f"--use-gpu={args.use_gpu}: no CUDA device is available; training runs on the "
             f"CPU ({backend} backend)", "WARNING")
    for flag in ("read_cache", "write_cache"):
        if getattr(args, flag):
            _log(f"--{flag.replace('_', '-')} is accepted and ignored (pynnet3 compiles in "
                 "memory; equal minibatch shapes compile once per run)", "WARNING")
    options = TrainerOptions.from_flags(trainer_flags(args))
    nnet, am = read_model_or_am(args.model)
    # (--optimization.min-deriv-time etc. shape the training computations, as in Kaldi)
    compiler = caching_compiler_from_args(nnet, args)
    examples = read_examples(args.egs_rspecifier)
    group = _Group.start(args) if args.distributed else None
    if group is not None:
        from ..train.distributed import DistributedTrainer, shard

        trainer = DistributedTrainer(nnet, options, reduce=args.distributed_reduce,
                                     backend=backend, device=device)
        examples = shard(examples, group.rank, group.world_size)
    else:
        trainer = Trainer(nnet, options, backend=backend, device=device)
    trainer.compiler = compiler
    speaks = group is None or group.rank == 0  # (one log and one model for all ranks)
    progress = _Progress() if speaks else None
    total_weight = 0.0
    with sigterm_stops():
        try:
            for key, eg in examples if group is None else group.in_step(examples):
                try:
                    mb = example_minibatch(nnet, eg, need_model_derivative=True,
                                           store_component_stats=options.store_component_stats)
                    stats = trainer.train_step(mb.request, inputs=mb.inputs,
                                               supervision=mb.supervision)
                except PynnetError as e:  # (say which example: archives hold thousands)
                    e.args = (f"example {key!r}: {e}",)
                    raise
                total_weight += stats.weight
                if not speaks:
                    continue
                progress.clear()
                # Kaldi's order: the previous phase's objective (printed while this
                # minibatch's outputs are processed), the backward pass's warnings, then
                # this update's max-change lines.
                phase = [x for x in stats.log_lines if x.startswith("Average objective")]
                for line in phase:
                    _log(line)
                for line in stats.backward_warnings:  # (e.g. natural gradient's fallback)
                    _log(line, "WARNING")
                if args.verbose >= 2:
                    for line in stats.verbose_lines:
                        _log(line, "VLOG[2]")
                for line in stats.log_lines:
                    if line not in phase:
                        _log(line)
                for line in stats.warnings:
                    _log(line, "WARNING")
                if args.verbose >= 1:
                    _log(f"minibatch {trainer.num_minibatches_processed - 1} ({key}): objective "
                         f"{stats.objective_per_frame:.6g} over {stats.weight:.6g} frames",
                         "VLOG[1]")
                progress.update(key, stats.objective_per_frame)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: no model that looks trained
            if progress is not None:
                progress.clear()
            how, status = stopped(e)
            _log(f"{how} after {trainer.num_minibatches_processed} minibatches; no model "
                 "written", "ERROR")
            return status
        finally:
            if progress is not None:
                progress.clear()
            if group is not None:
                group.finish()
    if speaks:
        for line in trainer.total_stats_lines():
            _log(line)
        write_model(nnet, args.out, args.binary, am)
        _log(f"Wrote model to {args.out}")
    return 0 if total_weight != 0.0 else 1


class _Group:
    """The torch.distributed process group of ``--distributed=true`` (torchrun's
    environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

    def __init__(self, dist, owned: bool):
        self.dist, self.owned = dist, owned
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.dropped = 0

    @classmethod
    def start(cls, args) -> _Group:
        import os

        from ..errors import ConfigError

        try:
            import torch.distributed as dist
        except ImportError:
            raise ConfigError("--distributed=true needs torch (pip install "
                              "'pynnet3[torch]')") from None
        if dist.is_initialized():
            return cls(dist, owned=False)
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if v not in os.environ]
        if missing:
            raise ConfigError(f"--distributed=true: {', '.join(missing)} not set (start the "
                              "ranks with torchrun, or set them)")
        from datetime import timedelta

        dist.init_process_group(args.distributed_backend, init_method="env://",
                                timeout=timedelta(seconds=args.distributed_timeout))
        return cls(dist, owned=True)

    def in_step(self, examples):
        """The rank's examples while every rank still has one (all ranks must take
        the same number of steps); what is left over is counted, not trained on."""
        from ..train.distributed import all_reduce_arrays

        it = iter(examples)
        while True:
            item = next(it, None)
            flag = np.array([0.0 if item is None else 1.0])
            all_reduce_arrays([flag])
            if flag[0] < self.world_size:
                self.dropped = int(item is not None) + sum(1 for _ in it)
                if self.dropped:
                    _log(f"rank {self.rank}: {self.dropped} minibatch(es) left untrained "
                         "(another rank ran out of examples first)", "WARNING")
                return
            yield item

    def finish(self) -> None:
        if self.owned and self.dist.is_initialized():
            self.dist.destroy_process_group()


def add_train_command(sub, command) -> None:
    """Add ``train`` to the subparsers ``sub`` (``command`` makes one, as main.py's
    ``_command``)."""
    s = command(sub, "train", "train a model on examples (like nnet3-train)",
                "Train a model's parameters with backprop and stochastic gradient descent\n"
                "as Kaldi's nnet3-train does: every example of EGS-RSPECIFIER is one\n"
                "minibatch (merge them first with 'pynnet3 merge-egs'); natural gradient\n"
                "for the components that have it, momentum, max-change, L2, BatchNorm\n"
                "stats scaling and backstitch as NnetTrainer; the learning rates are the\n"
                "model's. The log says the average objective every --print-interval\n"
                "minibatches and overall. Exit status 1 when no frame had supervision\n"
                "(the model is written anyway, as Kaldi does).",
                usage="pynnet3 train [-h] [options] [--optimization.OPTION=VALUE ...] "
                      "MODEL EGS-RSPECIFIER OUT")
    s.add_argument("model", metavar="MODEL",
                   help="model to train: Kaldi nnet3 raw model or acoustic model (final.mdl: "
                        "OUT is then an acoustic model with the same transition model and "
                        "priors), text or binary (detected), gzipped or not; '-' reads stdin")
    s.add_argument("egs_rspecifier", metavar="EGS-RSPECIFIER",
                   help="training examples: ark:egs.ark, scp:egs.scp, ark:- or "
                        "'ark:pynnet3 merge-egs ark:egs.ark ark:- |'")
    s.add_argument("out", metavar="OUT", help="where to write the trained model ('-': stdout)")
    add_binary_option(s)
    s.add_argument("--use-gpu", dest="use_gpu", choices=USE_GPU_CHOICES, default="yes",
                   help="yes/wait/optional: train on a CUDA device (the torch backend) when "
                        "there is one; without one, yes/wait warn and train on the CPU "
                        "(default: yes)")
    add_backend_flag(s)
    s.add_argument("--verbose", type=int, default=0, metavar="INT",
                   help="1 or more: also one line per minibatch (default: 0)")
    d = s.add_argument_group("data-parallel training (torch.distributed; start the ranks "
                             "with torchrun)")
    bool_option(d, "--distributed", False,
                "train on several processes: rank r takes minibatches r, r+W, ... of the table; "
                "each step's model change is combined over the ranks so all keep the same model; "
                "rank 0 logs and writes OUT; needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as "
                "torchrun sets them (default: false)")
    d.add_argument("--distributed-reduce", dest="distributed_reduce", choices=("sum", "mean"),
                   default="sum",
                   help="sum: a step equals one step on the ranks' minibatches merged into "
                        "one; mean: the average of the ranks' steps (default: sum)")
    d.add_argument("--distributed-backend", dest="distributed_backend", default="gloo",
                   choices=("gloo", "nccl", "mpi"),
                   help="torch.distributed backend (default: gloo)")
    d.add_argument("--distributed-timeout", dest="distributed_timeout", type=float,
                   default=600.0, metavar="SECONDS",
                   help="how long a rank waits for the others (default: 600)")
    g = s.add_argument_group("trainer options (Kaldi's NnetTrainerOptions)")
    _add_trainer_flags(g)
    g.add_argument("--read-cache", dest="read_cache", default="", metavar="FILE",
                   help="accepted and ignored (Kaldi's compiled-computation cache)")
    g.add_argument("--write-cache", dest="write_cache", default="", metavar="FILE",
                   help="accepted and ignored (Kaldi's compiled-computation cache)")
    bool_option(g, "--binary-write-cache", True, "accepted and ignored")
    bool_option(g, "--compiler.use-shortcut", True,
                "compile minibatches of regular structure for 2 sequences and expand (Kaldi's "
                "shortcut) (default: true)", dest="use_shortcut")
    g.add_argument("--compiler.cache-capacity", dest="cache_capacity", type=int, default=64,
                   metavar="INT", help="computations the compiler keeps (default: 64)")
    bool_option(g, "--computation.debug", False,
                "accepted and ignored (Kaldi's per-command debug output)")
    c = s.add_argument_group("CUDA allocator options (accepted and ignored, as in a Kaldi "
                             "build without CUDA)")
    c.add_argument("--cuda-memory-proportion", dest="cuda_memory_proportion", type=float,
                   default=0.5, metavar="FLOAT", help="(default: 0.5)")
    bool_option(c, "--cuda-cache-memory", True, "(default: true)")
    add_standard_options(s, verbose=False)
    add_optimize_flags(s)
    s.set_defaults(fn=_cmd_train)
