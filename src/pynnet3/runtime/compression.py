"""Matrix compression for COMPRESS_MATRIX / DECOMPRESS_MATRIX (Kaldi's CuCompressedMatrix).

A compressed matrix stores one small integer per element. ``kind`` uses Kaldi's
``CuCompressedMatrixType`` numbering (:data:`INT8`, :data:`UINT8`, :data:`INT16`,
:data:`UINT16`) and ``range`` says what the integers mean:

* ``range == 0``: only the sign is kept. Unsigned kinds store ``x > 0`` (1 or
  0), signed kinds store ``sign(x)``; decompression gives exactly those values.
  This is exact for what ReLU backprop reads (``y > 0``).
* ``range > 0``: ``q = round_half_even(x / scale)`` clamped to the integer
  type's limits, with ``scale = range / max_int``; decompression gives
  ``q * scale``. For ``x`` inside the representable interval
  ``[min_int * scale, max_int * scale]`` the error is at most ``scale / 2`` (plus
  a float rounding of the result); outside it the value is clamped to the nearer
  end. For int16 and range 10, ``scale / 2`` is about 1.5e-4.

Kaldi may skip the clamping ("truncate" off) when values are known to be in
range; we always clamp, which gives the same numbers whenever Kaldi's choice is
valid.

The arithmetic runs on the matrix's backend (:mod:`pynnet3.components.xp`): a
torch matrix is compressed on its device, with no copy to the host (torch has no
uint16 arithmetic; its UINT16 codes are held as int32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..components.xp import namespace
from ..computation import INT8, INT16, UINT8, UINT16, bytes_per_element
from ..errors import PynnetError

__all__ = ["INT8", "INT16", "UINT8", "UINT16", "CompressedMatrix", "bytes_per_element",
           "compress", "decompress", "positive_mask"]

# (the kinds and their storage are the computation's: optimize and analysis use them)
_TYPES = {INT8: np.int8, UINT8: np.uint8, INT16: np.int16, UINT16: np.uint16}


def _int_type(kind: int):
    try:
        return _TYPES[kind]
    except KeyError:
        raise PynnetError(f"unknown matrix compression kind {kind!r} "
                          f"(known: {sorted(_TYPES)})") from None


@dataclass
class CompressedMatrix:
    """Integer codes and the scale that maps them back (``scale`` 1 for sign-only)."""

    data: object  # the backend's integer (or bool) array
    scale: float

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        d = self.data
        return d.nbytes if isinstance(d, np.ndarray) else d.numel() * d.element_size()


def _codes(xp, a, itype):
    """``a`` (bool or integral-valued floats) as codes of NumPy type ``itype`` in
    the namespace's arrays (a bool array is 0/1 bytes: a uint8 view, not a cast)."""
    if xp.is_numpy:
        return a.view(itype) if a.dtype == np.bool_ and itype is np.uint8 \
            else a.astype(itype)
    import torch

    tdt = {np.int8: torch.int8, np.uint8: torch.uint8, np.int16: torch.int16,
           np.uint16: torch.int32}[itype]
    return a.to(tdt)


def compress(array, kind: int, range: float) -> CompressedMatrix:  # noqa: A002 (Kaldi's name)
    """Compress a real matrix; see the module docstring for the code."""
    x = array if not isinstance(array, (list, tuple)) else np.asarray(array)
    xp = namespace(x)
    itype = _int_type(kind)
    info = np.iinfo(itype)
    if range < 0:
        raise PynnetError(f"matrix compression range must be >= 0, got {range}")
    if range == 0:
        if info.min == 0:
            return CompressedMatrix(_codes(xp, x > 0, itype), 1.0)
        return CompressedMatrix(_codes(xp, xp.sign(x), itype), 1.0)
    scale = float(np.float32(range) / np.float32(info.max))
    # The division happens in the matrix's own precision, as Kaldi's kernel does
    # it in float; clipping before the cast avoids integer wrap-around. (One
    # temporary, rounded and clipped in place.)
    # (a Python float takes the matrix's dtype, as x.dtype.type(v) did: NEP 50)
    q = x * (1.0 / scale)
    xp.rint(q, out=q)
    xp.clip(q, info.min, info.max, out=q)
    return CompressedMatrix(_codes(xp, q, itype), scale)


def positive_mask(obj: CompressedMatrix) -> np.ndarray:
    """``decompressed > 0`` of a sign-only compression (scale 1) with NumPy codes,
    as a bool array, without the float matrix: the decompressed values are the
    codes themselves, so it is ``codes > 0``; an unsigned kind's codes are that
    mask already (0/1 bytes from ``x > 0``: a view)."""
    d = obj.data
    if obj.scale != 1.0 or not isinstance(d, np.ndarray):
        raise PynnetError("positive_mask: a sign-only NumPy compression is needed")
    return d.view(np.bool_) if d.dtype == np.uint8 else d > 0


def decompress(obj: CompressedMatrix, out) -> None:
    """Write the decompressed values of ``obj`` into ``out`` (same shape and
    backend): ``codes * scale`` in ``out``'s precision."""
    if tuple(out.shape) != obj.shape:
        raise PynnetError(f"decompressing a {obj.shape} matrix into shape "
                          f"{tuple(out.shape)}")
    if obj.scale == 1.0:
        out[...] = obj.data
    elif isinstance(out, np.ndarray):  # (one pass on NumPy)
        np.multiply(obj.data, out.dtype.type(obj.scale), out=out, casting="unsafe")
    else:  # the codes convert exactly, then one multiply in out's precision, as above
        out[...] = obj.data
        out *= obj.scale
