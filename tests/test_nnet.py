"""pynnet3.nnet: building networks from configs (like nnet3-init), validation,
context and recurrence, compared with what Kaldi made of the same configs."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from pynnet3.errors import ConfigError, DescriptorError, DimensionError, GraphError
from pynnet3.io.model_file import parse_model_bytes
from pynnet3.nnet import Nnet, read_nnet

from .reference import REF, ref_params, require_reference

_CONFIG_SPLIT = re.compile(r"^# --- config \d+ ---[ \t]*$", re.M)


def split_configs(text: str) -> list[str]:
    """A reference nnet.config as the list of configs Kaldi read in order."""
    if not _CONFIG_SPLIT.search(text):
        return [text]
    return [c for c in _CONFIG_SPLIT.split(text)[1:]]


def _config_cases() -> list[Path]:
    return sorted(p.parent for p in REF.rglob("nnet.config")) if REF.is_dir() else []


def _model_of(case: Path) -> Path:
    model = case / "model.txt"
    return model if model.is_file() else case.parent / "model.txt"


def _case_id(p: Path) -> str:
    return str(p.relative_to(REF))


@pytest.fixture(scope="module")
def nnets_from_config():
    cache: dict[Path, Nnet] = {}

    def get(case: Path) -> Nnet:
        if case not in cache:
            path = case / "nnet.config"
            cache[case] = Nnet.from_config(split_configs(path.read_text()), seed=0,
                                           source=str(path))
        return cache[case]

    return get


def test_split_configs():
    text = "# --- config 0 ---\ninput-node name=a dim=2\n# --- config 1 ---\nx\n"
    assert split_configs(text) == ["\ninput-node name=a dim=2\n", "\nx\n"]
    assert split_configs("input-node name=a dim=2\n") == ["input-node name=a dim=2\n"]


def test_reference_has_multi_config_cases():
    require_reference()
    multi = [c for c in _config_cases()
             if len(split_configs((c / "nnet.config").read_text())) > 1]
    assert multi, "expected some generated cases with several configs"


@pytest.mark.parametrize("case", ref_params(_config_cases(), "nnet.config cases"),
                         ids=_case_id)
def test_config_gives_kaldis_nodes_and_components(case, nnets_from_config):
    nnet = nnets_from_config(case)
    model = _model_of(case)
    parts = parse_model_bytes(model.read_bytes(), str(model))
    assert [n.config_line() for n in nnet.nodes] == [line for _, line in parts.config_lines]
    ref = dict(parts.components)
    assert list(nnet.components) == list(ref)
    for name, comp in ref.items():
        mine = nnet.components[name]
        assert type(mine) is type(comp), name
        assert (mine.input_dim, mine.output_dim) == (comp.input_dim, comp.output_dim), name


@pytest.mark.parametrize("case", ref_params(_config_cases(), "nnet.config cases"),
                         ids=_case_id)
def test_context_and_recurrence_match_kaldi(case, nnets_from_config):
    stats = json.loads((case / "stats.json").read_text())
    nnet = nnets_from_config(case)
    assert "left_context" in stats and "is_recurrent" in stats
    assert (nnet.left_context, nnet.right_context) == (stats["left_context"],
                                                      stats["right_context"])
    assert nnet.is_recurrent() == stats["is_recurrent"]


def _context_records() -> list[tuple[Path, int, int]]:
    """(model file, left, right) from every json that states a model's context."""
    if not REF.is_dir():
        return []
    out = []
    for case in _config_cases():
        st = json.loads((case / "stats.json").read_text())
        out.append((_model_of(case), st["left_context"], st["right_context"]))
    for info in sorted(REF.glob("am/*/info.json")) + sorted(REF.glob("looped/*/run_info.json")):
        st = json.loads(info.read_text())
        out.append(((info.parent / st["model"]).resolve(), st["left_context"],
                    st["right_context"]))
    return out


def test_context_of_models_read_from_files():
    require_reference()
    records = _context_records()
    assert records, f"no case states a model's context under {REF}"
    cache: dict[Path, tuple[int, int]] = {}
    for model, left, right in records:
        if model not in cache:
            cache[model] = read_nnet(model).context()
        assert cache[model] == (left, right), model


# ----------------------------------------------------------------------------------
# Small hand-made networks
# ----------------------------------------------------------------------------------

