"""The AutoML search: architecture search (Bayesian or random) interleaved with TPE tuning.

Trial kinds and the interleaving policy:

* ``seed`` -- the very first ask: the seed architecture with the default hyperparameters.
* ``arch`` -- a new architecture: a child of a *completed* architecture, reached by 1 to
  ``max_morphs_per_child`` morphs, inheriting the weights of that architecture's best trial
  and training with that trial's hyperparameters (its kernel size is the kernel of new
  layers). Children are never architectures already trained or pending.
* ``tune`` -- a share ``retune_fraction`` of the asks (spread evenly: ask ``n`` is a tune when
  ``floor(fraction * n)`` exceeds the tunes so far) re-tunes a good lineage: TPE samples fresh
  hyperparameters and the trial repeats that lineage's root trial -- same parent, same morphs
  (with the sampled kernel size in its ``deeper`` morphs), same inherited weights -- so the
  hyperparameter effect is measured from a fixed starting point. TPE is told the accuracy
  *gain over the root trial*; results that finish before their root are held until it does.
  The lineage re-tuned is, among the three with the best accuracy, the one re-tuned least.

Size schedule (optional, :mod:`nas.schedule`): the master tells the search the run's progress
before every ask (:meth:`AutoMLSearch.at`); nothing above the FLOPs-per-image band of that
moment is proposed, the architecture search takes the best candidate inside the band (the
largest below it when none is inside yet), and re-tunes pick among the lineages inside it.

Start-up: until some trial has completed nothing can be inherited, so every ask gets work
that needs no weights -- random morph children of the seed trained from scratch
(``inherit=None``) and tune trials of the seed, in the same proportion as later.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import numpy as np

from nas.bayesian import BayesianMorphSearch
from nas.defaults import DEFAULT_HPARAMS, SEARCH, STRATEGIES
from nas.errors import NasError
from nas.expand_pool import ExpandPool, PoolUnavailable
from nas.graph import Graph
from nas.hpo import HyperparameterSpace, HyperparameterTuner, normalise_hparams
from nas.limits import Limits
from nas.morph import Morph, apply_morph
from nas.proposer import HPARAM_KEYS, Proposer, TrialKind, TrialProposal
from nas.random_search import (
    ArchitectureStatus,
    ArchitectureStrategy,
    Child,
    Origin,
    Origins,
    RandomMorphSearch,
)
from nas.schedule import SizeSchedule
from nas.startup import StartupChildren
from nas.tree_expand import PoolGrower
from nas.trial_book import SearchTrial, TrialBook
from nas.tuner_ahead import MAX_AHEAD, AheadTuner, TunerProcess

logger = logging.getLogger(__name__)
TUNE_CANDIDATES = 3  # lineages considered for re-tuning: the best three
TUNE_RESAMPLES = 3  # TPE samples tried when a sampled kernel makes the graph exceed the limits
# Expansion processes from which they also serve the tree search after the start-up. A round's
# children depend on the last round's scores, so the master waits for each round: with one
# process the round is no shorter than in the master, and on a 2-core box the master's load was
# higher (0.61 against 0.36 at 65,536 simulated workers; benchmarks/RESULTS.md).
MIN_TREE_PROCESSES = 2
STARTUP_DEPTH = 3  # start-up children are at most this many morphs from the seed (or max_morphs_per_child)
_KINDS = frozenset(TrialKind)  # restore() takes kinds read back from a ledger as plain strings


@dataclass(frozen=True)
class SearchSettings:
    """How the search proposes trials (built by the engine from the ``search``/``hpo``/``train`` config)."""

    strategy: str = SEARCH.strategy
    seed: int = 0
    ucb_beta: float = SEARCH.ucb_beta
    retune_fraction: float = SEARCH.retune_fraction
    max_morphs_per_child: int = SEARCH.max_morphs_per_child
    gp_window: int = SEARCH.gp_window
    candidates: int = SEARCH.candidates
    default_hparams: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_HPARAMS))
    hparam_space: HyperparameterSpace = field(default_factory=HyperparameterSpace)
    landmarks: int = 32
    batch: int = 1  # architecture children proposed together from one fit (see AutoMLSearch._arch)
    processes: int = 0  # other processes expanding start-up children and tree-search nodes (nas.expand_pool); 0: none
    # TPE's asks made this many early (nas.tuner_ahead); with processes, TPE runs in one more of its own
    tune_ahead: int = 0
    # Until a trial completes, up to this many re-tunes (of the seed) come before the start-up children
    # instead of among them: they cost the master next to nothing, so the first wave's workers start
    # sooner on average. The share of re-tunes over the run stays retune_fraction.
    first_wave_tunes: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise NasError(f"search strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if not 0.0 <= self.retune_fraction <= 1.0:
            raise NasError(f"retune_fraction must be in [0, 1], got {self.retune_fraction}")
        if not (math.isfinite(self.ucb_beta) and self.ucb_beta >= 0):
            raise NasError(f"ucb_beta must be a non-negative number, got {self.ucb_beta}")
        for name, low in (
            ("max_morphs_per_child", 1),
            ("gp_window", 8),
            ("candidates", 1),
            ("landmarks", 2),
            ("batch", 1),
            ("processes", 0),
            ("tune_ahead", 0),
            ("first_wave_tunes", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise NasError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.tune_ahead > MAX_AHEAD:
            raise NasError(f"tune_ahead must be at most {MAX_AHEAD}, got {self.tune_ahead}")
        if not isinstance(self.hparam_space, HyperparameterSpace):
            raise NasError("hparam_space must be a HyperparameterSpace")
        object.__setattr__(self, "default_hparams", normalise_hparams(self.default_hparams))


@dataclass
class _Architecture:
    """What is known of one architecture, kept up to date on every tell instead of rescanning its trials.

    A lineage re-tuned for hours gathers thousands of trials of one architecture; its status
    must still cost only its running trials.
    """

    running: dict[str, None] = field(default_factory=dict)  # its pending trials, in proposal order (a set, in order)
    best_final: float | None = None  # best final accuracy over its completed trials
    lead: str | None = None  # the running trial with a partial result furthest along (progress, then accuracy)


def _lineage(parent: str | None, morphs: tuple[Morph, ...]) -> tuple:
    """What a tune trial shares with its root: the parent and the morphs up to deeper kernel sizes."""
    return parent, tuple((m.kind, m.target, m.source) for m in morphs)


def _kernel_of_deeper(graph: Graph, morphs: tuple[Morph, ...], kernel: int) -> tuple[Graph, tuple[Morph, ...]]:
    """Re-apply ``morphs`` to ``graph`` with ``kernel`` as the kernel of every image ``deeper`` morph."""
    out = []
    for m in morphs:
        if m.kind == "deeper" and len(graph.shape(m.target)) == 3:
            m = Morph("deeper", m.target, m.source, kernel)
        graph, _ = apply_morph(graph, m)
        out.append(m)
    return graph, tuple(out)


class AutoMLSearch(Proposer[TrialProposal]):
    """Architecture search plus TPE behind the master's ask/tell interface (see the module docstring)."""

    def __init__(
        self, settings: SearchSettings, seed_graph: Graph, limits: Limits, schedule: SizeSchedule | None = None
    ) -> None:
        reason = limits.reason(seed_graph)
        if reason:
            raise NasError(f"the seed architecture is over the search limits: {reason}")
        if schedule is not None and limits.flops_fn is None:
            raise NasError("a size schedule needs the limits' FLOPs counter (flops_fn)")
        self.settings = settings
        self.limits = limits
        self.seed_graph = seed_graph
        self.schedule = schedule
        self._progress = 0.0
        self.tuner = self._start_tuner()
        self._fallback = RandomMorphSearch(
            self._admits_now,
            np.random.default_rng([settings.seed, 1]),
            settings.max_morphs_per_child,
            size_rank=self._size_rank if schedule is not None else None,
        )
        self.strategy: ArchitectureStrategy
        if settings.strategy == "bayesian":
            self.strategy = BayesianMorphSearch(
                seed_graph,
                limits.admits,
                np.random.default_rng([settings.seed, 2]),
                ucb_beta=settings.ucb_beta,
                max_morphs=settings.max_morphs_per_child,
                window=settings.gp_window,
                candidates=settings.candidates,
                landmarks=settings.landmarks,
                accept_cheap=limits.admits_structure,
                size_rank=self._size_rank if schedule is not None else None,
                size=limits.flops if schedule is not None else None,
                ceiling=self._flops_ceiling if schedule is not None else None,
            )
        else:
            self.strategy = self._fallback
        self.book: TrialBook[TrialProposal] = TrialBook(self.tuner)
        self._trials = self.book.trials
        self._by_key: dict[str, _Architecture] = {}  # architectures with a pending or completed trial
        self._origins = Origins()  # completed architecture -> what children grow from
        self._best_trial: dict[str, str] = {}  # completed architecture -> its best trial
        self._top_roots: list[str] = []  # the TUNE_CANDIDATES completed roots with the best lineages, best first
        self._ranked: list[
            tuple[float, int, str]
        ] = []  # every completed root as (-lineage best, done order, id), sorted
        self._rank_of: dict[str, tuple[float, int, str]] = {}  # root -> its entry in _ranked
        self._startup: StartupChildren | None = None  # made at the first start-up child
        self._expander: ExpandPool | None = None  # its processes, when settings.processes asks for some
        self._grower: PoolGrower | None = None  # the tree search's expansions in those processes
        self._steady = False  # the start-up is over (something completed)
        self._queued: deque[Child] = deque()  # children of the last batch, handed out in order

    # --- Proposer -------------------------------------------------------------------------
    def ask(self, trial_id: str) -> TrialProposal:
        book = self.book
        book.check_new(trial_id)
        proposal: TrialProposal | None
        if book.seed_trial is None:
            proposal = TrialProposal(
                self.seed_graph,
                TrialKind.SEED,
                dict(self.settings.default_hparams),
                info={"reason": "the seed architecture"},
            )
        else:
            book.asks += 1
            want_tune = math.floor(self.settings.retune_fraction * book.asks) > book.tunes
            want_tune = want_tune or (not self._origins and book.tunes < self.settings.first_wave_tunes)
            proposal = self._tune(trial_id) if want_tune else None
            proposal = proposal or self._arch() or self._tune(trial_id, anywhere=True)
            if proposal is None:  # the seed lineage can always be re-tuned, so this is a bug
                raise NasError("the search found nothing to propose")  # pragma: no cover
        self._register(trial_id, proposal)
        return proposal

    def at(self, progress: float) -> None:
        self._progress = min(max(float(progress), 0.0), 1.0)

    @property
    def startup(self) -> StartupChildren | None:
        """The start-up's walk from the seed (None before the first start-up child): benchmarks read its counts."""
        return self._startup

    def _steady_state(self) -> None:
        """The start-up is over: its expansion processes go on with the tree search's expansions, or end.

        They go on from MIN_TREE_PROCESSES on, started here if the start-up had none (a resumed
        run). Where the expansions are made never changes what is proposed (nas.tree_expand).
        """
        if self._steady:
            return
        self._steady = True
        if self._startup is not None:
            self._startup.expand_here()  # what the pool still has queued for it is dropped
        strategy = self.strategy
        if self.settings.processes < MIN_TREE_PROCESSES or not isinstance(strategy, BayesianMorphSearch):
            self._close_expansion()
            return
        if self._expander is None:
            self._expander = self._start_pool()
            if self._expander is None:
                return
        self._grower = PoolGrower(self._expander, self.limits)
        strategy.grow_with(self._grower)

    def _start_tuner(self) -> AheadTuner | TunerProcess:
        """TPE here, or (with ``settings.processes``) in a process of its own: the same values either way."""
        space, seed, ahead = self.settings.hparam_space, self.settings.seed, self.settings.tune_ahead
        if self.settings.processes:
            try:
                return TunerProcess(space, seed, ahead)
            except (OSError, ImportError, NotImplementedError) as exc:  # no processes on this platform
                logger.warning(f"TPE process unavailable ({exc}); tuning in the master")
        return AheadTuner(HyperparameterTuner(space, seed=seed), ahead)

    def _start_pool(self) -> ExpandPool | None:
        """``settings.processes`` expansion processes, or None (with a warning) where none can start."""
        landmarks = self.strategy.landmarks if isinstance(self.strategy, BayesianMorphSearch) else ()
        try:
            return ExpandPool(self.settings.processes, self.limits, landmarks=landmarks)
        except (PoolUnavailable, OSError, ImportError, NotImplementedError) as exc:  # none on this platform
            logger.warning(f"expansion processes unavailable ({exc}); expanding in the master")
            return None

    def close(self) -> None:
        """End the expansion and TPE processes; whatever comes next is expanded and tuned here."""
        self.tuner.close()
        self._close_expansion()

    def _close_expansion(self) -> None:
        if self._grower is not None:
            self._grower.close()
        if self._expander is not None:
            if self._startup is not None:
                self._startup.expand_here()
            self._expander.close()
            self._expander = None

    def tell(self, trial_id: str, value: float, final: bool) -> None:
        trial = self.book.active(trial_id)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise NasError(f"trial {trial_id}: accuracy must be a number in [0, 1], got {value!r}")
        self.book.tell(trial, value, final)
        if not final:
            arch = self._by_key[trial.key]
            # A trial's (progress, accuracy) only rises, so the lead changes only to the trial just told.
            if arch.lead is None or (trial.progress, trial.result) > self._lead_key(arch.lead):
                arch.lead = trial_id
        else:
            arch = self._by_key[trial.key]
            del arch.running[trial_id]
            arch.best_final = trial.result if arch.best_final is None else max(arch.best_final, trial.result)
            self._completed(trial)
        self._update_strategy(trial)

    def forget(self, trial_id: str) -> None:
        trial = self.book.active(trial_id)
        self.book.failed(trial)
        arch = self._by_key[trial.key]
        del arch.running[trial_id]
        if arch.lead == trial_id:  # rare but at the run's end: a failed lead; the next one is found among the others
            # Of equal leads the latest proposed: forgetting in proposal order (the run's end) then rescans
            # once per distinct lead, not once per trial of an architecture re-tuned thousands of times.
            told = [t for t in reversed(arch.running) if self._trials[t].value is not None]
            arch.lead = max(told, key=self._lead_key) if told else None
        if not arch.running and arch.best_final is None:
            del self._by_key[trial.key]
        self._update_strategy(trial)

    def restore(self, trial_id: str, proposal: TrialProposal, value: float | None, final: bool) -> None:
        self.book.check_new(trial_id, restoring=True)
        proposal = replace(proposal, hparams=normalise_hparams(proposal.hparams))
        if proposal.kind not in _KINDS:
            raise NasError(f"trial {trial_id}: unknown kind {proposal.kind!r}")
        self.book.count_restored(proposal)
        self._register(trial_id, proposal)
        if value is not None:
            self.tell(trial_id, value, final)

    # --- proposals --------------------------------------------------------------------------
    def _arch(self) -> TrialProposal | None:
        """A new architecture: grown from a completed one, or from the seed during start-up."""
        if not self._origins:
            return self._startup_child()
        self._steady_state()
        child = self._next_queued()
        if child is None:
            batch = self.strategy.propose_batch(self._origins, self._taken, self.settings.batch)
            self._queued.extend(batch[1:])
            child = batch[0] if batch else None
        reason = None
        if child is None and self.strategy is not self._fallback:
            reason = f"{self.strategy.name}: {self.strategy.note or 'no candidate'}; random morphs instead"
            child = self._fallback.propose(self._origins, self._taken)
        if child is None:
            return None
        best_trial = self._best_trial[child.origin.key]
        info = dict(child.info)
        if reason:
            info["reason"] = reason
        info["origin_accuracy"] = child.origin.value
        hparams = dict(self._trials[best_trial].proposal.hparams)
        return TrialProposal(
            child.graph, TrialKind.ARCH, hparams, parent=best_trial, inherit=best_trial, morphs=child.morphs, info=info
        )

    def _next_queued(self) -> Child | None:
        """The next child of the last batch that can still be proposed as it was chosen.

        One dropped: its architecture was taken since, its origin's best trial now has another
        architecture or kernel (the morphs would not apply as chosen), or the size band moved.
        """
        while self._queued:
            child = self._queued.popleft()
            origin = self._origins.get(child.origin.key)
            if (
                origin is None
                or self._taken(child.graph.key())
                or origin.kernel_size != child.origin.kernel_size
                or not (origin.graph is child.origin.graph or origin.graph == child.origin.graph)
                or not self._admits_now(child.graph)
            ):
                continue
            return replace(child, origin=origin)
        return None

    def _startup_child(self) -> TrialProposal | None:
        """A child of the seed trained from scratch (no completed trial to inherit), breadth first."""
        hparams = dict(self.settings.default_hparams)
        if self._startup is None:
            depth = max(STARTUP_DEPTH, self.settings.max_morphs_per_child)
            if self.settings.processes:
                self._expander = self._start_pool()
            self._startup = StartupChildren(
                self.seed_graph,
                self.settings.seed,
                hparams["kernel_size"],
                self.limits,
                self._admits_now,
                depth,
                self._expander,
                self._flops_ceiling,
            )
        grown = self._startup.next(self._taken)
        if grown is None:
            return None
        return TrialProposal(
            grown[0],
            TrialKind.ARCH,
            hparams,
            parent=self.book.seed_trial,
            inherit=None,
            morphs=grown[1],
            info={"reason": "start-up: nothing completed to inherit"},
        )

    def _tune_target(self, anywhere: bool) -> str | None:
        """The lineage root to re-tune: of the best three, the one re-tuned least; the seed at start-up.

        Under a size schedule the best three are taken among the lineages inside the band now
        (None when there is none), unless ``anywhere``.
        """
        if not self._top_roots:
            assert self.book.seed_trial is not None
            return self.book.seed_trial
        best = self.book.lineage_best
        roots = self._top_roots
        if self.schedule is not None and not anywhere:
            # Best lineage first, so the scan stops at the third one inside the band (not all roots every ask).
            roots = list(islice(self._in_band_ranked(), TUNE_CANDIDATES))
            if not roots:
                return None
        return min(roots, key=lambda r: (self.book.tunes_per_root[r], -best[r]))

    def _tune(self, trial_id: str, anywhere: bool = False) -> TrialProposal | None:
        root_id = self._tune_target(anywhere)
        if root_id is None:
            return None
        root = self._trials[root_id].proposal
        base = self.seed_graph if root.parent is None else self._trials[root.parent].proposal.graph
        for _ in range(TUNE_RESAMPLES):
            hparams = self.tuner.ask(trial_id)
            try:
                graph, morphs = _kernel_of_deeper(base, root.morphs, hparams["kernel_size"])
            except NasError:
                graph = None
            if graph is not None and (self.limits.admits(graph) if anywhere else self._admits_now(graph)):
                return TrialProposal(
                    graph,
                    TrialKind.TUNE,
                    hparams,
                    parent=root.parent,
                    inherit=root.inherit,
                    morphs=morphs,
                    info={"retunes": root_id},
                )
            self.tuner.fail(trial_id)
        return None

    # --- the size schedule ----------------------------------------------------------------------
    def _admits_now(self, graph: Graph) -> bool:
        """Within the limits and not above the size band at the current progress."""
        if not self.limits.admits(graph):
            return False
        return self.schedule is None or self._size_rank(graph) < math.inf

    def _flops_ceiling(self) -> float:
        """Above which :meth:`_admits_now` refuses a graph within the limits, now (its FLOPs per image).

        Infinite without a size schedule or a FLOPs counter. The start-up expansion processes pack
        what is refused here (nas.startup.Packed).
        """
        if self.schedule is None or self.limits.flops_fn is None:
            return math.inf
        return self.schedule.ceiling(self._progress)

    def _size_rank(self, graph: Graph) -> float:
        """0 inside the band, ``ln(low / flops)`` below it, infinite above it (no schedule: 0)."""
        flops = self.limits.flops(graph)
        if self.schedule is None or flops is None:
            return 0.0
        if not self.schedule.admits(flops, self._progress):
            return math.inf
        return self.schedule.shortfall(flops, self._progress)

    # --- bookkeeping ------------------------------------------------------------------------
    def _register(self, trial_id: str, proposal: TrialProposal) -> None:
        key = proposal.graph.key()
        trial = self.book.register(trial_id, proposal, key, _lineage(proposal.parent, proposal.morphs))
        self._by_key.setdefault(key, _Architecture()).running[trial_id] = None
        self._update_strategy(trial)

    def _completed(self, trial: SearchTrial[TrialProposal]) -> None:
        self.book.completed(trial)
        if trial.root is not None:
            self._rank_root(trial.root)
        current = self._origins.get(trial.key)
        if current is None or trial.result > current.value:
            kernel = trial.proposal.hparams["kernel_size"]
            self._origins.put(Origin(trial.key, trial.proposal.graph, trial.result, kernel))
            self._best_trial[trial.key] = trial.id

    def _rank_root(self, root: str) -> None:
        """Keep ``_top_roots`` the best completed lineages (ties: the earlier completed) after ``root`` changed.

        A lineage's best accuracy only ever rises, so a root outside the top can only enter it
        when its own lineage improves: re-ranking that one root keeps the top exact.
        """
        done_order = self.book.done_order
        if root not in done_order:
            return
        old = self._rank_of.get(root)
        if old is not None:
            del self._ranked[bisect.bisect_left(self._ranked, old)]
        entry = self._rank_of[root] = (-self.book.lineage_best[root], done_order[root], root)
        bisect.insort(self._ranked, entry)
        self._top_roots = [r for _, _, r in self._ranked[:TUNE_CANDIDATES]]

    def _in_band_ranked(self) -> Iterator[str]:
        """Completed roots inside the size band now, best lineage first."""
        for _, _, root in self._ranked:
            if self._size_rank(self._trials[root].proposal.graph) == 0.0:
                yield root

    def _lead_key(self, trial_id: str) -> tuple[float, float]:
        trial = self._trials[trial_id]
        return trial.progress, trial.result

    def _taken(self, key: str) -> bool:
        return key in self._by_key

    def _status(self, key: str) -> ArchitectureStatus | None:
        """Best final accuracy; else the running trial furthest along; else pending; None when unknown."""
        arch = self._by_key.get(key)
        if arch is None:
            return None
        if arch.best_final is not None:
            return ArchitectureStatus("final", arch.best_final)
        if arch.lead is not None:
            lead = self._trials[arch.lead]
            return ArchitectureStatus("partial", lead.value, lead.progress)
        return ArchitectureStatus("pending")

    def _update_strategy(self, trial: SearchTrial[TrialProposal]) -> None:
        self.strategy.observe(trial.key, trial.proposal.graph, self._status(trial.key))

    # --- introspection ------------------------------------------------------------------------
    @property
    def pending(self) -> list[str]:
        return self.book.pending

    def best(self) -> tuple[str, float] | None:
        """The completed trial with the best accuracy, or None."""
        return self.book.best()


def make_proposer(
    settings: SearchSettings, seed_graph: Graph, limits: Limits, schedule: SizeSchedule | None = None
) -> Proposer:
    """The search the master runs, configured by ``settings`` (sizes following ``schedule`` when given)."""
    return AutoMLSearch(settings, seed_graph, limits, schedule)


__all__ = ["HPARAM_KEYS", "AutoMLSearch", "SearchSettings", "make_proposer"]
