"""``pynnet3 compute``: Kaldi's nnet3-compute. Reads a model and a table of feature
matrices, runs the network over each utterance in chunks
(:class:`pynnet3.runtime.simple.DecodableNnetSimple`) and writes a table of output
matrices. The model is prepared as nnet3-compute does (BatchNorm and dropout in test
mode, then the network optimizer in place of Kaldi's CollapseModel); one
:class:`pynnet3.CachingCompiler` serves the whole run, so equal-size chunks compile
once. The output is written atomically (:class:`pynnet3.io.ark.TableWriter`).

A failed utterance (unreadable entry, empty features, missing iVector, wrong dim) is
reported as a warning and counted; the exit status is 1 only when no utterance
succeeded (then no output is written) or when the feature archive broke (the
utterances before the break are written, as they would be for a failed utterance).
The last line on stderr sums up the run.

With ``--looped=true`` each utterance is decoded by the looped computation instead
(:class:`pynnet3.runtime.looped.DecodableNnetLooped`, Kaldi's
DecodableNnetSimpleLooped as nnet3-latgen-faster-looped uses it): state is carried
from chunk to chunk and nothing is recomputed. The acoustic scale stays the CLI's
(1.0 by default, as nnet3-compute), not the library's 0.1.

``--batch-size=N`` (beyond nnet3-compute; default 32) holds utterances until they
have N chunks and runs equal-shaped chunks N at a time as the sequences of one
request (:mod:`pynnet3.runtime.batching`); the outputs equal the unbatched ones
up to float rounding. ``--batch-size=1`` runs one chunk at a time, as Kaldi. (On one
core, batching 32 chunks measured 3-4x the frames/s of one chunk at a time on the
compute-timing TDNN-F run: the per-command cost of the Python runtime is paid
once per 32 chunks.)
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, PynnetError
from ..gcpause import start_up_done
from .jobs import (
    add_run_flags,
    add_table_arguments,
    run_device,
    run_table_job,
    say,
)
from .kaldi_options import (
    add_debug_options,
    add_decoding_option_groups,
    bool_option,
    optimize_options_from_args,
)

DEFAULT_BATCH_SIZE = 32  # chunks per request (--batch-size)


def _say(kind: str, message: str) -> None:
    say("compute", kind, message)


def _load_model(args):
    """(network prepared for decoding, log priors or None)."""
    from ..graphopt import optimize_network
    from .files import read_model

    log_priors = None
    if args.use_priors:
        from .am import read_am_file

        am = read_am_file(args.model)
        nnet = am.nnet
        if am.priors.size:
            with np.errstate(divide="ignore"):
                log_priors = np.log(am.priors)
        else:
            _say("warning", "--use-priors=true, but the acoustic model has no priors: "
                            "nothing is subtracted")
    else:
        nnet = read_model(args.model)
    nnet.set_test_mode(True)  # (in place: the network was just read, nothing shares it)
    if args.network_optimize:
        from ..cache.caching_compiler import FEW_SEQUENCES, FEW_SEQUENCES_RULES
        from ..graphopt import NetworkOptions

        batch = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
        # (up to FEW_SEQUENCES chunks per request an LSTM's input product is taken
        # out of its steps: tdnn_lstm --batch-size=1 over compute-timing's
        # feats.ark 1.52-1.71 -> 1.20-1.37 s CPU; at 32 no gain)
        few = batch <= FEW_SEQUENCES and not args.looped
        nnet = optimize_network(nnet, NetworkOptions(
            enable_rules=FEW_SEQUENCES_RULES if few else ()))
    return nnet, log_priors


def _options(args):
    from ..runtime.simple import SimpleOptions

    return SimpleOptions(frames_per_chunk=args.frames_per_chunk,
                         extra_left_context=args.extra_left_context,
                         extra_right_context=args.extra_right_context,
                         extra_left_context_initial=args.extra_left_context_initial,
                         extra_right_context_final=args.extra_right_context_final,
                         frame_subsampling_factor=args.frame_subsampling_factor,
                         acoustic_scale=args.acoustic_scale)


def _looped_info(args, nnet, optimize):
    """The looped computation for ``--looped=true`` (compiled once for the run)."""
    from ..runtime.looped import LoopedDecodingInfo, LoopedOptions

    unused = [flag for flag, value in (("--extra-left-context", args.extra_left_context),
                                       ("--extra-right-context", args.extra_right_context),
                                       ("--extra-right-context-final",
                                        max(args.extra_right_context_final, 0)))
              if value]
    if unused:
        _say("note", f"{', '.join(unused)} not used by looped decoding (Kaldi's looped "
                     "decoder has only --extra-left-context-initial)")
    # The scale is applied here, after the priors, as nnet3-compute does: the looped
    # decoder itself runs at 1.0 (its own default would be Kaldi's 0.1).
    options = LoopedOptions(frames_per_chunk=args.frames_per_chunk,
                            frame_subsampling_factor=args.frame_subsampling_factor,
                            extra_left_context_initial=max(args.extra_left_context_initial, 0),
                            acoustic_scale=1.0, optimize=optimize)
    return LoopedDecodingInfo(nnet, options)


def _decode_looped(info, feats, log_priors, acoustic_scale: float, kwargs) -> np.ndarray:
    from ..runtime.looped import DecodableNnetLooped

    out = DecodableNnetLooped(info, feats, **kwargs).output()
    if log_priors is not None:
        out = out - log_priors
    if acoustic_scale != 1.0:
        out = out * out.dtype.type(acoustic_scale)
    return out


def _lookup_table(rspecifier: str, flag: str):
    """(the table of ``rspecifier`` by key, or None when not given; a note to add to
    "not available" errors). An scp is read lazily (a bad entry fails its utterance
    only); an archive is read whole, and when it breaks off, the entries before the
    break are kept: the utterances after it fail one by one, as a missing entry."""
    from ..io.ark import parse_specifier, random_access_table, read_table

    if not rspecifier:
        return None, ""
    if parse_specifier(rspecifier).kind == "scp":
        return random_access_table(rspecifier), ""
    table = {}
    try:
        for key, value in read_table(rspecifier):
            table[key] = value
    except FormatError as e:
        _say("warning", f"{flag}: {e}; the entries after the break are missing")
        return table, f" ({flag} broke off after {len(table)} entries)"
    return table, ""


def read_utt2spk(rspecifier: str) -> dict[str, str]:
    """Kaldi's token table (``ark:data/utt2spk``: lines ``UTT SPK``) as a dict, for
    nnet3-compute's --utt2spk; ``ark:-`` and ``'ark:command |'`` are read too."""
    from ..io.ark import parse_specifier
    from .files import read_bytes

    spec = parse_specifier(rspecifier)
    if spec.kind != "ark":
        raise PynnetError(f"--utt2spk: expected an archive of 'utterance speaker' lines, "
                          f"e.g. ark:data/utt2spk, got {rspecifier!r}")
    data, name = read_bytes(spec.targets[0])
    table: dict[str, str] = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if len(words) != 2:
            raise FormatError(f"line {number}: expected 'utterance speaker', got "
                              f"{line.strip()!r}", name)
        table[words[0]] = words[1]
    return table


