"""Run configuration: YAML files (built-ins in ``aiperf/configs/``) validated into typed sections.

Validation is strict (unknown keys are errors) and every problem is reported as one line
naming the dotted key, e.g. ``config error: train.batch_size: must be >= 1 (got 0)``.
``--set key=value`` overrides parse ``value`` as YAML, so ``--set train.epochs=3`` and
``--set dataset.shape=[32,32,3]`` work as expected.

Config files come from users and from wherever ``--config`` points, so reading is defensive:
only regular files of at most ``MAX_CONFIG_BYTES`` are read (a FIFO, device or folder is
refused without blocking), the YAML loader refuses anchors and aliases (a 600-byte
"billion laughs" document expands to gigabytes) and nesting deeper than ``MAX_YAML_DEPTH``,
numbers must be finite, and error messages quote values only as short excerpts. A file none
of whose top-level keys is a config section is refused without quoting it, so
``--config /etc/shadow`` cannot print a line of that file.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from aiperf.builtin_configs import BUILTIN_CONFIGS
from aiperf.errors import AiperfError, excerpt
from nas.defaults import DEFAULT_HPARAMS, HPARAM_RANGES, SEARCH

DEFAULT_CONFIG = "default"
LANGUAGE_DATASETS = ("text", "token_shards")  # datasets of the language-model workload (docs/llm.md)
MAX_CONFIG_BYTES = 64 * 1024  # the largest built-in config is about 1 KB
MAX_OVERRIDE_CHARS = 16 * 1024  # one --set value (a long dataset path fits)
MAX_YAML_DEPTH = 16  # configs nest three levels (section, key, list)
MAX_SEED = 2**32 - 1  # Optuna's TPE sampler seeds NumPy's RandomState, which takes 32 bits
MAX_DURATION_S = 366 * 24 * 3600.0  # a year: longer budgets are typos, and overflow timers
MAX_INTERVAL_S = 3600.0
# Sizes and counts a config can ask for; each bounds work or memory that grows with it (docs/limits.md).
MAX_IMAGES = 100_000_000  # images in a split: 75x ImageNet-1k's training set
MAX_SIDE = 4096  # pixels per image side, as `aiperf make-imagenet --max-side`
MAX_BATCH = 1 << 20  # as `aiperf flops --batch-size`: 8x the largest published ImageNet batches
MAX_NODES = 16_384  # as `aiperf scaling --nodes`
MAX_WORKERS = 131_072  # 16,384 nodes x 8 accelerators
MAX_SEARCH_BATCH = 4096  # architectures per GP fit: the candidate pool a fit scores is smaller than that
MAX_AUTO_SEARCH_BATCH = 128  # search.batch auto: concurrent trials / 64, at most this
MAX_EXPAND_PROCESSES = 256  # search.processes (nas.expand_pool.MAX_PROCESSES)
AUTO_EXPAND_WORKERS = 1024  # search.processes auto: below this many concurrent trials the start-up is short
TUNE_AHEAD = 8  # TPE asks made early from AUTO_EXPAND_WORKERS concurrent trials on (nas.tuner_ahead)
MAX_AUTO_EXPAND_PROCESSES = 16
ImageSide = Annotated[int, Field(ge=1, le=MAX_SIDE)]
Channels = Annotated[int, Field(ge=1, le=64)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class PowerMeterConfig(_Section):
    """A site power meter the telemetry samplers read (docs/results.md, "Energy")."""

    command: str | None = Field(
        None,
        max_length=4096,
        description="a command that prints one number: watts (or joules, see reading), e.g. a BMC or PDU reading;"
        " split like a shell line (shlex), run without a shell; keep secrets out of it (it is recorded in the ledger)",
    )
    scope: Literal["node", "system"] = Field(
        "node",
        description="node: every node runs it and it measures that node; system: the first node runs it and it"
        " measures everything the run uses (covers says what that includes)",
    )
    reading: Literal["watts", "joules"] = Field(
        "watts", description="watts: the power now; joules: an energy counter that only grows (integrated)"
    )
    covers: list[Literal["compute_nodes", "interconnect", "storage"]] = Field(
        ["compute_nodes"], min_length=1, description="the subsystems a system meter measures"
    )
    timeout_s: float = Field(2.0, gt=0, le=5.0, description="a reading slower than this counts as a failure")

    @field_validator("command")
    @classmethod
    def _splits(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            argv = shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments ({exc})") from None
        if not argv:
            raise ValueError("is empty (leave it out, or null, for no meter)")
        return v

    @model_validator(mode="after")
    def _node_covers_its_node(self) -> PowerMeterConfig:
        if self.scope == "node" and list(self.covers) != ["compute_nodes"]:
            raise ValueError("covers: a node meter measures its compute node only; use scope: system for a meter"
                             " that also covers the interconnect or storage")  # fmt: skip
        return self


class RunConfig(_Section):
    name: str = "default"
    organization: str = Field("unspecified", description="who ran it (MLPerf-style log: submission_org)")
    time_budget_s: float = Field(
        300.0, gt=0, le=MAX_DURATION_S, description="search time; trials still running then are stopped"
    )
    max_trials: int | None = Field(None, ge=1, le=10**9, description="stop proposing after this many trials")
    seed: int = Field(0, ge=0, le=MAX_SEED)
    results_dir: str = "results"
    progress_interval_s: float = Field(5.0, gt=0, le=MAX_INTERVAL_S)
    # At least 0.1 s: every sample costs each host CPU time (NodeSampler.sample walks all its processes;
    # the measured cost: benchmarks/RESULTS.md, "Figures moved from code comments").
    telemetry_interval_s: float = Field(5.0, ge=0.1, le=MAX_INTERVAL_S)
    power_interval_s: float = Field(
        0.5,
        ge=0.0,
        le=MAX_INTERVAL_S,
        description="each node reads its power sources (NVML, RAPL, the site meter) this often and hands the "
        "readings over with its telemetry sample (0: only with the sample); MLPerf asks for >= 1 reading a second",
    )
    power_meter: PowerMeterConfig = PowerMeterConfig()
    grace_s: float = Field(
        0.0, ge=0, le=MAX_DURATION_S, description="after the budget, wait this long for running epochs to end"
    )
    stop_after_failures: int = Field(
        5,
        ge=1,
        le=100_000,
        description="stop the run (failed) when this many trials in a row fail with the same error, on as many"
        " workers, with no epoch completing in between",
    )


class SyntheticConfig(_Section):
    shape: tuple[ImageSide, ImageSide, Channels] = (32, 32, 3)
    classes: int = Field(10, ge=2, le=100_000)
    train_size: int = Field(10_000, ge=1, le=MAX_IMAGES)
    val_size: int = Field(2_000, ge=1, le=MAX_IMAGES)


class DatasetConfig(_Section):
    name: Literal[
        "mnist", "digits", "fashion_mnist", "cifar10", "image_folder", "tfrecord", "synthetic", "text", "token_shards"
    ] = "mnist"
    path: str | None = Field(
        None, description="folder or file for fashion_mnist, cifar10, image_folder, tfrecord and token_shards"
    )
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    split_seed: int = Field(0, ge=0, le=MAX_SEED)
    image_size: tuple[ImageSide, ImageSide] | None = Field(
        None, description="resize images to (height, width) (image_folder, tfrecord)"
    )
    max_train_images: int | None = Field(None, ge=1, le=MAX_IMAGES, description="use at most this many training images")
    storage: Literal["auto", "memory", "stream"] = Field(
        "auto",
        description="image_folder/tfrecord: decode once into memory, or stream (decode per batch on the workers);"
        " auto streams when the decoded images would exceed 2 GiB",
    )
    max_bad_fraction: float = Field(
        0.001, ge=0, lt=1, description="undecodable images are skipped; above this share of the dataset the run stops"
    )
    decode_threads: int | Literal["auto"] = Field(
        "auto", description="streamed input: decode threads per worker (auto: the worker's CPU share)"
    )
    label_offset: int = Field(
        1,
        ge=0,
        le=1_000_000,
        description="tfrecord: subtracted from image/class/label (TensorFlow's ImageNet tooling: 1..1000)",
    )
    shuffle_buffer: int = Field(
        8192,
        ge=1,
        le=10_000_000,
        description="tfrecord: records in each worker's shuffle buffer (shards are read in sequence)",
    )
    synthetic: SyntheticConfig = SyntheticConfig()

    @field_validator("decode_threads")
    @classmethod
    def _positive_threads(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1024:
            raise ValueError("must be 'auto' or an integer from 1 to 1024")
        return v


class ModelConfig(_Section):
    seed_architecture: str = Field("small_resnet", description="zoo name or path to an architecture JSON")
    width: int = Field(16, ge=1, le=4096, description="base width of the small_resnet seed")
    backend: Literal["tensorflow", "jax", "torch"] = "tensorflow"
    precision: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"] = "auto"
    jit_compile: Literal["auto", "on", "off"] = "auto"
    bn_momentum: float = Field(0.9, gt=0, lt=1)


class TrainConfig(_Section):
    epochs_per_trial: int = Field(DEFAULT_HPARAMS["epochs"], ge=1, le=1000)
    batch_size: int | Literal["auto"] = "auto"
    max_batch_size: int = Field(512, ge=1, le=MAX_BATCH)
    learning_rate: float = Field(DEFAULT_HPARAMS["learning_rate"], gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(DEFAULT_HPARAMS["weight_decay"], ge=0, le=1)
    dropout: float = Field(DEFAULT_HPARAMS["dropout"], ge=0, lt=1)
    kernel_size: Literal[1, 3, 5, 7] = DEFAULT_HPARAMS["kernel_size"]
    eval_batch_size: int = Field(512, ge=1, le=MAX_BATCH)
    compiled_models: int = Field(
        4,
        ge=0,
        le=64,
        description="architectures each worker keeps compiled, so a re-tune or re-queued trial of one starts "
        "without tracing or compiling (0: build and compile every trial afresh)",
    )
    compile_ahead: bool | Literal["auto"] = Field(
        "auto",
        description="build a worker's queued trial and compile its train and evaluation steps while the trial "
        "before trains (JAX or TensorFlow on one device, resident data; elsewhere steps compile in their first call); "
        "auto: where trials train on accelerators or a node keeps a core no trial trains on",
    )

    @field_validator("batch_size")
    @classmethod
    def _positive_batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= MAX_BATCH:
            raise ValueError(f"must be 'auto' or an integer from 1 to {MAX_BATCH:,}")
        return v


class HpoConfig(_Section):
    """Ranges TPE samples from when a trial re-tunes an architecture."""

    learning_rate: tuple[float, float] = HPARAM_RANGES.learning_rate
    weight_decay: tuple[float, float] = HPARAM_RANGES.weight_decay
    dropout: tuple[float, float] = HPARAM_RANGES.dropout
    batch_sizes: list[int] = list(HPARAM_RANGES.batch_sizes)
    kernel_sizes: list[Literal[1, 3, 5, 7]] = list(HPARAM_RANGES.kernel_sizes)
    epochs: tuple[int, int] = HPARAM_RANGES.epochs

    @model_validator(mode="after")
    def _ordered(self) -> HpoConfig:
        for name in ("learning_rate", "weight_decay", "dropout", "epochs"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: low {lo} exceeds high {hi}")
        if self.learning_rate[0] <= 0 or self.weight_decay[0] <= 0:
            raise ValueError("learning_rate and weight_decay ranges must be positive (sampled on a log scale)")
        if not 0 <= self.dropout[0] <= self.dropout[1] < 1:
            raise ValueError("dropout range must lie in [0, 1)")
        if self.epochs[0] < 1:
            raise ValueError("epochs range must start at 1 or more")
        if not self.batch_sizes or min(self.batch_sizes) < 1 or max(self.batch_sizes) > MAX_BATCH:
            raise ValueError(f"batch_sizes must be a non-empty list of integers from 1 to {MAX_BATCH:,}")
        if self.epochs[1] > 1000:
            raise ValueError("epochs range must end at 1,000 or less (as train.epochs_per_trial)")
        if not self.kernel_sizes:
            raise ValueError("kernel_sizes must not be empty")
        return self


class SearchConfig(_Section):
    strategy: Literal["bayesian", "random"] = SEARCH.strategy
    retune_fraction: float = Field(
        SEARCH.retune_fraction, ge=0, le=1, description="share of trials that re-tune a good architecture"
    )
    ucb_beta: float = Field(SEARCH.ucb_beta, ge=0, le=1e6)
    max_morphs_per_child: int = Field(SEARCH.max_morphs_per_child, ge=1, le=10)
    max_layers: int = Field(60, ge=1, le=10_000, description="weighted layers (conv, depthwise, dense)")
    max_params: int = Field(5_000_000, ge=1, le=10**13)
    max_flops_per_image: float = Field(2e9, gt=0, le=1e16, description="training FLOPs per image")
    size_growth: float | None = Field(
        None,
        ge=1,
        le=1e6,
        description="size schedule: the FLOPs-per-image band's centre at the end of the run over the seed's"
        " (capped at max_flops_per_image); null: no schedule (docs/search.md)",
    )
    size_band: float = Field(2.0, ge=1, le=1e3, description="size schedule: the band's high over its low")
    gp_window: int = Field(
        SEARCH.gp_window, ge=8, le=20_000, description="observations the GP is fitted on (best + newest; cubic cost)"
    )
    candidates: int = Field(
        SEARCH.candidates, ge=1, le=100_000, description="candidate architectures scored per acquisition"
    )
    batch: int | Literal["auto"] = Field(
        "auto",
        description="architectures proposed together from one GP fit (batch UCB); auto: concurrent trials / 64,"
        f" 1 to {MAX_AUTO_SEARCH_BATCH} (docs/search.md)",
    )

    processes: int | Literal["auto"] = Field(
        "auto",
        description="other processes of the master's machine expanding the start-up children (and from 2 on"
        " the tree search's nodes), plus one for TPE when above 0; auto: none below"
        f" {AUTO_EXPAND_WORKERS} concurrent trials, else one per free core up to {MAX_AUTO_EXPAND_PROCESSES}"
        " (docs/search.md)",
    )

    @field_validator("batch")
    @classmethod
    def _batch_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_SEARCH_BATCH:
            raise ValueError(f"must be auto or an integer from 1 to {MAX_SEARCH_BATCH}")
        return value

    @field_validator("processes")
    @classmethod
    def _processes_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= MAX_EXPAND_PROCESSES:
            raise ValueError(f"must be auto or an integer from 0 to {MAX_EXPAND_PROCESSES}")
        return value


class ClusterConfig(_Section):
    address: str | None = Field(None, description="Ray cluster to join; default: RAY_ADDRESS or a new local one")
    placement: Literal["per_accelerator", "per_node", "fractional"] = "per_accelerator"
    trials_per_accelerator: int = Field(2, ge=1, le=64, description="fractional placement: trials sharing a GPU")
    actors: Literal["per_worker", "per_node"] = Field(
        "per_worker",
        description="Ray actors: one per worker, or one node agent per node running its workers as processes"
        " (a 10,000-node run then needs 10,000 actors; docs/cluster.md)",
    )
    cpus_per_trial: int | Literal["auto"] = "auto"
    max_concurrent_trials: int | None = Field(None, ge=1, le=MAX_WORKERS)
    max_nodes: int | None = Field(
        None, ge=1, le=MAX_NODES, description="use at most this many nodes (head first); scaling studies"
    )
    planned_nodes: int | None = Field(
        None,
        ge=1,
        le=MAX_NODES,
        description="nodes the job was given (launch/aiperf.sbatch sets it): the run records how many trained"
        " against it, and a run that trained on fewer is not official",
    )
    min_concurrent_trials: int = Field(
        2, ge=1, le=1024, description="CPU-only runs oversubscribe cores to reach this (per run, not per node)"
    )
    keep_weights: int = Field(64, ge=1, le=100_000, description="trained weight sets the master keeps for inheritance")
    max_trial_retries: int = Field(2, ge=0, le=100)
    checkpoint_every_epoch: bool = Field(
        True, description="checkpoint after every epoch (kept on the trial's node; a re-queue resumes from it)"
    )
    queue_depth: int = Field(2, ge=1, le=4, description="trials queued per worker (>1 hides the master round trip)")
    ceiling_s: float | Literal["auto"] = Field(
        "auto",
        description="seconds each worker times dense matrix multiplies at start (the measured ceiling,"
        " docs/system.md); auto: 1 on CPU, 3 on accelerators; 0: not measured",
    )
    site: str | None = Field(
        None,
        max_length=4096,
        description="the site file (aiperf system --site): its declared_peak figures are recorded at run start",
    )

    @field_validator("cpus_per_trial")
    @classmethod
    def _cpus_range(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1024:
            raise ValueError("must be 'auto' or an integer from 1 to 1024")
        return v

    @field_validator("ceiling_s")
    @classmethod
    def _ceiling_range(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and not 0 <= v <= 60:
            raise ValueError("must be 'auto' or a number of seconds from 0 to 60")
        return v


class RulesConfig(_Section):
    min_accuracy: float = Field(0.95, ge=0, le=1, description="best validation top-1 needed for a valid run")
    official_min_duration_s: float = Field(
        3600.0, ge=0, le=MAX_DURATION_S, description="shorter runs are labelled unofficial"
    )
    min_precision_bits: int = Field(16, ge=8, le=64)


class LMSeedConfig(_Section):
    """The language search's seed model when ``lm.seed_architecture`` is ``seed``."""

    blocks: int = Field(2, ge=1, le=64)
    width: int = Field(128, ge=8, le=16_384)
    heads: int = Field(4, ge=1, le=256)
    head_dim: int = Field(32, ge=4, le=512)
    mlp_hidden: int = Field(512, ge=8, le=65_536)
    context: int = Field(128, ge=8, le=32_768, description="the model's longest sequence (its position table)")


