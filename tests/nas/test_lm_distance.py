"""The LM spec distance: a metric (identity, symmetry, triangle), batched like a loop, cheap, PSD kernel."""

from __future__ import annotations

import time

import numpy as np
import pytest

from nas.errors import NasError
from nas.gp import LandmarkEmbedding, rbf_kernel
from nas.language.distance import INCOMPARABLE, LMDistance, lm_distance
from nas.language.morph import LMMorph, apply_spec_morph
from nas.language.spec import TransformerSpec, seed_spec


def _random_spec(rng: np.random.Generator, vocab: int = 256, seq: int = 128) -> TransformerSpec:
    n = int(rng.integers(1, 9))
    return TransformerSpec(
        vocab,
        seq,
        int(rng.choice([64, 96, 128, 256, 512])),
        int(rng.choice([16, 32, 64])),
        tuple(int(x) for x in rng.choice([1, 2, 3, 4, 8], n)),
        tuple(int(x) for x in rng.choice([128, 256, 384, 512, 1024], n)),
        bool(rng.integers(2)),
    )


def _rel(p: float, q: float) -> float:
    return abs(p - q) / max(p, q)


def _reference(a: TransformerSpec, b: TransformerSpec) -> float:
    """The definition, one pair at a time in plain Python."""
    blocks_a = list(zip(a.heads, a.mlp_hidden, strict=True))
    blocks_b = list(zip(b.heads, b.mlp_hidden, strict=True))
    rows, cols = len(blocks_a) + 1, len(blocks_b) + 1
    d = [[float(i + j) if i == 0 or j == 0 else 0.0 for j in range(cols)] for i in range(rows)]
    for i in range(1, len(blocks_a) + 1):
        for j in range(1, len(blocks_b) + 1):
            (h1, f1), (h2, f2) = blocks_a[i - 1], blocks_b[j - 1]
            sub = 0.5 * (_rel(h1, h2) + _rel(f1, f2))
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + sub)
    globals_ = 2.0 * _rel(a.width, b.width) + _rel(a.head_dim, b.head_dim) + 0.5 * (a.tied_output != b.tied_output)
    incomparable = INCOMPARABLE * (a.vocab_size != b.vocab_size or a.seq_len != b.seq_len)
    return d[-1][-1] + globals_ + incomparable


SPECS = [_random_spec(np.random.default_rng(k)) for k in range(40)]


def test_the_batched_distance_is_the_definition_and_a_metric():
    matrix = LMDistance().cross(SPECS, SPECS)
    reference = np.array([[_reference(a, b) for b in SPECS] for a in SPECS])
    np.testing.assert_allclose(matrix, reference, atol=1e-12)
    assert np.all(np.diag(matrix) == 0.0)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-12)  # equal up to the order of the DP sums
    distinct = {s.key() for s in SPECS}
    assert np.count_nonzero(matrix == 0.0) == len(SPECS) + (len(SPECS) - len(distinct)) * 2
    # Triangle inequality over every triple: d(a, c) <= d(a, b) + d(b, c).
    through = matrix[:, :, None] + matrix[None, :, :]  # [a, b, c] = d(a, b) + d(b, c)
    direct = matrix[:, None, :]  # [a, ., c] = d(a, c)
    slack = float((through - direct).min())
    assert slack >= -1e-9, slack


def test_morph_children_are_close_and_unrelated_specs_far():
    seed = seed_spec()
    deeper = apply_spec_morph(seed, LMMorph("deeper", 1))
    wider = apply_spec_morph(seed, LMMorph("wider_mlp", 0, 1024))
    assert lm_distance(seed, deeper) == pytest.approx(1.0)  # one inserted block
    assert lm_distance(seed, wider) == pytest.approx(0.25)  # half of rel(512, 1024)
    unrelated = TransformerSpec(256, 128, 512, 64, (8,) * 6, (2048,) * 6, tied_output=False)
    for child in (deeper, wider):
        assert lm_distance(seed, child) < lm_distance(seed, unrelated)
    other_vocab = TransformerSpec(512, 128, 128, 32, (4, 4), (512, 512))
    assert lm_distance(seed, other_vocab) == INCOMPARABLE  # otherwise equal, but another task


def test_hundreds_of_candidates_against_32_landmarks_take_milliseconds():
    rng = np.random.default_rng(7)
    candidates = [_random_spec(rng) for _ in range(300)]
    landmarks = [_random_spec(rng) for _ in range(32)]
    distance = LMDistance()
    distance.cross(candidates, landmarks)  # features cached per key
    start = time.perf_counter()
    out = distance.cross(candidates, landmarks)
    elapsed = time.perf_counter() - start
    assert out.shape == (300, 32)
    assert elapsed < 0.25, elapsed  # ~15 ms on one core (blocks up to 8); generous for a loaded machine


def test_the_landmark_kernel_is_psd_and_embeddings_are_cached():
    embed = LandmarkEmbedding(SPECS[:12], LMDistance())
    x = embed(SPECS)
    assert x.shape == (len(SPECS), 12) and len(embed) == len({s.key() for s in SPECS})
    np.testing.assert_array_equal(embed(SPECS[:3]), x[:3])  # from the cache
    gram = rbf_kernel(x, x, length_scale=0.5, signal_variance=1.0)
    assert np.linalg.eigvalsh(gram).min() > -1e-9
    # Lipschitz: embedded points are no further apart than the specs (scaled by 1/sqrt(landmarks)).
    matrix = LMDistance().cross(SPECS, SPECS)
    gaps = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    assert np.all(gaps <= matrix + 1e-9)
    embed.forget({SPECS[0].key()})
    assert len(embed) == 1


def test_hostile_input_is_one_error_naming_the_culprit():
    with pytest.raises(NasError, match=r"a\[1\] must be a TransformerSpec"):
        LMDistance().cross([seed_spec(), "x"], [seed_spec()])  # type: ignore[list-item]
    with pytest.raises(NasError, match="at least one landmark"):
        LandmarkEmbedding([], LMDistance())
    assert LMDistance().cross([], SPECS).shape == (0, len(SPECS))
