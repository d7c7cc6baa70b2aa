"""Weight layout (seed 003's layout optimizer, for the one layout choice an nnet3
network has): each linear layer's weight matrix stored column-major.

A forward product is ``y = x W^T`` with ``W`` [output-dim, input-dim]. Stored
row-major, ``W^T`` reaches BLAS transposed; stored column-major, ``W^T`` is a
plain row-major matrix. OpenBLAS's AVX-512 kernels take the latter much faster
when ``x`` has few rows (a decoding chunk, an LSTM's per-step products):
384 x 160 by 160 x 512 in 268 us instead of 292, 24 rows in 28 us instead of 45,
3 rows in 6 us instead of 38; with many rows, and on its AVX2 kernels, the two
take the same time. The weights' values and the written file are unchanged
(NumPy and the writers read either layout); products differ by float32 rounding
(the two kernels sum in different orders). In-place updates keep the layout; an
update that assigns a new array gives it back row-major.
"""

from __future__ import annotations

import numpy as np

from ..components.affine import AffineComponent, LinearComponent
from ..components.fused import linear_part
from ..components.tdnn import TdnnComponent
from ..nnet import Nnet

#: component classes (and subclasses) -> the attribute holding the weight matrix
#: whose transpose the forward product reads
WEIGHTS = ((AffineComponent, "linear_params"), (TdnnComponent, "linear_params"),
           (LinearComponent, "params_"))


def _weight_attr(comp) -> str | None:
    for cls, attr in WEIGHTS:
        if isinstance(comp, cls):
            return attr
    return None


def column_major_weights(nnet: Nnet) -> list[str]:
    """Store the weight matrix of every linear layer of ``nnet`` (a fused kernel's
    linear part included) column-major, in place; the names of the components
    changed."""
    changed = []
    for name, comp in nnet.components.items():
        lin = linear_part(comp)
        attr = _weight_attr(lin)
        if attr is None:
            continue
        w = getattr(lin, attr)
        if type(w) is np.ndarray and w.ndim == 2 and not w.flags.f_contiguous:
            setattr(lin, attr, np.asfortranarray(w))
            changed.append(name)
    return changed
