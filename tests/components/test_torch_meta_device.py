"""The converted components run on a device that is not the host (issue 17), checked
without a GPU on torch's "meta" device: tensors there have shapes but no data, so
any host read (``.item()``, ``.numpy()``, a boolean mask's count), NumPy function
applied to a tensor, or tensor made on the CPU and mixed in fails, as it would make
a GPU run wait or fail. Output shapes and dtypes are checked; values are not (the
torch CPU parity tests check those)."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.attention import RestrictedAttentionComponent
from pynnet3.components.composite import CompositeComponent
from pynnet3.components.convolution import ConvolutionComponent, MaxpoolingComponent
from pynnet3.components.distribute import DistributeComponent
from pynnet3.components.recurrent import (
    GruNonlinearityComponent,
    LstmNonlinearityComponent,
    OutputGruNonlinearityComponent,
)
from pynnet3.components.statistics import (
    StatisticsExtractionComponent,
    StatisticsPoolingComponent,
)
from pynnet3.components.tdnn import TdnnComponent
from pynnet3.components.time_height_conv import TimeHeightConvolutionComponent
from tests.compiler import nets as N
from tests.components.common import cfg

torch = pytest.importorskip("torch")


def _times(step: int, t0: int, t1: int, n: int) -> np.ndarray:
    return np.array([[s, t, 0] for s in range(n) for t in range(t0, t1, step)], dtype=np.int64)


def _from(cls, line: str):
    return cls.from_config(cfg(line), np.random.default_rng(0))


def _composite_line():
    """Affine, ReLU, Tanh in chunks of 3 rows (sub-component lines set as values, as
    the quoted config values arrive)."""
    line = cfg("component name=c type=CompositeComponent num-components=3 "
               "max-rows-process=3")
    for i, sub in enumerate(("type=AffineComponent input-dim=5 output-dim=4",
                             "type=RectifiedLinearComponent dim=4",
                             "type=TanhComponent dim=4"), start=1):
        line.values[f"component{i}"] = sub
    return line


SHUFFLED = N.frames(-1, 9, n=2)[np.random.default_rng(0).permutation(20)]
CASES = {
    "tdnn": (_from(TdnnComponent, "component name=t type=TdnnComponent input-dim=3 "
                   "output-dim=4 time-offsets=-1,0,1"), N.frames(-1, 9, n=2),
             N.frames(0, 8, n=2)),
    "tdnn-gathered": (_from(TdnnComponent, "component name=t type=TdnnComponent input-dim=3 "
                            "output-dim=4 time-offsets=-1,0,1 use-bias=false"), SHUFFLED,
                      N.frames(0, 8, n=2)),
    "time-height-conv": (_from(
        TimeHeightConvolutionComponent, "component name=c type=TimeHeightConvolutionComponent "
        "num-filters-in=2 num-filters-out=3 height-in=4 height-out=4 time-offsets=-2,0,2 "
        "height-offsets=-1,0,1 required-time-offsets=0"), N.frames(0, 7, n=2),
        N.frames(0, 7, n=2)),
    "extraction": (StatisticsExtractionComponent(3, 1, 1, True), N.frames(0, 10, n=2),
                   N.frames(0, 10, n=2)),
    "extraction-period": (StatisticsExtractionComponent(3, 1, 4, True), N.frames(0, 16, n=2),
                          _times(4, 0, 16, 2)),
    "pooling-per-window": (StatisticsPoolingComponent(7, 1, 0, 40, 1, True),
                           N.frames(0, 20, n=2), _times(1, 0, 1, 2)),
    "pooling-prefix": (StatisticsPoolingComponent(7, 1, 12, 12, 0, True), N.frames(0, 30, n=2),
                       N.frames(0, 30, n=2)),
    "pooling-short": (StatisticsPoolingComponent(7, 1, 2, 2, 0, True), N.frames(0, 30, n=2),
                      N.frames(0, 30, n=2)),
    "lstm": (LstmNonlinearityComponent.from_config(
        cfg("component name=l type=LstmNonlinearityComponent cell-dim=4 use-dropout=true"),
        np.random.default_rng(0)), N.frames(0, 5), N.frames(0, 5)),
    "gru": (GruNonlinearityComponent.from_config(
        cfg("component name=l type=GruNonlinearityComponent cell-dim=5 recurrent-dim=3"),
        np.random.default_rng(0)), N.frames(0, 5), N.frames(0, 5)),
    "output-gru": (OutputGruNonlinearityComponent.from_config(
        cfg("component name=l type=OutputGruNonlinearityComponent cell-dim=4"),
        np.random.default_rng(0)), N.frames(0, 5), N.frames(0, 5)),
    "attention": (RestrictedAttentionComponent(2, 3, 4, 2, 1, 1, 1, 0), N.frames(0, 10, n=2),
                  N.frames(1, 10, n=2)),
    "convolution": (ConvolutionComponent.from_config(cfg(
        "component name=c type=ConvolutionComponent input-x-dim=3 input-y-dim=5 "
        "input-z-dim=4 filt-x-dim=2 filt-y-dim=3 filt-x-step=1 filt-y-step=1 num-filters=3"),
        np.random.default_rng(0)), N.frames(0, 5), N.frames(0, 5)),
    "maxpooling": (MaxpoolingComponent.from_config(cfg(
        "component name=p type=MaxpoolingComponent input-x-dim=1 input-y-dim=4 "
        "input-z-dim=3 pool-x-size=1 pool-y-size=2 pool-z-size=3 pool-x-step=1 "
        "pool-y-step=1 pool-z-step=3")), N.frames(0, 5), N.frames(0, 5)),
    "composite": (CompositeComponent.from_config(_composite_line(), np.random.default_rng(0)),
                  N.frames(0, 7), N.frames(0, 7)),
    "distribute": (DistributeComponent(6, 3), _times(1, 0, 4, 1),
                   np.array([[0, t, x] for t in range(4) for x in (0, 1)], dtype=np.int64)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_component_runs_on_a_device_without_host_reads(name, dtype):
    comp, inp, out = CASES[name]
    pre = None if comp.is_simple() else comp.precompute_indexes(inp, out, True)
    dt, meta = getattr(torch, dtype), torch.device("meta")
    x = torch.empty(len(inp), comp.input_dim, device=meta, dtype=dt)
    y = torch.empty(len(out), comp.output_dim, device=meta, dtype=dt)
    dy, dx = torch.empty_like(y), torch.empty_like(x)
    grad = {k: torch.empty(v.shape, device=meta, dtype=dt) for k, v in comp.params().items()}
    memo = comp.propagate(pre, x, y)
    comp.backprop(pre, x, y, dy, memo, grad if comp.is_updatable() else None, dx)
    for t in (y, dx, *grad.values()):  # written in place: still meta, same dtype
        assert t.device.type == "meta" and t.dtype == dt
