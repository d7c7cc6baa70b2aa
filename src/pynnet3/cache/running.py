"""``pynnet3.run``: run a compiled computation, or compile a request through the
network's cache first (above both the runtime and the cache, which it joins)."""

from __future__ import annotations

import numpy as np

from ..computation import NnetComputation
from ..errors import RuntimeInputError
from ..runtime.computer import RunResult, run_dtype
from ..runtime.computer import run as run_computation
from .caching_compiler import FEW_SEQUENCES, cache_for, few_sequences_cache


def _sequences(request) -> int:
    """The most distinct ``n`` of any input or output of ``request``."""
    most = 0
    for spec in (*request.inputs, *request.outputs):
        idx = spec.indexes
        if len(idx):
            most = max(most, len(np.unique(idx[:, 0])))
    return most


def run(nnet, computation, inputs: dict, output_derivs: dict | None = None,
        backend: str = "numpy", dtype=np.float32, network_optimize=None,
        device=None) -> RunResult:
    """Run a compiled computation; see :class:`~pynnet3.runtime.computer.RunResult`.
    ``computation`` may also be a ComputationRequest: it is then compiled through
    the network's cache (:func:`~pynnet3.cache.cache_for`), so repeated runs of
    equal shapes compile once. Component statistics (when the request stores them)
    accumulate in ``nnet``'s components, in place.

    ``backend="torch"`` runs on ``device`` (``"cpu"``, ``"cuda"``, a
    ``torch.device``; default the CPU); inputs may then be torch tensors (used where
    they are, without a copy through NumPy) and the result holds torch tensors on
    the device.

    ``network_optimize`` (True or a :class:`~pynnet3.NetworkOptions`; requests
    only): compile and run a network-optimized copy of ``nnet``, kept with the
    network's caches (then statistics accumulate in that copy)."""
    if isinstance(computation, NnetComputation):
        if network_optimize:
            raise RuntimeInputError("network_optimize applies when run() compiles a "
                                    "request; a computation is run on the network it was "
                                    "compiled for")
        return run_computation(nnet, computation, inputs, output_derivs, backend, dtype,
                               device)
    dtype = run_dtype(dtype)
    if network_optimize is not None and network_optimize is not False:
        derivatives = any(s.has_deriv for s in computation.outputs)
        cc = cache_for(nnet, network_optimize, derivatives=derivatives)
        # (a request storing statistics stays with the one copy they accumulate in)
        if network_optimize is True and not derivatives \
                and not computation.store_component_stats \
                and _sequences(computation) <= FEW_SEQUENCES:
            few = few_sequences_cache(nnet, cc)
            cc = few if few is not None else cc
        computation = cc.compile(computation, dtype=dtype, backend=backend, device=device)
        nnet = cc.compiled_nnet
    else:
        computation = cache_for(nnet).compile(computation, dtype=dtype, backend=backend,
                                              device=device)
    # (a cache's computation is shared and never modified: its commands are prepared
    # once and kept with it)
    return run_computation(nnet, computation, inputs, output_derivs, backend, dtype, device,
                           shared=True)
