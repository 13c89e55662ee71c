"""A distance between two :class:`~nas.language.spec.TransformerSpec` language models, for the GP kernel.

The GP (:mod:`nas.gp`) embeds an architecture as its distances to fixed landmarks, which is
Lipschitz when the distance obeys the triangle inequality; this one is a metric, built as a
weighted sum of metrics:

* **blocks** -- a Levenshtein distance over the block sequences: inserting or deleting a
  block costs 1, substituting block ``x`` by ``y`` costs ``(rel(heads) + rel(mlp_hidden)) / 2``
  with ``rel(p, q) = |p - q| / max(p, q)`` (a metric on positive numbers, below 1). A
  weighted edit distance with a metric substitution cost and equal insert/delete costs is a
  metric, and a substitution below 1 is never beaten by a delete plus an insert (2), so a
  morph to one block costs what it changed: ``deeper`` exactly 1, a doubled MLP 0.25.
* **width** ``WIDTH_WEIGHT * rel(width)`` (it resizes every block), **head_dim**
  ``HEAD_DIM_WEIGHT * rel(head_dim)``, **tied/untied** ``TIED_WEIGHT`` when they differ.
* **vocabulary and context** are incomparable (another task, another position table):
  ``INCOMPARABLE`` when either differs, a discrete metric, so the sum stays one. Morphs never
  change them, so within one search the term is always 0.

``norm_eps`` is left out: ``wider_model`` rescales it with the width, which is counted already.

Speed: :meth:`LMDistance.cross` scores every pair of two lists at once. Block sequences are
padded to a common length and the dynamic programme runs one row at a time over all pairs;
within a row the insertion chain ``D[i, j] = min(E[j], D[i, j-1] + 1)`` is a running
minimum of ``E[k] - k`` (``np.minimum.accumulate``), so a row is a few array operations
whatever the lengths. Per-spec arrays are cached by :meth:`TransformerSpec.key`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nas.errors import NasError
from nas.language.spec import TransformerSpec

WIDTH_WEIGHT = 2.0
HEAD_DIM_WEIGHT = 1.0
TIED_WEIGHT = 0.5
INCOMPARABLE = 1000.0
MAX_CACHED = 100_000


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b| / max(a, b)`` elementwise (positive inputs; 0 where both are padding zeros)."""
    top = np.maximum(a, b)
    return np.abs(a - b) / np.where(top > 0, top, 1.0)


def _half_rel_sum(h1: np.ndarray, h2: np.ndarray, f1: np.ndarray, f2: np.ndarray) -> np.ndarray:
    """``(rel(h1, h2) + rel(f1, f2)) / 2`` for positive arrays, as ``1 - (min/max + min/max) / 2``."""
    ratio = np.minimum(h1, h2) / np.maximum(h1, h2)
    ratio += np.minimum(f1, f2) / np.maximum(f1, f2)
    ratio *= -0.5
    ratio += 1.0
    return ratio


class LMDistance:
    """The metric of the module docstring, batched over lists and cached per spec key."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _features(self, specs: Sequence[TransformerSpec], where: str) -> tuple[np.ndarray, ...]:
        """Globals [n, 5] (vocab, seq, width, head_dim, tied), heads and mlp [n, L] zero-padded, lengths [n]."""
        rows = []
        for k, spec in enumerate(specs):
            if not isinstance(spec, TransformerSpec):
                raise NasError(f"lm distance: {where}[{k}] must be a TransformerSpec, got {type(spec).__name__}")
            key = spec.key()
            row = self._rows.get(key)
            if row is None:
                if len(self._rows) >= MAX_CACHED:
                    self._rows.clear()
                g = np.array([spec.vocab_size, spec.seq_len, spec.width, spec.head_dim, float(spec.tied_output)])
                row = self._rows[key] = (g, np.array(spec.heads, float), np.array(spec.mlp_hidden, float))
            rows.append(row)
        n = len(rows)
        longest = max((len(r[1]) for r in rows), default=0)
        glob = np.zeros((n, 5))
        heads = np.ones((n, longest))  # padding never reaches a result; ones keep every ratio finite
        mlp = np.ones((n, longest))
        lengths = np.zeros(n, dtype=np.int64)
        for k, (g, h, f) in enumerate(rows):
            glob[k] = g
            heads[k, : len(h)] = h
            mlp[k, : len(f)] = f
            lengths[k] = len(h)
        return glob, heads, mlp, lengths

    def cross(self, a: Sequence[TransformerSpec], b: Sequence[TransformerSpec]) -> np.ndarray:
        """Distances of every spec in ``a`` to every spec in ``b``, shape [len(a), len(b)]."""
        ga, ha, fa, la = self._features(a, "a")
        gb, hb, fb, lb = self._features(b, "b")
        out = np.zeros((len(a), len(b)))
        if out.size == 0:
            return out
        # Globals: incomparable vocab/context, relative width and head_dim, tied flag.
        differ = (ga[:, None, 0] != gb[None, :, 0]) | (ga[:, None, 1] != gb[None, :, 1])
        out += INCOMPARABLE * differ
        out += WIDTH_WEIGHT * _rel(ga[:, None, 2], gb[None, :, 2])
        out += HEAD_DIM_WEIGHT * _rel(ga[:, None, 3], gb[None, :, 3])
        out += TIED_WEIGHT * (ga[:, None, 4] != gb[None, :, 4])
        out += self._levenshtein(ha, fa, la, hb, fb, lb)
        return out

    @staticmethod
    def _levenshtein(
        ha: np.ndarray, fa: np.ndarray, la: np.ndarray, hb: np.ndarray, fb: np.ndarray, lb: np.ndarray
    ) -> np.ndarray:
        """Edit distances of all block-sequence pairs, one DP row (over all pairs) at a time."""
        n, m, rows_a, cols = len(la), len(lb), ha.shape[1], hb.shape[1]
        # Substitution costs [n, m, rows_a, cols].
        sub = _half_rel_sum(ha[:, None, :, None], hb[None, :, None, :], fa[:, None, :, None], fb[None, :, None, :])
        steps = np.arange(cols + 1, dtype=float)
        prev = np.broadcast_to(steps, (n, m, cols + 1)).copy()  # row 0: j insertions
        result = np.zeros((n, m))
        done = la == 0
        result[done] = lb[None, :].repeat(int(done.sum()), axis=0)
        for i in range(rows_a):
            # E[j] = min(delete a[i]: prev[j] + 1, substitute: prev[j-1] + sub[i, j-1]); E[0] = i + 1.
            best = np.empty_like(prev)
            best[..., 0] = i + 1
            best[..., 1:] = np.minimum(prev[..., 1:] + 1.0, prev[..., :-1] + sub[:, :, i, :])
            # Insertions along the row: D[j] = min_k E[k] + (j - k) = j + cummin(E[k] - k).
            row = np.minimum.accumulate(best - steps, axis=-1) + steps
            ends = la == i + 1
            if ends.any():
                result[ends] = np.take_along_axis(row[ends], np.broadcast_to(lb, (int(ends.sum()), m))[..., None], -1)[
                    ..., 0
                ]
            prev = row
        return result

    def __call__(self, a: TransformerSpec, b: TransformerSpec) -> float:
        return float(self.cross([a], [b])[0, 0])


def lm_distance(a: TransformerSpec, b: TransformerSpec) -> float:
    """The distance of two specs (one pair; use :meth:`LMDistance.cross` for many)."""
    return LMDistance()(a, b)
