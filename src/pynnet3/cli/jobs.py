"""What the long-running archive commands (compute, xvector-compute) share: their
arguments and run flags (add_table_arguments, add_run_flags), the utterance loop
over a feature table (run_table_job), the progress display, SIGTERM handling, the
choice of backend from --use-gpu / --backend and the BLAS threads from
--num-threads (run_device)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..errors import PynnetError
from .kaldi_options import bool_option

USE_GPU_CHOICES = ("yes", "no", "optional", "wait")
BACKEND_CHOICES = ("numpy", "torch")


# (what a user sets to choose BLAS / OpenMP threads; any of them set: their choice stands)
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def add_thread_flag(s) -> None:
    """--num-threads on the subparser ``s`` (see :func:`apply_num_threads`)."""
    s.add_argument("--num-threads", dest="num_threads", type=int, default=None,
                   metavar="INT",
                   help="threads of the CPU's matrix products (NumPy's OpenBLAS, torch); "
                        "default 1, as Kaldi's CPU jobs run (scale out with --jobs or "
                        "more processes), unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS "
                        "is set; 0: the library's own default (one per core)")


def apply_num_threads(num_threads: int | None, backend: str = "numpy",
                      device: str | None = None) -> int | None:
    """Set the CPU's BLAS threads for this process: ``num_threads`` (> 0), the
    library's default (0), or, when None, 1 unless one of
    :data:`THREAD_VARIABLES` is set (then nothing changes). Why 1: Kaldi's CPU
    decoding and training run one thread per job and many jobs per machine; on
    cores other processes also use, OpenBLAS's threads wait on each other (a
    150-frame decode measured 3 ms with one thread, 140-400 ms with two on two
    busy cores). Returns the thread count set, or None (left as it was)."""
    if num_threads is not None and num_threads < 0:
        raise PynnetError(f"--num-threads must be >= 0, got {num_threads}")
    if num_threads == 0 or (num_threads is None
                            and any(os.environ.get(v) for v in THREAD_VARIABLES)):
        return None
    n = 1 if num_threads is None else num_threads
    from ..components import blas

    blas.set_num_threads(n)
    if backend == "torch" and device in (None, "cpu"):
        import torch

        torch.set_num_threads(n)
    return n


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def add_device_flags(s) -> None:
    """--use-gpu (Kaldi's values) and --backend on the subparser ``s``."""
    s.add_argument("--use-gpu", dest="use_gpu", choices=USE_GPU_CHOICES, default="no",
                   metavar="yes|no|optional|wait",
                   help="as Kaldi: yes/wait run on a CUDA device (an error without one), "
                        "optional on one when there is one, no on the CPU; the GPU runs "
                        "on the torch backend (default: no)")
    add_backend_flag(s)


def add_backend_flag(s: argparse.ArgumentParser) -> None:
    """--backend (the CPU's: numpy or torch) on the subparser ``s``."""
    s.add_argument("--backend", choices=BACKEND_CHOICES, default="numpy",
                   help="beyond Kaldi: the backend on the CPU, numpy or torch "
                        "(default: numpy)")


def add_table_arguments(s: argparse.ArgumentParser, output_metavar: str, output_help: str
                        ) -> None:
    """MODEL FEATS-RSPECIFIER OUTPUT, the arguments of a command that runs a model over
    a table of features (compute, xvector-compute); ``output_metavar`` and
    ``output_help`` say what it writes."""
    s.add_argument("model", metavar="MODEL",
                   help="model: Kaldi nnet3 (raw) or final.mdl, text or binary (detected); "
                        "'-' reads stdin")
    s.add_argument("features", metavar="FEATS-RSPECIFIER",
                   help="feature matrices to read, e.g. scp:feats.scp or ark:feats.ark")
    s.add_argument("output", metavar=output_metavar, help=output_help)


def add_run_flags(s: argparse.ArgumentParser, program: str) -> None:
    """--use-gpu, --backend, --num-threads and --network-optimize on the subparser
    ``s``: where and how a table command runs its model (``program``, in the help of
    --network-optimize, is the Kaldi program whose CollapseModel it stands in for)."""
    add_device_flags(s)
    add_thread_flag(s)
    bool_option(s, "--network-optimize", True,
                f"run the network optimizer on the model first, as {program} runs "
                "CollapseModel; outputs equal up to float rounding (default: true)")


def run_device(args: argparse.Namespace, say: Callable[[str, str], None]
               ) -> tuple[str, str | None]:
    """(backend, device) of ``args.use_gpu`` and ``args.backend``
    (:func:`choose_backend`), with the CPU's BLAS threads of ``args.num_threads``
    set for it (:func:`apply_num_threads`)."""
    backend, device = choose_backend(args.use_gpu, args.backend, say)
    apply_num_threads(args.num_threads, backend, device)
    return backend, device


def choose_backend(use_gpu: str, backend: str, say: Callable[[str, str], None]
                   ) -> tuple[str, str | None]:
    """(backend, device) for a run, Kaldi's --use-gpu semantics on the torch backend:
    ``yes`` / ``wait`` need a CUDA device (PynnetError without one, as Kaldi stops
    with "no CUDA GPU detected"); ``optional`` takes one when there is one, else
    the CPU with a note; ``no``: the CPU. On the CPU ``backend`` picks NumPy (the
    default) or torch. ``say(kind, message)`` prints notes."""
    if use_gpu not in USE_GPU_CHOICES:
        raise PynnetError(f"--use-gpu must be one of {', '.join(USE_GPU_CHOICES)}, "
                          f"got {use_gpu!r}")
    if backend not in BACKEND_CHOICES:
        raise PynnetError(f"--backend must be one of {', '.join(BACKEND_CHOICES)}, "
                          f"got {backend!r}")
    if use_gpu != "no":
        if cuda_available():
            return "torch", "cuda"
        if use_gpu in ("yes", "wait"):
            raise PynnetError(f"--use-gpu={use_gpu}: no CUDA device is available (the GPU "
                              "runs on the torch backend: pip install 'pynnet3[torch]' "
                              "with a CUDA build of torch); --use-gpu=no runs on the CPU")
        say("note", "--use-gpu=optional: no CUDA device is available; running on the CPU")
    if backend == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise PynnetError("--backend=torch needs PyTorch: pip install 'pynnet3[torch]'"
                              ) from None
        return "torch", "cpu"
    return "numpy", None


class Progress:
    """Utterances done, on stderr when it is a terminal (tqdm when installed)."""

    def __init__(self, total: int | None):
        self.bar = None
        self.count = 0
        self.active = sys.stderr is not None and sys.stderr.isatty()  # (None: fd 2 closed)
        if self.active:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="utt", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def update(self, key: str) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.active:
            sys.stderr.write(f"\r{self.count} utterances ({key})\x1b[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.active and self.count:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class Terminated(KeyboardInterrupt):
    """SIGTERM: the run stops as on Ctrl-C (the output temporaries are removed)."""


def on_sigterm(signum, frame):
    """SIGTERM handler: stop the run as Ctrl-C does."""
    raise Terminated


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (a KeyboardInterrupt), so a
    run's ``except KeyboardInterrupt`` cleans up on it as on Ctrl-C; the previous
    handler is put back on leaving. Outside the main thread, where handlers cannot
    be set, nothing changes."""
    try:
        old = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # (not the main thread)
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def stopped(e: KeyboardInterrupt) -> tuple[str, int]:
    """How a run was stopped, and the exit status that says so: SIGTERM
    (:class:`Terminated`) is ("terminated", 143), Ctrl-C ("interrupted", 130)."""
    return ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)


def say(command: str, kind: str, message: str) -> None:
    """One line on stderr: ``pynnet3 COMMAND: KIND: message``."""
    if sys.stderr is None:  # (fd 2 closed at start: print(file=None) would write to
        return  # stdout, into an archive written there)
    print(f"pynnet3 {command}: {kind}: {message}", file=sys.stderr)


class OneByOne:
    """The plain batcher of :func:`run_table_job`: each utterance processed alone,
    as soon as it is read."""

    def __init__(self, process: Callable[[str, np.ndarray], np.ndarray]):
        self.process = process
        self.pending: list[tuple[str, np.ndarray]] = []

    def add(self, key: str, feats: np.ndarray) -> None:
        self.pending.append((key, feats))

    def full(self) -> bool:
        return True

    def flush(self, final: bool = False) -> list[tuple[str, np.ndarray | PynnetError, int]]:
        out = []
        for key, feats in self.pending:
            try:
                out.append((key, self.process(key, feats), len(feats)))
            except PynnetError as e:
                out.append((key, e, len(feats)))
        self.pending = []
        return out


def run_table_job(command: str, features: str, output: str,
                  process: Callable[[str, np.ndarray], np.ndarray] | None,
                  compiled: Callable[[], int], batcher=None, stats: dict | None = None
                  ) -> int:
    """Read the feature table ``features``, write ``process(key, feats)`` per
    utterance to the wspecifier ``output`` (atomically), and return the exit status.

    ``batcher`` (instead of ``process``) groups utterances: ``add(key, feats)``
    takes one (a pynnet3 error: that utterance failed), ``full()`` says when to
    ``flush()``, which returns ``(key, output or pynnet3 error, frames)`` for
    utterances finished since the last flush, in the order they were added (so the
    output keeps the input order); ``flush(final=True)`` at the end finishes all.

    Kaldi's habits: an utterance whose processing raises a pynnet3 error is
    warned about and counted, the others go on; the run fails (1) when nothing
    succeeded -- then nothing is written -- or when the table broke off; SIGTERM /
    Ctrl-C remove the output temporaries (143 / 130). A summary line ends the run
    (``compiled()``: computations compiled). ``stats``, when given, receives the
    counts (done, failed, frames, seconds, broken)."""
    from ..io.ark import TableEntryError, TableWriter, read_table

    if batcher is None:
        batcher = OneByOne(process)
    done = failed = frames = 0
    broken = False
    start = time.perf_counter()
    progress = Progress(None)

    def write_out(writer, final: bool = False) -> None:
        nonlocal done, failed, frames
        for key, out, num_frames in batcher.flush(final):
            if isinstance(out, PynnetError):
                say(command, "warning", f"utterance {key}: {out}")
                failed += 1
                continue
            writer.write(key, out)
            done += 1
            frames += num_frames
            progress.update(key)

    with sigterm_stops():
        try:
            with TableWriter(output) as writer:
                entries = read_table(features)
                while True:
                    try:
                        key, feats = next(entries)
                    except StopIteration:
                        break
                    except PynnetError as e:
                        say(command, "error", f"reading the features stopped: {e}")
                        broken = True
                        break
                    try:
                        if isinstance(feats, TableEntryError):
                            raise PynnetError(feats.message)
                        batcher.add(key, feats)
                    except PynnetError as e:
                        say(command, "warning", f"utterance {key}: {e}")
                        failed += 1
                        continue
                    if batcher.full():
                        write_out(writer)
                write_out(writer, final=True)
                if not done:  # nothing succeeded: leave no output that looks like a result
                    writer.abort()
        except KeyboardInterrupt as e:
            progress.close()
            how, status = stopped(e)
            say(command, "error", f"{how} after {done} utterances; no output written")
            return status
        finally:
            progress.close()
    seconds = time.perf_counter() - start
    if stats is not None:
        stats.update(done=done, failed=failed, frames=frames, seconds=seconds, broken=broken)
    rate = frames / seconds if seconds > 0 else 0.0
    say(command, "summary", f"done {done} utterances, failed {failed}; {frames} frames in "
                            f"{seconds:.2f}s ({rate:.0f} frames/s); compiled {compiled()} "
                            "computations")
    return 0 if done and not broken else 1
