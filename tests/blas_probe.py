"""What this process's BLAS keeps bit for bit, for tests whose exact claims hold only
where it does.

OpenBLAS picks its GEMM kernels by processor (and by ``OPENBLAS_CORETYPE``). Whether
an entry of a product gets the same floats whatever its row or column position in
the product (and so whether a block of the product computed alone equals that block
of the whole) depends on those kernels: the AVX-512 float32 kernels keep small
products' entries independent of position; the AVX2 (Haswell) kernels sum edge tiles
differently. A test that claims "the same floats as the whole product" asks NumPy's
own matmul first: where matmul itself keeps the blocks, ours must too, bit for bit;
where it does not, no implementation can, and the claim is float32 rounding.
"""

from __future__ import annotations

import numpy as np


def matmul_keeps_column_blocks(a: np.ndarray, b: np.ndarray, widths) -> bool:
    """Whether ``a @ b[:, block]`` equals the block's columns of ``a @ b`` for each
    column block of ``widths`` (in order), on this BLAS."""
    whole, start = a @ b, 0
    for w in widths:
        if not np.array_equal(whole[:, start:start + w], a @ b[:, start:start + w]):
            return False
        start += w
    return True


def matmul_keeps_row_blocks(a: np.ndarray, b: np.ndarray, heights) -> bool:
    """Whether ``a[block] @ b`` equals the block's rows of ``a @ b`` for each row
    block of ``heights`` (in order), on this BLAS."""
    whole, start = a @ b, 0
    for h in heights:
        if not np.array_equal(whole[start:start + h], a[start:start + h] @ b):
            return False
        start += h
    return True


def random_operands(shape_a, shape_b, seed: int = 0, dtype=np.float32):
    """Random standard-normal operands of the given shapes, for a probe of shapes
    alone (the kernels' blocking depends on the shapes, not the values)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape_a).astype(dtype),
            rng.standard_normal(shape_b).astype(dtype))


def assert_same_floats_if(exact: bool, got, want, rtol: float = 1e-5,
                          atol: float = 1e-6) -> None:
    """Bit-identical where ``exact`` (the BLAS keeps the blocks), else equal to float32
    rounding."""
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
