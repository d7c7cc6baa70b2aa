"""Model files: integers are range-checked where they are read (int32, and the
limit of the field's tag), so a corrupt or hostile model is a pynnet3 error naming
the file and line / byte, never an OverflowError or a huge allocation. Cases
marked "fuzz" are findings of pynnet3.testing.fuzz."""

from __future__ import annotations

import struct

import pytest

from pynnet3 import Nnet, limits
from pynnet3.errors import ConfigError, DescriptorError, FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader
from pynnet3.nnet import nnet_from_bytes

CONFIG = """input-node name=input dim=4
component name=t type=TdnnComponent input-dim=4 output-dim=3 time-offsets=-1,0,1
component-node name=t component=t input=input
component name=s type=NoOpComponent dim=3
component-node name=s component=s input=t
output-node name=output input=s
"""


@pytest.fixture(scope="module")
def nnet():
    return Nnet.from_config(CONFIG, seed=1)


def _text_error(data: bytes, *fragments: str, error=FormatError) -> str:
    with pytest.raises(error) as ei:
        nnet_from_bytes(data, "m.txt")
    msg = str(ei.value)
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_int_vector_beyond_int64(nnet):  # fuzz: OverflowError from numpy
    text = nnet.to_bytes(False).replace(b"[ -1 0 1 ]", b"[ -1 99999999999999999999 1 ]")
    _text_error(text, "m.txt, line 8", "<TimeOffsets>", "int32")


def test_int_vector_beyond_its_limit(nnet):
    text = nnet.to_bytes(False).replace(b"[ -1 0 1 ]", b"[ -1 0 100000000 ]")
    _text_error(text, "line 8", "<TimeOffsets> = 100000000 exceeds the limit max_context")


def test_int_pair_vector_ranges():
    r = TextReader(b"<Offsets> [ 0,1 -1,99999999999999 ]", "p.txt")
    r.expect_token("<Offsets>")
    with pytest.raises(FormatError, match="p.txt, line 1: <Offsets> = 99999999999999 is out "
                                          "of the int32 range"):
        r.read_int_pair_vector()
    r = TextReader(b"<Offsets> [ 0,1 -1,2 ]")
    assert r.read_tagged("<Offsets>", "int_pair_vector").tolist() == [[0, 1], [-1, 2]]


@pytest.mark.parametrize("old,new,fragment", [
    (b"<Dim> 3 ", b"<Dim> 2147483648 ", "<Dim> = 2147483648 is out of the int32 range"),
    (b"<Dim> 3 ", b"<Dim> 1073741824 ", "<Dim> = 1073741824 exceeds the limit max_dim"),
    (b"<RankInOut> 6 2", b"<RankInOut> 6 -2147483649", "int32"),
])
def test_tagged_integers_in_text(nnet, old, new, fragment):
    _text_error(nnet.to_bytes(False).replace(old, new), "m.txt, line ", fragment)


def test_config_section_of_a_model(nnet):
    text = nnet.to_bytes(False).replace(b"input-node name=input dim=4",
                                        b"input-node name=input dim=4294967296")
    _text_error(text, "m.txt, line 2", "dim = 4294967296", error=ConfigError)
    deep = b"Sum(" * 400 + b"t" + b")" * 400  # fuzz: RecursionError (parse, then str())
    text = nnet.to_bytes(False).replace(b"input=t\n", b"input=" + deep + b"\n")
    _text_error(text, "m.txt, line 4", "nested more than 64 deep", error=DescriptorError)


def _binary_int_after(data: bytes, tag: bytes) -> int:
    """Offset of the 4 value bytes of the int that follows ``tag`` in a binary model."""
    return data.index(tag) + len(tag) + 1 + 1  # tag, space, size byte


@pytest.mark.parametrize("value,fragment", [
    (2**31 - 1, "<Dim> = 2147483647 exceeds the limit max_dim"),
    (-(2**31), "<Dim> = -2147483648 exceeds the limit max_dim"),
])
def test_binary_dim(nnet, value, fragment):  # fuzz: MemoryError (a 2^31-wide matrix)
    data = nnet.to_bytes(True)
    at = _binary_int_after(data, b"<Dim>")
    bad = data[:at] + struct.pack("<i", value) + data[at + 4:]
    with pytest.raises(FormatError, match=f"m.bin, byte {at - 1}: {fragment}"):
        nnet_from_bytes(bad, "m.bin")


def test_binary_wide_integer_in_a_dim_field(nnet):
    data = nnet.to_bytes(True)
    at = _binary_int_after(data, b"<Dim>")
    bad = data[:at - 1] + b"\x08" + struct.pack("<q", 2**40) + data[at + 4:]
    with pytest.raises(FormatError, match=f"byte {at - 1}: <Dim> = 1099511627776 is out of "
                                          "the int32 range"):
        nnet_from_bytes(bad, "m.bin")


def test_binary_wide_integer_must_fit_int32(nnet):
    # fuzz: an 8-byte <UpdatePeriod> of 2^40 was read, then writing the model (int32)
    # was a struct.error
    assert BinaryReader(b"\x08" + struct.pack("<q", 7)).read_int() == 7
    with pytest.raises(FormatError, match="byte 0: integer = 1099511627776 is out of the int32"):
        BinaryReader(b"\x08" + struct.pack("<q", 2**40)).read_int()


def test_binary_int_vector_limit(nnet):
    data = nnet.to_bytes(True)
    at = data.index(b"<TimeOffsets>") + len(b"<TimeOffsets> ") + 5  # size byte, count
    bad = data[:at] + struct.pack("<i", -(10**8)) + data[at + 4:]
    with pytest.raises(FormatError, match="<TimeOffsets> = -100000000 exceeds the limit"):
        nnet_from_bytes(bad, "m.bin")


def test_dims_derived_from_several_fields_are_checked():
    # StatisticsExtraction: output-dim = 1 + 2 * input-dim, only known once made
    text = """input-node name=input dim=5
component name=s type=StatisticsExtractionComponent input-dim=5
component-node name=s component=s input=input
output-node name=output input=s
"""
    model = Nnet.from_config(text).to_bytes(False)
    with limits.override(max_dim=10):
        with pytest.raises(ConfigError, match="line 2: StatisticsExtractionComponent "
                                              "output-dim = 11 exceeds the limit max_dim"):
            Nnet.from_config(text)
        with pytest.raises(FormatError, match=r"m.txt, line 7: .* output-dim = 11 exceeds .*"
                                              r"at token '<StatisticsExtractionComponent>'"):
            nnet_from_bytes(model, "m.txt")


def test_statistics_period_in_a_model():
    # fuzz: a NaN written over <OutputPeriod> read as 2143289344, then a MemoryError in
    # the statistics window while computing the context
    text = """input-node name=input dim=2
component name=s type=StatisticsExtractionComponent input-dim=2 output-period=2
component-node name=s component=s input=input
output-node name=output input=Round(s, 2)
"""
    data = Nnet.from_config(text).to_bytes(True)
    at = _binary_int_after(data, b"<OutputPeriod>")
    bad = data[:at] + bytes.fromhex("0000c07f") + data[at + 4:]
    with pytest.raises(FormatError, match=f"byte {at - 1}: <OutputPeriod> = 2143289344 exceeds "
                                          "the limit max_context"):
        nnet_from_bytes(bad, "m.bin")
