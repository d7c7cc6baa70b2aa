"""Reading and writing Kaldi files: serialization streams and the model layout."""

from .kaldi_stream import (
    BinaryReader,
    BinaryWriter,
    KaldiReader,
    KaldiWriter,
    TextReader,
    TextWriter,
    format_float,
    make_reader,
    make_writer,
)

__all__ = ["BinaryReader", "BinaryWriter", "KaldiReader", "KaldiWriter", "TextReader",
           "TextWriter", "format_float", "make_reader", "make_writer"]
