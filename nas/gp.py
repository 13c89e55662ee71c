"""Gaussian-process surrogate over architectures with a kernel that is PSD by construction.

An edit distance is not a Euclidean distance, so ``exp(-d(a, b)^2 / 2l^2)`` on it need not
be positive semi-definite (AIPerf used such a kernel, and a different one when predicting).
Instead each architecture is embedded as a vector -- its distances to a fixed set of
landmark architectures, a Lipschitz (Bourgain-style) embedding: ``|d(a, m) - d(b, m)| <=
d(a, b)`` when ``d`` obeys the triangle inequality, so architectures close under the
distance stay close in the embedding -- and the kernel is an RBF on those vectors. An RBF on
real vectors is PSD for every set of points, so every Gram matrix the search builds is a
valid covariance, and the *same* :func:`rbf_kernel` serves fitting and prediction.

Hyperparameters (length scale, signal variance, noise variance) maximise the log marginal
likelihood (L-BFGS-B with analytic gradients, in log space). Each observation may carry extra
noise variance on top of the fitted one (partial results are noisier than final ones). Cholesky factorisations
escalate a diagonal jitter when a matrix is numerically singular (e.g. duplicated points) and
record the jitter used; when even the largest jitter fails they raise :class:`GPError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast

import numpy as np
from scipy.linalg import cho_solve, lapack, solve_triangular
from scipy.optimize import minimize

from nas.distance import ArchitectureDistance
from nas.errors import NasError

JITTER_START = 1e-10  # relative to the mean of the diagonal
JITTER_MAX = 1e-1
_LOG_2PI = math.log(2.0 * math.pi)


class GPError(NasError):
    """The surrogate could not be fitted (the message says which step failed)."""


def stable_cholesky(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of ``matrix``, adding diagonal jitter x10 at a time when needed.

    Returns the factor and the jitter actually added (0.0 when none was needed).
    """
    if not np.all(np.isfinite(matrix)):
        raise GPError("covariance matrix has non-finite entries")
    scale = float(np.mean(np.diag(matrix))) if len(matrix) else 1.0
    scale = scale if scale > 0 else 1.0
    jitter = 0.0
    while True:
        try:
            factor = np.linalg.cholesky(matrix + jitter * np.eye(len(matrix)) if jitter else matrix)
            return factor, jitter
        except np.linalg.LinAlgError:
            jitter = JITTER_START * scale if jitter == 0.0 else jitter * 10.0
            if jitter > JITTER_MAX * scale:
                raise GPError(
                    f"covariance matrix is not positive definite even with jitter {jitter / 10:.1e}"
                ) from None


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    sq = np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * a @ b.T
    return np.maximum(sq, 0.0)


def rbf_kernel(a: np.ndarray, b: np.ndarray, length_scale: float, signal_variance: float) -> np.ndarray:
    """The surrogate's one covariance function (used for fitting and for prediction)."""
    return signal_variance * np.exp(-0.5 * squared_distances(a, b) / (length_scale * length_scale))


@dataclass
class Hyperparameters:
    length_scale: float = 1.0
    signal_variance: float = 1.0
    noise_variance: float = 1e-2

    def as_log(self) -> np.ndarray:
        return np.log([self.length_scale, self.signal_variance, self.noise_variance])

    @classmethod
    def from_log(cls, theta: np.ndarray) -> Hyperparameters:
        length, signal, noise = np.exp(theta)
        return cls(float(length), float(signal), float(noise))


def _lml_and_gradient(
    sq: np.ndarray, y: np.ndarray, extra_noise: np.ndarray, hyper: Hyperparameters
) -> tuple[float, np.ndarray]:
    """Log marginal likelihood from squared distances, and its gradient in log hyperparameters.

    The gradient is ``0.5 tr((alpha alpha^T - K^-1) dK/dtheta)``; ``K^-1`` comes from the
    Cholesky factor (LAPACK potri), the one cubic step besides the factorisation.
    """
    n = len(y)
    shape = np.exp(-0.5 * sq / hyper.length_scale**2)
    cov = hyper.signal_variance * shape + np.diag(hyper.noise_variance + extra_noise)
    factor, _ = stable_cholesky(cov)
    alpha = cho_solve((factor, True), y)
    lml = -0.5 * float(y @ alpha) - float(np.sum(np.log(np.diag(factor)))) - 0.5 * n * _LOG_2PI
    inverse, info = lapack.dpotri(factor, lower=1)
    if info != 0:
        raise GPError(f"covariance inverse failed (LAPACK potri info={info})")
    inverse = np.tril(inverse) + np.tril(inverse, -1).T
    inner = np.outer(alpha, alpha) - inverse
    weighted = hyper.signal_variance * shape * inner
    grad = 0.5 * np.array(
        [
            float(np.sum(weighted * sq)) / hyper.length_scale**2,
            float(np.sum(weighted)),
            float(np.sum(np.diag(inner))) * hyper.noise_variance,
        ]
    )
    return lml, grad


