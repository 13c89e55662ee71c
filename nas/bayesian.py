"""Bayesian optimisation over architectures: GP surrogate, UCB, annealed morph tree search.

The surrogate models ``t = -ln(1 - accuracy)`` (which stretches the crowded top end of the
accuracy scale), standardised with the mean and spread of all real observations.

* **Data.** One point per architecture: its best final accuracy; else its latest partial
  accuracy (best so far after some epochs) with extra noise variance ``partial_noise *
  (1 - progress)`` in standardised units; else, while only pending, a *kriging believer*
  fantasy -- the posterior mean when it was proposed -- which shrinks the posterior
  variance there so the next ask looks elsewhere. A partial result replaces the fantasy.
* **Window.** The GP is fitted on at most ``window`` points: the best half of the real
  observations, the most recent pending architectures (up to a quarter) and the most recent
  of the other real observations. Selection is an ``argpartition`` over arrays kept up to
  date on every observation, and embeddings are cached per architecture, so a fit costs
  one kernel matrix and one Cholesky however long the history is.
* **Hyperparameters** are re-optimised when the number of final results has grown by a
  fifth (at least ``refit_every``) since the last optimisation; other fits reuse them.
* **Acquisition.** UCB ``mu + beta * sigma``, maximised over children reached by 1 to
  ``max_morphs`` morphs from good completed architectures through an annealed tree search:
  start from the best origins (plus a few random ones), pick a node to expand by a softmax
  of its UCB at temperature ``T``, expand it by its next untried morph (each node tries its
  morphs in an order seeded by the node, so the expansions can be made in other processes,
  :mod:`nas.tree_expand`), and keep the child as a
  node when its UCB beats its parent's or with probability ``exp(delta / T)``; ``T`` decays
  geometrically. Every new child not trained or pending joins a candidate pool that is
  re-scored and carried over between asks (so a warm pool needs fewer fresh expansions);
  the candidate with the best UCB that passes the full limits is proposed. Expansions use
  only the cheap limits (layers, parameters): growth morphs only add work, so a node over
  them has no admissible descendants; the FLOPs limit is checked on the pick.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
from threadpoolctl import ThreadpoolController

from nas.distance import ArchitectureDistance
from nas.errors import NasError
from nas.gp import GaussianProcess, GPError, LandmarkEmbedding
from nas.graph import Graph
from nas.morph import Morph, random_morph
from nas.random_search import (
    Accept,
    ArchitectureStatus,
    ArchitectureStrategy,
    Child,
    Origin,
    Origins,
    Taken,
    random_origin,
)
from nas.tree_expand import Grower, GrowTask, InlineGrower

MAX_ACCURACY = 1.0 - 1e-4
LANDMARK_WALK = 24  # longest random walk from the seed that makes a landmark
TOP_STARTS = 6  # tree search starts: the best origins ...
RANDOM_STARTS = 2  # ... plus a few others for breadth
SIZE_STARTS = 3  # ... and, under a size schedule, the largest not above the band (children that can reach it)
# Under a size schedule a child of an origin below the band may take this many morphs more than
# max_morphs, one per CATCH_UP_STEP of the origin's shortfall ln(low / flops): a growth morph of a
# grown net adds 10-50 % (a wider layer, a deeper one), and trials lengthen as nets grow, so the
# fixed depth fell behind the schedule in the run's second half (benchmarks/RESULTS.md, issue 52).
CATCH_UP_STEP = math.log(1.25)
MAX_CATCH_UP = 4
CATCH_UP_BEAM = 4  # when no candidate is inside the band: the largest nodes kept per level of a size-directed search
CATCH_UP_CHILDREN = 12  # ... and the children each of them is expanded into per level
EXPANSIONS_PER_ROUND = 8
START_TEMPERATURE = 1.0  # in standardised UCB units
COOLING = 0.85
MAX_FRONTIER = 32
POOL_FACTOR = 4  # candidates kept between asks, as a multiple of ``candidates``
MAX_CACHED_EMBEDDINGS = 50_000
MAX_START_NODES = 4096
MAX_FAILURES_KEPT = 100


def to_target(accuracy: float) -> float:
    """The modelled transform of an accuracy in [0, 1]."""
    return -math.log(1.0 - min(max(float(accuracy), 0.0), MAX_ACCURACY))


def from_target(target: float) -> float:
    return 1.0 - math.exp(-target)


def make_landmarks(seed_graph: Graph, accept: Accept, rng: np.random.Generator, count: int) -> list[Graph]:
    """The seed plus distinct architectures from random walks of 1..LANDMARK_WALK morphs."""
    landmarks = {seed_graph.key(): seed_graph}
    lengths = np.linspace(1, LANDMARK_WALK, max(count - 1, 1)).round().astype(int)
    for steps in lengths:
        for _ in range(4):  # a few tries to find a landmark not already in the set
            graph = seed_graph
            for _ in range(int(steps)):
                result = random_morph(graph, rng, accept=accept)
                if result is None:
                    break
                graph = result[0]
            if graph.key() not in landmarks:
                landmarks[graph.key()] = graph
                break
        if len(landmarks) >= count:
            break
    return list(landmarks.values())


@dataclass
class _Entry:
    graph: Graph
    status: ArchitectureStatus
    fantasy: float | None = None  # kriging-believer target of a pending architecture


def _believed(entry: _Entry) -> float:
    """A pending architecture's kriging-believer target, which it has once the surrogate predicted it."""
    if entry.fantasy is None:
        raise NasError("a pending architecture entered the fit before it had a believed value")
    return entry.fantasy


