"""Left/right context of deep networks (pynnet3.compiler.context): the window of the
search widens until the total context fits, for every time shift. Expected contexts
are sums of the configs' offsets, worked out by hand from the layer recipe."""

from __future__ import annotations

import numpy as np
import pytest

import pynnet3
from pynnet3.cli.main import main
from pynnet3.compiler.context import FIRST_WINDOW, MAX_WINDOW
from pynnet3.errors import ComputeError
from tests.compiler import nets as N


def spliced(num_layers: int, lo: int, hi: int, dim: int = 3, output: str = "{}") -> str:
    """``num_layers`` affine layers, each reading Append(Offset(prev, lo), Offset(prev, hi));
    ``output`` wraps the last layer's name for the output node's descriptor."""
    lines = [f"input-node name=input dim={dim}"]
    prev = "input"
    for i in range(num_layers):
        lines += [f"component name=a{i} type=AffineComponent input-dim={2 * dim} "
                  f"output-dim={dim}",
                  f"component-node name=a{i} component=a{i} "
                  f"input=Append(Offset({prev}, {lo}), Offset({prev}, {hi}))"]
        prev = f"a{i}"
    lines.append(f"output-node name=output input={output.format(prev)}")
    return "\n".join(lines) + "\n"


def tdnnf(strides: list[int], dim: int = 8, bottleneck: int = 4) -> str:
    """A chain TDNN-F as Kaldi's xconfig writes it: tdnn1 splices -1,0,1 of input and
    the iVector; each tdnnf layer is a TdnnComponent at (-s, 0), one at (0, s), ReLU,
    BatchNorm and a 0.66-scaled bypass (stride 0: no time offsets)."""
    lines = ["input-node name=ivector dim=5", "input-node name=input dim=4",
             f"component name=tdnn1.affine type=NaturalGradientAffineComponent input-dim=17 "
             f"output-dim={dim}",
             "component-node name=tdnn1.affine component=tdnn1.affine input=Append(Offset(input, "
             "-1), input, Offset(input, 1), ReplaceIndex(ivector, t, 0))",
             f"component name=tdnn1.relu type=RectifiedLinearComponent dim={dim}",
             "component-node name=tdnn1.relu component=tdnn1.relu input=tdnn1.affine",
             f"component name=tdnn1.batchnorm type=BatchNormComponent dim={dim}",
             "component-node name=tdnn1.batchnorm component=tdnn1.batchnorm input=tdnn1.relu"]
    prev = "tdnn1.batchnorm"
    for k, s in enumerate(strides, start=2):
        name = f"tdnnf{k}"
        first, second = (f"-{s},0", f"0,{s}") if s else ("0", "0")
        lines += [
            f"component name={name}.linear type=TdnnComponent input-dim={dim} "
            f"output-dim={bottleneck} use-bias=false time-offsets={first}",
            f"component-node name={name}.linear component={name}.linear input={prev}",
            f"component name={name}.affine type=TdnnComponent input-dim={bottleneck} "
            f"output-dim={dim} time-offsets={second}",
            f"component-node name={name}.affine component={name}.affine input={name}.linear",
            f"component name={name}.relu type=RectifiedLinearComponent dim={dim}",
            f"component-node name={name}.relu component={name}.relu input={name}.affine",
            f"component name={name}.batchnorm type=BatchNormComponent dim={dim}",
            f"component-node name={name}.batchnorm component={name}.batchnorm input={name}.relu",
            f"component name={name}.noop type=NoOpComponent dim={dim}",
            f"component-node name={name}.noop component={name}.noop "
            f"input=Sum(Scale(0.66, {prev}), {name}.batchnorm)"]
        prev = f"{name}.noop"
    lines += ["component name=output.affine type=NaturalGradientAffineComponent "
              f"input-dim={dim} output-dim=6",
              f"component-node name=output.affine component=output.affine input={prev}",
              "output-node name=output input=output.affine"]
    return "\n".join(lines) + "\n"


# The production layout: tdnn1 (+-1), tdnnf2-4 stride 1, tdnnf5 stride 0, tdnnf6-15
# stride 3: 15 layers, 1 + 3*1 + 10*3 = 34 frames of context on each side.
PRODUCTION_STRIDES = [1, 1, 1, 0] + [3] * 10


def test_production_tdnnf_context():
    assert 1 + sum(PRODUCTION_STRIDES) == 34 > FIRST_WINDOW // 2
    nnet = pynnet3.Nnet.from_config(tdnnf(PRODUCTION_STRIDES), seed=0)
    assert (nnet.left_context, nnet.right_context) == (34, 34)