BASE = """\
input-node name=input dim=4
component name=affine type=AffineComponent input-dim=4 output-dim=3
component-node name=affine component=affine input=input
output-node name=output input=affine
"""


def test_base_network_queries():
    nnet = Nnet.from_config(BASE)
    assert nnet.input_names() == ["input"]
    assert nnet.output_names() == ["output"]
    assert nnet.input_dim("input") == 4
    assert nnet.output_dim("output") == 3
    assert nnet.node_dim("affine") == 3
    assert nnet.num_params() == 15
    assert (nnet.left_context, nnet.right_context) == (0, 0)
    assert nnet.modulus() == 1
    assert not nnet.is_recurrent()
    with pytest.raises(GraphError, match="'affine' is not an input"):
        nnet.input_dim("affine")
    with pytest.raises(GraphError, match="not an output"):
        nnet.output_dim("input")
    with pytest.raises(GraphError, match="no node named 'nope'"):
        nnet.node("nope")


def test_seeded_initialization_is_deterministic():
    a = Nnet.from_config(BASE, seed=3).to_bytes()
    assert a == Nnet.from_config(BASE, seed=3).to_bytes()
    assert a != Nnet.from_config(BASE, seed=4).to_bytes()


def test_context_modulus_and_recurrence_of_a_small_network():
    text = """\
input-node name=input dim=2
component name=a type=AffineComponent input-dim=6 output-dim=2
component-node name=a component=a input=Append(Offset(input, -2), input, Offset(input, 3))
component name=r type=AffineComponent input-dim=4 output-dim=2
component-node name=r component=r input=Append(a, IfDefined(Offset(r, -1)))
output-node name=output input=Append(Round(r, 3), Switch(r, a))
"""
    nnet = Nnet.from_config(text)
    assert nnet.is_recurrent()
    assert nnet.modulus() == 6
    assert nnet.left_context >= 2 and nnet.right_context >= 3


def test_later_config_redefines_nodes_and_replaces_components():
    extra = """\
component name=affine2 type=AffineComponent input-dim=3 output-dim=5
component-node name=affine2 component=affine2 input=affine
output-node name=output input=affine2 objective=quadratic
component name=affine type=AffineComponent input-dim=4 output-dim=3 param-stddev=0
"""
    nnet = Nnet.from_config([BASE, extra])
    assert [n.name for n in nnet.nodes] == ["input", "affine", "affine2", "output"]
    assert list(nnet.components) == ["affine", "affine2"]
    assert nnet.node("output").config_line() == (
        "output-node name=output input=affine2 objective=quadratic")
    assert nnet.output_dim("output") == 5
    assert not nnet.components["affine"].linear_params.any()


def test_node_defined_twice_in_one_config_keeps_the_last_at_its_position():
    text = BASE + "input-node name=input dim=4\n"
    nnet = Nnet.from_config(text)
    assert [n.name for n in nnet.nodes] == ["affine", "output", "input"]


def test_forward_reference_within_a_config_is_allowed():
    text = """\
input-node name=input dim=4
output-node name=output input=affine
component-node name=affine component=affine input=input
component name=affine type=AffineComponent input-dim=4 output-dim=3
"""
    nnet = Nnet.from_config(text)
    assert [n.name for n in nnet.nodes] == ["input", "output", "affine"]


def _error(text: str, exc_type, *fragments):
    with pytest.raises(exc_type) as ei:
        Nnet.from_config(text, source="net.config")
    assert type(ei.value) is exc_type, repr(ei.value)
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, (f, msg)
    return ei.value


def test_unknown_node_in_descriptor():
    err = _error(BASE.replace("input=input", "input=Append(input, Offset(inptu, 1))"),
                 DescriptorError, "unknown node 'inptu'", "net.config", "line 3", "column 22")
    assert err.line_number == 3
    assert "bad descriptor" in str(err) and "config:" not in str(err)


def test_malformed_descriptor_names_line_and_token():
    _error(BASE.replace("input=affine", "input=Sum(affine"), DescriptorError,
           "line 4", "end of input")


def test_unknown_component():
    _error(BASE.replace("component=affine", "component=afine"), GraphError,
           "'affine'", "'afine'")


def test_descriptor_dim_differs_from_component_input_dim():
    _error(BASE.replace("input=input", "input=Append(input, input)"), DimensionError,
           "'affine'", "8", "4")


