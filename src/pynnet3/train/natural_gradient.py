"""OnlineNaturalGradient: Kaldi's online natural-gradient preconditioner.

The algorithm of Kaldi's ``natural-gradient-online.{h,cc}`` and of Povey, Zhang &
Khudanpur, "Parallel training of DNNs with natural gradient and parameter
averaging" (arXiv 1410.7455), section "online natural gradient".

What it keeps: a low-rank-plus-diagonal estimate of the Fisher matrix of the
vectors it sees (rows of an ``N x D`` matrix ``X``, e.g. a layer's inputs):

    F_t = R_t^T D_t R_t + rho_t I        (R_t: R x D with orthonormal rows)

stored as ``W_t = E_t^{1/2} R_t`` with ``e_ii = 1 / (beta_t / d_ii + 1)`` and
``beta_t = rho_t (1 + alpha) + alpha / D tr(D_t)``. Preconditioning a minibatch is

    X_hat = X - X W_t^T W_t  (= beta_t X G_t^{-1},  G_t = F_t + alpha/D tr(F_t) I)

and the caller multiplies its update by ``scale = ||X||_F / ||X_hat||_F`` so the
preconditioned direction keeps the plain one's size. On the calls where it
updates (the first 11, then every ``update_period``-th), the estimate moves to
``T_t = eta/N X^T X + (1 - eta) F_t`` by one step of subspace iteration:
``R_{t+1}`` is an orthonormal basis of the rows of ``R_t T_t``, ``D_{t+1}`` their
singular values minus ``rho_{t+1}``, and ``rho_{t+1}`` keeps ``tr F_{t+1} = tr T_t``
(``eta = 1 - exp(-N / num_samples_history)``, at most 0.9). The ``N x D`` work is
four GEMMs (float32, as Kaldi); the ``R x R`` part runs in float64.

For an affine update, which needs only ``dY_hat^T X_hat``,
:meth:`~OnlineNaturalGradient.precondition_implicit` leaves ``X_hat = X (I - W^T W)``
implicit: the caller projects the small ``dY^T X`` instead, and ``||X_hat||`` comes
from ``H`` and ``W W^T`` (X_hat is still formed where X lies mostly in the estimated
subspace and the difference would lose digits).

The first call initializes: ``W`` a fixed orthonormal pattern at ``epsilon``
scale, then three updates (one when ``N <= rank``) on that first minibatch, and
the call itself then preconditions with the result and updates once more.

Invariants (checked by :meth:`OnlineNaturalGradient.check_invariants`):
``E_t^{-1/2} W_t W_t^T E_t^{-1/2} = I``, ``rho_t >= epsilon``,
``d_ii >= max(epsilon, delta * max_i sqrt(c_i))`` after each update.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from ..components.blas import gemm_acc
from ..errors import ComputeError

_NUM_INITIAL_UPDATES = 10  # Kaldi: updates before update_period applies (> 3 init iters)
_CONDITION_THRESHOLD = 1.0e6
_REORTHOGONALIZE_THRESHOLD = 1.0e-3
# precondition_implicit: above this ||X||^2 / ||X_hat||^2, X_hat is formed (see there)
_IMPLICIT_MAX_RATIO = 2.0
# ... and ||X_hat||^2 takes W W^T as diagonal where that moves it by at most this much
_DIAGONAL_TOLERANCE = 1.0e-6
# Kaldi's ReorthogonalizeRt1 warnings (natural-gradient-online.cc), word for word
_CHOLESKY_RANGE_WARNING = ("Cholesky out of expected range, reorthogonalizing with "
                           "Gram-Schmidt")
_CHOLESKY_FAILED_WARNING = ("Cholesky or Invert() failed while re-orthogonalizing R_t. "
                            "Re-orthogonalizing on CPU.")


class OnlineNaturalGradient:
    """One preconditioner (Kaldi keeps one per matrix side: ``preconditioner_in_``,
    ``preconditioner_out_``). State persists across calls; see the module docstring.

    ``warnings``: what Kaldi's would have logged as a WARNING since the owner last
    took them (:meth:`take_warnings`), in order, one entry per event (an update
    whose re-orthogonalization fell back to Gram-Schmidt); nothing is printed here:
    the trainer hands them to its caller (``TrainStats.backward_warnings``)."""

    def __init__(self, rank: int = 40, update_period: int = 1,
                 num_samples_history: float = 2000.0, alpha: float = 4.0,
                 num_minibatches_history: float = 0.0):
        if rank <= 0:
            raise ValueError(f"natural gradient rank must be > 0, got {rank}")
        if update_period <= 0:
            raise ValueError(f"natural gradient update period must be > 0, got {update_period}")
        if not 0.0 < num_samples_history <= 1.0e6:
            raise ValueError(f"num-samples-history must be in (0, 1e6], got "
                             f"{num_samples_history}")
        if alpha < 0.0:
            raise ValueError(f"natural gradient alpha must be >= 0, got {alpha}")
        if num_minibatches_history != 0.0 and not 1.0 < num_minibatches_history < 1.0e6:
            raise ValueError(f"num-minibatches-history must be 0 or in (1, 1e6), got "
                             f"{num_minibatches_history}")
        self.rank = int(rank)
        self.update_period = int(update_period)
        self.num_samples_history = float(num_samples_history)
        self.num_minibatches_history = float(num_minibatches_history)
        self.alpha = float(alpha)
        self.epsilon = 1.0e-10
        self.delta = 5.0e-4
        self.frozen = False
        self.name = ""                   # what it preconditions, for error messages
        self.t = 0                       # calls so far (0: not initialized)
        self.W: np.ndarray | None = None  # (R, D) float32
        self.rho = -1.0e10
        self.d: np.ndarray | None = None  # (R,) float64
        self._gram = None  # _Gram of W for precondition_implicit
        self._last_ratio = 1.0  # precondition_implicit's last ||X||^2 / ||X_hat||^2
        self.warnings: list[str] = []

    def take_warnings(self) -> list[str]:
        """The :attr:`warnings` so far, which are then forgotten."""
        taken, self.warnings = self.warnings, []
        return taken

    # -- public -----------------------------------------------------------------------
    def precondition(self, x: np.ndarray, overwrite: bool = False) -> tuple[np.ndarray, float]:
        """``(X_hat, scale)`` for the rows of ``x``: the preconditioned directions
        (float32) and the factor that restores ``||x||_F``. ``x`` is not modified,
        unless ``overwrite`` and it is a C-contiguous float32 matrix (then X_hat is
        computed in it: the caller's temporary saves a copy). Counts as one call (it
        may update the Fisher estimate)."""
        ops = _TorchOps if _is_tensor(x) else _NumpyOps
        x = ops.prepare(x, overwrite)
        if x.ndim != 2:
            raise ValueError(f"precondition expects a matrix, got shape {x.shape}")
        if x.shape[1] == 1 or x.shape[0] == 0:
            # a one-dimensional space: the preconditioner is the identity (and no rows:
            # nothing to see; not counted as a call)
            return x, 1.0
        if self.W is not None and self.W.shape[1] != x.shape[1]:
            raise ValueError(f"natural gradient dimension changed: {self.W.shape[1]} -> "
                             f"{x.shape[1]}")
        if self.t == 0:
            self._init(x)
        self.W = ops.like(self.W, x)  # the state lives where the data is
        initial = ops.sumsq(x)
        x_hat = self._precondition_internal(x, initial, self._updating(), ops)
        self.t += 1
        if initial <= 0.0:
            return x_hat, 1.0
        final = ops.sumsq(x_hat)
        return x_hat, float(math.sqrt(initial / final)) if final > 0.0 else 1.0

    def precondition_implicit(self, blocks: list, bias: bool = False,
                              max_ratio: float = _IMPLICIT_MAX_RATIO):
        """:meth:`precondition` of ``X = [blocks... | ones]`` (NumPy float32 column
        blocks of N rows each; a column of ones appended when ``bias``), for a caller
        that needs only a product ``A^T X_hat`` with a matrix ``A`` of few columns
        (Kaldi's affine update): the same call for the estimate (it updates it when
        :meth:`precondition` would), but ``X_hat = X - X W^T W`` is left implicit
        where that is safe. Returns ``(x_hat, w, scale)``: either ``x_hat`` (float32
        N x D, the preconditioned rows) and ``w`` None, or ``x_hat`` None and ``w`` the
        ``W_t`` this call used (float32 R x D; None too: the identity), so that
        ``A^T X_hat = A^T X - ((A^T X) w^T) w``. The N x D work is then ``H = X W^T``
        (and ``J = H^T X`` when updating) instead of also ``X - H W``: ``||X_hat||``
        comes from ``||X||^2 - 2 tr(H^T H) + tr(H^T H W W^T)``. Where that difference
        is small (``||X||^2 / ||X_hat||^2 > max_ratio``: ``X`` mostly in the estimated
        subspace) it loses digits, and so would ``A^T X``'s rounding after the
        projection: ``X_hat`` is formed then."""
        n = blocks[0].shape[0]
        dim = sum(b.shape[1] for b in blocks) + int(bias)
        if dim == 1 or n == 0:
            return None, None, 1.0  # as precondition: the identity (no rows: not counted)
        if self.W is not None and self.W.shape[1] != dim:
            raise ValueError(f"natural gradient dimension changed: {self.W.shape[1]} -> "
                             f"{dim}")
        if self.t == 0 or self._last_ratio > max_ratio:
            # (the first call; or the last call's X was mostly in the subspace, so
            # this one's likely is too: the explicit X_hat at once)
            x_hat, scale = self.precondition(_stack_columns(blocks, bias), overwrite=True)
            self._last_ratio = scale * scale
            return x_hat, None, scale
        if type(self.W) is not np.ndarray:
            self.W = _NumpyOps.like(self.W, blocks[0])
        w = self.W
        gram = self._w_gram()
        updating = self._updating()
        # A call that does not update needs of H only ||X_hat||^2 = ||X||^2 -
        # sum_j (2 - M_jj) ||H e_j||^2 (M = W W^T diagonal enough, see below): H' = X W'^T
        # with W' = diag(s) W, s_j = sqrt(2 - M_jj), gives that sum as ||H'||^2.
        weighted = not updating and gram.w_scaled is not None
        h = _times_transpose(blocks, gram.w_scaled if weighted else w, bias)  # H = X W^T
        initial = sum(_NumpyOps.sumsq(b) for b in blocks) + float(n * bias)
        ell = None
        if updating:
            j = np.empty((w.shape[0], dim), np.float32)  # J_t = H^T X    (R x D)
            col = 0
            for blk in blocks:
                cb = blk.shape[1]
                np.matmul(h.T, blk, out=j[:, col:col + cb])
                col += cb
            if bias:
                j[:, col] = h.sum(axis=0)
            ell = _w_jt(gram.w64, j)                  # L_t = W J^T (= H^T H)
        elif weighted:
            h_sq = _NumpyOps.sumsq(h)
            final = initial - h_sq
            # (|sum_ij L_ij M_ij, i != j| <= ||M_off||_F tr L, tr L <= ||H'||^2 / min s_j^2)
            if gram.off_norm * h_sq > _DIAGONAL_TOLERANCE * gram.min_s2 * final:
                h *= gram.inv_s                       # back to H itself
                weighted = False
                ell = (h.T @ h).astype(np.float64)
        else:
            ell = (h.T @ h).astype(np.float64)        # L_t = H^T H
        if ell is not None:
            # ||X - H W||^2 = ||X||^2 - 2 tr(H^T H) + tr(H^T H W W^T)  (H^T X W^T = H^T H)
            final = initial - 2.0 * float(np.trace(ell)) + float(np.sum(ell * gram.m))
        if updating:
            self._update_estimate(n, dim, j, ell, initial, _NumpyOps, h)
        self.t += 1
        if initial > 0.0 and final * max_ratio >= initial:
            self._last_ratio = initial / final
            return None, w, math.sqrt(initial / final)
        if weighted:
            h *= gram.inv_s
        x_hat = _stack_columns(blocks, bias)
        _NumpyOps.sub_mm_(x_hat, h, w)                # X_hat = X - H W (with the old W)
        if initial <= 0.0:
            return x_hat, None, 1.0
        final = _NumpyOps.sumsq(x_hat)
        scale = float(math.sqrt(initial / final)) if final > 0.0 else 1.0
        self._last_ratio = scale * scale
        return x_hat, None, scale

    def _w_gram(self) -> _Gram:
        """What :meth:`precondition_implicit` needs of ``W_t`` (kept until W changes)."""
        cached = self._gram
        if cached is None or cached.w is not self.W:
            cached = self._gram = _Gram(self.W)
        return cached

    def freeze(self, frozen: bool = True) -> None:
        """Kaldi's Freeze: while frozen, calls precondition but never update the
        estimate (backstitch's first step)."""
        self.frozen = bool(frozen)

    def fisher_terms(self) -> tuple[np.ndarray, np.ndarray, float]:
        """``(R_t, d_t, rho_t)`` of ``F_t = R_t^T diag(d_t) R_t + rho_t I`` (float64)."""
        if self.W is None:
            raise ValueError("the preconditioner has not seen any data yet")
        _, sqrt_e, _ = self._e_terms(self.d, self._beta(self.rho, self.d))
        w = _NumpyOps.host64(self.W)
        return w / sqrt_e[:, None], self.d.copy(), self.rho

    def check_invariants(self) -> float:
        """The largest deviation of ``E^{-1/2} W W^T E^{-1/2}`` from the unit matrix;
        raises AssertionError when rho or d break their floors."""
        r, d, rho = self.fisher_terms()
        if not rho >= self.epsilon:
            raise AssertionError(f"rho_t = {rho} < epsilon")
        if not d.min() >= self.epsilon:
            raise AssertionError(f"min d_t = {d.min()} < epsilon")
        if not (d.min() > 0.9 * self.delta * d.max() and rho > 0.9 * self.delta * d.max()):
            raise AssertionError("d_t / rho_t below delta * max(d_t)")
        return float(np.abs(r @ r.T - np.eye(len(d))).max())

    # -- Kaldi's pieces ---------------------------------------------------------------
    def _updating(self) -> bool:
        return not self.frozen and (self.t <= _NUM_INITIAL_UPDATES or
                                    (self.t - _NUM_INITIAL_UPDATES) % self.update_period == 0)

    def _eta(self, n: int) -> float:
        if self.num_minibatches_history > 0.0:
            return 1.0 / self.num_minibatches_history
        # not too close to 1: an all-zero input would make NaNs
        return min(0.9, 1.0 - math.exp(-n / self.num_samples_history))

    def _beta(self, rho: float, d: np.ndarray) -> float:
        return rho * (1.0 + self.alpha) + self.alpha * float(d.sum()) / self.W.shape[1]

    @staticmethod
    def _e_terms(d: np.ndarray, beta: float):
        e = 1.0 / (beta / d + 1.0)
        sqrt_e = np.sqrt(e)
        return e, sqrt_e, 1.0 / sqrt_e

    def _init_default(self, dim: int) -> None:
        if self.rank >= dim:
            self.rank = dim - 1  # Kaldi warns: "probably still too high"
        r = self.rank
        self.rho = self.epsilon
        self.d = np.full(r, self.epsilon)
        e_tii = 1.0 / (2.0 + (dim + r) * self.alpha / dim)
        self.W = (orthonormal_special(r, dim) * np.float32(math.sqrt(e_tii))).astype(np.float32)
        self.t = 0

    def _init(self, x0: np.ndarray) -> None:
        """Three updates (one if ``N <= rank``) on the first minibatch from the default
        start, on a copy; the copy's estimate is kept, this object's ``t`` stays 0."""
        other = copy.copy(self)  # (it shares this object's warnings list: Kaldi's
        # initialization warns too, as part of the first call)
        other._init_default(x0.shape[1])
        other.t = 1  # so that the copy does not initialize again
        other.frozen = False
        iters = 1 if x0.shape[0] <= other.rank else 3
        for _ in range(iters):
            other.precondition(x0)
        self.rank, self.W, self.d, self.rho = other.rank, other.W, other.d, other.rho

    def _precondition_internal(self, x, tr_x_xt: float, updating: bool, ops):
        """The N x D products on ``x``'s device (``ops``), the R x R part on the host."""
        w = self.W
        h = x @ w.T                                   # H_t = X_t W_t^T   (N x R)
        if updating:
            j = h.T @ x                               # J_t = H^T X       (R x D)
            # L_t = W J^T (Kaldi's: R x D x R) or H^T H (N x R x R), the smaller
            ell = ops.host64(w @ j.T if x.shape[0] > x.shape[1] else h.T @ h)
            self._update_estimate(x.shape[0], x.shape[1], j, ell, tr_x_xt, ops, x)
        ops.sub_mm_(x, h, w)                          # X_hat = X - H W (with the old W)
        return x

    def _update_estimate(self, n: int, dim: int, j, ell: np.ndarray, tr_x_xt: float,
                         ops, like) -> None:
        """One subspace-iteration step of the Fisher estimate from ``J_t = H^T X``
        (``ops``' device), ``L_t = W J^T = H^T H`` (float64, host) and ``tr(X X^T)``."""
        r = self.rank
        w = self.W
        eta = self._eta(n)
        k = ops.host64(j @ j.T)                       # K_t = J J^T
        rho, d = self.rho, self.d
        e, sqrt_e, inv_sqrt_e = self._e_terms(d, self._beta(rho, d))

        # Z_t = E^-1/2 (eta/N)^2 K E^-1/2 + eta/N (1-eta) (E^-1/2 L E^-1/2 (D+rho) + its
        # transpose) + (1-eta)^2 (D+rho)^2: the Gram matrix of R_t T_t's rows.
        d_rho = d + rho
        eta_n, eta1 = eta / n, 1.0 - eta
        ell = 0.5 * (ell + ell.T)
        k = 0.5 * (k + k.T)
        outer = np.outer(inv_sqrt_e, inv_sqrt_e)
        z = (eta_n * eta_n) * outer * k + (eta_n * eta1) * outer * ell * \
            (d_rho[None, :] + d_rho[:, None])
        z[np.diag_indices(r)] += eta1 * eta1 * d_rho * d_rho
        if not np.isfinite(z).all():
            what = f" of {self.name}" if self.name else ""
            raise ComputeError(f"natural gradient{what}: the minibatch's statistics are not "
                               "finite (its values overflow float32: the training has "
                               "diverged, or the input holds inf/NaN)")
        z_scale = max(1.0, float(np.trace(z)))
        c, u = np.linalg.eigh(z / z_scale)
        order = np.argsort(-c, kind="stable")         # Kaldi's SortSvd: largest first
        c, u = c[order] * z_scale, u[:, order]
        must_reorthogonalize = bool(c[0] > _CONDITION_THRESHOLD * c[r - 1])
        c_floor = (rho * (1.0 - eta)) ** 2
        if np.any(c < c_floor):
            must_reorthogonalize = True
            c = np.maximum(c, c_floor)

        sqrt_c = np.sqrt(c)
        rho1 = (eta_n * tr_x_xt + eta1 * (dim * rho + float(d.sum())) - float(sqrt_c.sum())) \
            / (dim - r)
        floor_val = max(self.epsilon, self.delta * float(sqrt_c.max()))
        d1 = np.maximum(sqrt_c - rho1, floor_val)
        rho1 = max(rho1, floor_val)

        # W_{t+1} = A_t B_t with B_t = J_t + (1-eta)/(eta/N) (D_t + rho_t) W_t and
        # A_t = eta/N E_{t+1}^{1/2} C_t^{-1/2} U_t^T E_t^{-1/2}.
        _, sqrt_e1, inv_sqrt_e1 = self._e_terms(d1, self._beta(rho1, d1))
        b = j + ops.upload((eta1 / eta_n * d_rho)[:, None], like) * w
        a = u.T * (eta_n * sqrt_e1 / sqrt_c)[:, None] * inv_sqrt_e[None, :]
        w1 = ops.upload(a, like) @ b
        if must_reorthogonalize:
            w1 = ops.upload(_reorthogonalize(ops.host64(w1), sqrt_e1, inv_sqrt_e1,
                                             self.warnings), like)
        self.W, self.d, self.rho = w1, d1, rho1


def orthonormal_special(rows: int, cols: int) -> np.ndarray:
    """Kaldi's InitOrthonormalSpecial: row r has entries at columns r, r+rows, ...,
    the first 1.1 and the others 1, normalized (orthonormal rows, no zero column,
    and no combination of rows is all ones)."""
    if cols < rows:
        raise ValueError("orthonormal_special needs cols >= rows")
    m = np.zeros((rows, cols), np.float32)
    col = np.arange(cols)
    row = col % rows
    count = (cols - row - 1) // rows + 1               # entries in each row
    first = col < rows
    norm = 1.0 / np.sqrt(1.1 * 1.1 + count[row] - 1.0)
    m[row, col] = np.where(first, 1.1, 1.0) * norm
    return m


def _reorthogonalize(w64: np.ndarray, sqrt_e1: np.ndarray, inv_sqrt_e1: np.ndarray,
                     warnings: list[str]) -> np.ndarray:
    """Kaldi's ReorthogonalizeRt1 on ``W_{t+1}`` (float64 on the host): make
    ``E^{-1/2} W W^T E^{-1/2}`` the unit matrix again (Cholesky; Gram-Schmidt when
    that fails or is ill-conditioned, with Kaldi's warning appended to
    ``warnings``). Returns float32."""
    o = (w64 @ w64.T) * np.outer(inv_sqrt_e1, inv_sqrt_e1)
    if np.abs(o - np.eye(len(o))).max() <= _REORTHOGONALIZE_THRESHOLD:
        return w64.astype(np.float32)
    try:
        c_inv = np.linalg.inv(np.linalg.cholesky(o))
    except np.linalg.LinAlgError:
        c_inv = None
        warnings.append(_CHOLESKY_FAILED_WARNING)
    else:
        if not np.max(c_inv) < 100.0:  # (NaN too, as Kaldi's !(C.Max() < 100.0))
            c_inv = None
            warnings.append(_CHOLESKY_RANGE_WARNING)
    if c_inv is None:
        q, _ = np.linalg.qr(w64.T)                    # Gram-Schmidt on the rows
        q = q.T * np.sign(np.sum(q.T * w64, axis=1))[:, None]
        return (q * sqrt_e1[:, None]).astype(np.float32)
    c_inv = c_inv * np.outer(sqrt_e1, inv_sqrt_e1)    # E^{1/2} C^{-1} E^{-1/2}
    return (c_inv @ w64).astype(np.float32)


class _Gram:
    """What :meth:`OnlineNaturalGradient.precondition_implicit` needs of ``W``: ``w64``
    (float64), ``M = W W^T`` (float64), ``off_norm = ||M - diag(M)||_F``, and for a call
    that does not update: ``w_scaled = diag(s) W`` (float32) with ``s_j = sqrt(2 -
    M_jj)``, ``inv_s = 1 / s`` (float32) and ``min_s2 = min_j s_j^2`` (``w_scaled`` None where
    some ``M_jj >= 2``, which an estimate never has: ``M_jj = e_jj < 1``)."""

    __slots__ = ("w", "w64", "m", "off_norm", "w_scaled", "inv_s", "min_s2")

    def __init__(self, w: np.ndarray):
        w64 = self.w64 = w.astype(np.float64)
        self.w = w
        self.m = w64 @ w64.T
        diag = self.m.diagonal()
        off = self.m - np.diag(diag)
        self.off_norm = float(np.sqrt(np.sum(off * off)))
        s2 = 2.0 - diag
        self.w_scaled = self.inv_s = None
        self.min_s2 = 0.0
        if len(s2) and s2.min() > 0.0:
            s = np.sqrt(s2)
            self.w_scaled = (w64 * s[:, None]).astype(np.float32)
            self.inv_s = (1.0 / s).astype(np.float32)
            self.min_s2 = float(s2.min())


def _w_jt(w64: np.ndarray, j) -> np.ndarray:
    """``L_t = W_t J_t^T`` in float64 (Kaldi's order: with ``J_t = H_t^T X_t`` it is
    ``H_t^T H_t``, an R x D x R product instead of N x R x R)."""
    return w64 @ np.asarray(j, dtype=np.float64).T


def _times_transpose(blocks: list, w: np.ndarray, bias: bool) -> np.ndarray:
    """``[blocks... | ones] @ w^T`` (float32 N x R): one GEMM per block."""
    h = np.empty((blocks[0].shape[0], w.shape[0]), np.float32)
    col = 0
    for blk in blocks:
        cb = blk.shape[1]
        if col == 0:
            np.matmul(blk, w[:, :cb].T, out=h)
        else:
            gemm_acc(h, blk, w[:, col:col + cb].T)
        col += cb
    if bias:
        h += w[:, col]
    return h


def _stack_columns(blocks: list, bias: bool) -> np.ndarray:
    """A new float32 matrix: the column blocks side by side (and a column of ones)."""
    cols = sum(b.shape[1] for b in blocks)
    out = np.empty((blocks[0].shape[0], cols + int(bias)), np.float32)
    col = 0
    for blk in blocks:
        out[:, col:col + blk.shape[1]] = blk
        col += blk.shape[1]
    if bias:
        out[:, cols] = 1.0
    return out


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch")


class _NumpyOps:
    """The few array operations the preconditioner needs, on NumPy arrays."""

    @staticmethod
    def prepare(x, overwrite: bool) -> np.ndarray:
        if overwrite and isinstance(x, np.ndarray) and x.dtype == np.float32 and \
                x.flags.c_contiguous and x.flags.writeable:
            return x
        return np.array(x, dtype=np.float32, order="C", copy=True)

    @staticmethod
    def like(w, x):
        return w if w is None or type(w) is np.ndarray else _TorchOps.host64(w).astype(
            np.float32)

    @staticmethod
    def sumsq(x) -> float:
        flat = x.reshape(-1)
        return float(np.dot(flat, flat))

    @staticmethod
    def sub_mm_(x, h, w) -> None:
        gemm_acc(x, h, w, -1.0)

    @staticmethod
    def host64(a) -> np.ndarray:
        return a.astype(np.float64) if type(a) is np.ndarray else _TorchOps.host64(a)

    @staticmethod
    def upload(a: np.ndarray, like) -> np.ndarray:
        return np.asarray(a, dtype=np.float32)


class _TorchOps:
    """The same on torch tensors (any device: the state then lives there too, and
    only R x R matrices and scalars travel to the host, as in Kaldi's GPU code)."""

    @staticmethod
    def prepare(x, overwrite: bool):
        import torch

        if overwrite and x.dtype == torch.float32 and x.is_contiguous():
            return x
        return x.detach().to(torch.float32).contiguous().clone()

    @staticmethod
    def like(w, x):
        if w is None:
            return None
        if _is_tensor(w) and w.device == x.device:
            return w
        return _TorchOps.upload(_NumpyOps.host64(w), x)

    @staticmethod
    def sumsq(x) -> float:
        flat = x.reshape(-1)
        return float(flat @ flat)

    @staticmethod
    def sub_mm_(x, h, w) -> None:
        x.addmm_(h, w, alpha=-1.0)

    @staticmethod
    def host64(a) -> np.ndarray:
        return a.detach().cpu().numpy().astype(np.float64)

    @staticmethod
    def upload(a: np.ndarray, like):
        import torch

        return torch.as_tensor(np.ascontiguousarray(a, dtype=np.float32), device=like.device)
