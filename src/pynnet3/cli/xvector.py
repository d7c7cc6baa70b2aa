"""``pynnet3 xvector-compute``: Kaldi's nnet3-xvector-compute. Reads a model and a
table of feature matrices and writes one vector per utterance: the output of the
network's ``output`` node at t = 0 for chunks of the utterance, averaged.

As the Kaldi program does: the model gets BatchNorm and dropout test modes, then the
network optimizer (in place of CollapseModel); one :class:`pynnet3.CachingCompiler`
(``--cache-capacity`` entries) serves the run. An utterance of N frames is cut into
chunks of ``--chunk-size`` frames (N when it is -1 or larger than N) starting at 0,
the last one shorter; a chunk shorter than ``--min-chunk-size`` is padded to that
size with copies of its first frame before it ((min - len) // 2 of them) and of its
last frame after it, or with ``--pad-input=false`` left out. Each chunk is one
computation (``input`` at t = 0 .. len-1, ``output`` at t = 0); the x-vector is the
average of the chunk outputs weighted by their unpadded lengths.

Failed utterances are warned about and counted as in ``compute``; the exit status is
1 when none succeeded (then no output is written) or the feature archive broke. The
output is written atomically; the last line on stderr sums up the run.
"""

from __future__ import annotations

import numpy as np

from ..errors import PynnetError
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
    caching_compiler_from_args,
)


def _say(kind: str, message: str) -> None:
    say("xvector-compute", kind, message)


def xvector_chunks(num_frames: int, chunk_size: int, min_chunk_size: int,
                   pad_input: bool) -> list[tuple[int, int]]:
    """(start, frames) of the chunks nnet3-xvector-compute computes for an utterance
    of ``num_frames`` frames (chunks shorter than ``min_chunk_size`` are kept only
    with ``pad_input``)."""
    this_chunk = num_frames if chunk_size <= 0 or num_frames < chunk_size else chunk_size
    chunks = []
    for start in range(0, num_frames, this_chunk):
        frames = min(this_chunk, num_frames - start)
        if frames < min_chunk_size and not pad_input:
            continue
        chunks.append((start, frames))
    return chunks


def pad_chunk(chunk: np.ndarray, min_chunk_size: int) -> np.ndarray:
    """``chunk`` padded to ``min_chunk_size`` rows as nnet3-xvector-compute pads:
    (min - len) // 2 copies of the first row before it, the rest copies of the last
    row after it. A chunk that is long enough is returned as it is."""
    n = len(chunk)
    if n >= min_chunk_size:
        return chunk
    left = (min_chunk_size - n) // 2
    rows = np.clip(np.arange(-left, min_chunk_size - left), 0, n - 1)
    return chunk[rows]


def _request(num_frames: int):
    from ..compiler.request import ComputationRequest, IoSpecification

    t = np.arange(num_frames, dtype=np.int64)
    zeros = np.zeros_like(t)
    return ComputationRequest(
        inputs=[IoSpecification("input", np.stack([zeros, t, zeros], axis=1))],
        outputs=[IoSpecification("output", np.zeros((1, 3), dtype=np.int64))])


def compute_xvector(nnet, compiler, feats: np.ndarray, chunk_size: int = -1,
                    min_chunk_size: int = 100, pad_input: bool = True,
                    backend: str = "numpy", device=None) -> np.ndarray:
    """The x-vector of one utterance (module doc): the chunk outputs averaged with
    their unpadded lengths as weights, in float32 as Kaldi does; computed on
    ``backend`` / ``device``, returned as a NumPy vector."""
    from ..runtime.computer import NnetComputer

    feats = np.asarray(feats, dtype=np.float32)
    in_dim = nnet.input_dim("input")
    if feats.ndim != 2 or feats.shape[1] != in_dim:
        raise PynnetError(f"features: expected a (frames, {in_dim}) matrix, got shape "
                          f"{feats.shape}")
    if len(feats) == 0:
        raise PynnetError("zero-length utterance")
    if not pad_input and len(feats) < min_chunk_size:
        raise PynnetError(f"--min-chunk-size={min_chunk_size} is greater than the number "
                          f"of frames ({len(feats)}) and --pad-input=false")
    total = np.zeros(nnet.output_dim("output"), dtype=np.float32)
    weight = 0
    for start, frames in xvector_chunks(len(feats), chunk_size, min_chunk_size, pad_input):
        chunk = pad_chunk(feats[start:start + frames], min_chunk_size if pad_input else 0)
        computation = compiler.compile(_request(len(chunk)))
        # (a cache's computation: shared and never modified, so its commands are
        # prepared once, and bound to kept buffers when its length recurs)
        computer = NnetComputer(nnet, computation, backend, device=device,
                                cache_program=True)
        out = computer.backend.to_numpy(computer.run({"input": chunk}).outputs["output"])
        total += np.float32(frames) * out[0].astype(np.float32)
        weight += frames
    if weight == 0:
        raise PynnetError("no chunk of --min-chunk-size frames or more")
    return total * np.float32(1.0 / weight)