class LMConfig(_Section):
    """The language-model workload: used when dataset.name is text or token_shards (docs/llm.md)."""

    corpus: Literal["python", "pydoc", "stdlib"] = Field(
        "python", description="text: the corpus every Python installation carries (docs/lm-data.md)"
    )
    max_bytes: int | None = Field(None, ge=1024, le=1 << 30, description="text: read at most this many bytes")
    bytes_per_token: float | None = Field(
        None, gt=0, le=1e3, description="token_shards of a tokenizer other than bytes: text bytes per token"
    )
    seed_architecture: str = Field(
        "seed", max_length=4096, description="seed (sized by lm.seed) or the path of an aiperf-transformer JSON"
    )
    seed: LMSeedConfig = LMSeedConfig()
    steps_per_epoch: int | Literal["auto"] = Field(
        20, description="optimizer steps of one trial epoch; auto: lm.epoch_device_s seconds at the worker's ceiling"
    )
    epoch_device_s: float = Field(
        10.0, gt=0, le=3600, description="steps_per_epoch auto: an epoch's seconds at the worker's measured ceiling"
    )
    eval_windows: int = Field(32, ge=1, le=1 << 16, description="validation sequences every evaluation uses")
    learning_rate: float = Field(3e-3, gt=0, le=1)
    warmup_fraction: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0, le=1)
    batch_size: int = Field(32, ge=1, le=1 << 16, description="sequences per step (default trial)")
    seq_len: int = Field(128, ge=2, le=32_768, description="tokens per sequence (default trial)")
    hpo_learning_rate: tuple[float, float] = (3e-4, 1e-2)
    hpo_warmup_fraction: tuple[float, float] = (0.0, 0.2)
    hpo_weight_decay: tuple[float, float] = (1e-4, 0.3)
    hpo_batch_sizes: list[int] = [16, 32, 64]
    hpo_seq_lens: list[int] = [64, 128]
    max_batch_tokens: int = Field(
        16_384, ge=2, le=1 << 24, description="sequences x tokens of one step at most (what a device holds)"
    )
    max_blocks: int = Field(12, ge=1, le=1024)
    max_params: int = Field(20_000_000, ge=1, le=10**12)
    max_train_flops_per_token: float = Field(2e8, gt=0, le=1e15, description="training FLOPs per token at context")

    @field_validator("steps_per_epoch")
    @classmethod
    def _steps(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 1 << 20:
            raise ValueError("must be 'auto' or an integer from 1 to 1,048,576")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LMConfig:
        for name in ("hpo_learning_rate", "hpo_warmup_fraction", "hpo_weight_decay"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: low {lo} exceeds high {hi}")
        if not self.hpo_batch_sizes or not self.hpo_seq_lens:
            raise ValueError("hpo_batch_sizes and hpo_seq_lens must not be empty")
        if min(self.hpo_batch_sizes) < 1 or max(self.hpo_batch_sizes) > 1 << 16:
            raise ValueError("hpo_batch_sizes must hold integers from 1 to 65,536")
        if min(self.hpo_seq_lens) < 2 or max(self.hpo_seq_lens) > 32_768:
            raise ValueError("hpo_seq_lens must hold integers from 2 to 32,768")
        if self.batch_size * self.seq_len > self.max_batch_tokens:
            raise ValueError(
                f"batch_size x seq_len ({self.batch_size * self.seq_len:,}) exceeds max_batch_tokens"
                f" ({self.max_batch_tokens:,})"
            )
        if min(self.hpo_batch_sizes) * max(self.hpo_seq_lens) > self.max_batch_tokens:
            raise ValueError("the smallest hpo_batch_sizes times the longest hpo_seq_lens exceeds max_batch_tokens")
        return self


class Config(_Section):
    run: RunConfig = RunConfig()
    dataset: DatasetConfig = DatasetConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    hpo: HpoConfig = HpoConfig()
    search: SearchConfig = SearchConfig()
    cluster: ClusterConfig = ClusterConfig()
    lm: LMConfig = LMConfig()
    rules: RulesConfig = RulesConfig()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @model_validator(mode="after")
    def _epochs_sized_by_a_ceiling(self) -> Config:
        if self.lm.steps_per_epoch == "auto" and self.cluster.ceiling_s == 0:
            raise ValueError(
                "lm.steps_per_epoch auto sizes epochs by the workers' ceiling: cluster.ceiling_s must not be 0"
            )
        return self

    @property
    def family(self) -> Literal["image", "language"]:
        """What the run searches: image classifiers, or transformer language models (its dataset decides)."""
        return "language" if self.dataset.name in LANGUAGE_DATASETS else "image"


def _key_text(part: object) -> str:
    """A key as it appears in a message: itself when short and printable, else an excerpt."""
    if isinstance(part, str) and part.isprintable() and len(part) <= 40:
        return part
    return excerpt(part)


def _format_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(_key_text(p) for p in err["loc"] if not str(p).startswith("function-after"))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = err.get("input")
    if err["type"] != "extra_forbidden" and not isinstance(got, dict) and got is not None:
        msg = f"{msg} (got {excerpt(got)})"
    return f"config error: {loc or 'top level'}: {msg}"


def _builtin_path(name: str) -> Path | None:
    """The packaged ``aiperf/configs/<name>.yaml`` (shipped in the wheel; ``configs/`` in a checkout links to it)."""
    if name not in BUILTIN_CONFIGS:
        return None
    packaged = resources.files("aiperf") / "configs" / f"{name}.yaml"
    return Path(str(packaged)) if packaged.is_file() else None


class _Refused(yaml.YAMLError):
    """A YAML construct a config may not use (anchors, aliases, deep nesting)."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors or aliases and with bounded nesting.

    Aliases are how a few hundred bytes expand into gigabytes ("billion laughs"); a config
    never needs them, so they are refused where they appear, before anything is built.
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int | yaml.Node | None) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused("anchors and aliases (&name, *name) are not allowed in a config", event.start_mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise _Refused(f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_yaml(text: str) -> object:
    """Parse one YAML document with :class:`ConfigLoader` (any YAML value); errors are ``yaml.YAMLError``.

    The constructors of timestamps and integers raise ``ValueError`` on out-of-range input
    (``2024-13-45``, an integer of 10,000 digits); those are reported as YAML errors too.
    """
    loader = ConfigLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError:
        raise
    except (ValueError, OverflowError, RecursionError):
        raise _Refused(
            "a value cannot be represented (an impossible date, or an integer of more than 4,300 digits)", None
        ) from None
    finally:
        loader.dispose()


def _shown(path: str | Path) -> str:
    """A path for a message: as given when printable, else an escaped excerpt (one line, always)."""
    text = os.fspath(path)
    return text if text.isprintable() and len(text) <= 4096 else excerpt(text, 200)


def _read_text(path: Path) -> str:
    """The file's text, read only if it is a regular file of at most ``MAX_CONFIG_BYTES``.

    Opened non-blocking, so a FIFO given as a config is refused instead of hanging the command.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise AiperfError(f"config error: {_shown(path)}: no such file") from None
    except OSError as exc:
        raise AiperfError(f"config error: {_shown(path)}: cannot read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise AiperfError(f"config error: {_shown(path)}: is a folder, not a config file")
        if not stat.S_ISREG(info.st_mode):
            raise AiperfError(f"config error: {_shown(path)}: not a regular file (a pipe, device or socket)")
        if info.st_size > MAX_CONFIG_BYTES:
            raise AiperfError(
                f"config error: {_shown(path)}: too large for a config "
                f"({info.st_size:,} bytes; at most {MAX_CONFIG_BYTES:,})"
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise AiperfError(f"config error: {_shown(path)}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise AiperfError(
            f"config error: {_shown(path)}: too large for a config (more than {MAX_CONFIG_BYTES:,} bytes)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AiperfError(f"config error: {_shown(path)}: not a text (UTF-8) file") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    if isinstance(exc, _Refused):
        return f"{where}: {exc.problem}" if where else exc.problem
    return f"{where} is not valid YAML" if where else "not valid YAML"


def _read_yaml(path: Path) -> dict[str, object]:  # a config document, not validated yet
    text = _read_text(path)
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise AiperfError(f"config error: {_shown(path)}: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AiperfError(f"config error: {_shown(path)}: the top level must be a mapping of sections")
    if data and not any(isinstance(k, str) and k in Config.model_fields for k in data):
        # Quoting an unknown key here could print a line of an unrelated file (--config /etc/shadow).
        raise AiperfError(
            f"config error: {_shown(path)}: not an aiperf config (no top-level key is a config section: "
            f"{', '.join(Config.model_fields)})"
        )
    return data


def _parse_override_value(key: str, raw: str) -> object:
    if len(raw) > MAX_OVERRIDE_CHARS:
        raise AiperfError(f"config error: --set {key}: value too long ({len(raw):,} characters)")
    if not raw.strip():
        return None
    try:
        return parse_yaml(raw)
    except _Refused as exc:
        raise AiperfError(f"config error: --set {key}: {exc.problem}") from None
    except yaml.YAMLError:
        return raw  # not YAML (``--set run.name=a: b``): the text itself


def _apply_override(data: dict[str, object], item: str) -> None:
    if "=" not in item:
        raise AiperfError(f"config error: --set {excerpt(item)}: expected key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    shown = _key_text(key.strip())
    if not all(parts):
        raise AiperfError(f"config error: --set {excerpt(item)}: empty key")
    value = _parse_override_value(shown, raw)
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise AiperfError(f"config error: {shown}: {_key_text(p)} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a config file (or a built-in name such as ``smoke``) and apply ``key=value`` overrides."""
    if path is None:
        path = DEFAULT_CONFIG
    candidate = Path(path)
    try:
        exists = candidate.exists()
    except OSError as exc:  # a name too long, a loop in the path
        raise AiperfError(f"config error: {_shown(path)}: cannot read ({exc.strerror})") from None
    if not candidate.suffix and not exists:
        builtin = _builtin_path(str(path))
        if builtin is None:
            raise AiperfError(
                f"config error: {excerpt(str(path), 80)}: no such file or built-in config "
                f"(built-in: {', '.join(BUILTIN_CONFIGS)})"
            )
        candidate = builtin
    data = _read_yaml(candidate)
    for item in overrides:
        _apply_override(data, item)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise AiperfError(_format_error(exc)) from None


def config_from_dict(data: Mapping[str, object]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise AiperfError(_format_error(exc)) from None