@dataclass
class FitReport:
    """What the last fit did, so failures are visible instead of silently skipped."""

    points: int = 0
    optimised: bool = False
    optimiser_ok: bool = True
    optimiser_message: str = ""
    log_marginal_likelihood: float = float("nan")
    jitter: float = 0.0
    failures: list[str] = field(default_factory=list)


class GaussianProcess:
    """Zero-mean GP regression on vectors with an RBF kernel and optional per-point extra noise."""

    def __init__(
        self,
        hyper: Hyperparameters | None = None,
        noise_bounds: tuple[float, float] = (1e-4, 1.0),
        signal_bounds: tuple[float, float] = (1e-2, 1e2),
        length_prior_sd: float = 1.0,
    ) -> None:
        self.hyper = hyper or Hyperparameters()
        self.noise_bounds = noise_bounds
        self.signal_bounds = signal_bounds
        self.length_prior_sd = length_prior_sd
        self.report = FitReport()
        self._x = np.zeros((0, 0))
        self._factor = np.zeros((0, 0))
        self._alpha = np.zeros(0)

    # --- the likelihood -------------------------------------------------------------------
    def covariance(self, x: np.ndarray, extra_noise: np.ndarray, hyper: Hyperparameters) -> np.ndarray:
        gram = rbf_kernel(x, x, hyper.length_scale, hyper.signal_variance)
        return gram + np.diag(hyper.noise_variance + extra_noise)

    def log_marginal_likelihood(
        self, x: np.ndarray, y: np.ndarray, extra_noise: np.ndarray, hyper: Hyperparameters
    ) -> tuple[float, np.ndarray]:
        """Log marginal likelihood and its gradient with respect to the log hyperparameters."""
        return _lml_and_gradient(squared_distances(x, x), y, extra_noise, hyper)

    @staticmethod
    def typical_distance(x: np.ndarray) -> float:
        """Median distance between distinct points: the natural unit for the length scale."""
        sq = squared_distances(x, x)
        positive = np.sqrt(sq[sq > 1e-12])
        return float(np.median(positive)) if positive.size else 1.0

    def optimise(self, x: np.ndarray, y: np.ndarray, extra_noise: np.ndarray) -> None:
        """Set the hyperparameters by maximising the log marginal likelihood (two starts).

        A log-normal prior on the length scale, centred on the typical distance between the
        points, keeps a few observations from being explained as noise-free and independent
        (a collapsed length scale, after which every candidate looks equally uncertain).
        """
        typical = self.typical_distance(x)
        bounds = [
            (math.log(typical / 100.0), math.log(typical * 100.0)),
            tuple(math.log(b) for b in self.signal_bounds),
            tuple(math.log(b) for b in self.noise_bounds),
        ]
        starts = [
            np.clip(self.hyper.as_log(), [b[0] for b in bounds], [b[1] for b in bounds]),
            np.log([typical, 1.0, 1e-2]),
        ]
        prior_mean, prior_var = math.log(typical), self.length_prior_sd**2

        sq = squared_distances(x, x)

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            try:
                lml, grad = _lml_and_gradient(sq, y, extra_noise, Hyperparameters.from_log(theta))
            except GPError:
                return 1e25, np.zeros(3)
            offset = theta[0] - prior_mean
            lml -= 0.5 * offset * offset / prior_var
            grad = grad - np.array([offset / prior_var, 0.0, 0.0])
            return -lml, -grad

        best = None
        for start in starts:
            result = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 60})
            if best is None or result.fun < best.fun:
                best = result
        assert best is not None
        self.report.optimised = True
        self.report.optimiser_ok = bool(best.success) and best.fun < 1e24
        self.report.optimiser_message = str(best.message)
        if best.fun < 1e24:
            self.hyper = Hyperparameters.from_log(best.x)
        else:
            self.report.failures.append("hyperparameter optimisation found no finite likelihood; kept previous values")

    # --- fit and predict ------------------------------------------------------------------
    def fit(
        self, x: np.ndarray, y: np.ndarray, extra_noise: np.ndarray | None = None, optimise_on: int | None = None
    ) -> FitReport:
        """Condition on ``(x, y)``; re-optimise hyperparameters on the first ``optimise_on`` rows.

        Rows past ``optimise_on`` (e.g. fantasised outcomes of pending trials) enter the
        posterior but not the hyperparameter fit. ``optimise_on=None`` keeps the hyperparameters.
        """
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        extra_noise = np.zeros(len(y)) if extra_noise is None else np.asarray(extra_noise, dtype=np.float64)
        if x.ndim != 2 or len(x) != len(y) or len(extra_noise) != len(y):
            raise GPError(f"fit needs matching shapes, got x {x.shape}, y {y.shape}, noise {extra_noise.shape}")
        if not (np.all(np.isfinite(y)) and np.all(extra_noise >= 0)):
            raise GPError("fit needs finite targets and non-negative extra noise")
        failures = self.report.failures
        self.report = FitReport(points=len(y), failures=failures)
        if optimise_on is not None and optimise_on >= 3:
            self.optimise(x[:optimise_on], y[:optimise_on], extra_noise[:optimise_on])
        cov = self.covariance(x, extra_noise, self.hyper)
        self._factor, self.report.jitter = stable_cholesky(cov)
        self._alpha = cho_solve((self._factor, True), y)
        self._x = x
        self.report.log_marginal_likelihood = (
            -0.5 * float(y @ self._alpha) - float(np.sum(np.log(np.diag(self._factor)))) - 0.5 * len(y) * _LOG_2PI
        )
        return self.report

    @property
    def fitted(self) -> bool:
        return len(self._x) > 0

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``x`` (prior when nothing is fitted)."""
        x = np.asarray(x, dtype=np.float64)
        h = self.hyper
        if not self.fitted:
            return np.zeros(len(x)), np.full(len(x), math.sqrt(h.signal_variance))
        cross = rbf_kernel(x, self._x, h.length_scale, h.signal_variance)
        mean = cross @ self._alpha
        v = solve_triangular(self._factor, cross.T, lower=True)
        var = h.signal_variance - np.sum(v * v, axis=0)
        return mean, np.sqrt(np.maximum(var, 0.0))

    def predict_joint(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and full covariance at ``x``: what a batch of proposals conditions on."""
        x = np.asarray(x, dtype=np.float64)
        h = self.hyper
        prior = rbf_kernel(x, x, h.length_scale, h.signal_variance)
        if not self.fitted:
            return np.zeros(len(x)), prior
        cross = rbf_kernel(x, self._x, h.length_scale, h.signal_variance)
        v = solve_triangular(self._factor, cross.T, lower=True)
        return cross @ self._alpha, prior - v.T @ v


