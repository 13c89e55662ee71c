"""The surrogate: PSD kernels, one kernel for fit and predict, safe Cholesky, partial results."""

from __future__ import annotations

import numpy as np
import pytest

from nas.bayesian import BayesianMorphSearch, from_target, make_landmarks
from nas.gp import GaussianProcess, GPError, Hyperparameters, LandmarkEmbedding, rbf_kernel, stable_cholesky
from nas.limits import Limits
from nas.morph import random_morph
from nas.random_search import ArchitectureStatus
from nas.zoo import small_resnet

LIMITS = Limits(max_layers=40, max_params=3_000_000, max_flops_per_image=1e12)


def _architectures(count: int, seed: int):
    rng = np.random.default_rng(seed)
    graphs = [small_resnet()]
    while len(graphs) < count:
        result = random_morph(graphs[int(rng.integers(len(graphs)))], rng, accept=LIMITS.admits)
        if result is not None:
            graphs.append(result[0])
    return graphs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_matrices_on_architectures_are_psd(seed):
    graphs = _architectures(60, seed)
    landmarks = make_landmarks(small_resnet(), LIMITS.admits, np.random.default_rng(seed), 16)
    x = LandmarkEmbedding(landmarks)(graphs)
    typical = GaussianProcess.typical_distance(x)
    for length in (typical / 20, typical, typical * 20):
        gram = rbf_kernel(x, x, length, 1.0)
        np.testing.assert_allclose(gram, gram.T)
        assert np.linalg.eigvalsh(gram).min() > -1e-9 * len(gram)


def test_embedding_is_lipschitz_in_the_distance():
    graphs = _architectures(20, 3)
    landmarks = make_landmarks(small_resnet(), LIMITS.admits, np.random.default_rng(3), 8)
    embed = LandmarkEmbedding(landmarks)
    x = embed(graphs) * np.sqrt(len(landmarks))  # undo the 1/sqrt(m) scaling: raw distances
    from nas.distance import ArchitectureDistance

    d = ArchitectureDistance().cross(graphs, graphs)
    gaps = np.abs(x[:, None, :] - x[None, :, :]).max(axis=2)
    assert np.all(gaps <= d + 1e-9)  # |d(a,m) - d(b,m)| <= d(a,b): the distance obeys the triangle inequality here


def test_prediction_uses_the_fitting_kernel():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(25, 4))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1]
    gp = GaussianProcess(Hyperparameters(length_scale=1.3, signal_variance=1.7, noise_variance=1e-4))
    gp.fit(x, y)
    mean, std = gp.predict(x)
    np.testing.assert_allclose(mean, y, atol=0.02)  # interpolates its own data
    assert std.max() < 0.05
    # and exactly the textbook posterior with the one kernel function
    queries = rng.normal(size=(7, 4))
    k = rbf_kernel(x, x, 1.3, 1.7) + 1e-4 * np.eye(len(x))
    ks = rbf_kernel(queries, x, 1.3, 1.7)
    mean_q, std_q = gp.predict(queries)
    np.testing.assert_allclose(mean_q, ks @ np.linalg.solve(k, y), rtol=1e-6, atol=1e-8)
    var = 1.7 - np.einsum("ij,ji->i", ks, np.linalg.solve(k, ks.T))
    np.testing.assert_allclose(std_q, np.sqrt(np.maximum(var, 0)), rtol=1e-5, atol=1e-6)


def test_jitter_escalates_on_duplicated_points():
    x = np.repeat(np.random.default_rng(1).normal(size=(4, 3)), 3, axis=0)  # every point three times
    gram = rbf_kernel(x, x, 1.0, 1.0)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(gram)
    factor, jitter = stable_cholesky(gram)
    assert jitter > 0
    np.testing.assert_allclose(factor @ factor.T, gram + jitter * np.eye(len(gram)), atol=1e-10)
    # a GP without noise on the duplicated points still fits and reports the jitter
    gp = GaussianProcess(Hyperparameters(1.0, 1.0, 0.0))
    report = gp.fit(x, np.repeat([0.1, 0.5, -0.3, 0.2], 3))
    assert report.jitter > 0


def test_an_indefinite_matrix_raises_instead_of_being_skipped():
    with pytest.raises(GPError, match="not positive definite"):
        stable_cholesky(np.array([[1.0, 0.0], [0.0, -5.0]]))
    with pytest.raises(GPError, match="non-finite"):
        stable_cholesky(np.array([[np.nan]]))


