"""Acoustic models (final.mdl): Kaldi's files read and write back byte for byte, text
and binary; the network inside computes what the raw network computes; read_nnet
accepts a final.mdl; malformed files are FormatErrors naming file, place and token.
A model built in code round-trips without the reference data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import pynnet3
from pynnet3.am import AcousticModel, read_am
from pynnet3.errors import FormatError, GraphError
from pynnet3.io.am_file import (
    HmmState,
    HmmTopology,
    TransitionModel,
    is_am_bytes,
    read_transition_model,
)
from pynnet3.io.kaldi_stream import TextReader

from ..reference import REF, ref_params

NAMES = ["tdnnf_chain", "tdnn_relu_bn"]
_AM = ref_params([REF / "am" / n for n in NAMES], "am cases")


def _id(p) -> str:
    return p.name if p is not None else "none"


# -- a small model built in code (no reference data needed) --------------------------

_CONFIG = """\
input-node name=input dim=4
component-node name=affine component=affine input=Append(Offset(input, -1), input, Offset(input, 1))
component name=affine type=NaturalGradientAffineComponent input-dim=12 output-dim=6
output-node name=output input=affine objective=quadratic
"""


def _hmm_topology() -> HmmTopology:
    """gen_topo.pl-like: 2 emitting states + final, phones 1..3."""
    entry = [HmmState(0, 0, [(0, 0.75), (1, 0.25)]), HmmState(1, 1, [(1, 0.5), (2, 0.5)]),
             HmmState()]
    return HmmTopology([entry], np.array([-1, 0, 0, 0]))


def _chain_topology() -> HmmTopology:
    """Chain-style: one emitting state with separate self-loop pdf class, 2 entries."""
    a = [HmmState(0, 1, [(0, 0.5), (1, 0.5)]), HmmState()]
    b = [HmmState(0, 1, [(0, 1 / 3), (1, 2 / 3)]), HmmState()]
    return HmmTopology([a, b], np.array([-1, 1, 0, 0]))


def _small_am(topology: HmmTopology) -> AcousticModel:
    tm = TransitionModel.build(topology, lambda phone, c: (phone - 1) * 2 + c)
    nnet = pynnet3.Nnet.from_config(_CONFIG, seed=3)
    priors = np.arange(1, 7, dtype=np.float32) / 21
    return AcousticModel(tm, nnet, priors)


@pytest.mark.parametrize("topology", [_hmm_topology, _chain_topology])
@pytest.mark.parametrize("binary", [True, False])
def test_model_built_in_code_round_trips(topology, binary, tmp_path):
    am = _small_am(topology())
    tm = am.transition_model
    assert tm.num_phones == 3 and tm.num_pdfs == 6
    assert tm.num_transition_states == (6 if tm.is_hmm else 3)
    assert len(tm.log_probs) == tm.num_transition_ids + 1
    assert (am.left_context, am.right_context) == (1, 1)
    path = tmp_path / "final.mdl"
    am.write(path, binary=binary)
    data = path.read_bytes()
    assert (data[:2] == b"\0B") == binary
    assert data.startswith((b"\0B", b"")) and b"<TransitionModel>" in data[:20]
    back = read_am(path)
    assert back.to_bytes(binary) == data
    if binary:  # (text keeps 7 digits of what was computed in code)
        assert back.to_bytes(False) == am.to_bytes(False)
    np.testing.assert_array_equal(back.transition_model.tuples, tm.tuples)
    np.testing.assert_allclose(back.priors, am.priors, rtol=1e-6)
    assert back.nnet.to_bytes() == am.nnet.to_bytes()
    # read_nnet on a final.mdl gives its network
    assert pynnet3.read_nnet(path).to_bytes(True) == back.nnet.to_bytes(True)
    if not binary:
        text = data.decode()
        assert ("<Triples> 6 \n" in text) == tm.is_hmm
        assert "</Nnet3> <LeftContext> 1 <RightContext> 1 <Priors>  [ " in text


def test_transition_ids_follow_the_topology():
    tm = TransitionModel.build(_hmm_topology(), lambda phone, c: (phone - 1) * 2 + c)
    assert tm.tuples[:2].tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]
    np.testing.assert_allclose(tm.log_probs[:5], np.log([1, 0.75, 0.25, 0.5, 0.5]), atol=1e-7)


def test_priors_must_fit_the_output():
    tm = TransitionModel.build(_hmm_topology(), lambda phone, c: (phone - 1) * 2 + c)
    nnet = pynnet3.Nnet.from_config(_CONFIG)
    with pytest.raises(GraphError, match="Priors"):
        AcousticModel(tm, nnet, np.ones(5))
    assert AcousticModel(tm, nnet).priors.size == 0  # no priors is fine


def test_empty_priors_round_trip():
    am = _small_am(_hmm_topology())
    am.priors = np.zeros(0, dtype=np.float32)
    for binary in (True, False):
        data = am.to_bytes(binary)
        assert AcousticModel.from_bytes(data).to_bytes(binary) == data
    assert am.to_bytes(False).endswith(b"<Priors>  [ ]\n")


# -- malformed files ----------------------------------------------------------------

def _small_text() -> str:
    return _small_am(_hmm_topology()).to_bytes(False).decode()


@pytest.mark.parametrize("binary", [True, False])
def test_truncated_is_a_format_error(binary):
    data = _small_am(_chain_topology()).to_bytes(binary)
    nnet_start = data.index(b"<Nnet3>")
    cuts = list(range(3, nnet_start, 7)) + [len(data) - 3, len(data) - 40]
    for cut in cuts:
        with pytest.raises(FormatError) as e:
            AcousticModel.from_bytes(data[:cut], "cut.mdl")
        assert e.value.source == "cut.mdl"
        assert (e.value.offset is not None) == binary, (cut, str(e.value))


@pytest.mark.parametrize("old, new, token", [
    ("<Triples>", "<Triplets>", "<Triplets>"),
    ("</Topology>", "</Topologies>", "</Topologies>"),
    ("<LogProbs>", "<LogProb>", "<LogProb>"),
    ("<Priors>", "<Prior>", "<Prior>"),
    ("<Transition> 0 0.75", "<Transition> 0 x", "x"),
    ("<Triples> 6", "<Triples> -6", "-6"),
])
def test_flipped_tokens_name_the_token_and_line(old, new, token):
    text = _small_text().replace(old, new, 1)
    with pytest.raises(FormatError) as e:
        AcousticModel.from_bytes(text.encode(), "bad.mdl.txt")
    assert e.value.token == token and e.value.line is not None, str(e.value)
    assert str(e.value).startswith("bad.mdl.txt, line ")


def test_wrong_counts_are_format_errors():
    text = _small_text()
    # one transition state fewer than the count says: the next token is not an integer
    fewer = re.sub(r"<Triples> 6 \n", "<Triples> 7 \n", text)
    with pytest.raises(FormatError, match="expected an integer"):
        AcousticModel.from_bytes(fewer.encode())
    # log-probs that do not match the number of transition-ids
    short = text.replace("<LogProbs> \n [ 0 ", "<LogProbs> \n [ ", 1)
    with pytest.raises(FormatError, match="transition-ids"):
        AcousticModel.from_bytes(short.encode())
    # a transition state for a phone the topology does not have
    ghost = text.replace("\n3 1 5 \n", "\n4 1 5 \n", 1)
    with pytest.raises(FormatError, match="no topology entry"):
        AcousticModel.from_bytes(ghost.encode())
    # priors of the wrong dim
    priors = text.replace("<Priors>  [ ", "<Priors>  [ 0.5 ", 1)
    with pytest.raises(FormatError, match="Priors"):
        AcousticModel.from_bytes(priors.encode())
    # trailing data
    with pytest.raises(FormatError, match="after the acoustic model"):
        AcousticModel.from_bytes((text + "<Extra> ").encode())


def test_triples_must_fit_the_topology():
    text = _small_am(_chain_topology()).to_bytes(False).decode()
    start = text.index("<Tuples>")
    bad = text[:start] + "<Triples> 0 \n</Triples> \n" + text[text.index("<LogProbs>"):]
    r = TextReader(bad.encode(), "t")
    with pytest.raises(FormatError) as e:
        read_transition_model(r)
    assert e.value.token == "<Triples>"


def test_binary_errors_name_the_offset():
    data = bytearray(_small_am(_hmm_topology()).to_bytes(True))
    i = data.index(b"<Triples>")
    data[i + 10] = 9  # the count's size byte
    with pytest.raises(FormatError) as e:
        AcousticModel.from_bytes(bytes(data), "b.mdl")
    assert e.value.offset == i + 10


def test_detection():
    am = _small_am(_hmm_topology())
    assert is_am_bytes(am.to_bytes(True)) and is_am_bytes(am.to_bytes(False))
    assert not is_am_bytes(am.nnet.to_bytes(True)) and not is_am_bytes(b"")
    with pytest.raises(FormatError, match="TransitionModel"):
        AcousticModel.from_bytes(am.nnet.to_bytes(False), "raw.txt")


# -- Kaldi's files ------------------------------------------------------------------

@pytest.mark.parametrize("folder", _AM, ids=_id)
def test_reference_files_round_trip_byte_exact(folder):
    meta = json.loads((folder / "info.json").read_text())
    binary_data = (folder / "final.mdl").read_bytes()
    text_data = (folder / "final.mdl.txt").read_bytes()
    assert len(binary_data) == meta["final_mdl_bytes"]
    from_bin = AcousticModel.from_bytes(binary_data, "final.mdl")
    from_text = AcousticModel.from_bytes(text_data, "final.mdl.txt")
    assert from_bin.to_bytes(True) == binary_data
    assert from_text.to_bytes(False) == text_data
    # text -> binary -> text
    assert AcousticModel.from_bytes(from_text.to_bytes(True)).to_bytes(False) == text_data
    tm = from_bin.transition_model
    assert tm.num_pdfs == meta["num_pdfs"] == from_bin.num_pdfs
    assert tm.num_transition_ids == meta["num_transition_ids"]
    assert tm.num_transition_states == meta["num_transition_states"]
    assert tm.num_phones == meta["num_phones"]
    assert ("<Triples>" if tm.is_hmm else "<Tuples>") == meta["transition_model_format"]
    assert from_bin.priors.size == meta["priors_dim"]
    assert abs(float(from_bin.priors.sum()) - meta["priors_sum"]) < 1e-5
    assert float(from_bin.priors.min()) == pytest.approx(meta["priors_min"], rel=1e-5)
    assert (from_bin.left_context, from_bin.right_context) == \
        (meta["left_context"], meta["right_context"]) == from_bin.nnet.context()
    np.testing.assert_array_equal(from_text.transition_model.tuples, tm.tuples)
    np.testing.assert_allclose(from_text.transition_model.log_probs, tm.log_probs, atol=1e-6)


@pytest.mark.parametrize("folder", _AM, ids=_id)
def test_transition_model_is_what_the_topology_and_monophone_tree_give(folder):
    """Kaldi built it from ``topo`` and a monophone tree (pdf = (phone-1)*classes + class)."""
    am = read_am(folder / "final.mdl")
    tm = am.transition_model
    text = (folder / "topo").read_bytes()
    classes = tm.topology.num_pdf_classes(1)
    built = TransitionModel.build(tm.topology, lambda p, c: (p - 1) * classes + c)
    np.testing.assert_array_equal(built.tuples, tm.tuples)
    np.testing.assert_allclose(built.log_probs, tm.log_probs, atol=1e-6)
    # the topology text inside final.mdl.txt is the topo file, token for token
    inner = (folder / "final.mdl.txt").read_bytes()
    inner = inner[inner.index(b"<Topology>"):inner.index(b"</Topology>") + 11]
    assert inner.split() == text.split()


@pytest.mark.parametrize("folder", _AM, ids=_id)
def test_network_of_final_mdl_computes_what_model_txt_computes(folder):
    case = REF / "realistic" / folder.name / "decode"
    nnet = pynnet3.read_nnet(folder / "final.mdl")
    raw = pynnet3.read_nnet(case.parent / "model.txt")
    request = pynnet3.ComputationRequest.from_json(json.loads((case / "request.json").read_text()))
    with np.load(case / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    ours = pynnet3.run(nnet, pynnet3.compile(nnet, request), inputs=dict(inputs)).outputs
    theirs = pynnet3.run(raw, pynnet3.compile(raw, request), inputs=dict(inputs)).outputs
    for name, ref in arrays.items():
        if name.startswith("output:"):
            out = name.split(":", 1)[1]
            np.testing.assert_allclose(ours[out], theirs[out], rtol=1e-4, atol=1e-4)
            err = np.linalg.norm(ours[out] - ref) / max(np.linalg.norm(ref), 1e-6)
            assert err < 1e-3, (out, err)


@pytest.mark.parametrize("folder", _AM, ids=_id)
def test_truncated_reference_file(folder):
    data = (folder / "final.mdl").read_bytes()
    for cut in (1000, 3799, len(data) - 1):
        with pytest.raises(FormatError):
            AcousticModel.from_bytes(data[:cut], "final.mdl")


def test_raw_model_path_unchanged(tmp_path):
    nnet = pynnet3.Nnet.from_config(_CONFIG)
    path = Path(tmp_path) / "raw.mdl"
    nnet.write(path, binary=True)
    assert pynnet3.read_nnet(path).to_bytes(True) == path.read_bytes()