def test_sum_of_different_dims():
    text = BASE.replace("output-node name=output input=affine",
                        "output-node name=output input=Sum(affine, input)")
    _error(text, DimensionError, "'output'", "3", "4")


@pytest.mark.parametrize("offset, dim", [(2, 2), (0, 4), (-1, 2), (0, 0)])
def test_dim_range_out_of_range(offset, dim):
    text = BASE + (f"dim-range-node name=dr input-node=affine dim-offset={offset} dim={dim}\n"
                   "output-node name=out2 input=dr\n")
    _error(text, DimensionError, "'dr'")


def test_dim_range_ok_and_unknown_source():
    text = BASE + ("dim-range-node name=dr input-node=affine dim-offset=1 dim=2\n"
                   "output-node name=out2 input=dr\n")
    nnet = Nnet.from_config(text)
    assert nnet.output_dim("out2") == 2
    assert nnet.node("dr").config_line() == (
        "dim-range-node name=dr input-node=affine dim-offset=1 dim=2")
    _error(text.replace("input-node=affine", "input-node=nope"), ConfigError, "'nope'",
           "line 5")


def test_reading_an_output_node():
    text = BASE + ("component name=b type=AffineComponent input-dim=3 output-dim=3\n"
                   "component-node name=b component=b input=output\n")
    _error(text, GraphError, "'b'", "output node 'output'")


def test_unknown_component_type():
    _error(BASE.replace("type=AffineComponent", "type=FooComponent"), ConfigError,
           "FooComponent", "line 2")


def test_no_output_node():
    _error("\n".join(BASE.splitlines()[:3]) + "\n", GraphError, "no output-node")


def test_unknown_line_type_and_unknown_options():
    _error(BASE + "node name=x\n", ConfigError, "'node'", "line 5")
    _error(BASE.replace("name=input dim=4", "name=input dim=4 foo=1"), ConfigError, "foo=",
           "line 1")
    _error(BASE.replace("output-dim=3", "output-dim=3 bogus=2"), ConfigError, "bogus=",
           "line 2")


@pytest.mark.parametrize("old, new, fragment", [
    ("input-node name=input dim=4", "input-node name=input dim=0", "dim"),
    ("input-node name=input dim=4", "input-node name=input dim=four", "dim="),
    ("input-node name=input dim=4", "input-node dim=4", "name="),
    ("component-node name=affine component=affine input=input",
     "component-node name=affine component=affine", "input="),
    ("output-node name=output input=affine",
     "output-node name=output input=affine objective=xent", "objective"),
    ("component name=affine type=AffineComponent", "component name=affine", "type="),
    ("component name=affine type=AffineComponent",
     "component name=1affine type=AffineComponent", "invalid name '1affine'"),
    ("input-node name=input dim=4", "input-node name=in/put dim=4", "invalid name 'in/put'"),
    ("output-node name=output", "output-node name=out:put", "invalid name 'out:put'"),
])
def test_bad_node_and_component_lines(old, new, fragment):
    assert old in BASE
    _error(BASE.replace(old, new), ConfigError, fragment)


# ----------------------------------------------------------------------------------
# Validation of model files
# ----------------------------------------------------------------------------------

def _model_text(nnet: Nnet) -> str:
    return nnet.to_bytes(binary=False).decode()


def _read_text(text: str):
    parts = parse_model_bytes(text.encode(), "m.txt")
    return Nnet.from_model_parts(parts, "m.txt")


def test_model_file_duplicate_node_name():
    text = _model_text(Nnet.from_config(BASE))
    text = text.replace("input-node name=input dim=4\n",
                        "input-node name=input dim=4\ninput-node name=input dim=4\n")
    with pytest.raises(ConfigError) as ei:
        _read_text(text)
    assert "duplicate node name 'input'" in str(ei.value) and "line 3" in str(ei.value)


def test_model_file_duplicate_component_name():
    text = _model_text(Nnet.from_config(BASE))
    start = text.index("<ComponentName>")
    end = text.index("</Nnet3>")
    comp = text[start:end]
    text = text[:start] + comp + comp + text[end:]
    text = text.replace("<NumComponents> 1", "<NumComponents> 2")
    with pytest.raises(GraphError, match="duplicate component name 'affine'"):
        _read_text(text)


