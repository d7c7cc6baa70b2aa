"""BatchNormComponent: both modes, statistics, files, Kaldi reference cases."""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components import Flags
from pynnet3.errors import ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader
from pynnet3.io.model_file import read_component
from tests.components.common import from_config, roundtrip_spans
from tests.components.test_affine import (
    _forward,
    check_in_place,
    direct_cases,
    files_with_types,
    gradient_check,
    malformed_checks,
    reread,
    run_direct_case,
    serialize,
)
from tests.reference import REF, ref_params

TYPES = ("BatchNormComponent",)
BASE = Flags.SIMPLE | Flags.BACKPROP_NEEDS_OUTPUT | Flags.PROPAGATE_IN_PLACE \
    | Flags.BACKPROP_IN_PLACE


def _trained(config: str, seed: int = 3):
    """A component whose stats come from one training-mode batch, then test mode."""
    comp = from_config(config)
    x = np.random.default_rng(seed).standard_normal((40, comp.dim)).astype(np.float32) * 2 + 1
    out, memo = _forward(comp, x)
    comp.store_stats(x, out, memo)
    comp.set_test_mode(True)
    return comp


@pytest.mark.parametrize("path", ref_params(files_with_types(TYPES)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_reference_roundtrip(path):
    """Byte-identical even where Kaldi itself is not (it re-derives mean/var)."""
    assert roundtrip_spans(path, TYPES) > 0


@pytest.mark.parametrize("case", ref_params(direct_cases({"BatchNorm"}), "cases"),
                         ids=lambda p: p.name)
def test_reference_case(case):
    run_direct_case(case)


@pytest.mark.parametrize("config", [
    "component name=b type=BatchNormComponent dim=6",
    "component name=b type=BatchNormComponent dim=6 block-dim=2 target-rms=0.5 epsilon=0.1",
])
def test_gradients_training_mode(config):
    comp = from_config(config)
    gradient_check(comp, num_rows=9)
    check_in_place(from_config(config))


def test_gradients_test_mode():
    comp = _trained("component name=b type=BatchNormComponent dim=6 block-dim=3")
    check_in_place(comp)
    gradient_check(comp)


def test_properties():
    comp = from_config("component name=b type=BatchNormComponent dim=6")
    assert comp.properties() == BASE | Flags.USES_MEMO | Flags.STORES_STATS
    comp.set_test_mode(True)
    assert comp.properties() == BASE
    comp = from_config("component name=b type=BatchNormComponent dim=6 block-dim=3 "
                       "test-mode=true")
    assert comp.properties() == BASE | Flags.INPUT_CONTIGUOUS | Flags.OUTPUT_CONTIGUOUS


def test_training_mode_math():
    comp = from_config("component name=b type=BatchNormComponent dim=4 block-dim=2 "
                       "target-rms=2 epsilon=0.01")
    x = np.random.default_rng(0).standard_normal((5, 4)) * 3 + 1
    out, memo = _forward(comp, x)
    blocks = x.reshape(-1, 2)
    want = 2 * (blocks - blocks.mean(0)) / np.sqrt(blocks.var(0) + 0.01)
    np.testing.assert_allclose(out, want.reshape(5, 4), rtol=1e-10)
    assert memo["num_frames"] == 10


def test_stats_accumulate_and_drive_test_mode():
    comp = from_config("component name=b type=BatchNormComponent dim=3")
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((n, 3)).astype(np.float32) * 2 + 3 for n in (10, 6)]
    for x in batches:
        out, memo = _forward(comp, x)
        comp.store_stats(x, out, memo)
    allx = np.concatenate(batches).astype(np.float64)
    assert comp.count == 16
    text = serialize(comp)[0]
    again = read_component(make_reader(text))
    np.testing.assert_allclose(again.stats_sum / 16, allx.mean(0), rtol=1e-5)
    comp.set_test_mode(True)
    y, memo = _forward(comp, allx.astype(np.float32))
    assert memo is None
    want = (allx - allx.mean(0)) / np.sqrt(allx.var(0) + 1e-3)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    comp.zero_stats()  # test mode keeps the stats that define the transform
    assert comp.count == 16
    comp.set_test_mode(False)
    comp.zero_stats()
    assert comp.count == 0 and serialize(comp)[0].endswith(
        b"<Count> 0 <StatsMean>  [ 0 0 0 ]\n<StatsVar>  [ 0 0 0 ]\n</BatchNormComponent> ")


def test_written_stats_kept_until_stats_change():
    text = (b"<BatchNormComponent> <Dim> 2 <BlockDim> 2 <Epsilon> 0.001 <TargetRms> 1 "
            b"<TestMode> F <Count> 3 <StatsMean>  [ 0.1234567 -2.345678 ]\n"
            b"<StatsVar>  [ 1.000001 0.0001234567 ]\n</BatchNormComponent> ")
    comp = read_component(make_reader(text))
    assert serialize(comp)[0] == text
    x = np.ones((2, 2), np.float32)
    out, memo = _forward(comp, x)
    comp.store_stats(x, out, memo)
    assert comp.count == 5 and serialize(comp)[0] != text


def test_stats_read_as_doubles_and_written_from_sums_as_kaldi():
    """As Kaldi's BatchNormComponent: <StatsMean>/<StatsVar> parsed into doubles and
    kept as count-scaled sums; once the file's values are forgotten (what the command
    line tools do before writing), written as float32(sum) * float32(1/count) (minus
    mean^2 for the variance), which need not give the same decimals back."""
    text = (b"<BatchNormComponent> <Dim> 2 <BlockDim> 2 <Epsilon> 0.001 <TargetRms> 1 "
            b"<TestMode> F <Count> 3 <StatsMean>  [ 0.1234567 -2.345678 ]\n"
            b"<StatsVar>  [ 1.000001 0.0001234567 ]\n</BatchNormComponent> ")
    comp = read_component(make_reader(text))
    mean = np.array([0.1234567, -2.345678])  # (the decimals as doubles)
    var = np.array([1.000001, 0.0001234567])
    np.testing.assert_array_equal(comp.stats_sum, mean * 3)
    np.testing.assert_array_equal(comp.stats_sumsq, (var + mean * mean) * 3)
    comp.forget_file_stats()
    inv = np.float32(1.0 / 3)
    m32 = (mean * 3).astype(np.float32) * inv
    v32 = ((var + mean * mean) * 3).astype(np.float32) * inv - m32 * m32
    out = serialize(comp)[0]
    got = [part.split(b"]")[0].split() for part in out.split(b"[")[1:3]]
    # (Kaldi's text streams print 7 significant digits)
    assert got == [[f"{float(v):.7g}".encode() for v in m32],
                   [f"{float(v):.7g}".encode() for v in v32]]
    assert out != text


def test_test_mode_without_stats_invents_them():
    """As Kaldi (with a warning); from a fixed seed, so that two processes (or a
    network and its optimized copy) compute the same outputs."""
    with pytest.warns(RuntimeWarning, match="no statistics"):
        comp = from_config("component name=b type=BatchNormComponent dim=3 test-mode=true")
    assert comp.count == 1.0 and comp.scale is not None
    y, _ = _forward(comp, np.zeros((2, 3), np.float32))
    assert np.all(np.isfinite(y))
    with pytest.warns(RuntimeWarning):
        again = from_config("component name=b type=BatchNormComponent dim=3 test-mode=true")
    np.testing.assert_array_equal(again.scale, comp.scale)
    np.testing.assert_array_equal(again.offset, comp.offset)


@pytest.mark.parametrize("binary", [False, True])
def test_file_roundtrip_and_malformed(binary):
    comp = _trained("component name=b type=BatchNormComponent dim=4 block-dim=2 epsilon=0.01")
    again = reread(comp, binary)
    assert serialize(again)[binary] == serialize(comp)[binary]
    np.testing.assert_allclose(again.scale, comp.scale, rtol=1e-5)
    malformed_checks(*serialize(comp))


def test_config_defaults_and_errors():
    comp = from_config("component name=b type=BatchNormComponent dim=8")
    assert (comp.block_dim, comp.epsilon, comp.target_rms, comp.test_mode) == \
        (8, pytest.approx(1e-3), 1.0, False)
    assert serialize(comp)[0].startswith(
        b"<BatchNormComponent> <Dim> 8 <BlockDim> 8 <Epsilon> 0.001 <TargetRms> 1 "
        b"<TestMode> F <Count> 0 ")
    for bad in ("", "dim=6 block-dim=4", "dim=6 epsilon=0", "dim=6 target-rms=-1",
                "dim=6 foo=2", "dim=6 test-mode=yes"):
        with pytest.raises(ConfigError):
            from_config(f"component name=b type=BatchNormComponent {bad}")


def test_bad_files():
    head = b"<BatchNormComponent> <Dim> 4 <BlockDim> "
    tail = (b" <Epsilon> 0.001 <TargetRms> 1 <TestMode> T <Count> 2 <StatsMean>  [ 1 2 ]\n"
            b"<StatsVar>  [ 1 1 ]\n</BatchNormComponent> ")
    assert read_component(make_reader(head + b"2" + tail)).dim == 4
    for data in (head + b"3" + tail, head + b"4" + tail,
                 head + b"2" + tail.replace(b"[ 1 1 ]", b"[ 1 nan ]")):
        with pytest.raises(FormatError):
            read_component(make_reader(data, "<test>"))
