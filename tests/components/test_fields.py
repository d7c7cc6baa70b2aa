"""Tests of components/fields.py: the declarative Kaldi file layouts.

Expected bytes are written out by hand in Kaldi's text format (what a Kaldi
``Write`` with ``binary=false`` produces: ``<Tag> value`` pairs separated by single
spaces, vectors as `` [ a b ]`` plus a newline); binary layouts are checked by a
write -> read -> write round trip and against the values read back.
"""

from __future__ import annotations

import numpy as np
import pytest

from pynnet3.components.base import Component
from pynnet3.components.fields import (
    REPEATED_OPENING,
    Custom,
    Field,
    positive,
    proportion,
    skip_optional,
)
from pynnet3.errors import FormatError
from pynnet3.io.kaldi_stream import BinaryReader, TextReader, make_writer


class Toy(Component):
    """A made-up component (not registered) exercising every kind of step."""

    type_name = "ToyComponent"
    kaldi_fields = (
        REPEATED_OPENING,
        Field("<Dim>", "dim", "int", check=positive, aliases=("<OldDim>",)),
        Field("<BlockDim>", "block_dim", "int", default=lambda c: c.dim,
              write_if=lambda c: c.block_dim != c.dim),
        Field("<Proportion>", "proportion", "float", check=proportion),
        Field("<Count>", "count", "double", default=0.0),
        Field("<Values>", "values", "vector", finite="values"),
        Field("<RankInOut>", "rank_in", "int"),
        Field("", "rank_out", "int"),
        Field("<Extra>", "extra", "float", default=0.0,
              write_if=lambda c: c.extra != 0.0,
              then=(Field("<ExtraCount>", "extra_count", "int", default=7),)),
        skip_optional("<Removed>", "float"),
        Custom("_read_marker", "_write_marker"),
        Field("<Flag>", "flag", "flag"),
    )

    def __init__(self) -> None:
        self.dim = self.block_dim = 0
        self.proportion = self.count = self.extra = 0.0
        self.values = np.zeros(0, np.float32)
        self.rank_in = self.rank_out = self.extra_count = 0
        self.flag = False
        self.marker = ""

    def _read_marker(self, r) -> None:
        self.marker = r.read_tagged("<Marker>", "token")

    def _write_marker(self, w) -> None:
        w.write_tagged("<Marker>", "token", self.marker)


def _read(text: bytes) -> Toy:
    r = TextReader(text, "toy.txt")
    assert r.read_token() == "<ToyComponent>"
    return Toy.read(r)


def _write(comp: Toy, binary: bool) -> bytes:
    w = make_writer(binary)
    comp.write(w)
    return w.getvalue()


FULL = (b"<ToyComponent> <Dim> 6 <BlockDim> 3 <Proportion> 0.5 <Count> 2 "
        b"<Values>  [ 1 2.5 ]\n<RankInOut> 4 5 <Extra> 0.25 <ExtraCount> 9 "
        b"<Marker> abc <Flag> </ToyComponent> ")


def test_text_round_trip_is_byte_exact():
    comp = _read(FULL)
    assert (comp.dim, comp.block_dim, comp.proportion, comp.count) == (6, 3, 0.5, 2.0)
    np.testing.assert_array_equal(comp.values, [1.0, 2.5])
    assert (comp.rank_in, comp.rank_out, comp.extra, comp.extra_count) == (4, 5, 0.25, 9)
    assert comp.marker == "abc" and comp.flag is True
    assert _write(comp, binary=False) == FULL


def test_binary_round_trip_keeps_every_value():
    comp = _read(FULL)
    data = _write(comp, binary=True)
    r = BinaryReader(data, "toy.bin")
    assert r.read_token() == "<ToyComponent>"
    again = Toy.read(r)
    assert r.at_eof()
    assert vars(again).keys() == vars(comp).keys()
    for key, value in vars(comp).items():
        np.testing.assert_array_equal(getattr(again, key), value, err_msg=key)
    assert _write(again, binary=True) == data


def test_optional_fields_take_defaults_and_are_not_written_back():
    text = (b"<ToyComponent> <ToyComponent> <OldDim> 4 <Proportion> 1 <Values> [ ] "
            b"<RankInOut> 1 2 <Removed> 3.5 <Marker> m </ToyComponent> ")
    comp = _read(text)
    # repeated opening token and legacy <OldDim> accepted; <Removed> dropped
    assert comp.dim == 4 and comp.block_dim == 4  # default from an earlier field
    assert comp.count == 0.0 and comp.extra == 0.0 and comp.extra_count == 7
    assert comp.flag is False
    assert _write(comp, binary=False) == (
        b"<ToyComponent> <Dim> 4 <Proportion> 1 <Count> 0 <Values>  [ ]\n"
        b"<RankInOut> 1 2 <Marker> m </ToyComponent> ")


def test_refused_value_names_file_line_and_token():
    text = b"<ToyComponent>\n<Dim> 4 <Proportion> 1.5 <Values> [ ] </ToyComponent> "
    with pytest.raises(FormatError) as e:
        _read(text)
    err = e.value
    assert err.source == "toy.txt" and err.line == 2 and err.token == "1.5"
    assert "<Proportion> must be in [0, 1]" in str(err)


def test_non_positive_dim_is_refused():
    with pytest.raises(FormatError, match="<Dim> must be positive") as e:
        _read(b"<ToyComponent> <Dim> 0 </ToyComponent> ")
    assert e.value.token == "0"


def test_wrong_tag_names_the_expected_ones():
    with pytest.raises(FormatError, match="'<Dim>' or '<OldDim>'") as e:
        _read(b"<ToyComponent> <Dime> 4 </ToyComponent> ")
    assert e.value.token == "<Dime>"


@pytest.mark.parametrize("binary", [False, True])
def test_non_finite_parameter_is_refused(binary):
    comp = _read(FULL)
    comp.values = np.array([1.0, np.inf], np.float32)
    data = _write(comp, binary)
    r = BinaryReader(data, "toy.bin") if binary else TextReader(data, "toy.txt")
    r.read_token()
    with pytest.raises(FormatError, match="non-finite value"):
        Toy.read(r)


def test_missing_closing_token_is_named():
    text = (b"<ToyComponent> <Dim> 2 <Proportion> 0 <Values> [ ] <RankInOut> 1 2 "
            b"<Marker> m <Bogus> </ToyComponent> ")
    with pytest.raises(FormatError, match="</ToyComponent>") as e:
        _read(text)
    assert e.value.token == "<Bogus>"