def cmd_xvector_compute(args) -> int:
    from ..graphopt import optimize_network
    from .files import read_model

    backend, device = run_device(args, _say)
    if args.min_chunk_size <= 0:
        raise PynnetError(f"--min-chunk-size must be positive, got {args.min_chunk_size}")
    nnet = read_model(args.model).copy()
    nnet.set_test_mode(True)
    if args.network_optimize:
        nnet = optimize_network(nnet)
    compiler = caching_compiler_from_args(nnet, args)
    for flag, value in (("--cached-compiler-in", args.cached_compiler_in),
                        ("--cached-compiler-out", args.cached_compiler_out)):
        if value:
            _say("note", f"{flag}={value} not used: pynnet3 cannot read or write Kaldi's "
                         "compiled-computation cache (it compiles anew; the x-vectors "
                         "are the same)")
    start_up_done()  # (the console script's pause of the garbage collector ends here)

    def process(key: str, feats: np.ndarray) -> np.ndarray:
        return compute_xvector(nnet, compiler, feats, args.chunk_size, args.min_chunk_size,
                               args.pad_input, backend, device)

    return run_table_job("xvector-compute", args.features, args.output, process,
                         lambda: compiler.info()["misses"])


def add_xvector_command(sub, command) -> None:
    """Add ``xvector-compute`` to the subparsers ``sub`` (``command`` makes one, as
    main.py's ``_command``)."""
    s = command(sub, "xvector-compute",
                "x-vectors: a model's output averaged over chunks (like "
                "nnet3-xvector-compute)",
                "Run the network over every utterance of a feature table and write one\n"
                "vector per utterance, as Kaldi's nnet3-xvector-compute does: the\n"
                "utterance is cut into chunks of --chunk-size frames (the last one\n"
                "shorter), a chunk shorter than --min-chunk-size is padded by repeating\n"
                "its first and last frames (or left out with --pad-input=false), each\n"
                "chunk gives the 'output' node at t=0, and the chunk outputs are\n"
                "averaged weighted by their unpadded lengths. The output node is the\n"
                "model's 'output': to extract the embedding, prepare the model as Kaldi\n"
                "recipes do (output-node name=output input=tdnn6.affine). The model is\n"
                "prepared as the Kaldi program does (BatchNorm and dropout in test mode,\n"
                "then the network optimizer). Tables are Kaldi rspecifiers/wspecifiers,\n"
                "as for compute; the output is written atomically. Failed utterances\n"
                "are warned about and counted; the exit status is 1 when none\n"
                "succeeded. The last line on stderr gives utterances done and failed,\n"
                "frames and frames/s.\n\n"
                "example: pynnet3 xvector-compute --chunk-size=10000 final.raw \\\n"
                "           scp:feats.scp ark,scp:xvector.ark,xvector.scp",
                usage="pynnet3 xvector-compute [options] MODEL FEATS-RSPECIFIER "
                      "VECTOR-WSPECIFIER")
    add_table_arguments(s, "VECTOR-WSPECIFIER",
                        "where to write the x-vectors, e.g. ark:xvector.ark or "
                        "ark,scp:xvector.ark,xvector.scp")
    s.add_argument("--chunk-size", dest="chunk_size", type=int, default=-1, metavar="INT",
                   help="frames per chunk; -1 means the whole utterance in one chunk "
                        "(default: -1)")
    s.add_argument("--min-chunk-size", dest="min_chunk_size", type=int, default=100,
                   metavar="INT",
                   help="shorter chunks are padded to this many frames (or left out "
                        "with --pad-input=false) (default: 100)")
    bool_option(s, "--pad-input", True,
                "pad chunks shorter than --min-chunk-size by repeating their first and last "
                "frames; false leaves them out, and fails utterances shorter than it "
                "(default: true)")
    s.add_argument("--cache-capacity", dest="cache_capacity", type=int, default=64,
                   metavar="INT",
                   help="computations kept by the compiler's cache, one per chunk "
                        "length (default: 64)")
    add_run_flags(s, "the Kaldi program")
    bool_option(s, "--use-shortcut", True,
                "Kaldi's compiler shortcut (CachingOptimizingCompilerOptions): compile requests of "
                "regular structure for 2 sequences and expand; x-vector requests have one "
                "sequence, so the same either way (default: true)")
    s.add_argument("--cached-compiler-in", dest="cached_compiler_in", default="",
                   metavar="FILE",
                   help="Kaldi: read the compiled-computation cache from FILE (accepted; "
                        "not used: a note says so, and pynnet3 compiles anew with the same "
                        "results) (default: none)")
    s.add_argument("--cached-compiler-out", dest="cached_compiler_out", default="",
                   metavar="FILE",
                   help="Kaldi: write the compiled-computation cache to FILE (accepted; "
                        "not used: a note says so, and no file is written) (default: none)")
    g = s.add_argument_group(
        "decoding options nnet3-xvector-compute registers (Kaldi's "
        "NnetSimpleComputationOptions) but does not use: accepted, no effect")
    for flag, default, what in (
            ("--extra-left-context", 0, "extra left context"),
            ("--extra-right-context", 0, "extra right context"),
            ("--extra-left-context-initial", -1, "extra left context of the first chunk"),
            ("--extra-right-context-final", -1, "extra right context of the last chunk"),
            ("--frame-subsampling-factor", 1, "output frame subsampling"),
            ("--frames-per-chunk", 50, "frames per decoding chunk (--chunk-size is "
                                       "this command's)")):
        g.add_argument(flag, dest=flag[2:].replace("-", "_"), type=int, default=default,
                       metavar="INT", help=f"{what} (no effect) (default: {default})")
    g.add_argument("--acoustic-scale", dest="acoustic_scale", type=float, default=1.0,
                   metavar="FLOAT", help="acoustic scale (no effect: the x-vectors are not "
                                         "scaled) (default: 1.0)")
    add_debug_options(g)
    add_decoding_option_groups(s)
    s.set_defaults(fn=cmd_xvector_compute)
