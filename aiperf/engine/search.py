"""The search a config asks for: its limits and its proposer (the seed architecture is the family's: its seed.py).

Real runs, resumed runs, simulated runs and the benchmarks build their search here, so the
same config always searches the same way. A trial never asks for a batch larger than the
training images an epoch surely delivers (every training batch is full): batch sizes above
that are dropped from the search space here, once, with a warning saying why.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from aiperf.config import Config
from aiperf.datasets import Dataset
from aiperf.datasets.bad_images import largest_full_batch
from aiperf.errors import AiperfError
from nas.errors import NasError
from nas.graph import Graph
from nas.proposer import Proposer, TrialProposal

if TYPE_CHECKING:
    from nas.language.search import LMTrialProposal
    from nas.language.spec import TransformerSpec
    from nas.limits import Limits
    from nas.schedule import SizeSchedule
    from nas.search import SearchSettings

logger = logging.getLogger(__name__)


def batch_choices(cfg: Config, plan_batch: int, largest: int | None = None) -> tuple[list[int], int]:
    """(the batch sizes TPE picks from, the default trial batch size), none above ``largest``.

    ``largest`` is the biggest batch an epoch fills (:func:`largest_full_batch`); a config
    whose sizes all exceed it gets ``largest`` itself, so every trial trains.
    """
    sizes = sorted({b for b in cfg.hpo.batch_sizes if b <= cfg.train.max_batch_size}) or [plan_batch]
    if largest is None:
        return sizes, plan_batch
    fitting = [b for b in sizes if b <= largest] or [largest]
    return fitting, plan_batch if plan_batch <= largest else fitting[-1]


def _batch_note(cfg: Config, plan_batch: int, dataset: Dataset, largest: int) -> str | None:
    """Why the config's batch sizes were cut for this dataset (None when none was)."""
    sizes, default = batch_choices(cfg, plan_batch)
    over = [str(b) for b in sizes if b > largest]
    parts = [f"hpo.batch_sizes {', '.join(over)}"] if over else []
    if default > largest:
        parts.append(f"the plan's batch size {default}")
    if not parts:
        return None
    kept, default = batch_choices(cfg, plan_batch, largest)
    skippable = dataset.train_size - largest
    delivered = (
        f"the {largest:,} training images every epoch surely delivers ({dataset.train_size:,} in the split, less "
        f"the {skippable:,} that dataset.max_bad_fraction={cfg.dataset.max_bad_fraction:g} lets be skipped)"
        if skippable
        else f"the {largest:,} training images"
    )
    return (
        f"{' and '.join(parts)} cannot be filled by {delivered}; a training batch must be full, so "
        f"trials use batch sizes {', '.join(map(str, kept))} (default {default})"
    )


