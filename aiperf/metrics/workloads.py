"""The built-in workloads and the rules each one carries, in code rather than in the user's config.

A score is comparable with another only when both ran the same workload under the same rules.
The thresholds a run was held to are recorded in its ``run_start.rules`` (they come from the
config, which anyone can override with ``--set rules.min_accuracy=0.01``); this module holds
what each built-in workload's rules *are*, so the verdict can tell a run judged by the
workload's rules from one judged by rules of its own making. A run is identified as a built-in
workload by its config's ``run.name`` and ``dataset.name``, and its dataset must have the
workload's image count (a subset via ``dataset.max_train_images`` or another folder of images
is a different dataset), and the run must follow the workload's size schedule (the band of
network sizes over the run, docs/search.md), since network size drives the rate a device
reaches. Anything else is "custom rules: not comparable": the rule outcomes are
still reported, but the run can never be official. Only ``imagenet`` is the official workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiperf.ledger.schema import RunStartRecord

OFFICIAL_WORKLOAD = "imagenet"
NOT_COMPARABLE = "custom rules: not comparable"


@dataclass(frozen=True)
class Workload:
    """A built-in config as a benchmark workload: how to recognise its runs, and its rules."""

    name: str  # the built-in config (``aiperf run --config NAME``)
    run_name: str  # its ``run.name``
    datasets: tuple[str, ...]  # the ``dataset.name`` values it may load
    total_images: int  # training + validation images (+ undecodable ones skipped at load)
    split: tuple[int, int] | None  # (training, validation) images where the split is fixed by the config
    min_accuracy: float
    official_min_duration_s: float = 3600.0
    min_precision_bits: int = 16
    size_growth: float | None = None  # the size schedule the search follows (docs/search.md); None: none
    size_band: float = 2.0
    # Runs of one config a ranked list entry needs (aiperf check, docs/submission.md): one score moves
    # 16.6 % across search seeds on the default config (issue 21), so a list shows a median of several.
    ranked_runs: int = 3
    # image, or language: then min_accuracy is the quality 1 - bits per byte / 8 (docs/llm.md), and the
    # data is identified by its fingerprint, not an image count (the embedded corpus is the text of the
    # Python installation, which differs between Python versions; token shards are the site's own).
    family: str = "image"

    @property
    def rules(self) -> dict[str, float]:
        return {
            "min_accuracy": self.min_accuracy,
            "official_min_duration_s": self.official_min_duration_s,
            "min_precision_bits": self.min_precision_bits,
        }

    @property
    def official(self) -> bool:
        return self.name == OFFICIAL_WORKLOAD


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        # ILSVRC-2012: 1,281,167 training and 50,000 validation images, as a folder or TFRecord shards.
        Workload(
            "imagenet",
            "imagenet",
            ("image_folder", "tfrecord"),
            1_331_167,
            (1_281_167, 50_000),
            0.70,
            size_growth=2.0,
            size_band=1.5,
        ),
        Workload("default", "mnist-default", ("mnist",), 5_000, (4_000, 1_000), 0.95, size_growth=8.0, size_band=1.4),
        Workload("smoke", "smoke", ("digits",), 1_797, (1_438, 359), 0.80, ranked_runs=2),
        # the default's work on one slot standing for a device (docs/cluster.md, "Where a device's time goes")
        Workload("cpu-standin", "cpu-standin", ("mnist",), 5_000, (4_000, 1_000), 0.95, size_growth=8.0, size_band=1.4),
        Workload("fashion_mnist", "fashion-mnist", ("fashion_mnist",), 70_000, None, 0.90),
        Workload("synthetic", "synthetic", ("synthetic",), 22_000, (20_000, 2_000), 0.0),
        Workload("llm", "llm", ("text",), 0, None, 0.5, family="language"),
        Workload("llm-official", "llm-official", ("token_shards",), 0, None, 0.6, family="language"),
        # what `aiperf run` runs with no --config on a host with GPUs (aiperf/cluster/workload_choice.py)
        Workload("gpu", "gpu", ("text",), 0, None, 0.5, family="language"),
    )
}


@dataclass(frozen=True)
class Comparability:
    """Which workload a run is, and why it is not comparable (empty when it is)."""

    workload: str | None
    reasons: tuple[str, ...]

    @property
    def comparable(self) -> bool:
        return self.workload is not None and not self.reasons

    @property
    def official_workload(self) -> bool:
        return self.comparable and self.workload == OFFICIAL_WORKLOAD


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def _schedule_differences(workload: Workload, start: RunStartRecord) -> list[str]:
    """Where the run's size schedule differs from the workload's: sizes drive the rate, so both must match."""
    search = start.config.search
    reasons = []
    if search.size_growth != workload.size_growth:
        reasons.append(f"search.size_growth {_shown(search.size_growth)} instead of {_shown(workload.size_growth)}")
    elif workload.size_growth is not None and search.size_band != workload.size_band:
        reasons.append(f"search.size_band {_shown(search.size_band)} instead of {_shown(workload.size_band)}")
    return reasons


def _shown(value: object) -> str:
    return "null (no schedule)" if value is None else _number(value)


def identify(start: RunStartRecord) -> Comparability:
    """Match a ``run_start`` record against the built-in workloads; say what differs."""
    run_name, dataset = start.config.run.name, start.dataset
    ds_name = start.config.dataset.name if start.config.dataset.name is not None else dataset.name
    workload = next(
        (w for w in WORKLOADS.values() if w.run_name == run_name and ds_name in w.datasets),
        None,
    )
    if workload is None:
        return Comparability(None, (f"config {_number(run_name)!s} on dataset {ds_name} is not a built-in workload",))
    reasons: list[str] = []
    given = start.rules.model_dump()  # every threshold the header declares, None where it has none
    for key, value in workload.rules.items():
        if given.get(key) is None or float(given[key]) != float(value):
            reasons.append(f"rules.{key} {_number(given.get(key))} instead of {_number(value)}")
    reasons += _schedule_differences(workload, start)
    if workload.family == "language":
        if start.family != "language":
            reasons.append(f"a run of {start.family} models, not language models")
        elif dataset.train_tokens is None or dataset.eval_tokens is None:
            reasons.append("dataset size not recorded")
        return Comparability(workload.name, tuple(reasons))
    train, evaluation = dataset.train_images, dataset.eval_images
    skipped = dataset.bad_images.count if dataset.bad_images is not None else 0
    if train is not None and evaluation is not None:
        total = train + evaluation + skipped
        if total != workload.total_images:
            reasons.append(f"dataset of {total:,} images instead of {workload.total_images:,}")
        elif workload.split is not None and not skipped and (train, evaluation) != workload.split:
            reasons.append(
                f"dataset split {train:,}/{evaluation:,} instead of {workload.split[0]:,}/{workload.split[1]:,}"
            )
    else:
        reasons.append("dataset size not recorded")
    return Comparability(workload.name, tuple(reasons))
