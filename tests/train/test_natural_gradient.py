"""OnlineNaturalGradient on its own: against the paper's math written out with
explicit D x D matrices in float64 (an independent formulation of the update
that Kaldi's code computes through the R x R matrices J, K, L, Z), and its
invariants (scale, Fisher-inverse form, orthonormality, trace, update period)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pynnet3.train import OnlineNaturalGradient
from pynnet3.train.natural_gradient import orthonormal_special


class PaperNaturalGradient:
    """arXiv 1410.7455 / natural-gradient-online.h, in float64 with explicit matrices:
    F = R^T diag(d) R + rho I; X_hat = X - X R^T E R X with e = d / (d + beta);
    update: T = eta/N X^T X + (1-eta) F, Y = R T, Y Y^T = U C U^T,
    R' = C^-1/2 U^T Y, rho' keeps the trace, d' = sqrt(c) - rho' (floored)."""

    def __init__(self, rank, dim, alpha=4.0, num_samples_history=2000.0, update_period=1):
        self.rank, self.dim, self.alpha = rank, dim, alpha
        self.nsh, self.period = num_samples_history, update_period
        eps = 1e-10
        # Kaldi's start: the special orthonormal pattern, built here from its description
        r = np.zeros((rank, dim))
        for i in range(rank):
            cols = list(range(i, dim, rank))
            r[i, cols] = [1.1] + [1.0] * (len(cols) - 1)
            r[i] /= np.linalg.norm(r[i])
        self.R, self.d, self.rho, self.t = r, np.full(rank, eps), eps, 0

    def beta(self):
        return self.rho * (1 + self.alpha) + self.alpha * self.d.sum() / self.dim

    def precondition_only(self, x):
        e = self.d / (self.d + self.beta())
        w = np.sqrt(e)[:, None] * self.R
        return x - x @ w.T @ w

    def update(self, x):
        n, dim, rank = x.shape[0], self.dim, self.rank
        eta = min(0.9, 1 - math.exp(-n / self.nsh))
        f = self.R.T @ np.diag(self.d) @ self.R + self.rho * np.eye(dim)
        t = eta / n * x.T @ x + (1 - eta) * f
        y = self.R @ t
        c, u = np.linalg.eigh(y @ y.T)
        c, u = c[::-1], u[:, ::-1]
        c = np.maximum(c, (self.rho * (1 - eta)) ** 2)
        r1 = (u.T @ y) / np.sqrt(c)[:, None]
        rho1 = (eta / n * np.sum(x * x) + (1 - eta) * (dim * self.rho + self.d.sum())
                - np.sqrt(c).sum()) / (dim - rank)
        floor = max(1e-10, 5e-4 * np.sqrt(c).max())
        self.d = np.maximum(np.sqrt(c) - rho1, floor)
        self.rho = max(rho1, floor)
        self.R = r1

    def precondition(self, x):
        """One Kaldi call: initialize on the first (3 updates, or 1 if N <= rank), then
        precondition with the current estimate, then update when it is time."""
        if self.t == 0:
            for _ in range(1 if x.shape[0] <= self.rank else 3):
                self.update(x)
        x_hat = self.precondition_only(x)
        if self.t <= 10 or (self.t - 10) % self.period == 0:
            self.update(x)
        self.t += 1
        return x_hat * math.sqrt(np.sum(x * x) / np.sum(x_hat * x_hat))


def _data(rng, n, dim, strong=5):
    """Rows with a few strong directions (the same ones for every call with this dim
    and number) plus isotropic noise: a Fisher matrix worth estimating."""
    basis = np.linalg.qr(np.random.default_rng(dim * 1000 + strong).standard_normal(
        (dim, strong)))[0].T
    scales = np.linspace(10.0, 3.0, strong)
    return (rng.standard_normal((n, strong)) * scales) @ basis + rng.standard_normal((n, dim))


@pytest.mark.parametrize("n,dim,rank,period", [(128, 41, 20, 4), (128, 300, 80, 1),
                                               (30, 25, 10, 3)])
def test_matches_paper_math_over_many_calls(n, dim, rank, period):
    rng = np.random.default_rng(n + dim)
    ours = OnlineNaturalGradient(rank, update_period=period)
    ref = PaperNaturalGradient(rank, dim, update_period=period)
    for step in range(25):
        x = _data(rng, n, dim).astype(np.float32)
        x_hat, scale = ours.precondition(x)
        expected = ref.precondition(x.astype(np.float64))
        got = x_hat.astype(np.float64) * scale
        err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
        assert err < 2e-4, f"call {step}: relative difference {err:.2e}"
    r, d, rho = ours.fisher_terms()
    np.testing.assert_allclose(d, ref.d, rtol=1e-3)
    assert rho == pytest.approx(ref.rho, rel=1e-3)
    # same subspace (rows of R may differ in sign only)
    np.testing.assert_allclose(np.abs(np.sum(r * ref.R, axis=1)), 1.0, atol=1e-3)


def test_scale_restores_the_frobenius_norm():
    rng = np.random.default_rng(1)
    ng = OnlineNaturalGradient(10, update_period=2)
    for _ in range(15):
        x = _data(rng, 50, 30).astype(np.float32)
        x_hat, scale = ng.precondition(x)
        assert np.linalg.norm(scale * x_hat.astype(np.float64)) == pytest.approx(
            np.linalg.norm(x.astype(np.float64)), rel=1e-5)
        assert scale > 1.0  # strong directions are damped, so X_hat is smaller


def test_preconditioning_is_beta_times_inverse_of_g():
    """X_hat = beta_t X G_t^{-1} with G_t = F_t + alpha/D tr(F_t) I, from the state
    before the call (the update in a call affects only later calls)."""
    rng = np.random.default_rng(2)
    dim, alpha = 40, 4.0
    ng = OnlineNaturalGradient(12, update_period=1, alpha=alpha)
    ng.precondition(_data(rng, 100, dim).astype(np.float32))
    for _ in range(5):
        r, d, rho = ng.fisher_terms()
        f = r.T @ np.diag(d) @ r + rho * np.eye(dim)
        g = f + alpha / dim * np.trace(f) * np.eye(dim)
        beta = rho * (1 + alpha) + alpha * d.sum() / dim
        x = _data(rng, 100, dim).astype(np.float32)
        x_hat, _ = ng.precondition(x)
        expected = beta * x.astype(np.float64) @ np.linalg.inv(g)
        np.testing.assert_allclose(x_hat, expected, rtol=0, atol=2e-4 * np.abs(expected).max())


def test_update_keeps_the_trace_and_orthonormality():
    """tr F_{t+1} = eta/N tr(X^T X) + (1 - eta) tr F_t (rho's definition, when no
    floor is hit: as many strong directions as the rank), and E^{-1/2} W W^T E^{-1/2} = I
    after every update."""
    rng = np.random.default_rng(3)
    n, dim = 64, 50
    ng = OnlineNaturalGradient(15, update_period=1, num_samples_history=500.0)
    ng.precondition(_data(rng, n, dim, strong=15).astype(np.float32))
    eta = 1 - math.exp(-n / 500.0)
    for _ in range(20):
        r, d, rho = ng.fisher_terms()
        trace_f = dim * rho + d.sum()
        x = _data(rng, n, dim, strong=15).astype(np.float32)
        ng.precondition(x)
        r1, d1, rho1 = ng.fisher_terms()
        expected = eta / n * np.sum(x.astype(np.float64) ** 2) + (1 - eta) * trace_f
        assert dim * rho1 + d1.sum() == pytest.approx(expected, rel=1e-4)
        assert ng.check_invariants() < 1e-3


def test_learns_the_strong_subspace():
    """After many minibatches, R_t spans the data's strong directions, d + rho
    approach their variances and rho the noise variance, or its floor
    delta * max sqrt(c) (5e-4 * 64 here, above the noise's 0.01)."""
    rng = np.random.default_rng(4)
    dim, k = 60, 4
    basis = np.linalg.qr(rng.standard_normal((dim, k)))[0].T
    scales = np.array([8.0, 6.0, 4.0, 3.0])
    ng = OnlineNaturalGradient(k, update_period=1, num_samples_history=1000.0)
    for _ in range(200):
        x = (rng.standard_normal((100, k)) * scales) @ basis + 0.1 * rng.standard_normal(
            (100, dim))
        ng.precondition(x.astype(np.float32))
    r, d, rho = ng.fisher_terms()
    # principal angles between span(R) and span(basis): all cosines near 1
    cosines = np.linalg.svd(r @ basis.T, compute_uv=False)
    assert cosines.min() > 0.99
    np.testing.assert_allclose(np.sort(d + rho)[::-1], scales ** 2 + 0.01, rtol=0.2)
    assert rho == pytest.approx(5e-4 * (d + rho).max(), rel=1e-3)
    assert d.min() >= rho


def test_update_period_and_freeze():
    """The estimate changes on calls t <= 10 and then every update_period-th call
    (t - 10 divisible by it); frozen, it never changes; t counts every call."""
    rng = np.random.default_rng(5)
    ng = OnlineNaturalGradient(6, update_period=3)
    changed = []
    for _ in range(22):
        w = None if ng.W is None else ng.W.copy()
        ng.precondition(_data(rng, 40, 20).astype(np.float32))
        changed.append(w is None or not np.array_equal(w, ng.W))
    expected = [t <= 10 or (t - 10) % 3 == 0 for t in range(22)]
    assert changed == expected
    assert ng.t == 22
    ng.freeze(True)
    w = ng.W.copy()
    for _ in range(6):
        ng.precondition(_data(rng, 40, 20).astype(np.float32))
    assert np.array_equal(w, ng.W) and ng.t == 28


def test_first_call_from_few_rows_and_edge_dims():
    rng = np.random.default_rng(6)
    # N <= rank: one initialization iteration; the result is finite and orthonormal
    ng = OnlineNaturalGradient(20)
    x = rng.standard_normal((8, 50)).astype(np.float32)
    x_hat, scale = ng.precondition(x)
    assert np.isfinite(x_hat).all() and math.isfinite(scale)
    assert ng.check_invariants() < 1e-3
    # rank >= dim is lowered to dim - 1, as Kaldi does
    ng = OnlineNaturalGradient(80)
    ng.precondition(rng.standard_normal((100, 30)).astype(np.float32))
    assert ng.rank == 29 and ng.W.shape == (29, 30)
    # a one-dimensional space: identity
    ng = OnlineNaturalGradient(5)
    x = rng.standard_normal((10, 1)).astype(np.float32)
    x_hat, scale = ng.precondition(x)
    assert scale == 1.0 and np.array_equal(x_hat, x)
    # an all-zero minibatch: scale 1, nothing NaN
    ng = OnlineNaturalGradient(5)
    ng.precondition(rng.standard_normal((20, 12)).astype(np.float32))
    x_hat, scale = ng.precondition(np.zeros((20, 12), np.float32))
    assert scale == 1.0 and not x_hat.any() and ng.check_invariants() < 1e-3


def test_orthonormal_special_pattern():
    m = orthonormal_special(3, 8).astype(np.float64)
    np.testing.assert_allclose(m @ m.T, np.eye(3), atol=1e-6)
    assert (m != 0).sum(axis=0).tolist() == [1] * 8  # every column used once
    assert m[0, 0] / m[0, 3] == pytest.approx(1.1)


def test_bad_settings_are_refused():
    for kwargs in ({"rank": 0}, {"rank": 4, "update_period": 0},
                   {"rank": 4, "num_samples_history": 0.0}, {"rank": 4, "alpha": -1.0}):
        with pytest.raises(ValueError):
            OnlineNaturalGradient(**kwargs)
    ng = OnlineNaturalGradient(4)
    ng.precondition(np.ones((10, 8), np.float32) + np.eye(10, 8, dtype=np.float32))
    with pytest.raises(ValueError, match="dimension changed"):
        ng.precondition(np.ones((10, 9), np.float32))


def test_torch_tensors_keep_the_state_on_their_device():
    """Rows given as torch tensors are preconditioned with torch (the state W lives
    there; only R x R matrices go to the host) and give the NumPy result."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    on_numpy, on_torch = OnlineNaturalGradient(10, 2), OnlineNaturalGradient(10, 2)
    for _ in range(15):
        x = _data(rng, 60, 30).astype(np.float32)
        a, sa = on_numpy.precondition(x)
        b, sb = on_torch.precondition(torch.from_numpy(x.copy()))
        assert isinstance(b, torch.Tensor) and isinstance(on_torch.W, torch.Tensor)
        np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=2e-4 * np.abs(a).max())
        assert sb == pytest.approx(sa, rel=1e-4)
    # (rows are eigenvectors: equal up to sign)
    wt, wn = on_torch.W.numpy().astype(np.float64), on_numpy.W.astype(np.float64)
    np.testing.assert_allclose(wt.T @ wt, wn.T @ wn, rtol=0, atol=1e-4)
    assert on_torch.check_invariants() < 1e-3


def test_overflowing_statistics_are_a_clear_error():
    """Rows whose products overflow float32 (a diverged training) make the Fisher
    update non-finite: a ComputeError naming the preconditioner, not LAPACK's
    'eigenvalues did not converge'."""
    from pynnet3.errors import ComputeError

    p = OnlineNaturalGradient(rank=4, update_period=1)
    p.name = "component 'affine1' (in)"
    rng = np.random.default_rng(0)
    p.precondition(rng.standard_normal((32, 12)).astype(np.float32))
    with pytest.raises(ComputeError, match=r"natural gradient of component 'affine1' \(in\): "
                                           r"the minibatch's statistics are not finite"):
        with np.errstate(over="ignore", invalid="ignore"):
            p.precondition(np.full((32, 12), 3e37, np.float32))


def _blocks_data(rng, n, dims, amplitude):
    """Column blocks (float32) whose side-by-side matrix has a few directions
    ``amplitude`` times stronger than isotropic noise."""
    dim = sum(dims)
    basis = np.linalg.qr(np.random.default_rng(dim).standard_normal((dim, 4)))[0].T
    x = (rng.standard_normal((n, 4)) * amplitude) @ basis + rng.standard_normal((n, dim))
    x = x.astype(np.float32)
    out, col = [], 0
    for d in dims:
        out.append(np.ascontiguousarray(x[:, col:col + d]))
        col += d
    return out


@pytest.mark.parametrize("amplitude", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("dims,bias", [((30,), True), ((17, 20), False), ((12, 9, 15), True)])
def test_implicit_preconditioning_matches_paper_math(amplitude, dims, bias, monkeypatch):
    """precondition_implicit (X_hat left implicit as ``X - X w^T w``, or formed when X
    lies mostly in the subspace) gives the paper's ``A^T X_hat * scale`` for column
    blocks plus a column of ones; with weak directions it stays implicit on most
    calls, with strong ones it forms X_hat."""
    rng = np.random.default_rng(len(dims) + int(amplitude))
    dim = sum(dims) + int(bias)
    ours = OnlineNaturalGradient(8, update_period=3)
    ref = PaperNaturalGradient(8, dim, update_period=3)
    kinds = {"implicit": 0, "formed": 0}
    for step in range(20):
        blocks = _blocks_data(rng, 64, dims, amplitude)
        x = np.concatenate(blocks + ([np.ones((64, 1), np.float32)] if bias else []), axis=1)
        a = rng.standard_normal((64, 5)).astype(np.float32)
        x_hat, w, scale = ours.precondition_implicit([b.copy() for b in blocks], bias)
        if x_hat is None:
            kinds["implicit"] += 1
            prod = a.T.astype(np.float64) @ x
            got = scale * (prod - (prod @ w.T) @ w)
        else:
            kinds["formed"] += 1
            got = scale * (a.T.astype(np.float64) @ x_hat)
        expected = a.T.astype(np.float64) @ ref.precondition(x.astype(np.float64))
        err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
        assert err < 2e-4, f"call {step}: relative difference {err:.2e}"
    assert ours.t == 20
    if amplitude <= 2.0:
        assert kinds["implicit"] >= 15, kinds
    else:
        assert kinds["formed"] >= 15, kinds


def test_implicit_preconditioning_with_full_gram_term(monkeypatch):
    """With a zero tolerance for W W^T's off-diagonal part, ||X_hat|| comes from the
    full H^T H on every call: still the paper's scale."""
    import pynnet3.train.natural_gradient as ng_mod

    monkeypatch.setattr(ng_mod, "_DIAGONAL_TOLERANCE", 0.0)
    rng = np.random.default_rng(5)
    ours = OnlineNaturalGradient(6, update_period=4)
    ref = PaperNaturalGradient(6, 25, update_period=4)
    for step in range(16):
        (x,) = _blocks_data(rng, 40, (25,), 1.0)
        x_hat, w, scale = ours.precondition_implicit([x])
        expected = ref.precondition(x.astype(np.float64))
        if x_hat is None:
            x64 = x.astype(np.float64)
            x_hat = x64 - (x64 @ w.T) @ w
        err = np.linalg.norm(scale * x_hat - expected) / np.linalg.norm(expected)
        assert err < 2e-4, f"call {step}: relative difference {err:.2e}"


def test_implicit_preconditioning_edge_cases():
    ng = OnlineNaturalGradient(4)
    one = [np.ones((10, 1), np.float32)]
    assert ng.precondition_implicit(one) == (None, None, 1.0)      # 1-dimensional
    assert ng.precondition_implicit([np.zeros((0, 6), np.float32)]) == (None, None, 1.0)
    assert ng.t == 0
    rng = np.random.default_rng(0)
    ng.precondition_implicit([rng.standard_normal((20, 6)).astype(np.float32)])
    with pytest.raises(ValueError, match="dimension changed"):
        ng.precondition_implicit([rng.standard_normal((20, 6)).astype(np.float32)], True)
    # all-zero rows: nothing to scale
    _, _, scale = ng.precondition_implicit([np.zeros((20, 6), np.float32)])
    assert scale == 1.0


@pytest.mark.parametrize("amplitude", [0.5, 8.0])
def test_precondition_product_matches_explicit_preconditioning(amplitude):
    """components.preconditioning.precondition_product (the affine update, NumPy:
    ``(I - Wo^T Wo) (dY^T X) (I - Wi^T Wi)`` where safe) adds what Kaldi's order
    gives: both sides' X_hat formed by ``precondition``, then ``s dY_hat^T X_hat``;
    the estimates evolve the same."""
    from pynnet3.components.preconditioning import PreconditionedGrad, precondition_product

    rng = np.random.default_rng(int(amplitude))
    pre = {"in": OnlineNaturalGradient(6, update_period=2),
           "out": OnlineNaturalGradient(5, update_period=2)}
    ref = {"in": OnlineNaturalGradient(6, update_period=2),
           "out": OnlineNaturalGradient(5, update_period=2)}
    for step in range(12):
        blocks = _blocks_data(rng, 50, (11, 13), amplitude)
        (dy,) = _blocks_data(rng, 50, (15,), amplitude)
        grad = PreconditionedGrad({"w": np.zeros((15, 24), np.float32),
                                   "b": np.zeros(15, np.float32)}, pre)
        assert precondition_product(grad, "w", "b", [b.copy() for b in blocks], dy.copy())
        x = np.concatenate(blocks + [np.ones((50, 1), np.float32)], axis=1)
        x_hat, s_in = ref["in"].precondition(x)
        dy_hat, s_out = ref["out"].precondition(dy)
        expected = s_in * s_out * (dy_hat.T.astype(np.float64) @ x_hat)
        got = np.concatenate([grad["w"], grad["b"][:, None]], axis=1)
        err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
        assert err < 1e-4, f"call {step}: relative difference {err:.2e}"
    for side in ("in", "out"):
        f_got, f_ref = pre[side].fisher_terms(), ref[side].fisher_terms()
        np.testing.assert_allclose(f_got[0].T @ (f_got[1][:, None] * f_got[0]),
                                   f_ref[0].T @ (f_ref[1][:, None] * f_ref[0]),
                                   rtol=1e-4, atol=1e-4 * f_ref[1].max())
        assert f_got[2] == pytest.approx(f_ref[2], rel=1e-4)



def test_implicit_preconditioning_forms_x_hat_after_a_call_that_stays_implicit(monkeypatch):
    """A call that does not update its estimate and finds X mostly in the estimated
    subspace (the previous call's did not) forms X_hat from H after the fact: still
    the paper's ``X_hat * scale``. (Strong directions learned over the first 11 calls,
    X_hat formed at once; two calls of isotropic noise; the strong ones again on call
    13, which does not update. The tolerance for W W^T's off-diagonal part raised so
    that call 13 takes the column-weighted H of a call that does not update.)"""
    import pynnet3.train.natural_gradient as ng_mod

    monkeypatch.setattr(ng_mod, "_DIAGONAL_TOLERANCE", 1.0)
    rng = np.random.default_rng(11)
    ours = OnlineNaturalGradient(6, update_period=4)
    ref = PaperNaturalGradient(6, 21, update_period=4)
    kinds = []
    for step in range(16):
        (x,) = _blocks_data(rng, 50, (20,), 0.0 if step in (11, 12) else 30.0)
        x_hat, w, scale = ours.precondition_implicit([x.copy()], True)
        x1 = np.concatenate([x, np.ones((50, 1), np.float32)], axis=1).astype(np.float64)
        expected = ref.precondition(x1)
        if x_hat is None:
            x_hat = x1 - (x1 @ w.T) @ w
        kinds.append("implicit" if w is not None else "formed")
        err = np.linalg.norm(scale * x_hat - expected) / np.linalg.norm(expected)
        assert err < 2e-4, f"call {step}: relative difference {err:.2e}"
    assert kinds[12] == "implicit" and kinds[13] == "formed", kinds


def test_gram_schmidt_fallback_is_recorded_not_printed(capsys):
    """Kaldi's ReorthogonalizeRt1 warns when the Cholesky factor's inverse is out of
    range or the factorization fails, and falls back to Gram-Schmidt: the warning is
    kept in ``warnings`` (one per event, Kaldi's wording) for the trainer to log, and
    nothing is printed here."""
    from pynnet3.train.natural_gradient import (
        _CHOLESKY_FAILED_WARNING,
        _CHOLESKY_RANGE_WARNING,
        _reorthogonalize,
    )

    sqrt_e = np.array([0.5, 0.25])
    close = np.array([[1.0, 0.0, 0.0], [1.0, 1e-3, 0.0]])  # C^{-1} ~ 1000
    parallel = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])  # O singular
    fine = np.array([[1.0, 0.0, 0.0], [0.1, 1.0, 0.0]])  # Cholesky handles it
    for rows in (close, fine):
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    warnings: list[str] = []
    for rows in (close, fine, parallel):
        w1 = _reorthogonalize(rows * sqrt_e[:, None], sqrt_e, 1.0 / sqrt_e, warnings)
        r = w1.astype(np.float64) / sqrt_e[:, None]
        if rows is not parallel:  # (Gram-Schmidt of parallel rows: no basis to find)
            np.testing.assert_allclose(r @ r.T, np.eye(2), atol=1e-6)
    assert warnings == [_CHOLESKY_RANGE_WARNING, _CHOLESKY_FAILED_WARNING]
    assert _CHOLESKY_RANGE_WARNING == ("Cholesky out of expected range, "
                                       "reorthogonalizing with Gram-Schmidt")

    # through a preconditioner: a first minibatch of fewer rows than the rank falls
    # back once (in the initialization, on a copy: the warning is still this one's)
    rng = np.random.default_rng(0)
    ng = OnlineNaturalGradient(rank=5)
    ng.precondition(rng.standard_normal((1, 20)).astype(np.float32))
    assert ng.warnings == [_CHOLESKY_RANGE_WARNING]
    assert ng.take_warnings() == [_CHOLESKY_RANGE_WARNING] and ng.warnings == []
    ng.precondition(rng.standard_normal((1, 20)).astype(np.float32))
    assert ng.take_warnings() == []
    assert capsys.readouterr() == ("", "")
