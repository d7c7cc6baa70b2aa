"""``pynnet3 export``: write a model as ONNX or as a PyTorch module.

``--format=onnx`` writes an ONNX model (standard operators, opset 17, the batch
dimension N free), checked with onnx.checker. ``--format=torch`` writes the
``torch.fx`` GraphModule with ``torch.save``; load it with
``torch.load(OUT, weights_only=False)`` (needs torch only). Both compute the
network in test mode for blocks of ``--frames`` output frames; the interface is
:mod:`pynnet3.export`'s (inputs ``[N, T, dim]`` and the iVector ``[N, dim]``,
outputs ``[N, F, dim]`` or ``[N, 1, dim]``). The output is written atomically.
"""

from __future__ import annotations

import sys

from .kaldi_options import bool_option

_DESCRIPTION = """\
Export a model (Kaldi nnet3, text or binary, or a final.mdl) for blocks of F
output frames, in test mode (BatchNorm with its stored statistics, dropout off):
  inputs:  each frame input node [N, T, dim] with T = left context + F + right
           context (rows t = -left .. F-1+right); the iVector node [N, dim]
  outputs: each output node [N, F, dim] (t = 0 .. F-1), or [N, 1, dim] (t = 0)
           for networks that pool statistics over whole utterances (x-vectors)
--format=onnx writes an ONNX model with standard operators (checked with
onnx.checker); --format=torch writes the torch.fx module with torch.save (load
it with torch.load(OUT, weights_only=False)). The lines on stderr say the shapes."""


def add_export_command(sub, command) -> None:
    from .network import add_network_flags

    s = command(sub, "export", "write a model as ONNX or a PyTorch (torch.fx) module",
                _DESCRIPTION)
    s.add_argument("model", metavar="MODEL",
                   help="model file: Kaldi nnet3, text or binary (detected), or final.mdl")
    s.add_argument("out", metavar="OUT", help="where to write the exported model")
    s.add_argument("--format", choices=("onnx", "torch"), default="onnx",
                   help="onnx or torch (default: onnx)")
    s.add_argument("--frames", type=int, default=150, metavar="INT",
                   help="output frames per block, F (default: 150)")
    s.add_argument("--output-times", dest="output_times", choices=("auto", "all", "first"),
                   default="auto",
                   help="outputs at t = 0..F-1 (all), at t = 0 only (first), or auto: first "
                        "for networks that pool whole utterances (default: auto)")
    bool_option(s, "--network-optimize", False,
                "run the network optimizer first (folds BatchNorm and fixed scales into affine "
                "layers: fewer ops) (default: false)")
    add_network_flags(s)
    s.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    from ..errors import PynnetError
    from ..export import save_torch, to_onnx, to_torch
    from .files import read_model
    from .network import network_options_from_args, prepare_for_test

    if args.frames < 1:
        raise PynnetError(f"--frames must be >= 1, got {args.frames}")
    nnet = read_model(args.model)
    if args.network_optimize:
        nnet = prepare_for_test(nnet, network_options_from_args(args))
    module = to_torch(nnet, args.frames, output_times=args.output_times)
    if args.format == "onnx":
        to_onnx(nnet, args.out, args.frames, module=module)
    else:
        save_torch(module, args.out)
    ins = ", ".join(f"{n} [N, {'' if n == 'ivector' else f'{module.input_frames}, '}"
                    f"{module.input_dims[n]}]" for n in module.input_names)
    outs = ", ".join(f"{n} [N, {module.output_frames}, {module.output_dims[n]}]"
                     for n in module.output_names)
    sys.stderr.write(f"pynnet3 export: wrote {args.format} model {args.out}: inputs {ins}; "
                     f"outputs {outs}\n")
    return 0
