#!/usr/bin/env python
"""Training speed: ``pynnet3.train.Trainer.train_step`` minibatches per second.

For the four realistic networks at the train shape of ``scaling.json`` (N sequences
of 20 output frames; x-vector: one output per sequence), networks in training mode
(BatchNorm and dropout as Kaldi's training sees them), one BLAS thread, on the
NumPy backend (``--backends numpy,torch,torch:cuda`` adds torch on the CPU / a GPU;
the preconditioning and the update stay on the host), prints per (network, N,
backend):

* ``step``: one whole ``train_step`` (forward, objective, backward with natural
  gradient, max-change, BatchNorm stats scaling, ConstrainOrthonormal) in ms, and
  as minibatches/s;
* ``plain``: the same with every preconditioner switched off (plain SGD);
* ``ng share``: the part of ``step`` spent inside ``OnlineNaturalGradient.precondition``
  (and ``.precondition_implicit``: the N-row work of the natural gradient);
* ``kaldi``: ``forward_backward_ms`` from ``scaling.json`` (forward + backward into
  a gradient copy, without natural gradient or the update; another machine:
  compare ratios, not milliseconds).

Times are the mean of ``--reps`` steps (default 4: one natural-gradient update
period) after ``--warmup`` steps (default 11: compiling, and the first 11 calls of
each preconditioner, which always update its estimate; later calls update every
4th time, as in a long training run), the fastest of ``--rounds`` (default 3)
such rounds, the two trainers' rounds alternating (the host may be shared). No
assertions.

    python benchmarks/train.py [--nets tdnnf_chain,xvector] [--ns 128] [--reps 4]
                               [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import bench_setup  # noqa: F401 - first: one BLAS thread; pynnet3, benchmarks/ importable

# isort: split
import numpy as np
from realistic import NETS, print_table, reference_dir, scaling_records, scaling_request

import pynnet3
from pynnet3.train import OnlineNaturalGradient, Trainer, TrainerOptions

FLAGS = {"max-param-change": 2.0, "momentum": 0.0, "store-component-stats": False,
         "zero-component-stats": False}


class _PreconditionTimer:
    """Wraps OnlineNaturalGradient.precondition and .precondition_implicit to add up
    the seconds spent in them (a call inside another counted once)."""

    _METHODS = ("precondition", "precondition_implicit")

    def __init__(self):
        self.seconds = 0.0
        self._depth = 0
        self._orig = {m: getattr(OnlineNaturalGradient, m) for m in self._METHODS
                      if hasattr(OnlineNaturalGradient, m)}

    def __enter__(self):
        timer = self

        def wrap(orig):
            def timed(obj, *args, **kwargs):
                timer._depth += 1
                t0 = time.perf_counter()
                try:
                    return orig(obj, *args, **kwargs)
                finally:
                    timer._depth -= 1
                    if timer._depth == 0:
                        timer.seconds += time.perf_counter() - t0
            return timed

        for m, orig in self._orig.items():
            setattr(OnlineNaturalGradient, m, wrap(orig))
        return self

    def __exit__(self, *exc):
        for m, orig in self._orig.items():
            setattr(OnlineNaturalGradient, m, orig)


def _supervision(nnet, req, rng) -> dict:
    """One-hot rows (a label per output frame) for every output node."""
    sup = {}
    for spec in req.outputs:
        dim = nnet.output_dim(spec.name)
        y = np.zeros((len(spec.indexes), dim), np.float32)
        y[np.arange(len(y)), rng.integers(0, dim, len(y))] = 1.0
        sup[spec.name] = y
    return sup


def _bench(nnet, req, inputs, sup, reps: int, warmup: int, rounds: int,
           backend: str = "numpy", device=None):
    """(step ms, ng share, plain ms): a trainer with natural gradient and one without
    (each on its own copy of ``nnet``), timed in alternating rounds of ``reps`` steps;
    each figure from its fastest round (the host may be shared)."""
    trainers = {}
    for ng in (True, False):
        trainer = Trainer(nnet.copy(), TrainerOptions.from_flags(FLAGS), backend=backend,
                          device=device)
        if not ng:
            trainer.preconditioners = {name: None for name in nnet.components}
        for _ in range(warmup):  # compiles; natural gradient past its initial updates
            trainer.train_step(req, inputs=inputs, supervision=sup)
        trainers[ng] = trainer
    best = {True: (float("inf"), 0.0), False: (float("inf"), 0.0)}
    for _ in range(rounds):
        for ng, trainer in trainers.items():
            with _PreconditionTimer() as timer:
                t0 = time.perf_counter()
                for _ in range(reps):
                    trainer.train_step(req, inputs=inputs, supervision=sup)
                total = time.perf_counter() - t0
            best[ng] = min(best[ng], (total / reps * 1e3, timer.seconds / total))
    return best[True][0], best[True][1], best[False][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--ns", default="128")
    ap.add_argument("--backends", default="numpy",
                    help="comma-separated: numpy, torch (CPU), torch:cuda, ...")
    ap.add_argument("--reps", type=int, default=4,
                    help="timed steps (the mean; 4 = one natural-gradient update period)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed rounds of --reps steps, alternating between the two "
                         "trainers (the fastest round counts)")
    ap.add_argument("--warmup", type=int, default=11,
                    help="untimed steps first (compile; the first 11 calls always update "
                         "the natural-gradient estimate, later ones every 4th)")
    args = ap.parse_args()
    ref = reference_dir()
    scaling = {(net, n): r for (net, shape, n), r in scaling_records(ref).items()
               if shape == "train"}
    rows = []
    cases = [(net, int(n), b) for net in args.nets.split(",") for n in args.ns.split(",")
             for b in args.backends.split(",")]
    for net, n, backend_spec in cases:
        backend, _, device = backend_spec.partition(":")
        device = device or None
        nnet = pynnet3.read_nnet(ref / "realistic" / net / "model.txt")
        nnet.set_batchnorm_test_mode(False)
        nnet.set_dropout_test_mode(False)
        req = scaling_request(nnet, net, "train", n)
        rng = np.random.default_rng(0)
        inputs = {s.name: rng.standard_normal((len(s.indexes), nnet.input_dim(s.name)))
                  .astype(np.float32) for s in req.inputs}
        sup = _supervision(nnet, req, rng)
        step_ms, share, plain_ms = _bench(nnet, req, inputs, sup, args.reps, args.warmup,
                                          args.rounds, backend, device)
        kaldi = (scaling.get((net, n)) or {}).get("forward_backward_ms")
        rows.append([net, str(n), backend_spec, f"{step_ms:.1f}", f"{1e3 / step_ms:.2f}",
                     f"{plain_ms:.1f}", f"{100 * share:.0f}%",
                     "-" if kaldi is None else f"{kaldi:.1f}",
                     "-" if kaldi is None else f"{step_ms / kaldi:.2f}",
                     "-" if kaldi is None else f"{plain_ms / kaldi:.2f}"])
    print_table("train_step (1 BLAS thread; ms: mean of --reps steps after --warmup, "
                "fastest of --rounds)",
                ["network", "N", "backend", "step ms", "mb/s", "plain ms", "ng share",
                 "kaldi fb ms", "step/kaldi", "plain/kaldi"], rows,
                ["kaldi fb ms: scaling.json forward_backward_ms (forward + backward into a "
                 "gradient copy: no natural gradient, no update), another machine.",
                 "plain: the same trainer with every preconditioner switched off."])


if __name__ == "__main__":
    main()