@dataclass
class _Node:
    """A tree-search node; its first ``tried`` morphs of ``total`` (known after its first expansion) are tried."""

    graph: Graph
    morphs: tuple[Morph, ...]
    origin: Origin
    score: float
    tried: int = 0
    total: int | None = None

    @property
    def exhausted(self) -> bool:
        return self.total is not None and self.tried >= self.total


class _RealObservations:
    """Targets of the architectures with a real (final or partial) result, and what a fit reads off them.

    Every ask needs the best targets, the most recent of the others, and the mean and spread
    of all of them. None of that is recomputed over the whole history; it is kept up to date
    on every :meth:`put`:

    * the best: an *elite* holds every key whose target went above ``floor``, and every other
      key is at or below it, so the best ``k`` are the best of the elite as long as ``k`` of
      its targets are still at least ``floor``. The elite is rebuilt from the arrays (one
      ``argpartition``) only when that fails or it has grown to ``4 x`` the largest ``k`` asked;
    * recency: a dict in order of the last update;
    * mean and spread: running sums, recomputed exactly now and then so rounding cannot drift.
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._slot: dict[str, int] = {}
        self.targets = np.zeros(64)
        self._recent: dict[str, None] = {}  # oldest update first
        self._elite: dict[str, None] = {}  # insertion-ordered (a set's order would vary between processes)
        self._floor = -math.inf
        self._want = 0  # the largest number of best keys asked for
        self._sum = 0.0
        self._sum_sq = 0.0
        self._updates = 0  # since the sums were last recomputed exactly

    def __len__(self) -> int:
        return len(self.keys)

    def put(self, key: str, target: float) -> None:
        slot = self._slot.get(key)
        if slot is None:
            slot = self._slot[key] = len(self.keys)
            self.keys.append(key)
            if slot >= len(self.targets):
                self.targets = np.concatenate([self.targets, np.zeros(len(self.targets))])
        else:
            self._subtract(float(self.targets[slot]))
            del self._recent[key]
        self.targets[slot] = target
        self._sum += target
        self._sum_sq += target * target
        self._recent[key] = None
        if target > self._floor:
            self._elite[key] = None
        self._counted()

    def drop(self, key: str) -> None:
        slot = self._slot.pop(key, None)
        if slot is None:
            return
        self._subtract(float(self.targets[slot]))
        del self._recent[key]
        self._elite.pop(key, None)
        last = len(self.keys) - 1
        if slot != last:  # move the last entry into the hole
            moved = self.keys[last]
            self.keys[slot] = moved
            self._slot[moved] = slot
            self.targets[slot] = self.targets[last]
        self.keys.pop()
        self._counted()

    def _subtract(self, target: float) -> None:
        self._sum -= target
        self._sum_sq -= target * target

    def _counted(self) -> None:
        self._updates += 1
        if self._updates >= 4096:
            n = len(self.keys)
            self._sum = float(self.targets[:n].sum())
            self._sum_sq = float(self.targets[:n] @ self.targets[:n])
            self._updates = 0

    def mean_and_spread(self) -> tuple[float, float]:
        """Mean and standard deviation of all targets (spread 1.0 when there is none to speak of)."""
        n = len(self.keys)
        mean = self._sum / n
        variance = self._sum_sq / n - mean * mean
        spread = math.sqrt(variance) if n > 1 and variance > 1e-18 else 1.0
        return mean, spread

    def best_and_recent(self, best: int, recent: int) -> list[str]:
        """Keys of the ``best`` highest targets, then of the ``recent`` latest among the others."""
        chosen = self._best(min(best, len(self.keys)))
        recent = min(recent, len(self.keys) - len(chosen))
        if recent > 0:
            skip = set(chosen)
            newest = []
            for key in reversed(self._recent):
                if key not in skip:
                    newest.append(key)
                    if len(newest) == recent:
                        break
            chosen += newest
        return chosen

    def _best(self, k: int) -> list[str]:
        if k <= 0:
            return []
        if k > self._want or len(self._elite) > 4 * self._want:
            self._want = max(self._want, k)
            self._rebuild_elite()
        keys, values = self._elite_values()
        if int(np.count_nonzero(values >= self._floor)) < k:  # elite targets fell: look at everything again
            self._rebuild_elite()
            keys, values = self._elite_values()
        return [keys[int(i)] for i in np.argsort(-values, kind="stable")[:k]]

    def _elite_values(self) -> tuple[list[str], np.ndarray]:
        keys = list(self._elite)
        return keys, self.targets[[self._slot[k] for k in keys]]

    def _rebuild_elite(self) -> None:
        """The elite becomes the 2 x ``_want`` best keys; the floor the lowest of their targets."""
        n, size = len(self.keys), 2 * self._want
        if n <= size:
            top = np.arange(n)
            self._floor = -math.inf
        else:
            top = np.sort(np.argpartition(-self.targets[:n], size - 1)[:size])
            self._floor = float(self.targets[top].min())
        self._elite = dict.fromkeys(self.keys[int(i)] for i in top)


@dataclass
class _Posterior:
    """A fitted surrogate with the standardisation it was fitted under."""

    gp: GaussianProcess
    embed: LandmarkEmbedding
    center: float
    spread: float
    points: int

    def predict(self, graphs: Sequence[Graph]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation in standardised target units."""
        return self.gp.predict(self.embed(graphs))

    def target(self, standardised: float) -> float:
        return self.center + self.spread * standardised