def test_likelihood_gradient_and_optimisation():
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, size=(30, 2))
    y = np.sin(2 * x[:, 0]) + 0.05 * rng.normal(size=30)
    extra = np.where(np.arange(30) < 5, 0.3, 0.0)
    gp = GaussianProcess()
    hyper = Hyperparameters(0.7, 1.2, 0.02)
    _, grad = gp.log_marginal_likelihood(x, y, extra, hyper)
    for k in range(3):
        step = np.zeros(3)
        step[k] = 1e-6
        up, _ = gp.log_marginal_likelihood(x, y, extra, Hyperparameters.from_log(hyper.as_log() + step))
        down, _ = gp.log_marginal_likelihood(x, y, extra, Hyperparameters.from_log(hyper.as_log() - step))
        assert grad[k] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-6)
    before, _ = gp.log_marginal_likelihood(x, y, extra, Hyperparameters())
    report = gp.fit(x, y, extra, optimise_on=len(y))
    after, _ = gp.log_marginal_likelihood(x, y, extra, gp.hyper)
    assert report.optimised and report.optimiser_ok
    assert after > before


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_partial_results_change_the_posterior(seed):
    graphs = _architectures(12, 4 + seed)
    search = BayesianMorphSearch(small_resnet(), LIMITS.admits, np.random.default_rng(seed), landmarks=8)
    for g in graphs[:10]:  # a smooth function of the architecture, so the GP has signal to fit
        search.observe(g.key(), g, ArchitectureStatus("final", min(0.9, 0.4 + 1e-5 * g.param_count)))
    probe = graphs[10]

    def predicted_accuracy():
        post = search.posterior()
        mean, std = post.predict([probe])
        return from_target(post.target(float(mean[0]))), float(std[0])

    search.observe(probe.key(), probe, ArchitectureStatus("pending"))
    pending, _ = predicted_accuracy()
    search.observe(probe.key(), probe, ArchitectureStatus("partial", 0.95, progress=0.5))
    partial, std_partial = predicted_accuracy()
    assert abs(partial - 0.95) < abs(pending - 0.95)  # the partial result replaced the believer value
    search.observe(probe.key(), probe, ArchitectureStatus("final", 0.95))
    final, std_final = predicted_accuracy()
    assert std_final < std_partial  # a final result is trusted more than a partial one
    assert abs(final - 0.95) <= abs(partial - 0.95) + 1e-9


def test_the_window_selection_kept_on_every_update_matches_a_full_sort():
    from nas.bayesian import _RealObservations

    rng = np.random.default_rng(5)
    real = _RealObservations()
    targets: dict[str, float] = {}
    updated: dict[str, int] = {}  # key -> time of its last update
    elite_rebuilt = False
    for step in range(3000):
        key = f"a{int(rng.integers(400))}"
        if rng.random() < 0.1:
            real.drop(key)
            targets.pop(key, None)
            updated.pop(key, None)
        else:
            # Targets rise and fall (a partial result, then a lower final one), without ties.
            targets[key] = float(rng.normal(2.0, 0.5) + (1.0 if rng.random() < 0.05 else 0.0))
            updated[key] = step
            real.put(key, targets[key])
        if step % 25 == 0 and targets:
            best, recent = int(rng.integers(1, 30)), int(rng.integers(0, 40))
            chosen = real.best_and_recent(best, recent)
            by_target = sorted(targets, key=lambda k: -targets[k])[:best]
            others = sorted((k for k in targets if k not in by_target), key=lambda k: -updated[k])
            assert chosen == by_target + others[:recent]
            values = np.array(list(targets.values()))
            spread = values.std() if len(values) > 1 else 1.0
            assert real.mean_and_spread() == pytest.approx((values.mean(), spread), rel=1e-9)
            elite_rebuilt |= real._floor > -np.inf
    assert elite_rebuilt and len(real) > 200  # the elite was in use, not just the whole set


def test_the_embedding_cache_stays_bounded_however_many_architectures_are_observed(monkeypatch):
    import nas.bayesian as bayesian
    from nas.search import SearchSettings, make_proposer

    monkeypatch.setattr(bayesian, "MAX_CACHED_EMBEDDINGS", 40)
    settings = SearchSettings(seed=0, retune_fraction=0.0, gp_window=8, candidates=4, landmarks=6)
    search = make_proposer(settings, small_resnet(), LIMITS)
    sizes = []
    for k in range(90):
        proposal = search.ask(f"t{k}")
        search.tell(f"t{k}", min(0.95, 0.3 + 0.02 * proposal.graph.depth), True)
        sizes.append(len(search.strategy._embed))
    assert len(search.strategy._entries) >= 90  # far more architectures than the cache may hold
    assert max(sizes[20:]) <= 40 + 20  # what one ask embeds on top of the bound