def cmd_compute(args, stats: dict | None = None) -> int:
    """Run ``compute`` (``args`` from its parser); the exit status. ``stats`` receives
    the counts (:func:`pynnet3.cli.jobs.run_table_job`)."""
    from ..cache import CachingCompiler
    from ..runtime.simple import DecodableNnetSimple, fixed_frames_per_chunk, pads_at_end

    if args.ivectors and args.online_ivectors:
        raise PynnetError("give --ivectors or --online-ivectors, not both")
    if args.batch_size is not None and args.batch_size < 1:
        raise PynnetError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.jobs < 1:
        raise PynnetError(f"--jobs must be >= 1, got {args.jobs}")
    if args.jobs > 1 or args.ray_address:
        from .scaleout import run_scaled

        start_up_done()  # (the collector back on for the run)
        return run_scaled(args)
    backend, device = run_device(args, _say)
    options = _options(args)
    optimize = optimize_options_from_args(args)  # (--optimization.*)
    nnet, log_priors = _load_model(args)
    if args.looped:
        looped = _looped_info(args, nnet, optimize)
        fpc = looped.frames_per_chunk
    else:
        looped = None
        fpc = fixed_frames_per_chunk(nnet, options)
    start_up_done()  # (the console script's pause of the garbage collector ends here)
    if fpc != options.frames_per_chunk:
        _say("note", f"increasing --frames-per-chunk from {options.frames_per_chunk} to {fpc} "
                     f"to make it a multiple of --frame-subsampling-factor="
                     f"{options.frame_subsampling_factor} and the network's modulus")
    compiler = CachingCompiler(nnet, optimize=optimize)
    ivectors, iv_broken = _lookup_table(args.ivectors, "--ivectors")
    # (as Kaldi's RandomAccessBaseFloatVectorReaderMapped: used with --ivectors only)
    utt2spk = read_utt2spk(args.utt2spk) if args.utt2spk and args.ivectors else None
    online, online_broken = _lookup_table(args.online_ivectors, "--online-ivectors")

    def inputs(key: str, feats: np.ndarray) -> dict:
        if len(feats) == 0:
            raise PynnetError("zero-length utterance")
        kwargs = {}
        if ivectors is not None:
            speaker = key
            if utt2spk is not None:
                if key not in utt2spk:
                    raise PynnetError(f"utterance not in the --utt2spk map {args.utt2spk!r}")
                speaker = utt2spk[key]
            if speaker not in ivectors:
                raise PynnetError("no iVector available for this utterance"
                                  + (f" (speaker {speaker})" if speaker != key else "")
                                  + iv_broken)
            kwargs["ivector"] = ivectors[speaker]
        if online is not None:
            if key not in online:
                raise PynnetError("no online iVectors available for this utterance"
                                  + online_broken)
            kwargs["online_ivectors"] = online[key]
            kwargs["online_ivector_period"] = args.online_ivector_period
        return kwargs

    # a short last chunk computed full-size (the same rows where pads_at_end says so):
    # one computation for every chunk instead of one per last-chunk length
    pad = bool(args.pad_last_chunk and looped is None and pads_at_end(nnet))

    def process(key: str, feats: np.ndarray) -> np.ndarray:
        kwargs = inputs(key, feats)
        if looped is not None:
            out = _decode_looped(looped, feats, log_priors, args.acoustic_scale,
                                 dict(kwargs, backend=backend, device=device))
        else:
            out = DecodableNnetSimple(nnet, compiler, feats, options, log_priors=log_priors,
                                      pad_last_chunk=pad, backend=backend, device=device,
                                      **kwargs).output()
        return np.exp(out) if args.apply_exp else out

    def decodable(key: str, feats: np.ndarray):
        return DecodableNnetSimple(nnet, compiler, feats, options, log_priors=log_priors,
                                   pad_last_chunk=pad, backend=backend, device=device,
                                   **inputs(key, feats))

    batcher = None
    batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    if batch_size > 1 and looped is None:
        batcher = _Batcher(decodable, batch_size, args.apply_exp)
    elif args.batch_size is not None and args.batch_size > 1:
        _say("note", "--batch-size is not used with --looped=true (one utterance at a time)")
    rc = run_table_job("compute", args.features, args.output, process,
                       lambda: 1 if looped is not None else compiler.info()["misses"],
                       batcher=batcher, stats=stats)
    # a broken iVector archive fails the run as a broken feature archive does (the
    # utterances that had their iVector are written)
    if stats is not None:
        stats["ivectors_broken"] = bool(iv_broken or online_broken)
    return 1 if rc == 0 and (iv_broken or online_broken) else rc


