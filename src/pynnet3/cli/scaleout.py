"""``pynnet3 compute --jobs=J`` / ``--ray-address=ADDR``: one compute run split over
Ray workers, as Kaldi recipes split a job with ``split_scp.pl`` and ``run.pl``.

The features must be an scp. Its lines are split as ``split_scp.pl`` splits them
(contiguous pieces; the first ``lines % J`` pieces one line longer), and worker ``k``
(1-based, Kaldi's JOB) runs the ordinary single-process compute on piece ``k``,
writing its own shard ``OUT.k.ark`` / ``OUT.k.scp`` atomically and then a marker
``OUT.k.ark.done`` (JSON: a fingerprint of the piece, the model and the options,
and the counts). When every shard is done:

- ``ark,scp:OUT.ark,OUT.scp``: ``OUT.scp`` is written (atomically), the shards'
  scps one after the other, so it lists every utterance in input order; the shard
  archives are the data (``OUT.ark`` itself is not written).
- ``ark:OUT.ark`` (or ``ark:-``): the shard archives are concatenated, in order,
  into ``OUT.ark`` -- the bytes a single-process run writes -- and the shards removed.

Every worker runs the same code on the same utterances, so the outputs equal a
single-process run's. ``--resume=true`` skips a shard whose marker matches its
fingerprint. A run that fails or is interrupted writes no final output; finished
shards stay for ``--resume``. ``--jobs=J`` starts a local Ray cluster bound to
127.0.0.1 with J CPUs and stops it at the end; ``--ray-address`` uses an existing
cluster (whose workers must see the same files at the same paths). Ray is the
optional extra ``pynnet3[ray]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from ..errors import DependencyError, FormatError, PynnetError
from .jobs import Terminated, say, sigterm_stops, stopped

# the workers decode on one thread each, like Kaldi's jobs (queue.pl/run.pl with nj)
_ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                      "MKL_NUM_THREADS")}
# options that say how the run is spread, not what it computes
_NOT_FINGERPRINTED = ("fn", "features", "output", "jobs", "ray_address", "resume",
                      # (Kaldi's options that change no output; --config's lines are
                      # in the options they set)
                      "kaldi_config", "print_args", "verbose", "debug_computation",
                      "computation_debug", "cuda_use_tensor_cores", "cuda_use_tf32_compute")


def split_scp(lines: list[str], num_parts: int) -> list[list[str]]:
    """Kaldi's ``split_scp.pl`` (without ``--utt2spk``): ``num_parts`` contiguous
    pieces, the first ``len(lines) % num_parts`` of them one line longer. Fewer
    lines than pieces is an error, as there."""
    if num_parts < 1:
        raise PynnetError(f"--jobs must be >= 1, got {num_parts}")
    per, extra = divmod(len(lines), num_parts)
    if per < 1:
        raise PynnetError(f"splitting {len(lines)} utterances into {num_parts} jobs: too "
                          "many pieces (reduce --jobs)")
    pieces, at = [], 0
    for k in range(num_parts):
        size = per + (1 if k < extra else 0)
        pieces.append(lines[at:at + size])
        at += size
    return pieces


def _scp_lines(rspecifier: str) -> tuple[list[str], str]:
    """The non-blank lines of the scp of ``rspecifier`` and its option letters."""
    import kaldiio

    from ..io.ark import parse_specifier

    spec = parse_specifier(rspecifier)
    if spec.kind != "scp":
        raise PynnetError(f"--jobs / --ray-address split an scp: the features must be "
                          f"'scp:...', got {rspecifier!r}")
    try:
        with kaldiio.utils.open_like_kaldi(spec.targets[0], "r") as f:
            lines = [line.strip() + "\n" for line in f.read().splitlines() if line.strip()]
    except OSError as e:
        raise FormatError(f"cannot open {spec.targets[0]!r}: {e.strerror or e}",
                          rspecifier) from None
    return lines, ",".join(sorted(spec.options))


def _shard_name(path: str, k: int) -> str:
    """``out.ark`` -> ``out.3.ark`` (Kaldi's ``output.JOB.ark``)."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{k}{p.suffix}")) if p.suffix else f"{path}.{k}"


def _fingerprint(options: dict, lines: list[str], k: int, jobs: int) -> str:
    model = options.get("model", "")
    try:
        st = os.stat(model)
        model_id = [model, st.st_size, st.st_mtime_ns]
    except OSError:
        model_id = [model]
    kept = {key: value for key, value in sorted(options.items())
            if key not in _NOT_FINGERPRINTED}
    text = json.dumps([kept, model_id, k, jobs, lines], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _marker_matches(marker: str, fingerprint: str, ark: str, scp: str) -> dict | None:
    try:
        info = json.loads(Path(marker).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("fingerprint") != fingerprint:
        return None
    if info.get("done") and not (os.path.exists(ark) and os.path.exists(scp)):
        return None
    return info


def run_shard(options: dict, cwd: str, lines: list[str], scp_options: str, ark: str,
              scp: str, marker: str, fingerprint: str) -> dict:
    """One worker's job (a Ray task): the single-process compute over ``lines``
    into the shard ``ark`` / ``scp``, then the ``marker``. Returns the counts, and
    ``error`` when the shard failed."""
    from ..io.atomic import atomic_write
    from .compute import cmd_compute

    os.chdir(cwd)  # (scp entries and rspecifiers are relative to the caller's folder)
    fd, piece = tempfile.mkstemp(suffix=".scp", prefix="pynnet3-shard-")
    stats: dict = {}
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
        args = argparse.Namespace(**options)
        args.jobs, args.ray_address, args.resume = 1, "", False
        args.features = f"{','.join(filter(None, ['scp', scp_options]))}:{piece}"
        text = ",t" if options.get("_text_output") else ""
        args.output = f"ark,scp{text}:{ark},{scp}"
        try:
            rc = cmd_compute(args, stats=stats)
        except (PynnetError, OSError) as e:  # (as main() reports them: one line)
            return {"error": str(e)}
    finally:
        os.unlink(piece)
    if rc not in (0, 1) or not stats:  # (interrupted or terminated: no counts)
        return {**stats, "error": f"the job stopped (exit status {rc})"}
    if stats.get("broken") or stats.get("ivectors_broken"):
        return {**stats, "error": "a feature or iVector archive broke off (see the job's "
                                  "messages above)"}
    # (exit status 0, or 1 with every utterance failed and counted: the shard is done)
    stats["fingerprint"] = fingerprint
    atomic_write(marker, json.dumps(stats).encode())
    return stats


def _loopback(address: str) -> bool:
    """Whether ``--ray-address`` is empty (our own cluster) or names this host's
    loopback (a cluster started with the same setting)."""
    host = address.rsplit(":", 1)[0].strip("[]") if address else ""
    return not address or host in ("localhost", "::1") or host.startswith("127.")


def _ray(loopback: bool):
    """The ray module. ``loopback``: the cluster is (or will be) on 127.0.0.1 only.
    Ray on Linux resolves 127.0.0.1 to the host's address and listens on every
    interface unless its "cluster mode" is off, which it reads when imported -- so
    it is turned off here before the first import (the cluster's processes inherit
    the setting; a driver in cluster mode cannot join such a cluster)."""
    if loopback and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # (loopback only)
    try:
        import ray
    except ImportError:
        raise DependencyError("--jobs and --ray-address run on Ray, which is not "
                              "installed: pip install 'pynnet3[ray]'") from None
    return ray


def _concatenate(parts: list[str], target: str) -> None:
    """The archives ``parts`` one after the other into ``target`` (``-``: stdout),
    through a temporary renamed into place."""
    import shutil

    from ..io.atomic import _host, remove_stale_temporaries, temp_prefix

    if target == "-":
        out = sys.stdout.buffer
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
        out.flush()
        return
    remove_stale_temporaries(target)
    p = Path(target)
    tmp = p.with_name(f"{temp_prefix(p)}{_host()}-{os.getpid()}-concat")
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _connect(ray, args, state: dict) -> None:
    """Start or join the cluster; ``state["owns"]`` is set when this run must shut
    it down again (a caller that already runs a Ray driver keeps its connection).
    Ctrl-C / SIGTERM wait until the cluster is up (a start cut short leaves Ray's
    processes half-made), then stop the run as usual."""
    import logging

    if ray.is_initialized():
        return
    caught: list[int] = []
    # (handlers, not a blocked mask: Ray's processes must not inherit blocked signals)
    try:
        saved = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                 for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # (not the main thread)
        saved = {}
    try:
        if args.ray_address:
            ray.init(address=args.ray_address, logging_level=logging.WARNING)
        else:
            # the cluster's processes (and so its workers) inherit one BLAS thread:
            # no per-task runtime_env, so Ray's prestarted workers serve at once
            kept = {name: os.environ.get(name) for name in _ONE_THREAD}
            os.environ.update(_ONE_THREAD)
            try:
                ray.init(address="local", num_cpus=args.jobs, include_dashboard=False,
                         _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
            finally:
                for name, value in kept.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            state["local"] = True
        state["owns"] = True
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if signal.SIGTERM in caught:
        raise Terminated
    if caught:
        raise KeyboardInterrupt


def run_scaled(args) -> int:
    """``compute`` over Ray workers (module doc); the exit status."""
    from ..io.ark import parse_specifier
    from ..io.atomic import atomic_write

    ray = _ray(loopback=_loopback(args.ray_address))
    lines, scp_options = _scp_lines(args.features)
    out = parse_specifier(args.output, write=True)
    ark_target = out.targets[0]
    if ark_target.endswith("|") or ark_target.startswith("|") or (
            ark_target == "-" and out.kind != "ark"):
        raise PynnetError(f"--jobs / --ray-address write shards beside the output: "
                          f"{args.output!r} must name files (ark:OUT.ark or "
                          "ark,scp:OUT.ark,OUT.scp, or ark:-)")
    options = {k: v for k, v in vars(args).items() if k != "fn"}
    options["_text_output"] = out.is_text
    base = ark_target if ark_target != "-" else "compute-output.ark"
    scp_base = out.targets[1] if out.kind == "ark,scp" else str(Path(base).with_suffix(".scp"))
    start = time.perf_counter()
    state = {"owns": False}
    results: dict[int, object] = {}
    with sigterm_stops():
        try:
            jobs = args.jobs
            if jobs <= 1:  # (--ray-address alone: one job per CPU of the cluster)
                _connect(ray, args, state)
                jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
            pieces = split_scp(lines, jobs)
            shards, todo = [], []
            for k, piece in enumerate(pieces, 1):
                ark, scp = _shard_name(base, k), _shard_name(scp_base, k)
                marker, fp = ark + ".done", _fingerprint(options, piece, k, jobs)
                shards.append((ark, scp, marker))
                info = _marker_matches(marker, fp, ark, scp) if args.resume else None
                if info is not None:
                    results[k] = info
                else:
                    todo.append((k, (options, os.getcwd(), piece, scp_options, ark, scp,
                                     marker, fp)))
            resumed = len(pieces) - len(todo)
            if todo:  # (nothing left to do: no cluster started)
                _connect(ray, args, state)
                task = ray.remote(num_cpus=1)(run_shard)
                if not state.get("local"):
                    task = task.options(runtime_env={"env_vars": _ONE_THREAD})
                refs = {k: task.remote(*task_args) for k, task_args in todo}
                for k, ref in refs.items():
                    try:
                        results[k] = ray.get(ref)
                    except Exception as e:  # (a worker that crashed or was killed)
                        results[k] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        except KeyboardInterrupt as e:
            how, status = stopped(e)
            say("compute", "error", f"{how}; no final output written (finished shards are "
                                    "kept for --resume=true)")
            return status
        finally:
            if state["owns"] and ray.is_initialized():
                ray.shutdown()
    results = dict(sorted(results.items()))
    errors = [(k, r["error"]) for k, r in results.items() if "error" in r]
    for k, message in errors:
        say("compute", "error", f"job {k} of {jobs} failed: {message}")
    done = sum(r.get("done", 0) for r in results.values())
    failed = sum(r.get("failed", 0) for r in results.values())
    frames = sum(r.get("frames", 0) for r in results.values())
    if errors or not done:
        say("compute", "error", f"no final output written ({len(errors)} of {jobs} jobs "
                                f"failed, {done} utterances done); finished shards are kept "
                                "for --resume=true")
        return 1
    written = [k for k in results if results[k].get("done")]
    if out.kind == "ark,scp":
        text = b"".join(Path(shards[k - 1][1]).read_bytes() for k in written)
        atomic_write(out.targets[1], text)
    else:
        _concatenate([shards[k - 1][0] for k in written], ark_target)
        for ark, scp, marker in shards:
            for path in (ark, scp, marker):
                Path(path).unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    say("compute", "summary", f"done {done} utterances, failed {failed}; {frames} frames in "
                              f"{seconds:.2f}s ({frames / max(seconds, 1e-9):.0f} frames/s); "
                              f"{jobs} jobs on Ray ({resumed} resumed)")
    return 0
