"""Architecture search over the transformer LM family: GP-UCB over morph children, interleaved with TPE.

The language-model counterpart of :mod:`nas.search`, on :class:`~nas.language.spec.TransformerSpec`
and its function-preserving morphs (:mod:`nas.language.morph`). Trial kinds:

* ``seed`` -- the first ask: the seed spec with the default hyperparameters.
* ``arch`` -- a new architecture. Until some trial has completed nothing can be inherited,
  so a start-up child is a morph child of the seed trained from scratch (``inherit=None``):
  the seed's children breadth first (all one-morph children, then two-morph ones ...), each
  level in an order drawn from the seed, so start-up children are distinct and near the seed.
  Afterwards a child is 1 to ``max_morphs_per_child`` morphs from a *completed*
  architecture, inheriting that architecture's best trial (weights and hyperparameters).
  Candidates (``candidates`` of them): one-morph children of the best completed architectures
  and of a few others (up to two thirds), then random walks of 2 to ``max_morphs_per_child``
  morphs from the same architectures; the pick maximises UCB
  ``mu + beta * sigma`` of a GP (:mod:`nas.gp`) on the landmark embedding of
  :mod:`nas.language.distance`, fitted on the completed architectures (best final score),
  running ones with a partial score (extra noise shrinking with progress), and pending ones
  as fantasies at the GP mean when they were proposed (kriging believer, as
  :mod:`nas.bayesian`), so asks in a row spread out. ``strategy="random"`` (and the fallback
  when the GP cannot be fitted) takes a random walk from a random completed architecture.
* ``tune`` -- a share ``retune_fraction`` of the asks (ask ``n`` is a tune when
  ``floor(fraction * n)`` exceeds the tunes so far) repeats a lineage root -- same spec,
  parent, morphs and inherited weights -- with TPE hyperparameters (:mod:`nas.language.hpo`); TPE
  is told the gain over the root. The lineage is, of the three best, the one re-tuned least
  (the seed's before anything completes).

Never proposed: an architecture pending or trained, or one over the :class:`LMLimits` (blocks,
parameters, training FLOPs per token by :func:`~nas.language.flops.transformer_flops` at
the spec's context). Every morph only grows the model, so a child over a limit has no
admissible descendants and is pruned where it is generated.

Scores are told as numbers to maximise (e.g. minus validation bits per byte); any finite
number is accepted. Everything random is drawn from generators seeded by ``settings.seed``,
so a run repeats itself exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from nas.errors import NasError
from nas.gp import GaussianProcess, GPError, LandmarkEmbedding
from nas.graph import short_repr
from nas.language.distance import LMDistance
from nas.language.flops import transformer_flops
from nas.language.hpo import DEFAULT_LM_HPARAMS, LMHyperparameterSpace, LMTuner, normalise_lm_hparams
from nas.language.morph import LMMorph, apply_spec_morph, candidate_morphs
from nas.language.spec import TransformerSpec
from nas.proposer import Proposer, TrialKind
from nas.trial_book import TrialBook

STRATEGIES = ("bayesian", "random")
TUNE_CANDIDATES = 3  # lineages considered for re-tuning: the best three
STARTUP_DEPTH = 3  # start-up children are at most this many morphs from the seed (or max_morphs_per_child)
TOP_STARTS = 4  # candidate children grow from the best completed architectures ...
RANDOM_STARTS = 2  # ... and a few others
LANDMARK_WALK = 16  # longest random walk from the seed that makes a landmark
PARTIAL_NOISE = 0.25  # extra variance (standardised units) of a partial score at progress 0
REFIT_EVERY = 4  # GP hyperparameters are re-optimised when the finals grew by this (or a fifth)
MAX_CACHED_CHILDREN = 50_000
_KINDS = frozenset(TrialKind)
Children = list[tuple[LMMorph, TransformerSpec]]


def _positive_int(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NasError(f"{where}: {name} must be a positive integer, got {short_repr(value)}")
    return value


@dataclass(frozen=True)
class LMLimits:
    """Upper bounds on blocks, parameters and training FLOPs per token (at the spec's ``seq_len``)."""

    max_blocks: int
    max_params: int
    max_train_flops_per_token: float
    _verdicts: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _positive_int("lm limits", "max_blocks", self.max_blocks)
        _positive_int("lm limits", "max_params", self.max_params)
        flops = self.max_train_flops_per_token
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not math.isfinite(flops) or flops <= 0:
            raise NasError(f"lm limits: max_train_flops_per_token must be a positive number, got {short_repr(flops)}")

    @staticmethod
    def train_flops(spec: TransformerSpec) -> float:
        return transformer_flops(spec).training()

    def reason(self, spec: TransformerSpec) -> str:
        """Why ``spec`` is over a limit, or ``""`` (cached by key)."""
        key = spec.key()
        verdict = self._verdicts.get(key)
        if verdict is None:
            if spec.n_blocks > self.max_blocks:
                verdict = f"{spec.n_blocks} blocks > max_blocks {self.max_blocks}"
            elif spec.params() > self.max_params:
                verdict = f"{spec.params()} params > max_params {self.max_params}"
            elif (flops := self.train_flops(spec)) > self.max_train_flops_per_token:
                cap = self.max_train_flops_per_token
                verdict = f"{flops:.4g} training FLOPs per token > max_train_flops_per_token {cap:.4g}"
            else:
                verdict = ""
            if len(self._verdicts) >= MAX_CACHED_CHILDREN:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    def admits(self, spec: TransformerSpec) -> bool:
        return not self.reason(spec)


@dataclass(frozen=True)
class LMSearchSettings:
    """How the LM search proposes trials."""

    strategy: str = "bayesian"
    seed: int = 0
    ucb_beta: float = 2.0
    retune_fraction: float = 0.25
    max_morphs_per_child: int = 2
    candidates: int = 64  # children scored per ask
    landmarks: int = 32
    gp_window: int = 256
    widen_factor: float = 2.0
    default_hparams: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_LM_HPARAMS))
    hparam_space: LMHyperparameterSpace = field(default_factory=LMHyperparameterSpace)

    def __post_init__(self) -> None:
        where = "lm search settings"
        if self.strategy not in STRATEGIES:
            raise NasError(f"{where}: strategy must be one of {', '.join(STRATEGIES)}, got {short_repr(self.strategy)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise NasError(f"{where}: seed must be a non-negative integer, got {short_repr(self.seed)}")
        for name, lo, hi in (("retune_fraction", 0.0, 1.0), ("ucb_beta", 0.0, 1e6), ("widen_factor", 1.0, 1e6)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise NasError(f"{where}: {name} must be a number in [{lo}, {hi}], got {short_repr(value)}")
        if self.widen_factor == 1.0:
            raise NasError(f"{where}: widen_factor must be above 1, got 1.0")
        for name, low in (("max_morphs_per_child", 1), ("candidates", 1), ("landmarks", 2), ("gp_window", 8)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise NasError(f"{where}: {name} must be an integer >= {low}, got {short_repr(value)}")
        if not isinstance(self.hparam_space, LMHyperparameterSpace):
            raise NasError(f"{where}: hparam_space must be an LMHyperparameterSpace")
        object.__setattr__(self, "default_hparams", normalise_lm_hparams(self.default_hparams))


@dataclass
class LMTrialProposal:
    """What to train: ``spec`` is trial ``parent``'s spec after ``morphs``; ``inherit``: whose weights, or None."""

    spec: TransformerSpec
    kind: TrialKind
    hparams: dict[str, Any]
    parent: str | None = None
    inherit: str | None = None
    morphs: tuple[LMMorph, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def epochs(self) -> int:
        return int(self.hparams["epochs"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready ledger form (what :meth:`from_dict` reads back)."""
        return {
            "spec": self.spec.to_dict(),
            "kind": str(self.kind),
            "hparams": dict(self.hparams),
            "parent": self.parent,
            "inherit": self.inherit,
            "morphs": [m.to_dict() for m in self.morphs],
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, data: Any) -> LMTrialProposal:
        if not isinstance(data, Mapping):
            raise NasError(f"lm proposal must be an object, got {type(data).__name__}")
        unknown = sorted(str(k) for k in set(data) - {"spec", "kind", "hparams", "parent", "inherit", "morphs", "info"})
        if unknown:
            raise NasError(f"lm proposal: unknown key {short_repr(unknown[0])}")
        for name in ("spec", "kind", "hparams"):
            if name not in data:
                raise NasError(f"lm proposal: missing key {name!r}")
        kind = data["kind"]
        if not isinstance(kind, str) or kind not in _KINDS:
            raise NasError(f"lm proposal: kind must be one of seed, arch, tune, got {short_repr(kind)}")
        for name in ("parent", "inherit"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise NasError(f"lm proposal: {name} must be a trial id or null, got {short_repr(data[name])}")
        morphs = data.get("morphs", [])
        if not isinstance(morphs, list):
            raise NasError(f"lm proposal: morphs must be a list, got {short_repr(morphs)}")
        info = data.get("info", {})
        if not isinstance(info, Mapping):
            raise NasError(f"lm proposal: info must be an object, got {short_repr(info)}")
        return cls(
            TransformerSpec.from_dict(data["spec"]),
            TrialKind(kind),
            normalise_lm_hparams(data["hparams"]),
            data.get("parent"),
            data.get("inherit"),
            tuple(LMMorph.from_dict(m) for m in morphs),
            dict(info),
        )


@dataclass
class _Arch:
    """One architecture with a pending or completed trial: what the GP and the children read."""

    spec: TransformerSpec
    order: int  # when it was last updated (the GP window keeps the most recent)
    running: dict[str, None] = field(default_factory=dict)
    best_final: float | None = None
    best_trial: str | None = None
    lead: tuple[float, float] | None = None  # (progress, score) of the running trial furthest along
    fantasy: float | None = None  # believed score while only pending


class LMSearch(Proposer[LMTrialProposal]):
    """GP-UCB architecture search plus TPE re-tunes over transformer LMs (see the module docstring).

    ``ask``/``restore`` take and give :class:`LMTrialProposal` instead of the image
    ``TrialProposal``; the protocol (ask, tell, forget, restore) is the same.
    """

    def __init__(self, settings: LMSearchSettings, seed_spec: TransformerSpec, limits: LMLimits) -> None:
        if not isinstance(settings, LMSearchSettings):
            raise NasError(f"lm search: settings must be LMSearchSettings, got {type(settings).__name__}")
        if not isinstance(seed_spec, TransformerSpec):
            raise NasError(f"lm search: the seed must be a TransformerSpec, got {type(seed_spec).__name__}")
        if not isinstance(limits, LMLimits):
            raise NasError(f"lm search: limits must be LMLimits, got {type(limits).__name__}")
        reason = limits.reason(seed_spec)
        if reason:
            raise NasError(f"lm search: the seed architecture is over the search limits: {reason}")
        settings.hparam_space.check_context(seed_spec.seq_len)
        if settings.default_hparams["seq_len"] > seed_spec.seq_len:
            raise NasError(
                f"lm search: default_hparams seq_len {settings.default_hparams['seq_len']} "
                f"exceeds the model's seq_len {seed_spec.seq_len}"
            )
        self.settings = settings
        self.limits = limits
        self.seed_spec = seed_spec
        self.tuner = LMTuner(settings.hparam_space, seed=settings.seed)
        self._rng = np.random.default_rng([settings.seed, 1])
        self._children_of: dict[str, Children] = {}
        self.book: TrialBook[LMTrialProposal] = TrialBook(self.tuner)
        self._trials = self.book.trials
        self._archs: dict[str, _Arch] = {}
        self._updates = 0
        self._final_count = 0
        self._startup = _StartupChildren(
            seed_spec,
            self._children,
            np.random.default_rng([settings.seed, 3]),
            max(STARTUP_DEPTH, settings.max_morphs_per_child),
        )
        self.surrogate: _Surrogate | None = None
        if settings.strategy == "bayesian":
            landmarks = _landmarks(
                seed_spec, self._children, np.random.default_rng([settings.seed, 2]), settings.landmarks
            )
            self.surrogate = _Surrogate(LandmarkEmbedding(landmarks, LMDistance()), settings.gp_window)

    # --- Proposer -------------------------------------------------------------------------
    def ask(self, trial_id: str) -> LMTrialProposal:
        if not isinstance(trial_id, str):
            raise NasError(f"trial id must be a string, got {short_repr(trial_id)}")
        book = self.book
        book.check_new(trial_id)
        proposal: LMTrialProposal | None
        if book.seed_trial is None:
            hparams = dict(self.settings.default_hparams)
            proposal = LMTrialProposal(
                self.seed_spec, TrialKind.SEED, hparams, info={"reason": "the seed architecture"}
            )
        else:
            book.asks += 1
            want_tune = math.floor(self.settings.retune_fraction * book.asks) > book.tunes
            proposal = self._tune(trial_id) if want_tune else None
            proposal = proposal or self._arch() or self._tune(trial_id)
        assert proposal is not None  # a lineage can always be re-tuned
        self._register(trial_id, proposal)
        return proposal

    def tell(self, trial_id: str, value: float, final: bool) -> None:
        trial = self.book.active(trial_id)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise NasError(f"trial {trial_id}: score must be a finite number, got {short_repr(value)}")
        self.book.tell(trial, value, final)
        arch = self._archs[trial.key]
        arch.order = self._tick()
        arch.fantasy = None  # a real score replaces the belief (a new one is formed if it ever reverts to pending)
        if not final:
            lead = (trial.progress, trial.result)
            if arch.lead is None or lead > arch.lead:
                arch.lead = lead
            return
        self._final_count += 1
        del arch.running[trial_id]
        if arch.best_final is None or trial.result > arch.best_final:
            arch.best_final, arch.best_trial = trial.result, trial_id
        self._relead(arch)
        self.book.completed(trial)

    def forget(self, trial_id: str) -> None:
        trial = self.book.active(trial_id)
        self.book.failed(trial)
        arch = self._archs[trial.key]
        del arch.running[trial_id]
        if not arch.running and arch.best_final is None:
            del self._archs[trial.key]  # the architecture may be proposed again
        else:
            self._relead(arch)

    def restore(self, trial_id: str, proposal: LMTrialProposal, value: float | None, final: bool) -> None:
        """Re-enter a trial read back from a ledger (e.g. :meth:`LMTrialProposal.from_dict`) without proposing."""
        if not isinstance(proposal, LMTrialProposal):
            raise NasError(f"trial {trial_id}: restore needs an LMTrialProposal, got {type(proposal).__name__}")
        self.book.check_new(trial_id, restoring=True)
        if not isinstance(proposal.kind, str) or proposal.kind not in _KINDS:
            raise NasError(f"trial {trial_id}: unknown kind {short_repr(proposal.kind)}")
        if not isinstance(proposal.spec, TransformerSpec):
            raise NasError(f"trial {trial_id}: spec must be a TransformerSpec, got {type(proposal.spec).__name__}")
        if not isinstance(proposal.morphs, tuple) or not all(isinstance(m, LMMorph) for m in proposal.morphs):
            raise NasError(f"trial {trial_id}: morphs must be a tuple of LMMorph")
        proposal = replace(proposal, kind=TrialKind(proposal.kind), hparams=normalise_lm_hparams(proposal.hparams))
        self.book.count_restored(proposal)
        self._register(trial_id, proposal)
        if value is not None:
            self.tell(trial_id, value, final)

    # --- proposals --------------------------------------------------------------------------
    def _arch(self) -> LMTrialProposal | None:
        origins = [a for a in self._archs.values() if a.best_final is not None]
        if not origins:
            grown = self._startup.next(self._taken)
            if grown is None:
                return None
            return LMTrialProposal(
                grown[0],
                TrialKind.ARCH,
                dict(self.settings.default_hparams),
                parent=self.book.seed_trial,
                inherit=None,
                morphs=grown[1],
                info={"reason": "start-up: nothing completed to inherit"},
            )
        picked = self._gp_child(origins) if self.surrogate is not None else None
        if picked is None:
            picked = self._random_child(origins)
            if picked is not None and self.surrogate is not None:
                picked[3]["reason"] = f"bayesian: {self.surrogate.note or 'no candidate'}; random morphs instead"
        if picked is None:
            return None
        origin, spec, morphs, info = picked
        assert origin.best_trial is not None
        info["origin_score"] = origin.best_final
        best = origin.best_trial
        hparams = dict(self._trials[best].proposal.hparams)
        return LMTrialProposal(spec, TrialKind.ARCH, hparams, parent=best, inherit=best, morphs=morphs, info=info)

    def _gp_child(self, origins: list[_Arch]) -> tuple[_Arch, TransformerSpec, tuple[LMMorph, ...], dict] | None:
        assert self.surrogate is not None
        posterior = self.surrogate.fit(self._archs, self._finals())
        if posterior is None:
            return None
        pool = self._candidate_pool(origins)
        if not pool:
            self.surrogate.note = "no untried child within the limits"
            return None
        entries = list(pool.values())
        mean, std = posterior.predict([spec for _, spec, _ in entries])
        ucb = mean + self.settings.ucb_beta * std
        index = int(np.argmax(ucb))
        origin, spec, morphs = entries[index]
        fantasy = posterior.score(float(mean[index]))
        info = {
            "strategy": "bayesian",
            "ucb": round(float(ucb[index]), 6),
            "predicted_score": round(fantasy, 6),
            "predicted_std": round(float(std[index]) * posterior.spread, 6),
            "candidates": len(entries),
            "gp_points": posterior.points,
            "fantasy": fantasy,
        }
        return origin, spec, morphs, info

    def _candidate_pool(self, origins: list[_Arch]) -> dict[str, tuple[_Arch, TransformerSpec, tuple[LMMorph, ...]]]:
        """Untaken children: every one-morph child of the best origins, then random walks, up to ``candidates``."""
        ranked = sorted(origins, key=lambda a: -(a.best_final or 0.0))
        starts = ranked[:TOP_STARTS]
        others = ranked[TOP_STARTS:]
        for _ in range(min(RANDOM_STARTS, len(others))):
            starts.append(others.pop(int(self._rng.integers(len(others)))))
        want = self.settings.candidates
        # A third of the pool is kept for longer walks, so multi-morph children compete too.
        near = want if self.settings.max_morphs_per_child < 2 else want - want // 3
        pool: dict[str, tuple[_Arch, TransformerSpec, tuple[LMMorph, ...]]] = {}
        for origin in starts:
            for morph, child in self._children(origin.spec):
                key = child.key()
                if len(pool) < near and key not in pool and not self._taken(key):
                    pool[key] = (origin, child, (morph,))
        for _ in range(4 * want):
            if len(pool) >= want or self.settings.max_morphs_per_child < 2:
                break
            origin = starts[int(self._rng.integers(len(starts)))]
            walk = self._walk(origin.spec, int(self._rng.integers(2, self.settings.max_morphs_per_child + 1)))
            if walk is not None and walk[0].key() not in pool and not self._taken(walk[0].key()):
                pool[walk[0].key()] = (origin, walk[0], walk[1])
        return pool

    def _random_child(self, origins: list[_Arch]) -> tuple[_Arch, TransformerSpec, tuple[LMMorph, ...], dict] | None:
        """A random walk of 1..max_morphs_per_child morphs from a random completed architecture, untaken."""
        for _ in range(64):
            origin = origins[int(self._rng.integers(len(origins)))]
            walk = self._walk(origin.spec, int(self._rng.integers(1, self.settings.max_morphs_per_child + 1)))
            if walk is not None and not self._taken(walk[0].key()):
                return origin, walk[0], walk[1], {"strategy": "random"}
        for origin in origins:  # every random walk hit a taken child: any untaken one-morph child
            for morph, child in self._children(origin.spec):
                if not self._taken(child.key()):
                    return origin, child, (morph,), {"strategy": "random", "reason": "first untaken child"}
        return None

    def _walk(self, spec: TransformerSpec, steps: int) -> tuple[TransformerSpec, tuple[LMMorph, ...]] | None:
        morphs: list[LMMorph] = []
        for _ in range(steps):
            step = _draw(self._children(spec), self._rng)
            if step is None:
                break
            morphs.append(step[0])
            spec = step[1]
        return (spec, tuple(morphs)) if morphs else None

    def _children(self, spec: TransformerSpec) -> Children:
        """Every admissible one-morph child of ``spec`` (one per distinct child), cached by key."""
        key = spec.key()
        cached = self._children_of.get(key)
        if cached is None:
            if len(self._children_of) >= MAX_CACHED_CHILDREN:
                self._children_of.clear()
            admits = self.limits.admits
            morphs = candidate_morphs(spec, self.settings.widen_factor, accept=admits)
            cached = self._children_of[key] = [(m, apply_spec_morph(spec, m)) for m in morphs]
        return cached

    def _tune_target(self) -> str:
        """Of the best three completed lineages, the one re-tuned least; the seed's before any completed."""
        book = self.book
        assert book.seed_trial is not None
        if not book.done_order:
            return book.seed_trial
        best, order = book.lineage_best, book.done_order
        top = sorted(order, key=lambda r: (-best[r], order[r]))[:TUNE_CANDIDATES]
        return min(top, key=lambda r: (book.tunes_per_root.get(r, 0), -best[r], order[r]))

    def _tune(self, trial_id: str) -> LMTrialProposal:
        root_id = self._tune_target()
        root = self._trials[root_id].proposal
        return LMTrialProposal(
            root.spec,
            TrialKind.TUNE,
            self.tuner.ask(trial_id),
            parent=root.parent,
            inherit=root.inherit,
            morphs=root.morphs,
            info={"retunes": root_id},
        )

    # --- bookkeeping ------------------------------------------------------------------------
    def _tick(self) -> int:
        self._updates += 1
        return self._updates

    def _register(self, trial_id: str, proposal: LMTrialProposal) -> None:
        key = proposal.spec.key()
        self.book.register(trial_id, proposal, key, (proposal.parent, proposal.morphs))
        arch = self._archs.get(key)
        if arch is None:
            arch = self._archs[key] = _Arch(proposal.spec, self._tick())
            fantasy = proposal.info.get("fantasy")
            arch.fantasy = float(fantasy) if isinstance(fantasy, (int, float)) else None
        arch.running[trial_id] = None

    def _relead(self, arch: _Arch) -> None:
        told = [self._trials[t] for t in arch.running if self._trials[t].value is not None]
        arch.lead = max(((t.progress, float(t.value or 0.0)) for t in told), default=None)

    def _taken(self, key: str) -> bool:
        return key in self._archs

    def _finals(self) -> int:
        return self._final_count

    # --- introspection ------------------------------------------------------------------------
    @property
    def pending(self) -> list[str]:
        return self.book.pending

    def best(self) -> tuple[str, float] | None:
        """The completed trial with the best score, or None."""
        return self.book.best()


def _draw(children: Children, rng: np.random.Generator) -> tuple[LMMorph, TransformerSpec] | None:
    """One child: a morph kind first, then one of its options (as ``random_morph`` draws)."""
    if not children:
        return None
    kinds = sorted({m.kind for m, _ in children})
    kind = kinds[int(rng.integers(len(kinds)))]
    options = [c for c in children if c[0].kind == kind]
    return options[int(rng.integers(len(options)))]


def _landmarks(seed: TransformerSpec, children: Any, rng: np.random.Generator, count: int) -> list[TransformerSpec]:
    """The seed plus distinct specs from random walks of 1..LANDMARK_WALK admissible morphs."""
    found = {seed.key(): seed}
    for steps in np.linspace(1, LANDMARK_WALK, max(count - 1, 1)).round().astype(int):
        for _ in range(4):
            spec = seed
            for _ in range(int(steps)):
                step = _draw(children(spec), rng)
                if step is None:
                    break
                spec = step[1]
            if spec.key() not in found:
                found[spec.key()] = spec
                break
        if len(found) >= count:
            break
    return list(found.values())


class _StartupChildren:
    """The seed's admissible morph children breadth first, each level in an order drawn once."""

    def __init__(self, seed: TransformerSpec, children: Any, rng: np.random.Generator, depth: int) -> None:
        self._children = children
        self._rng = rng
        self._depth = depth
        self._level: list[tuple[TransformerSpec, tuple[LMMorph, ...]]] = [(seed, ())]
        self._levels = 0
        self._queue: deque[tuple[TransformerSpec, tuple[LMMorph, ...]]] = deque()
        self._seen = {seed.key()}

    def next(self, taken: Any) -> tuple[TransformerSpec, tuple[LMMorph, ...]] | None:
        while True:
            while self._queue:
                spec, morphs = self._queue.popleft()
                if not taken(spec.key()):
                    return spec, morphs
            if self._levels >= self._depth or not self._level:
                return None
            grown = []
            for spec, morphs in self._level:
                for morph, child in self._children(spec):
                    if child.key() not in self._seen:
                        self._seen.add(child.key())
                        grown.append((child, (*morphs, morph)))
            self._level = [grown[int(i)] for i in self._rng.permutation(len(grown))]
            self._levels += 1
            self._queue = deque(self._level)


@dataclass
class _Posterior:
    gp: GaussianProcess
    embed: LandmarkEmbedding[TransformerSpec]
    center: float
    spread: float
    points: int

    def predict(self, specs: list[TransformerSpec]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation in standardised units."""
        return self.gp.predict(self.embed(specs))

    def score(self, standardised: float) -> float:
        return self.center + self.spread * standardised


class _Surrogate:
    """The GP over the landmark embedding, fitted on the architectures known to the search."""

    def __init__(self, embed: LandmarkEmbedding[TransformerSpec], window: int) -> None:
        self.embed = embed
        self.gp = GaussianProcess()
        self.window = window
        self.note = ""
        self.failures: list[str] = []
        self.fits = 0
        self.optimisations = 0
        self._finals_at_optimisation = 0

    def fit(self, archs: Mapping[str, _Arch], finals: int) -> _Posterior | None:
        """Fit on real scores (final, or partial with extra noise) and pending fantasies; None when it fails."""
        self.note = ""
        real: list[tuple[_Arch, float, float]] = []  # (arch, score, extra noise)
        pending: list[_Arch] = []
        for arch in archs.values():
            if arch.best_final is not None:
                real.append((arch, arch.best_final, 0.0))
            elif arch.lead is not None:
                real.append((arch, arch.lead[1], PARTIAL_NOISE * (1.0 - arch.lead[0])))
            else:
                pending.append(arch)
        if not real:
            self.note = "no observations for the surrogate"
            return None
        scores = np.array([s for _, s, _ in real])
        center = float(scores.mean())
        spread = float(scores.std()) if len(real) > 1 and scores.std() > 1e-12 else 1.0
        if len(real) > self.window // 2 + self.window // 4:  # the best half of the window plus the most recent
            best = sorted(range(len(real)), key=lambda i: -real[i][1])[: self.window // 2]
            chosen = set(best)
            recent = sorted((i for i in range(len(real)) if i not in chosen), key=lambda i: -real[i][0].order)
            real = [real[i] for i in best + recent[: self.window // 4]]
        pending = sorted(pending, key=lambda a: a.order)[-(self.window // 4) :]
        believed = [a for a in pending if a.fantasy is not None]
        unbelieved = [a for a in pending if a.fantasy is None]
        grown = finals - self._finals_at_optimisation
        optimise = len(real) >= 3 and (
            self.optimisations == 0 or grown >= max(REFIT_EVERY, self._finals_at_optimisation // 5)
        )
        try:
            posterior = self._fit(real, believed, center, spread, optimise)
            if unbelieved:
                mean, _ = posterior.predict([a.spec for a in unbelieved])
                for arch, m in zip(unbelieved, mean, strict=True):
                    arch.fantasy = posterior.score(float(m))
                posterior = self._fit(real, believed + unbelieved, center, spread, False)
        except GPError as exc:
            self.note = f"surrogate fit failed: {exc}"
            self.failures = [*self.failures[-99:], self.note]
            return None
        if optimise:
            self.optimisations += 1
            self._finals_at_optimisation = finals
        return posterior

    def _fit(
        self,
        real: list[tuple[_Arch, float, float]],
        fantasies: list[_Arch],
        center: float,
        spread: float,
        optimise: bool,
    ) -> _Posterior:
        specs = [a.spec for a, _, _ in real] + [a.spec for a in fantasies]
        y = np.array([s for _, s, _ in real] + [float(a.fantasy or 0.0) for a in fantasies])
        extra = np.array([n for _, _, n in real] + [0.0] * len(fantasies))
        self.gp.fit(self.embed(specs), (y - center) / spread, extra, optimise_on=len(real) if optimise else None)
        self.fits += 1
        return _Posterior(self.gp, self.embed, center, spread, len(specs))


def make_lm_search(settings: LMSearchSettings, seed_spec: TransformerSpec, limits: LMLimits) -> LMSearch:
    """The LM search the master runs."""
    return LMSearch(settings, seed_spec, limits)


__all__ = ["LMLimits", "LMSearch", "LMSearchSettings", "LMTrialProposal", "make_lm_search"]
