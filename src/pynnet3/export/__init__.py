"""Export a network to PyTorch (``torch.fx``) and ONNX, standard operators only.

``to_torch(nnet, frames=F)`` returns a :class:`torch.fx.GraphModule` (read it with
``print(module.graph)`` or ``print(module.code)``) computing the network in test
mode (BatchNorm with its stored statistics, dropout off: what ``nnet3-compute``
runs) for blocks of F output frames:

* inputs, in ``module.input_names`` order (the network's input nodes, by name):
  frame inputs ``[N, T, dim]`` with T = left context + F + right context, rows
  t = -left .. F-1+right; the iVector input ``[N, dim]``. N is free.
* output: a dict by output-node name (``module.output_names``) of ``[N, F, dim]``
  for t = 0 .. F-1, or ``[N, 1, dim]`` (t = 0) for networks that pool statistics
  over whole utterances (x-vector extractors; ``output_times`` overrides).
* weights are ``nn.Parameter`` (one per component parameter, named in
  ``module.param_names[(component, param)]``), so the module fine-tunes with
  ordinary PyTorch; BatchNorm transforms and index tables are buffers.

How: the network is compiled (``pynnet3.compile``) for one sequence (n = 0) and
that forward computation's commands are translated into batched ops on
``[N, rows, dim]`` tensors (:mod:`.translate`): row copies become slices or
``index_select`` with constant index buffers, propagates become per-type torch
functions (:mod:`.ops`). Recurrences (LSTM) come out unrolled over the T frames.
A component with no standard-op form raises :class:`pynnet3.errors.ExportError`
naming the node and type.

``to_onnx(nnet, path, frames=F)`` writes the same graph as ONNX (opset 17, the
standard ``ai.onnx`` domain, N dynamic), checked with ``onnx.checker``.
Needs the ``[torch]`` / ``[onnx]`` extras.
"""

from __future__ import annotations

import io
import os
import warnings

from ..errors import DependencyError, ExportError
from ..io.atomic import atomic_write
from .request import IVECTOR, ExportShape, export_request

ONNX_OPSET = 17


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise DependencyError("pynnet3.export needs PyTorch: pip install 'pynnet3[torch]'") \
            from None
    return torch


def to_torch(nnet, frames: int, *, output_times: str = "auto", ivector_rows: str = "auto",
             optimize: bool = True):
    """The network as a ``torch.fx.GraphModule`` for blocks of ``frames`` output
    frames (module doc). ``nnet`` is a :class:`pynnet3.Nnet` (``read_nnet`` reads
    text, binary and ``final.mdl`` models; ``optimize_network`` output works too)
    or a :class:`pynnet3.AcousticModel` (its network); it is not modified (a copy
    is put in test mode). ``output_times``: "auto", "all" or "first";
    ``optimize``: run the command-level optimizer on the computation first (fewer,
    larger ops)."""
    torch = _torch()
    from torch import fx

    from ..compiler import compile_computation
    from ..optimize import OptimizeOptions
    from ..optimize import optimize as optimize_computation
    from .graph import GraphBuilder, attr_name
    from .translate import Translator

    if not hasattr(nnet, "components") and hasattr(nnet, "nnet"):
        nnet = nnet.nnet  # an AcousticModel (pynnet3.read_am): its network
    nnet = nnet.copy()
    nnet.set_test_mode(True)
    request, shape = export_request(nnet, frames, output_times, ivector_rows)
    computation = compile_computation(nnet, request)
    if optimize:
        computation = optimize_computation(computation, nnet, OptimizeOptions())
    g = GraphBuilder(torch.float32)
    placeholders = {}
    for name in nnet.input_names():
        placeholders[name] = g.graph.placeholder(attr_name(name))
    g.ref = next(iter(placeholders.values()))
    g.batch = g.method("size", g.ref, 0)  # N
    values = {}
    for name, ph in placeholders.items():
        if name == IVECTOR:
            v = g.method("unsqueeze", ph, 1)  # [N, 1, dim]
            if shape.ivector_rows > 1:
                v = g.method("expand", v, -1, shape.ivector_rows, -1)
            values[name] = v
        else:
            values[name] = ph
    outputs = Translator(nnet, computation, g).run(values)
    missing = [n for n in nnet.output_names() if n not in outputs]
    if missing:
        raise ExportError(f"internal: the computation provides no output for {missing}")
    g.graph.output({name: outputs[name] for name in nnet.output_names()})
    g.graph.eliminate_dead_code()
    g.graph.lint()
    module = fx.GraphModule(g.root, g.graph, class_name="ExportedNnet")
    module.input_names = list(nnet.input_names())
    module.output_names = list(nnet.output_names())
    # (a parameter no output depends on is not in the module: dead code)
    module.param_names = {k: v for k, v in g.param_names.items() if hasattr(module, v)}
    # (TorchScript cannot type a dict with tuple keys: torch.jit.script skips it)
    module.__jit_ignored_attributes__ = ["param_names"]
    module.frames = shape.frames
    module.left_context, module.right_context = shape.left, shape.right
    module.input_frames = shape.input_frames
    module.output_frames = shape.output_frames
    module.ivector_times = list(shape.ivector_times)  # (usually [0])
    module.input_dims = {n: nnet.input_dim(n) for n in nnet.input_names()}
    module.output_dims = {n: nnet.output_dim(n) for n in nnet.output_names()}
    return module