class Keyed(Protocol):
    def key(self) -> str: ...


A = TypeVar("A", bound=Keyed)
A_contra = TypeVar("A_contra", bound=Keyed, contravariant=True)


class CrossDistance(Protocol[A_contra]):
    def cross(self, rows: Sequence[A_contra], cols: Sequence[A_contra], /) -> np.ndarray: ...


class LandmarkEmbedding(Generic[A]):
    """Architectures as vectors of distances to fixed landmarks (scaled by 1/sqrt(#landmarks)).

    The scaling keeps the Euclidean norm of a difference on the scale of one distance, so the
    length-scale bounds do not depend on how many landmarks there are. Any family with a
    ``key()`` and a batched ``cross`` distance embeds so: image graphs (the default distance,
    :class:`nas.distance.ArchitectureDistance`) and transformer specs (:class:`nas.language.distance.LMDistance`).
    """

    def __init__(self, landmarks: Sequence[A], distance: CrossDistance[A] | None = None) -> None:
        if not landmarks:
            raise GPError("the embedding needs at least one landmark architecture")
        self._distance = distance if distance is not None else cast(CrossDistance[A], ArchitectureDistance())
        self._landmarks = list(landmarks)
        self._scale = 1.0 / math.sqrt(len(self._landmarks))
        self._vectors: dict[str, np.ndarray] = {}

    @property
    def dimension(self) -> int:
        return len(self._landmarks)

    def __len__(self) -> int:
        return len(self._vectors)

    def __call__(self, graphs: Sequence[A]) -> np.ndarray:
        """One row per architecture; new ones are embedded together in one batched distance call."""
        missing: dict[str, A] = {}
        for g in graphs:
            key = g.key()
            if key not in self._vectors and key not in missing:
                missing[key] = g
        if missing:
            rows = self._distance.cross(list(missing.values()), self._landmarks) * self._scale
            for key, row in zip(missing, rows, strict=True):
                self._vectors[key] = row
        if not graphs:
            return np.zeros((0, self.dimension))
        return np.stack([self._vectors[g.key()] for g in graphs])

    def learn(self, rows: Mapping[str, np.ndarray]) -> None:
        """Take vectors another process computed for these keys (with the same landmarks and distance)."""
        for key, row in rows.items():
            self._vectors.setdefault(key, row)

    def forget(self, keep: set[str]) -> None:
        """Drop cached vectors not in ``keep`` (bounds memory over a long run)."""
        self._vectors = {k: v for k, v in self._vectors.items() if k in keep}