def search_batch(cfg: Config, workers: int) -> int:
    """Architectures per GP fit: the config's, or for ``auto`` one per 64 concurrent trials (1 to 128).

    A batch is handed out over the next asks, so the results that arrive meanwhile (about one
    per ask) are what it does not see; against ``workers`` trials in flight, whose outcomes
    the fit only believes anyway, 1/64 of them changes little (benchmarks/RESULTS.md, "Batched
    proposals"), while one fit and one tree search serve many asks.
    """
    from aiperf.config import MAX_AUTO_SEARCH_BATCH

    if cfg.search.batch != "auto":
        return int(cfg.search.batch)
    return max(1, min(MAX_AUTO_SEARCH_BATCH, int(workers) // 64))


def expand_processes(cfg: Config, workers: int) -> int:
    """Processes expanding the start-up children: the config's, or for ``auto`` none below
    AUTO_EXPAND_WORKERS concurrent trials (their start-up takes seconds in this process) and
    otherwise one per core this process may use beyond its own, at most MAX_AUTO_EXPAND_PROCESSES.
    Even one helps on a 2-core box, as the master expands nodes itself while the process is behind
    (nas.startup): at 65,536 simulated workers by the wall clock 0.492-0.533 % of the worker time
    idle with one, 0.622 % with none (benchmarks/RESULTS.md, "The start-up fill by the wall clock").

    The processes change when the children are ready, never which they are: proposals are the
    same for any number (nas.startup).
    """
    from aiperf.config import AUTO_EXPAND_WORKERS, MAX_AUTO_EXPAND_PROCESSES

    if cfg.search.processes != "auto":
        return int(cfg.search.processes)
    if workers < AUTO_EXPAND_WORKERS:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(MAX_AUTO_EXPAND_PROCESSES, cores - 1))


def tune_ahead(workers: int) -> int:
    """How many TPE asks are made early (nas.tuner_ahead): TUNE_AHEAD from AUTO_EXPAND_WORKERS concurrent trials.

    Decided by the workers, not the processes, so the processes never change what is proposed.
    Below that, each re-tune is asked when proposed, after every result so far (small runs lose nothing).
    """
    from aiperf.config import AUTO_EXPAND_WORKERS, TUNE_AHEAD

    return TUNE_AHEAD if workers >= AUTO_EXPAND_WORKERS else 0


def first_wave_tunes(cfg: Config, workers: int) -> int:
    """Re-tunes proposed before the start-up children (nas.search.SearchSettings.first_wave_tunes).

    From AUTO_EXPAND_WORKERS concurrent trials, the first wave's share of them (``retune_fraction``
    of ``workers``): there the fill takes seconds, and a re-tune of the seed costs the master a
    fraction of a start-up child, so taking them first shortens the first wave's mean wait. Below
    that the order is the usual one (small runs are unchanged).
    """
    from aiperf.config import AUTO_EXPAND_WORKERS

    return int(cfg.search.retune_fraction * workers) if workers >= AUTO_EXPAND_WORKERS else 0


def search_settings(cfg: Config, plan_batch: int, largest_batch: int | None = None, workers: int = 1) -> SearchSettings:
    """The search part of a config; ``plan_batch`` is the plan's batch size (the default of every trial),
    ``largest_batch`` the biggest batch a trial may ask for (None: no bound), ``workers`` the trials
    that run at once (sizes ``search.batch: auto``)."""
    from nas.hpo import HyperparameterSpace
    from nas.search import SearchSettings

    h = cfg.hpo
    batch_sizes, plan_batch = batch_choices(cfg, plan_batch, largest_batch)
    space = HyperparameterSpace(
        learning_rate=h.learning_rate,
        weight_decay=h.weight_decay,
        dropout=h.dropout,
        batch_sizes=tuple(batch_sizes),
        kernel_sizes=tuple(h.kernel_sizes),
        epochs=h.epochs,
    )
    defaults = {
        "learning_rate": cfg.train.learning_rate,
        "batch_size": plan_batch,
        "weight_decay": cfg.train.weight_decay,
        "dropout": cfg.train.dropout,
        "kernel_size": cfg.train.kernel_size,
        "epochs": cfg.train.epochs_per_trial,
    }
    s = cfg.search
    return SearchSettings(
        strategy=s.strategy,
        seed=cfg.run.seed,
        ucb_beta=s.ucb_beta,
        retune_fraction=s.retune_fraction,
        max_morphs_per_child=s.max_morphs_per_child,
        gp_window=s.gp_window,
        candidates=s.candidates,
        batch=search_batch(cfg, workers),
        processes=expand_processes(cfg, workers),
        tune_ahead=tune_ahead(workers),
        first_wave_tunes=first_wave_tunes(cfg, workers),
        default_hparams=defaults,
        hparam_space=space,
    )


def make_search(
    cfg: Config, seed_graph: Graph, plan_batch: int, dataset: Dataset | None = None, workers: int = 1
) -> Proposer[TrialProposal]:
    """The proposer for this config: BO or random architecture search interleaved with TPE.

    With the ``dataset`` the trials will train on, no trial asks for a batch its epochs cannot fill.
    ``workers``: the trials that run at once (how many architectures one GP fit proposes).
    """
    from aiperf.families.image.flops import TrainFlopsPerImage
    from nas.limits import Limits
    from nas.search import make_proposer

    limits = Limits(
        cfg.search.max_layers,
        cfg.search.max_params,
        cfg.search.max_flops_per_image,
        flops_fn=TrainFlopsPerImage(plan_batch),
    )
    reason = limits.reason(seed_graph)
    if reason:
        raise AiperfError(f"the seed architecture is already over a search limit: {reason}")
    largest = None
    if dataset is not None:
        largest = largest_full_batch(dataset, cfg.dataset.max_bad_fraction)
        note = _batch_note(cfg, plan_batch, dataset, largest)
        if note:
            logger.warning(note)
    settings = search_settings(cfg, plan_batch, largest, workers)
    return make_proposer(settings, seed_graph, limits, size_schedule(cfg, seed_graph, limits))


def size_schedule(cfg: Config, seed_graph: Graph, limits: Limits) -> SizeSchedule | None:
    """The config's size schedule: from the seed's FLOPs per image to ``size_growth`` times that, capped."""
    from nas.schedule import SizeSchedule

    growth = cfg.search.size_growth
    start = limits.flops(seed_graph)
    if growth is None or start is None:
        return None
    return SizeSchedule(start, min(start * growth, max(start, cfg.search.max_flops_per_image)), cfg.search.size_band)


def make_lm_search(cfg: Config, seed: TransformerSpec) -> Proposer[LMTrialProposal]:
    """The proposer of a language run: GP-UCB over function-preserving transformer growth, with TPE re-tunes."""
    from nas.language.hpo import LMHyperparameterSpace
    from nas.language.search import LMLimits, LMSearchSettings
    from nas.language.search import make_lm_search as build

    lm, s = cfg.lm, cfg.search
    try:
        space = LMHyperparameterSpace(
            learning_rate=lm.hpo_learning_rate,
            warmup_fraction=lm.hpo_warmup_fraction,
            weight_decay=lm.hpo_weight_decay,
            batch_sizes=tuple(lm.hpo_batch_sizes),
            seq_lens=tuple(lm.hpo_seq_lens),
            epochs=cfg.hpo.epochs,
            max_batch_tokens=lm.max_batch_tokens,
        )
        settings = LMSearchSettings(
            strategy=s.strategy,
            seed=cfg.run.seed,
            ucb_beta=s.ucb_beta,
            retune_fraction=s.retune_fraction,
            max_morphs_per_child=s.max_morphs_per_child,
            candidates=min(s.candidates, 1024),
            gp_window=s.gp_window,
            default_hparams={
                "learning_rate": lm.learning_rate,
                "warmup_fraction": lm.warmup_fraction,
                "weight_decay": lm.weight_decay,
                "batch_size": lm.batch_size,
                "seq_len": lm.seq_len,
                "epochs": cfg.train.epochs_per_trial,
            },
            hparam_space=space,
        )
        limits = LMLimits(lm.max_blocks, lm.max_params, lm.max_train_flops_per_token)
        return build(settings, seed, limits)
    except NasError as exc:
        raise AiperfError(f"lm: {exc}") from None