class _Batcher:
    """``--batch-size=N`` (a batcher for :func:`run_table_job`): each utterance's
    chunks join a :class:`pynnet3.runtime.batching.ChunkQueue`, where equal-shaped
    chunks run N at a time as the sequences of one request; utterances come back in
    input order once all their chunks have run."""

    def __init__(self, decodable, batch_size: int, apply_exp: bool):
        from ..runtime.batching import ChunkQueue

        self.decodable, self.apply_exp = decodable, apply_exp
        self.queue = ChunkQueue(batch_size)

    def add(self, key: str, feats: np.ndarray) -> None:
        d = self.decodable(key, feats)
        plan = d.plan()  # (an utterance's bad input fails here, alone)
        self.queue.add(key, d, plan, len(feats))

    def full(self) -> bool:
        return self.queue.ready()

    def flush(self, final: bool = False) -> list:
        out = []
        for u in self.queue.step(final):
            value = u.error if u.error is not None else u.output()
            if u.error is None and self.apply_exp:
                value = np.exp(value)
            out.append((u.key, value, u.frames))
        return out


def add_compute_command(sub, command) -> None:
    """Add ``compute`` to the subparsers ``sub`` (``command`` makes one, as main.py's
    ``_command``)."""
    s = command(sub, "compute", "run a model over a table of features (like nnet3-compute)",
                "Run the network over every utterance of a feature table and write the\n"
                "output of its 'output' node, one matrix per utterance, as Kaldi's\n"
                "nnet3-compute does: chunks of --frames-per-chunk frames with the\n"
                "network's context plus the extra context, frames outside the utterance\n"
                "repeating the first/last frame, one output row every\n"
                "--frame-subsampling-factor frames. The model is prepared as nnet3-compute\n"
                "does (BatchNorm and dropout in test mode, then the network optimizer).\n"
                "Tables are Kaldi rspecifiers/wspecifiers: ark:f.ark, scp:f.scp,\n"
                "ark,t:f.txt, ark,scp:o.ark,o.scp, ark:- (stdin/stdout), 'ark:cmd |';\n"
                "compressed matrices are read. The output files are written to\n"
                "temporaries and renamed when the run ends, so a failed or killed run\n"
                "leaves no complete-looking output. Failed utterances are warned about\n"
                "and counted; the exit status is 1 when none succeeded. The last line on\n"
                "stderr gives utterances done and failed, frames and frames/s.\n\n"
                "example: pynnet3 compute --ivectors=scp:ivectors.scp final.mdl \\\n"
                "           scp:feats.scp ark,scp:out.ark,out.scp",
                usage="pynnet3 compute [options] MODEL FEATS-RSPECIFIER OUT-WSPECIFIER")
    add_table_arguments(s, "OUT-WSPECIFIER",
                        "where to write the outputs, e.g. ark:out.ark or "
                        "ark,scp:out.ark,out.scp")
    s.add_argument("--frames-per-chunk", dest="frames_per_chunk", type=int, default=50,
                   metavar="INT",
                   help="input frames per chunk; raised to a multiple of "
                        "--frame-subsampling-factor (default: 50)")
    s.add_argument("--extra-left-context", dest="extra_left_context", type=int, default=0,
                   metavar="INT",
                   help="extra left context for each chunk, beyond the network's "
                        "(default: 0)")
    s.add_argument("--extra-right-context", dest="extra_right_context", type=int, default=0,
                   metavar="INT",
                   help="extra right context for each chunk, beyond the network's "
                        "(default: 0)")
    s.add_argument("--extra-left-context-initial", dest="extra_left_context_initial",
                   type=int, default=-1, metavar="INT",
                   help="extra left context of the first chunk; -1 means as "
                        "--extra-left-context (default: -1)")
    s.add_argument("--extra-right-context-final", dest="extra_right_context_final",
                   type=int, default=-1, metavar="INT",
                   help="extra right context of the last chunk; -1 means as "
                        "--extra-right-context (default: -1)")
    s.add_argument("--frame-subsampling-factor", dest="frame_subsampling_factor", type=int,
                   default=1, metavar="INT",
                   help="one output row every this many input frames (3 for chain "
                        "models) (default: 1)")
    s.add_argument("--ivectors", default="", metavar="RSPECIFIER",
                   help="one iVector (vector) per utterance, e.g. scp:ivectors.scp "
                        "(default: none)")
    s.add_argument("--utt2spk", default="", metavar="RSPECIFIER",
                   help="with --ivectors: look iVectors up by speaker, the utterance's "
                        "speaker from this table (ark:data/utt2spk); an utterance not in "
                        "it fails (Kaldi's nnet3-compute stops the run) (default: none, "
                        "iVectors by utterance)")
    s.add_argument("--online-ivectors", dest="online_ivectors", default="",
                   metavar="RSPECIFIER",
                   help="online iVectors: a matrix per utterance, one row every "
                        "--online-ivector-period frames (default: none)")
    s.add_argument("--online-ivector-period", dest="online_ivector_period", type=int,
                   default=0, metavar="INT",
                   help="frames between rows of --online-ivectors (default: 0)")
    bool_option(s, "--apply-exp", False,
                "apply exp() to the output, e.g. to get posteriors from log-softmax "
                "(default: false)")
    s.add_argument("--acoustic-scale", dest="acoustic_scale", type=float, default=1.0,
                   metavar="FLOAT",
                   help="multiply the output by this (after the priors, before exp) "
                        "(default: 1.0)")
    bool_option(s, "--use-priors", False,
                "MODEL is a final.mdl: subtract the log of its priors from the output "
                "(default: false)")
    bool_option(s, "--looped", False,
                "decode each utterance with the looped computation (Kaldi's "
                "DecodableNnetSimpleLooped, as nnet3-latgen-faster-looped): state carried between "
                "chunks, no extra context but --extra-left-context-initial (-1 means 0 here); the "
                "--acoustic-scale default stays 1.0 (default: false)")
    add_run_flags(s, "nnet3-compute")
    s.add_argument("--batch-size", dest="batch_size", type=int, default=None, metavar="INT",
                   help="beyond nnet3-compute: run up to this many equal-sized chunks, "
                        "from several utterances, as the sequences of one computation; "
                        "outputs equal to --batch-size=1 (one chunk at a time, as Kaldi) "
                        "up to float rounding; not used with --looped=true "
                        f"(default: {DEFAULT_BATCH_SIZE})")
    bool_option(s, "--pad-last-chunk", True,
                "beyond nnet3-compute: compute a short last chunk full-size (frames past the end "
                "repeating the last one) and keep its real rows, when that gives the same rows: "
                "each output frame of the network needs a fixed set of input frames (only simple "
                "and TDNN components), or its recurrences run forward in time (IfDefined/Failover "
                "looking back, as an LSTM's); one computation for every chunk instead of one per "
                "last-chunk length; other networks compute it short, as Kaldi does (default: true)")
    add_debug_options(s)
    s.add_argument("--jobs", type=int, default=1, metavar="INT",
                   help="split the scp of FEATS-RSPECIFIER as split_scp.pl does and run "
                        "this many workers on a local Ray cluster (127.0.0.1, stopped at "
                        "the end), one thread each; worker k writes the shard OUT.k.ark / "
                        "OUT.k.scp; then ark,scp:OUT.ark,OUT.scp gets an OUT.scp listing "
                        "every utterance in input order (pointing into the shards), and "
                        "ark:OUT.ark the shards concatenated; outputs equal a "
                        "single-process run's; needs pip install 'pynnet3[ray]' "
                        "(default: 1)")
    s.add_argument("--ray-address", dest="ray_address", default="", metavar="ADDRESS",
                   help="run the --jobs workers on this existing Ray cluster (its workers "
                        "must see the same files); --jobs=1 means one per CPU of the "
                        "cluster (default: none)")
    bool_option(s, "--resume", False,
                "with --jobs / --ray-address: skip the shards that a previous run with the same "
                "model, options and utterances finished (default: false)")
    add_decoding_option_groups(s)
    s.set_defaults(fn=cmd_compute)
