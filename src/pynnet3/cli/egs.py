"""``pynnet3 merge-egs``: Kaldi's nnet3-merge-egs (examples merged into minibatches).

Reads an examples table (rspecifier), merges examples of the same structure into
minibatches of ``--minibatch-size`` (Kaldi's rule syntax) and writes them
(wspecifier, atomically) as ``merged-<count>-<size>``; the statistics lines Kaldi
prints end the run on stderr.
"""

from __future__ import annotations

from .jobs import sigterm_stops, stopped
from .kaldi_options import add_standard_options, bool_option, kaldi_log


def _log(message: str, level: str = "LOG") -> None:
    kaldi_log("merge-egs", level, message)


def _cmd_merge_egs(args) -> int:
    from ..io.egs import ExampleWriter, read_examples
    from ..io.egs_merge import ExampleMerger

    for flag in ("measure_output_frames", "discard_partial_minibatches"):
        if getattr(args, flag) is not None:
            _log(f"the --{flag.replace('_', '-')} option is deprecated and will be ignored "
                 "(as in Kaldi).", "WARNING")
    merger = ExampleMerger(args.minibatch_size, compress=args.compress)
    num_read = 0
    with sigterm_stops():
        try:
            with ExampleWriter(args.egs_wspecifier) as writer:
                for _, eg in read_examples(args.egs_rspecifier):
                    num_read += 1
                    for key, merged in merger.accept(eg):
                        writer.write(key, merged)
                for key, merged in merger.finish():
                    writer.write(key, merged)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the writer removed its output
            how, status = stopped(e)
            _log(f"{how} after {num_read} examples; no output written", "ERROR")
            return status
    for line in merger.stats_lines():
        _log(line)
    return 0 if merger.num_written else 1


def add_egs_commands(sub, command) -> None:
    """Add ``merge-egs`` to the subparsers ``sub`` (``command`` makes one, as
    main.py's ``_command``)."""
    s = command(sub, "merge-egs", "merge examples into minibatches (like nnet3-merge-egs)",
                "Merge Kaldi nnet3 examples (NnetExample archives, egs.*.ark) into\n"
                "minibatches, as Kaldi's nnet3-merge-egs does: examples with the same\n"
                "structure (names, indexes, sizes) are grouped; example i of a minibatch\n"
                "gets n = i (an already-merged one of S sequences n + i*S, so minibatches\n"
                "merge again); compressed and full features become one full matrix, sparse\n"
                "supervision stays sparse. Output keys are merged-<count>-<size>.\n"
                "Exit status 1 when no minibatch was written.")
    s.add_argument("egs_rspecifier", metavar="EGS-RSPECIFIER",
                   help="examples to read: ark:egs.ark, scp:egs.scp, ark:- or "
                        "'ark:gunzip -c egs.ark.gz |'")
    s.add_argument("egs_wspecifier", metavar="EGS-WSPECIFIER",
                   help="where to write the minibatches: ark:out.ark, ark,t:out.txt, "
                        "ark,scp:out.ark,out.scp or ark:-")
    s.add_argument("--minibatch-size", dest="minibatch_size", default="256", metavar="RULES",
                   help="examples per minibatch, Kaldi's syntax: an integer (128), a list of "
                        "sizes and ranges (64,128 or 16:32,64,128), or rules per example size "
                        "(128=64:128/256=32:64): the rule of the nearest example size is "
                        "used; at the end of the input the largest allowed size that fits "
                        "is used and the rest discarded (default: 256)")
    bool_option(s, "--compress", False,
                "compress the merged full matrices with Kaldi's automatic method (default: false)")
    s.add_argument("--measure-output-frames", dest="measure_output_frames", default=None,
                   metavar="BOOL", help="deprecated in Kaldi; accepted and ignored")
    s.add_argument("--discard-partial-minibatches", dest="discard_partial_minibatches",
                   default=None, metavar="BOOL", help="deprecated in Kaldi; accepted and ignored")
    bool_option(s, "--multilingual-eg", False,
                "accepted; as in Kaldi's nnet3-merge-egs it changes nothing (only "
                "nnet3-chain-merge-egs names minibatches by language) (default: false)")
    add_standard_options(s)
    s.set_defaults(fn=_cmd_merge_egs)
