"""TdnnComponent: file round trips, reference cases, gradients, flags, config, bad files.

The helpers at the top (round trips of spans and whole files, running a reference
case) are also used by test_recurrent.py and test_time_height_conv.py; the generic
ones are in common.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pynnet3.components import Flags, component_class
from pynnet3.errors import ComputeError, ConfigError, FormatError
from pynnet3.io.kaldi_stream import make_reader, make_writer
from pynnet3.io.model_file import parse_model_bytes, read_component, write_model_parts
from tests.components.common import (
    finite_difference_check,
    from_config,
    reference_files,
    rel_err,
    roundtrip_spans,
)
from tests.reference import REF, component_cases, load_case, ref_params, require_reference

# ----------------------------------------------------------------------------------
# helpers shared by the three test files


def check_round_trip(path: Path, type_name: str) -> int:
    """Reading and writing each component of the type gives Kaldi's bytes back;
    when every component type of the file is known, the whole file too."""
    count = roundtrip_spans(path, type_name)
    assert count > 0
    data = path.read_bytes()
    binary = data[:2] == b"\0B"
    types = {t.decode() for t in re.findall(rb"<ComponentName> \S+ <(\w+)>", data)}
    # BatchNorm keeps sums in memory and writes mean/variance, so Kaldi itself does
    # not reproduce those files byte for byte (reference README); skip them whole.
    if "BatchNormComponent" not in types and all(component_class(t) for t in types):
        assert write_model_parts(parse_model_bytes(data, str(path)), binary) == data
    return count


def direct_cases(prefix: str) -> list[Path]:
    """Reference cases whose network is just input -> comp -> output."""
    out = []
    for case in component_cases(prefix):
        cfg = (case / "nnet.config").read_text()
        if ("component-node name=comp component=comp input=input\n" in cfg
                and "output-node name=output input=comp" in cfg):
            out.append(case)
    return out


def forward(comp, idx, x, num_out, out_init=None):
    out = (np.zeros((num_out, comp.output_dim), x.dtype) if out_init is None
           else out_init.astype(x.dtype).copy())
    memo = comp.propagate(idx, x, out)
    return out, memo


def run_reference_case(case: Path, comp_name: str = "comp", shuffle_seed: int | None = None):
    """Run the component directly on a reference case; check output, input
    derivative and exported gradient against Kaldi (rel 1e-4 / 1e-3)."""
    req, arrays, _ = load_case(case)
    comp = parse_model_bytes((case / "model.txt").read_bytes()).components[0][1]
    x = arrays["input:input"]
    in_idx = np.array(req["inputs"][0]["indexes"], dtype=np.int64)
    out_idx = np.array(req["outputs"][0]["indexes"], dtype=np.int64)
    want_out = arrays["output:output"]
    out_deriv = arrays["output_deriv:output"]
    want_in_deriv = arrays["input_deriv:input"]
    if shuffle_seed is not None:  # rows in another order: the maps must follow
        rng = np.random.default_rng(shuffle_seed)
        pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
        x, in_idx, want_in_deriv = x[pi], in_idx[pi], want_in_deriv[pi]
        out_idx, want_out, out_deriv = out_idx[po], want_out[po], out_deriv[po]
    idx = comp.precompute_indexes(in_idx, out_idx, True)
    out, memo = forward(comp, idx, x, len(out_idx))
    assert out.dtype == np.float32
    assert rel_err(out, want_out) < 1e-4
    in_deriv = np.zeros_like(x)
    grad = {k: np.zeros_like(v) for k, v in comp.params().items()}
    comp.backprop(idx, x, out, out_deriv, memo, grad, in_deriv)
    assert rel_err(in_deriv, want_in_deriv) < 1e-3
    exported = comp.export_gradient(grad)
    keys = {k.split(":", 2)[2] for k in arrays if k.startswith(f"grad:{comp_name}:")}
    assert set(exported) == keys
    for k, g in exported.items():
        assert rel_err(g, arrays[f"grad:{comp_name}:{k}"]) < 1e-3, k


def written(comp, binary: bool) -> bytes:
    w = make_writer(binary)
    if binary:
        w.raw(b"\0B")
    comp.write(w)
    return w.getvalue()


def reread(data: bytes):
    r = make_reader(data, "test")
    comp = read_component(r)
    assert r.at_eof()
    return comp


def check_malformed(comp) -> None:
    """Truncated bodies and a garbage token raise FormatError, text and binary."""
    for binary in (False, True):
        data = written(comp, binary)
        assert written(reread(data), binary) == data
        for cut in (len(data) // 3, len(data) // 2, len(data) - 3):
            with pytest.raises(FormatError):
                reread(data[:cut])
    text = written(comp, False).decode()
    second_tag = re.findall(r"<\w+>", text)[2]
    with pytest.raises(FormatError):
        reread(text.replace(second_tag, "<Garbage>", 1).encode())


def sequence_indexes(ts, ns=(0, 1)) -> np.ndarray:
    return np.array([(n, t, 0) for n in ns for t in ts], dtype=np.int64)


# ----------------------------------------------------------------------------------
# tests

TYPE = "TdnnComponent"


@pytest.mark.parametrize("path", ref_params(reference_files(TYPE)),
                         ids=lambda p: str(p.relative_to(REF)))
def test_round_trip_reference_files(path):
    check_round_trip(path, TYPE)


def test_round_trip_covers_reference():
    require_reference()
    names = {p.relative_to(REF).as_posix() for p in reference_files(TYPE)}
    assert {"components/Tdnn_1/model.txt", "components/Tdnn_2/model.bin",
            "realistic/tdnnf_chain/model.txt", "generated/case_20/model.bin"} <= names


@pytest.mark.parametrize("case", ref_params(direct_cases("Tdnn_"), "cases"), ids=lambda p: p.name)
@pytest.mark.parametrize("shuffle", [None, 7])
def test_reference_case(case, shuffle):
    run_reference_case(case, shuffle_seed=shuffle)


@pytest.mark.parametrize("use_bias", [True, False])
def test_finite_differences(use_bias):
    comp = from_config("component name=c type=TdnnComponent input-dim=3 output-dim=4 "
                       f"time-offsets=-2,0,1 use-bias={str(use_bias).lower()}")
    rng = np.random.default_rng(1)
    in_idx = sequence_indexes(range(-2, 6))
    out_idx = sequence_indexes(range(0, 5))
    pi, po = rng.permutation(len(in_idx)), rng.permutation(len(out_idx))
    x = rng.standard_normal((len(in_idx), 3))
    finite_difference_check(comp, x, in_idx[pi], out_idx[po])


def test_subsampled_time_offsets():
    """Outputs every 3rd frame with offsets -3,0,3: row gather, not a stride rule."""
    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=2 "
                       "time-offsets=-3,0,3")
    in_idx = sequence_indexes(range(-3, 10), ns=(0,))
    out_idx = sequence_indexes(range(0, 7, 3), ns=(0,))
    x = np.random.default_rng(0).standard_normal((len(in_idx), 2)).astype(np.float32)
    out, _ = forward(comp, comp.precompute_indexes(in_idx, out_idx, False), x, len(out_idx))
    w, b = comp.linear_params, comp.bias_params
    for j, (_, t, _) in enumerate(out_idx):
        rows = [int(np.flatnonzero(in_idx[:, 1] == t + o)[0]) for o in (-3, 0, 3)]
        want = w @ np.concatenate([x[r] for r in rows]) + b
        np.testing.assert_allclose(out[j], want, rtol=1e-5, atol=1e-6)


def test_propagate_adds_without_bias_and_backprop_adds():
    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                       "time-offsets=0,1 use-bias=false")
    in_idx, out_idx = sequence_indexes(range(0, 4)), sequence_indexes(range(0, 3))
    idx = comp.precompute_indexes(in_idx, out_idx, True)
    x = np.random.default_rng(2).standard_normal((len(in_idx), 2))
    base, _ = forward(comp, idx, x, len(out_idx))
    added, _ = forward(comp, idx, x, len(out_idx), out_init=np.ones_like(base))
    np.testing.assert_allclose(added, base + 1)
    d = np.random.default_rng(3).standard_normal(base.shape)
    in_deriv = np.zeros_like(x)
    comp.backprop(idx, x, base, d, None, None, in_deriv)
    in_deriv2 = np.ones_like(x)
    comp.backprop(idx, x, base, d, None, None, in_deriv2)
    np.testing.assert_allclose(in_deriv2, in_deriv + 1)


def test_float64_math():
    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                       "time-offsets=0")
    idx = comp.precompute_indexes(sequence_indexes([0]), sequence_indexes([0]), False)
    out, _ = forward(comp, idx, np.ones((2, 2)), 2)
    assert out.dtype == np.float64


def test_input_indexes_and_missing_input():
    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                       "time-offsets=-1,2")
    deps = comp.input_indexes(np.array([[0, 5, 0], [1, 7, 2]]))
    assert deps.owner.tolist() == [0, 0, 1, 1]
    assert deps.indexes.tolist() == [[0, 4, 0], [0, 7, 0], [1, 6, 2], [1, 9, 2]]
    assert deps.required.all() and not deps.any_suffices
    with pytest.raises(ComputeError):
        comp.precompute_indexes(sequence_indexes([0, 1]), sequence_indexes([1]), False)


def test_stretched_precomputed_indexes_equal_recomputed_ones():
    """Shortcut expansion's hook: the two-sequence object stretched along n equals
    precompute_indexes on the expanded indexes; an incomplete object (whose
    precompute_indexes raises) is not stretched."""
    from pynnet3.cache.expand import RowMapStretch

    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                       "time-offsets=-2,0,1")
    ts_in, ts_out = range(-2, 9), range(0, 8)
    # t-major in both (n innermost, S = 1), the output reversed in t
    inp = np.array([(n, t, 0) for t in ts_in for n in (0, 1)], dtype=np.int64)
    out = np.array([(n, t, 0) for t in reversed(ts_out) for n in (0, 1)], dtype=np.int64)
    mini = comp.precompute_indexes(inp, out, False)
    assert mini.starts is None  # reversed in t: not runs
    stretch = RowMapStretch(len(inp), 1, len(out), 1)
    for num_n in (2, 3, 16):
        ns = range(num_n)
        new_in = np.array([(n, t, 0) for t in ts_in for n in ns], dtype=np.int64)
        new_out = np.array([(n, t, 0) for t in reversed(ts_out) for n in ns], dtype=np.int64)
        got = comp.stretch_precomputed(mini, new_in, new_out, False, stretch.bind(num_n))
        want = comp.precompute_indexes(new_in, new_out, False)
        assert got.num_in == want.num_in == len(new_in)
        assert got.src.dtype == want.src.dtype and got.src.tobytes() == want.src.tobytes()
    incomplete = type(mini)(np.where(mini.src == 0, -1, mini.src), mini.num_in)
    assert comp.stretch_precomputed(incomplete, inp, out, False, stretch.bind(2)) is None
    assert comp.stretch_precomputed(None, inp, out, False, stretch.bind(2)) is None


@pytest.mark.parametrize("n_inner", [True, False])
def test_run_maps_stretch_from_their_starts(n_inner):
    """Inputs and outputs in one row order make each offset's map a run of rows:
    the object knows its starts, propagate/backprop read slices with the results
    of the gathering form, and the stretched object is built from the starts alone
    (when n is innermost) and equals the recomputed one."""
    from pynnet3.cache.expand import RowMapStretch
    from pynnet3.components.tdnn import OffsetGather

    comp = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                       "time-offsets=-2,0,1")

    def rows(ns, ts):
        if n_inner:
            return np.array([(n, t, 0) for t in ts for n in ns], dtype=np.int64)
        return np.array([(n, t, 0) for n in ns for t in ts], dtype=np.int64)

    ts_in, ts_out = range(-2, 9), range(0, 8)
    inp, out = rows((0, 1), ts_in), rows((0, 1), ts_out)
    mini = comp.precompute_indexes(inp, out, False)
    if n_inner:
        assert mini.starts == (0, 4, 6)  # t + offset - (-2), times 2 rows per t
    else:
        assert mini.starts is None  # each sequence's input is longer than its output
    stretch = RowMapStretch(len(inp), 1 if n_inner else len(ts_in),
                            len(out), 1 if n_inner else len(ts_out))
    for num_n in (2, 5):
        new_in, new_out = rows(range(num_n), ts_in), rows(range(num_n), ts_out)
        bound = stretch.bind(num_n)
        got = comp.stretch_precomputed(mini, new_in, new_out, False, bound)
        want = comp.precompute_indexes(new_in, new_out, False)
        if n_inner:
            assert got._src is None  # made from the starts; rows built on demand
        assert got == want and got.starts == want.starts
        # slices (a product per time offset, accumulated as Kaldi's layer does) and
        # gathers (one product over the spliced rows) agree up to float32 rounding
        x = np.random.default_rng(num_n).standard_normal((len(new_in), 2)).astype(np.float32)
        gathered = OffsetGather(want.src, want.num_in)
        gathered.starts = None
        y1, y2 = (np.zeros((len(new_out), 3), np.float32) for _ in range(2))
        comp.propagate(got, x, y1)
        comp.propagate(gathered, x, y2)
        np.testing.assert_allclose(y1, y2, rtol=1e-6, atol=1e-6)
        d = np.random.default_rng(7).standard_normal(y1.shape).astype(np.float32)
        g1, g2 = (np.zeros_like(x) for _ in range(2))
        comp.backprop(got, x, y1, d, None, None, g1)
        comp.backprop(gathered, x, y2, d, None, None, g2)
        assert g1.tobytes() == g2.tobytes()


def test_run_starts_rejects_maps_that_are_not_runs():
    from pynnet3.cache.expand import RowMapStretch
    from pynnet3.components.tdnn import run_starts

    assert run_starts(np.array([[3, 4, 5], [0, 1, 2]])) == (3, 0)
    assert run_starts(np.array([[3, 4, 6]])) is None
    assert run_starts(np.array([[-1, 0, 1]])) is None
    assert run_starts(np.zeros((2, 0), dtype=np.int64)) is None
    # a within-sequence map that is a run in the two-sequence layout only when the
    # strides differ is not taken for a run after stretching
    stretch = RowMapStretch(8, 2, 4, 1)
    assert stretch.run_starts(np.array([[0, 2, 4, 6]], dtype=np.int64), 3) is None


def test_properties():
    with_bias = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                            "time-offsets=0")
    assert with_bias.properties() == (Flags.UPDATABLE | Flags.REORDERS_INDEXES
                                      | Flags.BACKPROP_ADDS | Flags.BACKPROP_NEEDS_INPUT)
    no_bias = from_config("component name=c type=TdnnComponent input-dim=2 output-dim=3 "
                          "time-offsets=0 use-bias=false")
    assert no_bias.properties() == with_bias.properties() | Flags.PROPAGATE_ADDS
    assert no_bias.is_updatable() and not no_bias.is_simple()


def test_flags_arithmetic_is_integer_arithmetic():
    """Flags' | and & (a fast path through the value map, used by every
    properties() call) give the members plain int arithmetic would, either side."""
    members = list(Flags)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = (Flags(int(v)) for v in rng.integers(0, 0x4000, size=2))
        v = int(rng.integers(0, 0x4000))
        for got, want in ((a | b, int(a) | int(b)), (a & b, int(a) & int(b)),
                          (a | v, int(a) | v), (v | a, int(a) | v), (a & v, int(a) & v),
                          (v & a, int(a) & v)):
            assert type(got) is Flags and int(got) == want and got is Flags(want)
    assert Flags.SIMPLE | Flags.UPDATABLE is Flags(3) and (Flags.NONE | Flags.NONE) is Flags.NONE
    assert all(m | m is m and m & m is m for m in members)
    with pytest.raises(TypeError):
        Flags.SIMPLE | "x"
    with pytest.raises(TypeError):
        Flags.SIMPLE & 1.0


def test_config_init_defaults_and_dims():
    comp = from_config("component name=c type=TdnnComponent input-dim=40 output-dim=30 "
                       "time-offsets=-1,0,1", seed=3)
    assert (comp.input_dim, comp.output_dim) == (40, 30)
    assert comp.linear_params.shape == (30, 120) and comp.bias_params.shape == (30,)
    assert abs(comp.linear_params.std() - 1 / np.sqrt(120)) < 0.01
    assert abs(comp.bias_params.std() - 1.0) < 0.4  # bias-stddev defaults to 1
    assert (comp.rank_in, comp.rank_out) == (20, 15)
    assert comp.num_samples_history == 2000.0 and comp.use_natural_gradient
    assert comp.orthonormal_constraint == 0.0
    text = written(comp, False).decode()
    assert "<RankInOut> 20 15 " in text and "<AlphaInOut> 4 4 " in text
    comp = from_config("component name=c type=TdnnComponent input-dim=4 output-dim=3 "
                       "time-offsets=0,3 use-bias=false orthonormal-constraint=-1 "
                       "param-stddev=0 learning-rate-factor=0.5 max-change=0.75")
    assert comp.bias_params.size == 0 and not comp.linear_params.any()
    assert "<OrthonormalConstraint> -1 " in written(comp, False).decode()
    assert set(comp.params()) == {"linear_params"}


@pytest.mark.parametrize("line", [
    "input-dim=4 output-dim=3",                              # no time-offsets
    "input-dim=4 time-offsets=0",                            # no output-dim
    "input-dim=4 output-dim=3 time-offsets=0,0",             # repeated offset
    "input-dim=0 output-dim=3 time-offsets=0",
    "input-dim=4 output-dim=3 time-offsets=0 bogus-option=1",
    "input-dim=4 output-dim=3 time-offsets=a,b",
])
def test_config_errors(line):
    with pytest.raises(ConfigError):
        from_config("component name=c type=TdnnComponent " + line)


def test_malformed_files():
    comp = from_config("component name=c type=TdnnComponent input-dim=3 output-dim=2 "
                       "time-offsets=-1,1")
    check_malformed(comp)
    text = written(comp, False).decode()
    bad = re.sub(r"(<LinearParams>  \[\n  )(\S+)", r"\1nan", text)
    assert "nan" in bad
    with pytest.raises(FormatError, match="non-finite"):
        reread(bad.encode())
    with pytest.raises(FormatError):  # 6 columns are not a multiple of 4 offsets
        reread(text.replace("<TimeOffsets> [ -1 1 ]", "<TimeOffsets> [ -1 0 1 5 ]").encode())
    with pytest.raises(FormatError):
        reread(text.replace("<TimeOffsets> [ -1 1 ]", "<TimeOffsets> [ 1 1 ]").encode())