@dataclass
class SurrogateStats:
    """What the surrogate did; failures are recorded here (and the ask falls back), never skipped silently."""

    fits: int = 0
    optimisations: int = 0
    failure_count: int = 0
    failures: list[str] = field(default_factory=list)  # the latest MAX_FAILURES_KEPT messages
    last_jitter: float = 0.0

    def record(self, message: str) -> None:
        self.failure_count += 1
        self.failures.append(message)
        del self.failures[:-MAX_FAILURES_KEPT]


class BayesianMorphSearch(ArchitectureStrategy):
    """GP-UCB over morph children of completed architectures (see the module docstring).

    ``accept`` is the full limits test (the proposal must pass it); ``accept_cheap`` a
    necessary part of it that is cheap to evaluate, used while expanding the search tree.
    ``size_rank`` (the size schedule's, :mod:`nas.schedule`) is 0 for a candidate inside the
    size band, how far below it otherwise, and infinite above it.
    """

    name = "bayesian"

    def __init__(
        self,
        seed_graph: Graph,
        accept: Accept,
        rng: np.random.Generator,
        *,
        ucb_beta: float = 2.0,
        max_morphs: int = 2,
        window: int = 256,
        candidates: int = 64,
        landmarks: int = 32,
        partial_noise: float = 0.25,
        refit_every: int = 8,
        accept_cheap: Accept | None = None,
        size_rank: Callable[[Graph], float] | None = None,
        size: Callable[[Graph], float | None] | None = None,
        ceiling: Callable[[], float] | None = None,
    ) -> None:
        self._accept = accept
        self._size_rank = size_rank
        self._size = size  # the schedule's measure of a graph (training FLOPs per image), with ``ceiling`` its top
        self._ceiling = ceiling
        self._by_size: list[tuple[float, str]] = []  # origins by size, for SIZE_STARTS
        self._sized = 0  # origins already in it (they are never removed)
        self._accept_cheap = accept_cheap or accept
        self._rng = rng
        self.ucb_beta = ucb_beta
        self._max_morphs = max_morphs
        self._window = window
        self._candidates = candidates
        self._partial_noise = partial_noise
        self._refit_every = refit_every
        landmark_rng = np.random.default_rng(int(rng.integers(2**63)))
        self.landmarks = make_landmarks(seed_graph, accept, landmark_rng, landmarks)
        self._embed = LandmarkEmbedding(self.landmarks, ArchitectureDistance())
        self._node_seed = int(rng.integers(2**63))  # orders each node's morphs (nas.tree_expand.morph_order)
        self._grower: Grower = InlineGrower(self._accept_cheap)
        self._gp = GaussianProcess()
        self._entries: dict[str, _Entry] = {}
        self._real = _RealObservations()
        self._pending: dict[str, _Entry] = {}  # insertion order = proposal order
        self._window_keys: list[str] = []  # the real observations of the last fit
        self._finals = 0
        self._finals_at_optimisation = 0
        self._posterior: _Posterior | None = None
        self._dirty = True
        self._pool: dict[str, _Node] = {}  # scored, untaken candidates carried between asks
        self._start_nodes: dict[str, _Node] = {}  # per origin: its untried morphs, across asks
        self.stats = SurrogateStats()
        self._fit_error = ""
        self._blas = ThreadpoolController()

    def grow_with(self, grower: Grower) -> None:
        """Answer the tree search's expansions with ``grower`` (the proposals stay the same; see nas.tree_expand).

        A grower that builds children elsewhere must apply this search's cheap test there.
        """
        self._grower = grower

    def _one_blas_thread(self):
        """Small matrices are fastest on one BLAS thread, and the master must not fight its own threads."""
        return self._blas.limit(limits=1, user_api="blas")

    # --- observations ----------------------------------------------------------------------
    def observe(self, key: str, graph: Graph, status: ArchitectureStatus | None) -> None:
        old = self._entries.get(key)
        if status is None:
            self._entries.pop(key, None)
            self._pending.pop(key, None)
            self._real.drop(key)
            self._dirty = True
            return
        if status.status == "pending":
            entry = _Entry(graph, status, old.fantasy if old is not None else None)
            if old is None or old.status.status != "pending":
                entry.fantasy = self._believe(graph)  # before marking the posterior stale
            self._real.drop(key)
            self._pending[key] = entry
        else:
            if status.status == "final" and (old is None or old.status.status != "final"):
                self._finals += 1
            entry = _Entry(graph, status)
            self._pending.pop(key, None)
            self._real.put(key, to_target(status.measured))
        self._entries[key] = entry
        self._dirty = True

    def _believe(self, graph: Graph) -> float | None:
        """The kriging-believer value of a newly pending architecture, when the posterior is at hand.

        If the posterior is stale (results arrived since the last fit) it is computed at the
        next fit instead, so replaying a long ledger does not refit once per trial.
        """
        if self._dirty or self._posterior is None:
            return None
        with self._one_blas_thread():  # only here: entering the limit costs more than most observations
            mean, _ = self._posterior.predict([graph])
        return self._posterior.target(float(mean[0]))

    # --- the surrogate ---------------------------------------------------------------------
    def posterior(self) -> _Posterior | None:
        """The surrogate fitted on the current window (refitted only when something changed)."""
        if not self._dirty:
            return self._posterior
        self._dirty = False
        self._posterior = None
        n_real = len(self._real)
        if n_real == 0:
            return None
        # The most recent pending architectures, read from the end (not a copy of all of them).
        pending = list(islice(reversed(self._pending.values()), self._window // 4))[::-1]
        best = min(n_real, self._window // 2)
        real_keys = self._real.best_and_recent(best, self._window - best - len(pending))
        self._window_keys = real_keys
        real = [self._entries[k] for k in real_keys]
        center, spread = self._real.mean_and_spread()
        believed = [e for e in pending if e.fantasy is not None]
        unbelieved = [e for e in pending if e.fantasy is None]
        posterior = self._fit(real, believed, center, spread)
        if posterior is not None and unbelieved:
            mean, _ = posterior.predict([e.graph for e in unbelieved])
            for entry, m in zip(unbelieved, mean, strict=True):
                entry.fantasy = posterior.target(float(m))
            posterior = self._fit(real, believed + unbelieved, center, spread)
        self._posterior = posterior
        return posterior

    def _fit(self, real: list[_Entry], fantasies: list[_Entry], center: float, spread: float) -> _Posterior | None:
        entries = real + fantasies
        y = np.array([to_target(e.status.measured) for e in real] + [_believed(e) for e in fantasies])
        y = (y - center) / spread
        extra = np.array(
            [self._partial_noise * (1.0 - e.status.progress) if e.status.status == "partial" else 0.0 for e in entries]
        )
        x = self._embed([e.graph for e in entries])
        grown = self._finals - self._finals_at_optimisation
        optimise = len(real) >= 3 and (
            self.stats.optimisations == 0 or grown >= max(self._refit_every, self._finals_at_optimisation // 5)
        )
        try:
            report = self._gp.fit(x, y, extra, optimise_on=len(real) if optimise else None)
        except GPError as exc:
            self._fit_error = f"surrogate fit failed: {exc}"
            self.stats.record(self._fit_error)
            return None
        self._fit_error = ""
        if optimise:
            self.stats.optimisations += 1
            self._finals_at_optimisation = self._finals
            if not report.optimiser_ok:
                self.stats.record(f"hyperparameter optimisation: {report.optimiser_message}")
        self.stats.fits += 1
        self.stats.last_jitter = report.jitter
        return _Posterior(self._gp, self._embed, center, spread, len(entries))

    def _ucb(self, posterior: _Posterior, graphs: Sequence[Graph]) -> np.ndarray:
        mean, std = posterior.predict(graphs)
        return mean + self.ucb_beta * std

    # --- acquisition -----------------------------------------------------------------------
    def propose(self, origins: Mapping[str, Origin], taken: Taken) -> Child | None:
        children = self.propose_batch(origins, taken, 1)
        return children[0] if children else None

    def propose_batch(self, origins: Mapping[str, Origin], taken: Taken, count: int) -> list[Child]:
        """Up to ``count`` children from one fit and one tree search (GP-BUCB, see :meth:`_pick_batch`)."""
        with self._one_blas_thread():
            return self._propose(origins, taken, max(1, int(count)))

    def _propose(self, origins: Mapping[str, Origin], taken: Taken, count: int) -> list[Child]:
        self.note = ""
        if not origins:
            self.note = "no completed architecture to grow from"
            return []
        posterior = self.posterior()
        if posterior is None:
            self.note = self._fit_error or "no observations for the surrogate"
            return []
        if len(self._embed) > MAX_CACHED_EMBEDDINGS:
            # Keep what the next fits and scores need; anything else is re-embedded if it comes back.
            self._embed.forget({*self._window_keys, *self._pending, *self._pool})
        self._refresh_pool(origins, taken)
        # A warm pool carries earlier asks' candidates, so fewer fresh expansions are needed; a
        # batch takes ``count`` candidates out of it, so as many fresh ones are added.
        budget = (
            self._candidates if len(self._pool) < self._candidates else max(EXPANSIONS_PER_ROUND, self._candidates // 4)
        ) + (count - 1)
        self._tree_search(posterior, origins, taken, budget)
        if self._size_rank is not None and not any(self._size_rank(n.graph) == 0.0 for n in self._pool.values()):
            self._catch_up(origins, taken)
        if not self._pool:
            self.note = "no untried child within the limits"
            return []
        nodes = list(self._pool.values())
        if count == 1:
            mean, std = posterior.predict([n.graph for n in nodes])
            cov = None
        else:
            mean, cov = posterior.gp.predict_joint(posterior.embed([n.graph for n in nodes]))
            std = np.sqrt(np.maximum(np.diag(cov), 0.0))
        for node, score in zip(nodes, mean + self.ucb_beta * std, strict=True):
            node.score = float(score)
        picks = self._pick_batch(nodes, mean, std, cov, count, posterior.gp.hyper.noise_variance)
        if not picks:
            self.note = "every candidate exceeded the FLOPs limit or the size band"
            return []
        children = []
        for rank, (index, ucb, sigma) in enumerate(picks):
            best = nodes[index]
            del self._pool[best.graph.key()]
            info = {
                "strategy": self.name,
                "ucb": round(ucb, 6),
                "predicted_accuracy": round(from_target(posterior.target(float(mean[index]))), 6),
                "predicted_std": round(sigma, 6),
                "candidates": len(nodes),
                "gp_points": posterior.points,
            }
            if count > 1:
                info["batch"] = [rank, len(picks)]
            children.append(Child(best.origin, best.graph, best.morphs, info))
        if len(self._pool) > POOL_FACTOR * self._candidates:
            keep = heapq.nlargest(POOL_FACTOR * self._candidates, self._pool.values(), key=lambda n: n.score)
            self._pool = {n.graph.key(): n for n in keep}
        return children

    def _pick_batch(
        self, nodes: list[_Node], mean: np.ndarray, std: np.ndarray, cov: np.ndarray | None, count: int, noise: float
    ) -> list[tuple[int, float, float]]:
        """Greedy batch UCB: (index, UCB, sigma) of each pick, best first.

        After each pick the posterior is conditioned on a *believed* outcome there (its own
        mean): the mean stays and the variance shrinks around the pick (GP-BUCB, Desautels et
        al. 2014), so the next pick is the best UCB that is not a near-copy of an earlier one.
        That is the kriging believer the fit applies to pending trials, without a refit per pick.
        """
        picks: list[tuple[int, float, float]] = []
        available = np.ones(len(nodes), dtype=bool)
        ranks: dict[int, float] = {}
        while len(picks) < count:
            scores = mean + self.ucb_beta * std
            index = self._pick(nodes, np.where(available, scores, -np.inf), available, ranks)
            if index is None:
                break
            picks.append((index, float(scores[index]), float(std[index])))
            available[index] = False
            if cov is not None and len(picks) < count:
                column = cov[:, index].copy()
                cov -= np.outer(column, column) / (column[index] + noise)
                std = np.sqrt(np.maximum(np.diag(cov), 0.0))
        return picks

    def _pick(
        self, nodes: list[_Node], scores: np.ndarray, available: np.ndarray, ranks: dict[int, float]
    ) -> int | None:
        """The best-UCB available candidate within the limits and the size band; else the one nearest below the band.

        Candidates over a fixed limit can never be proposed and leave the pool (and ``available``);
        those outside the band stay, as the band moves with the run. ``ranks`` caches size ranks.
        """
        fallback, fallback_rank = None, math.inf
        for index in np.argsort(-scores, kind="stable"):
            index = int(index)
            if not available[index]:
                continue
            rank = ranks.get(index)
            if rank is None:
                node = nodes[index]
                if not self._accept(node.graph):
                    del self._pool[node.graph.key()]
                    available[index] = False
                    continue
                rank = ranks[index] = self._size_rank(node.graph) if self._size_rank is not None else 0.0
            if rank == 0.0:
                return index
            if rank < fallback_rank:
                fallback, fallback_rank = index, rank
        return fallback

    @staticmethod
    def _same_origin(a: Origin, b: Origin) -> bool:
        """Morphs drawn on ``a`` apply to ``b``: same node ids and kernel for new layers."""
        return a.kernel_size == b.kernel_size and (a.graph is b.graph or a.graph == b.graph)

    def _refresh_pool(self, origins: Mapping[str, Origin], taken: Taken) -> None:
        """Drop pooled candidates now taken, or whose origin changed (another best trial, another kernel)."""
        fresh: dict[str, _Node] = {}
        for key, node in self._pool.items():
            origin = origins.get(node.origin.key)
            if origin is None or taken(key) or not self._same_origin(origin, node.origin):
                continue
            node.origin = origin
            fresh[key] = node
        self._pool = fresh

    def _starts(self, origins: Mapping[str, Origin]) -> list[_Node]:
        """Tree roots: the best origins and a few random ones, keeping their untried morphs across asks."""
        best = self._best_origins(origins)
        chosen = {o.key for o in best}
        if len(origins) > len(best):
            for _ in range(RANDOM_STARTS):
                extra = random_origin(origins, self._rng)
                if extra.key not in chosen:
                    chosen.add(extra.key)
                    best.append(extra)
        for origin in self._largest_origins(origins):
            if origin.key not in chosen:
                chosen.add(origin.key)
                best.append(origin)
        if len(self._start_nodes) > MAX_START_NODES:
            self._start_nodes = {k: v for k, v in self._start_nodes.items() if k in chosen}
        return [self._start_node(origin) for origin in best]

    def _catch_up(self, origins: Mapping[str, Origin], taken: Taken) -> None:
        """No candidate is inside the size band: search from the largest origins by size alone until some are.

        A beam of the CATCH_UP_BEAM largest nodes not above the band, each expanded into its next
        CATCH_UP_CHILDREN children per level, for as many morphs as a child may take; the level that
        first reaches the band pools every child inside it (the pick then takes the best UCB of them,
        as always). The accuracy-led tree search grows from the best origins a few morphs at a time,
        and when trials lengthen with the networks it falls behind a band that keeps rising.
        """
        assert self._size_rank is not None
        starts = {o.key: o for o in self._largest_origins(origins)}
        beam = [self._start_node(o) for o in starts.values()]
        depths: dict[str, int] = {}
        for _ in range(self._max_morphs + MAX_CATCH_UP):
            grown = [
                (child, self._size_rank(child.graph)) for _, child in self._grow([[n, CATCH_UP_CHILDREN] for n in beam])
            ]
            grown = [(child, rank) for child, rank in grown if not math.isinf(rank) and not taken(child.graph.key())]
            inside = [child for child, rank in grown if rank == 0.0]
            if inside:
                for child in inside:
                    self._pool.setdefault(child.graph.key(), child)
                return
            grown.sort(key=lambda pair: pair[1])
            beam = [child for child, _ in grown if len(child.morphs) < self._depth(child.origin, depths)][
                :CATCH_UP_BEAM
            ]
            if not beam:
                return

    def _start_node(self, origin: Origin) -> _Node:
        """The tree-search node of ``origin`` (its untried morphs kept across asks)."""
        node = self._start_nodes.get(origin.key)
        if node is None or node.exhausted or not self._same_origin(origin, node.origin):
            node = self._start_nodes[origin.key] = _Node(origin.graph, (), origin, 0.0)
        node.origin = origin
        return node

    def _largest_origins(self, origins: Mapping[str, Origin]) -> list[Origin]:
        """Under a size schedule, the SIZE_STARTS largest origins not above the band: the best accuracy may
        belong to a small net whose children cannot reach the band. Kept sorted as origins arrive."""
        if self._size is None or self._ceiling is None:
            return []
        if self._sized < len(origins):
            new = (
                [origins.at(i) for i in range(self._sized, len(origins))]
                if isinstance(origins, Origins)
                else [o for o in origins.values() if o.key not in {k for _, k in self._by_size}]
            )
            for origin in new:
                flops = self._size(origin.graph)
                if flops is not None:
                    bisect.insort(self._by_size, (flops, origin.key))
            self._sized = len(origins)
        top = bisect.bisect_right(self._by_size, (self._ceiling(), "\uffff"))
        return [origins[key] for _, key in self._by_size[max(0, top - SIZE_STARTS) : top] if key in origins]

    def _depth(self, origin: Origin, cache: dict[str, int]) -> int:
        """How many morphs a child of ``origin`` may take: ``max_morphs``, more while the origin is below the band."""
        depth = cache.get(origin.key)
        if depth is None:
            rank = self._size_rank(origin.graph) if self._size_rank is not None else 0.0
            extra = 0 if rank == 0.0 or math.isinf(rank) else min(MAX_CATCH_UP, math.ceil(rank / CATCH_UP_STEP))
            depth = cache[origin.key] = self._max_morphs + extra
        return depth

    def _best_origins(self, origins: Mapping[str, Origin]) -> list[Origin]:
        """The TOP_STARTS best origins, read off the observation arrays instead of sorting all origins.

        An origin's value is its architecture's best final accuracy, which is also its observed
        target here; the leaders among the observations are origins unless they are partial.
        """
        # The fit already keeps the best window/2 at hand, so looking that deep costs no more.
        leaders = self._real.best_and_recent(max(4 * TOP_STARTS, self._window // 2), 0)
        best = [origins[k] for k in leaders if k in origins][:TOP_STARTS]
        if len(best) < min(TOP_STARTS, len(origins)):
            best = heapq.nlargest(TOP_STARTS, origins.values(), key=lambda o: o.value)
        return best

    def _grow(self, wanted: list[list]) -> list[tuple[_Node, _Node]]:
        """Each ``[parent, k]``'s next ``k`` children within the cheap limits, as (parent, child) in draw order."""
        tasks = [
            GrowTask(parent.graph, parent.origin.kernel_size, self._node_seed, parent.tried, count)
            for parent, count in wanted
        ]
        batch: list[tuple[_Node, _Node]] = []
        rows = {}
        for (parent, _), growth in zip(wanted, self._grower.grow(tasks), strict=True):
            parent.tried, parent.total = growth.tried, growth.total
            for child in growth.children:
                batch.append((parent, _Node(child.graph, (*parent.morphs, child.morph), parent.origin, 0.0)))
                if child.row is not None:
                    rows[child.graph.key()] = child.row
        self._embed.learn(rows)
        return batch

    def _tree_search(self, posterior: _Posterior, origins: Mapping[str, Origin], taken: Taken, budget: int) -> None:
        """Annealed expansion from good origins; every new untaken child joins the pool."""
        frontier = self._starts(origins)
        for node, score in zip(frontier, self._ucb(posterior, [n.graph for n in frontier]), strict=True):
            node.score = float(score)
        temperature = START_TEMPERATURE
        attempts = 0
        depths: dict[str, int] = {}
        while attempts < budget and frontier:
            weights = np.array([n.score for n in frontier]) / temperature
            weights = np.exp(weights - weights.max())
            weights /= weights.sum()
            draws = min(EXPANSIONS_PER_ROUND, budget - attempts)
            attempts += draws
            wanted: dict[int, list] = {}  # a parent drawn k times this round: its next k children
            for _ in range(draws):
                parent = frontier[int(self._rng.choice(len(frontier), p=weights))]
                wanted.setdefault(id(parent), [parent, 0])[1] += 1
            batch = self._grow(list(wanted.values()))
            frontier = [n for n in frontier if not n.exhausted]
            if not batch:
                continue
            if self._size_rank is not None:
                # Above the size band now: not proposable, and growth only makes its descendants larger.
                # Pooling such children filled the pool with candidates no pick could take (a batch of
                # 64 found 0-7 in it; benchmarks/RESULTS.md, "Batched proposals").
                batch = [(parent, child) for parent, child in batch if self._size_rank(child.graph) < math.inf]
                if not batch:
                    temperature *= COOLING
                    continue
            child_scores = self._ucb(posterior, [c.graph for _, c in batch])
            for (parent, child), score in zip(batch, child_scores, strict=True):
                child.score = float(score)
                key = child.graph.key()
                if not taken(key) and (key not in self._pool or len(child.morphs) < len(self._pool[key].morphs)):
                    self._pool[key] = child
                if len(child.morphs) < self._depth(child.origin, depths):
                    delta = child.score - parent.score
                    if delta >= 0 or self._rng.random() < math.exp(delta / temperature):
                        frontier.append(child)
            if len(frontier) > MAX_FRONTIER:
                frontier.sort(key=lambda n: -n.score)
                del frontier[MAX_FRONTIER:]
            temperature *= COOLING
