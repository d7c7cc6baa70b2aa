"""TimeHeightConvolutionComponent: files, reference cases, gradients, padding, config."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pynnet3.components import Flags
from pynnet3.errors import ComputeError, ConfigError, FormatError
from tests.components.common import finite_difference_check, from_config, reference_files
from tests.components.test_tdnn import (
    check_malformed,
    check_round_trip,
    direct_cases,
    forward,
    reread,
    run_reference_case,
    sequence_indexes,
    written,
)
from tests.reference import REF, ref_params, require_reference

TYPE = "TimeHeightConvolutionComponent"


@pytest.mark.parametrize("path", ref_params(reference_files(TYPE)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_round_trip_reference_files(path):
    check_round_trip(path, TYPE)


def test_round_trip_covers_reference():
    require_reference()
    names = {p.relative_to(REF).as_posix() for p in reference_files(TYPE)}
    assert {"components/TimeHeightConvolution_1/model.txt",
            "components/TimeHeightConvolution_2/model.bin",
            "generated/case_7/model.txt", "generated/case_7/model.bin"} <= names


@pytest.mark.parametrize("case", ref_params(direct_cases("TimeHeightConvolution_"), "cases"),
                         ids=lambda p: p.name)
@pytest.mark.parametrize("shuffle", [None, 3])
def test_reference_case(case, shuffle):
    # TimeHeightConvolution_2 has only t=0..11 at the input: the optional time offsets
    # -2 and 2 fall off the edges and contribute zero.
    run_reference_case(case, shuffle_seed=shuffle)


def test_reference_cases_found():
    require_reference()
    assert len(direct_cases("TimeHeightConvolution_")) == 2


def reference_conv(comp, x, in_idx, out_idx):
    """Direct loops over output pixels: the definition of the convolution."""
    m = comp.model
    w = comp.linear_params.astype(np.float64)
    out = np.zeros((len(out_idx), m.height_out, m.num_filters_out))
    pos = {tuple(i): r for r, i in enumerate(in_idx.tolist())}
    for j, (n, t, xx) in enumerate(out_idx.tolist()):
        for h in range(m.height_out):
            acc = comp.bias_params.astype(np.float64).copy()
            for i, (t_off, h_off) in enumerate(m.offsets):
                r = pos.get((n, t + t_off, xx))
                h_in = h * m.height_subsample_out + h_off
                if r is None or not 0 <= h_in < m.height_in:
                    continue
                pixel = x[r, h_in * m.num_filters_in:(h_in + 1) * m.num_filters_in]
                acc += w[:, i * m.num_filters_in:(i + 1) * m.num_filters_in] @ pixel
            out[j, h] = acc
    return out.reshape(len(out_idx), -1)


CONFIGS = [
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=-1,0,1 "
    "time-offsets=-1,0,1",
    "num-filters-in=1 num-filters-out=2 height-in=8 height-out=3 height-subsample-out=2 "
    "height-offsets=0,1,2 time-offsets=-2,0,2 required-time-offsets=0",
    "num-filters-in=2 num-filters-out=2 height-in=4 height-out=4 offsets=0,0;-1,1;1,-1 "
    "required-time-offsets=0",
]


@pytest.mark.parametrize("options", CONFIGS)
def test_against_direct_loops(options):
    comp = from_config(f"component name=c type={TYPE} {options} bias-stddev=1", seed=1)
    rng = np.random.default_rng(2)
    in_idx = sequence_indexes(range(0, 7))  # edges lack optional inputs
    required = comp.model.required_time_offsets
    out_ts = [t for t in range(-2, 9) if all(0 <= t + o < 7 for o in required)]
    out_idx = sequence_indexes(out_ts)
    pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
    in_idx, out_idx = in_idx[pi], out_idx[po]
    x = rng.standard_normal((len(in_idx), comp.input_dim)).astype(np.float32)
    out, _ = forward(comp, comp.precompute_indexes(in_idx, out_idx, False), x, len(out_idx))
    np.testing.assert_allclose(out, reference_conv(comp, x, in_idx, out_idx),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", CONFIGS)
def test_finite_differences(options):
    comp = from_config(f"component name=c type={TYPE} {options} bias-stddev=0.5", seed=3)
    rng = np.random.default_rng(4)
    in_idx = sequence_indexes(range(0, 5))
    required = comp.model.required_time_offsets
    out_idx = sequence_indexes([t for t in range(-1, 6) if all(0 <= t + o < 5 for o in required)])
    pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
    x = rng.standard_normal((len(in_idx), comp.input_dim))
    finite_difference_check(comp, x, in_idx[pi], out_idx[po])


def test_backprop_adds_and_float64():
    comp = from_config(f"component name=c type={TYPE} {CONFIGS[0]}")
    in_idx, out_idx = sequence_indexes(range(0, 4)), sequence_indexes(range(1, 3))
    idx = comp.precompute_indexes(in_idx, out_idx, True)
    x = np.random.default_rng(5).standard_normal((len(in_idx), comp.input_dim))
    out, _ = forward(comp, idx, x, len(out_idx), out_init=np.full((4, 15), 9.0))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, forward(comp, idx, x, len(out_idx))[0])  # assigns
    d = np.random.default_rng(6).standard_normal(out.shape)
    a, b = np.zeros_like(x), np.ones_like(x)
    comp.backprop(idx, x, out, d, None, None, a)
    comp.backprop(idx, x, out, d, None, None, b)
    np.testing.assert_allclose(b, a + 1)


def test_input_indexes_required_and_optional():
    comp = from_config(f"component name=c type={TYPE} {CONFIGS[1]}")
    deps = comp.input_indexes(np.array([[0, 10, 0], [1, 4, 0]]))
    assert deps.owner.tolist() == [0, 0, 0, 1, 1, 1]
    assert deps.indexes[:, 1].tolist() == [8, 10, 12, 2, 4, 6]
    assert deps.required.tolist() == [False, True, False] * 2
    with pytest.raises(ComputeError):  # the required offset 0 is missing for t=9
        comp.precompute_indexes(sequence_indexes(range(0, 5)), sequence_indexes([9]), False)


def test_properties():
    comp = from_config(f"component name=c type={TYPE} {CONFIGS[0]}")
    assert comp.properties() == (Flags.UPDATABLE | Flags.REORDERS_INDEXES | Flags.BACKPROP_ADDS
                                 | Flags.BACKPROP_NEEDS_INPUT | Flags.INPUT_CONTIGUOUS
                                 | Flags.OUTPUT_CONTIGUOUS)


def test_config_defaults_and_text():
    comp = from_config(f"component name=c type={TYPE} num-filters-in=3 num-filters-out=6 "
                       "height-in=12 height-out=10 height-offsets=0,1,2 time-offsets=-1,0,1",
                       seed=7)
    assert (comp.input_dim, comp.output_dim) == (36, 60)
    assert comp.linear_params.shape == (6, 27) and comp.bias_params.shape == (6,)
    assert not comp.bias_params.any()  # bias-stddev defaults to 0
    assert comp.model.required_time_offsets == [-1, 0, 1]
    text = written(comp, False).decode()
    assert ("<Offsets> [ -1,0 -1,1 -1,2 0,0 0,1 0,2 1,0 1,1 1,2 ]\n"
            "<RequiredTimeOffsets> [ -1 0 1 ]\n</ConvolutionModel> ") in text
    assert ("<MaxMemoryMb> 200 <UseNaturalGradient> T <NumMinibatchesHistory> 4 "
            "<AlphaInOut> 4 4 <RankInOut> 14 3 </TimeHeightConvolutionComponent> ") in text
    assert comp.export_gradient(comp.params())["params_vectorized"].shape == (6 * 27 + 6,)

    unit = from_config(f"component name=c type={TYPE} num-filters-in=2 num-filters-out=2 "
                       "height-in=3 height-out=3 height-offsets=-1,0,1 time-offsets=0 "
                       "init-unit=true")
    x = np.random.default_rng(8).standard_normal((2, 6)).astype(np.float32)
    idx = unit.precompute_indexes(sequence_indexes([0]), sequence_indexes([0]), False)
    np.testing.assert_allclose(forward(unit, idx, x, 2)[0], x)


@pytest.mark.parametrize("options", [
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5",      # no offsets
    "num-filters-out=3 height-in=5 height-out=5 height-offsets=0 time-offsets=0",
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=1,0 "
    "time-offsets=0",                                                   # not sorted
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=0 "
    "time-offsets=0 required-time-offsets=1",                          # not a subset
    "num-filters-in=2 num-filters-out=3 height-in=3 height-out=5 height-offsets=0 "
    "time-offsets=0",                                                   # height 3,4 see nothing
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=0 "
    "time-offsets=0 init-unit=true",                                    # 2 != 3 filters
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 offsets=0,0;0,0",
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=0 "
    "time-offsets=0 max-memory-mb=0",
    "num-filters-in=2 num-filters-out=3 height-in=5 height-out=5 height-offsets=0 "
    "time-offsets=0 unknown=3",
])
def test_config_errors(options):
    with pytest.raises(ConfigError):
        from_config(f"component name=c type={TYPE} {options}")


def test_malformed_files():
    comp = from_config(f"component name=c type={TYPE} {CONFIGS[1]}")
    check_malformed(comp)
    text = written(comp, False).decode()
    with pytest.raises(FormatError):  # pair vector entry that is not "t,h"
        reread(text.replace("-2,0", "-2;0").encode())
    with pytest.raises(FormatError):  # required offset that is not a time offset
        reread(text.replace("<RequiredTimeOffsets> [ 0 ]", "<RequiredTimeOffsets> [ 1 ]")
               .encode())
    with pytest.raises(FormatError):  # params no longer match the model
        reread(text.replace("<NumFiltersOut> 2", "<NumFiltersOut> 3").encode())
    bad = re.sub(r"(<BiasParams>  \[ )(\S+)", r"\1inf", text)
    assert "inf" in bad
    with pytest.raises(FormatError, match="non-finite"):
        reread(bad.encode())
    binary = written(comp, True)
    with pytest.raises(FormatError):  # count of the offsets vector runs past the end
        reread(binary.replace(b"<Offsets> \x04\x09", b"<Offsets> \x04\x7f"))