def example_inputs(module, batch: int = 1, seed: int = 0) -> tuple:
    """Random inputs of the right shapes for ``module`` (a :func:`to_torch` result),
    in ``module.input_names`` order."""
    torch = _torch()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name in module.input_names:
        dim = module.input_dims[name]
        shape = (batch, dim) if name == IVECTOR else (batch, module.input_frames, dim)
        out.append(torch.randn(*shape, generator=gen))
    return tuple(out)


def to_onnx(nnet, path: str | os.PathLike, frames: int, *, output_times: str = "auto",
            ivector_rows: str = "auto", optimize: bool = True, module=None) -> None:
    """Write the network as an ONNX model (module doc) to ``path`` and check it with
    ``onnx.checker``. ``module``: an already exported :func:`to_torch` module."""
    torch = _torch()
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise DependencyError("to_onnx needs onnx: pip install 'pynnet3[onnx]'") from None
    if module is None:
        module = to_torch(nnet, frames, output_times=output_times, ivector_rows=ivector_rows,
                          optimize=optimize)
    elif getattr(module, "frames", frames) != frames:
        # (the module's interface is what gets written: a silent mismatch would give
        # a model of other input/output lengths than asked for)
        raise ExportError(f"to_onnx: frames={frames}, but the module given was exported "
                          f"for frames={module.frames}")

    class _Tuple(torch.nn.Module):  # ONNX outputs are positional: output_names order
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *xs):
            y = self.inner(*xs)
            return tuple(y[n] for n in inner_names)

    inner_names = module.output_names
    wrapper = _Tuple(module).eval()
    dynamic = {n: {0: "N"} for n in module.input_names + module.output_names}
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the TorchScript-based exporter's deprecation)
        with torch.no_grad():
            torch.onnx.export(wrapper, example_inputs(module, batch=2), buf, dynamo=False,
                              opset_version=ONNX_OPSET, input_names=module.input_names,
                              output_names=module.output_names, dynamic_axes=dynamic,
                              do_constant_folding=True)
    model = _keep_unused_inputs(onnx.load_from_string(buf.getvalue()), module)
    onnx.checker.check_model(model, full_check=True)
    atomic_write(path, model.SerializeToString())


def _keep_unused_inputs(model, module):
    """The exporter drops inputs the outputs do not depend on (an iVector that a
    Failover makes optional): put them back, so every exported model has one input
    per network input node, in ``module.input_names`` order."""
    import onnx

    have = {i.name: i for i in model.graph.input}
    if list(have) == module.input_names:
        return model
    inputs = []
    for name in module.input_names:
        if name in have:
            inputs.append(have[name])
            continue
        dims = ["N", module.input_dims[name]] if name == IVECTOR else \
            ["N", module.input_frames, module.input_dims[name]]
        inputs.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims))
    extra = [i for i in model.graph.input if i.name not in module.input_names]
    del model.graph.input[:]
    model.graph.input.extend(inputs + extra)
    return model


def save_torch(module, path: str | os.PathLike) -> None:
    """Save a :func:`to_torch` module with ``torch.save`` (atomically). Load it with
    ``torch.load(path, weights_only=False)``: a GraphModule pickles as its generated
    code plus tensors, so loading needs torch only, not pynnet3."""
    torch = _torch()
    buf = io.BytesIO()
    torch.save(module, buf)
    atomic_write(path, buf.getvalue())


__all__ = ["ExportShape", "example_inputs", "export_request", "save_torch", "to_onnx",
           "to_torch"]