def test_model_file_validation_errors():
    good = _model_text(Nnet.from_config(BASE))
    with pytest.raises(DescriptorError, match="unknown node 'nope'") as ei:
        _read_text(good.replace("input=affine", "input=nope"))
    assert "m.txt" in str(ei.value) and "line 4" in str(ei.value)
    with pytest.raises(GraphError, match="unknown component 'nope'"):
        _read_text(good.replace("component=affine", "component=nope"))
    with pytest.raises(DimensionError, match="'affine'"):
        _read_text(good.replace("input-node name=input dim=4", "input-node name=input dim=5"))
    with pytest.raises(GraphError, match="no output-node"):
        _read_text(good.replace("output-node name=output input=affine objective=linear\n", ""))
    with pytest.raises(ConfigError, match="unexpected line type 'component'"):
        _read_text(good.replace("output-node name=output",
                                "component name=x type=AffineComponent\noutput-node name=output"))


def test_info_lists_nodes_and_components():
    info = Nnet.from_config(BASE).info()
    assert "left-context: 0" in info and "right-context: 0" in info
    assert "num-parameters: 15" in info
    assert "component-node name=affine component=affine input=input input-dim=4 output-dim=3" \
        in info
    assert "output-node name=output input=affine dim=3 objective=linear" in info
    assert "component name=affine" in info


def test_context_follows_changes_to_the_network():
    nnet = Nnet.from_config(BASE)
    assert nnet.context() == (0, 0)
    nnet.read_config("""\
component name=a2 type=AffineComponent input-dim=6 output-dim=3
component-node name=a2 component=a2 input=Append(Offset(affine, -2), Offset(affine, 1))
output-node name=output input=a2
""")
    assert nnet.context() == (2, 1)
    assert (nnet.left_context, nnet.right_context) == (2, 1)
    copy = nnet.copy()
    assert copy.context() == (2, 1)
    nnet.read_config("output-node name=output input=affine\n")
    assert nnet.context() == (0, 0)
    assert copy.context() == (2, 1)


def test_context_cache_survives_a_replaced_component_at_a_reused_address():
    """A component replaced by a new object is seen even when the new one lands at
    the old one's address (CPython reuses freed memory at once): the cache keeps
    the objects it was computed for, so their ids stay taken."""
    config = """\
input-node name=input dim=4
component name=tdnn type=TdnnComponent input-dim=4 output-dim=3 time-offsets=-1,0,1
component-node name=tdnn component=tdnn input=input
output-node name=output input=tdnn
"""
    nnet = Nnet.from_config(config)
    assert nnet.context() == (1, 1)
    wider = Nnet.from_config(config.replace("-1,0,1", "-3,0,2")).components["tdnn"]
    for _ in range(50):  # try to make the replacement reuse the old address
        old_id = id(nnet.components["tdnn"])
        nnet.components["tdnn"] = None
        replacement = copy.deepcopy(wider)
        nnet.components["tdnn"] = replacement
        assert nnet.context() == (3, 2), id(replacement) == old_id
        nnet.components["tdnn"] = copy.deepcopy(
            Nnet.from_config(config).components["tdnn"])
        assert nnet.context() == (1, 1)


def test_node_lookup():
    nnet = Nnet.from_config(BASE)
    assert nnet.node("affine").name == "affine" and nnet.has_node("affine")
    assert not nnet.has_node("nope")
    with pytest.raises(GraphError, match="nope"):
        nnet.node("nope")


_SMALL = """input-node name=input dim=4
component name=a type=AffineComponent input-dim=8 output-dim=3
component-node name=a component=a input=Append(Offset(input, -1), input)
output-node name=output input=a
"""


def test_a_copy_shares_only_the_immutable_descriptors():
    nnet = Nnet.from_config(_SMALL, seed=1)
    other = nnet.copy()
    a, b = nnet.node("a"), other.node("a")
    assert b is not a and b == a and b.descriptor is a.descriptor  # (frozen: shared)
    assert copy.deepcopy(a.descriptor) is a.descriptor
    assert other.components["a"] is not nnet.components["a"]
    other.components["a"].linear_params[0, 0] += 1.0
    assert other.components["a"].linear_params[0, 0] != nnet.components["a"].linear_params[0, 0]
    b.component = "renamed"  # (nodes are copied: the original keeps its own)
    assert a.component == "a"