@pytest.mark.parametrize("num_layers,lo,hi", [
    (15, -3, 3),    # 45 + 45: beyond the first 40-frame window
    (30, -3, 4),    # 90 + 120
    (25, -1, 12),   # 25 + 300: lopsided, needs the 640-frame window
    (40, -5, 7),    # 200 + 280
])
def test_deep_spliced_context_is_the_sum_of_offsets(num_layers, lo, hi):
    nnet = pynnet3.Nnet.from_config(spliced(num_layers, lo, hi), seed=0)
    assert nnet.context() == (-lo * num_layers, hi * num_layers)


def test_deep_context_with_a_modulus():
    # Round(a, 3) reads a at 3*floor(t/3): up to 2 frames further back, never further
    # forward; the search must take the worst of the shifts 0..3.
    nnet = pynnet3.Nnet.from_config(spliced(25, -2, 3, output="Round({}, 3)"), seed=0)
    assert nnet.modulus() == 3
    assert nnet.context() == (50 + 2, 75)


def test_context_up_to_the_widest_window():
    # one layer, so the context is the offsets themselves
    wide = spliced(1, -500, 450)
    assert pynnet3.Nnet.from_config(wide).context() == (500, 450)
    too_wide = spliced(1, -(MAX_WINDOW // 2), MAX_WINDOW // 2)
    with pytest.raises(ComputeError, match=f"window of {MAX_WINDOW} input frames"):
        pynnet3.Nnet.from_config(too_wide).context()


def test_info_prints_the_context_of_a_deep_network(tmp_path, capsys):
    config = tmp_path / "deep.config"
    config.write_text(tdnnf(PRODUCTION_STRIDES))
    model = tmp_path / "deep.mdl"
    assert main(["init", str(config), str(model)]) == 0
    capsys.readouterr()
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "left-context: 34" in out and "right-context: 34" in out


def _affine_stack_reference(nnet, num_layers: int, lo: int, hi: int, x: np.ndarray,
                            t0: int) -> tuple[np.ndarray, int]:
    """Run the spliced affine stack by hand: y_i(t) = W_i [y_{i-1}(t+lo); y_{i-1}(t+hi)]
    + b_i on rows for consecutive t from ``t0``. Returns (rows, first t)."""
    y = x.astype(np.float64)
    for i in range(num_layers):
        comp = nnet.components[f"a{i}"]
        n = len(y) - (hi - lo)  # frames t with t+lo and t+hi both present
        spliced_in = np.concatenate([y[:n], y[hi - lo:hi - lo + n]], axis=1)
        y = spliced_in @ comp.linear_params.astype(np.float64).T + comp.bias_params
        t0 -= lo
    return y, t0


def test_deep_network_compiles_and_runs_with_exactly_its_context():
    num_layers, lo, hi = 30, -3, 4
    nnet = pynnet3.Nnet.from_config(spliced(num_layers, lo, hi), seed=3)
    left, right = nnet.context()
    outputs = N.frames(0, 10)
    req = N.request({"input": N.frames(-left, 10 + right)}, {"output": outputs})
    x = np.random.default_rng(0).standard_normal((10 + left + right, 3)).astype(np.float32)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req), {"input": x}, dtype=np.float64)
    ref, first_t = _affine_stack_reference(nnet, num_layers, lo, hi, x, -left)
    assert first_t == 0 and ref.shape == (10, 3)
    np.testing.assert_allclose(res.outputs["output"], ref, rtol=1e-6, atol=1e-9)
    # one input frame fewer on either side and the outputs at the edge are lost
    for frames in (N.frames(-left + 1, 10 + right), N.frames(-left, 10 + right - 1)):
        with pytest.raises(ComputeError, match="not computable"):
            pynnet3.compile(nnet, N.request({"input": frames}, {"output": outputs}))


def test_production_tdnnf_compiles_and_runs():
    nnet = pynnet3.Nnet.from_config(tdnnf(PRODUCTION_STRIDES), seed=0)
    left, right = nnet.context()
    req = N.request({"input": N.frames(-left, 8 + right, n=2),
                     "ivector": np.array([[0, 0, 0], [1, 0, 0]])},
                    {"output": N.frames(0, 8, n=2)}, False, True, True)
    rng = np.random.default_rng(1)
    x = N.random_inputs(nnet, req, rng, np.float32)
    d = N.random_output_derivs(nnet, req, rng, np.float32)
    res = pynnet3.run(nnet, pynnet3.compile(nnet, req), x, d)
    assert res.outputs["output"].shape == (16, 6)
    assert np.isfinite(res.outputs["output"]).all()
    updatable = [n for n, c in nnet.components.items() if c.is_updatable()]
    assert sorted(res.gradients) == sorted(updatable)
    with pytest.raises(ComputeError, match="not computable"):
        pynnet3.compile(nnet, N.request({"input": N.frames(-left + 1, 8 + right, n=2),
                                         "ivector": np.array([[0, 0, 0], [1, 0, 0]])},
                                        {"output": N.frames(0, 8, n=2)}))
