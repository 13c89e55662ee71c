"""Run configuration: YAML files (built-ins in ``aiperf/configs/``) validated into typed sections.

Validation is strict (unknown keys are errors) and every problem is reported as one line
naming the dotted key, e.g. ``config error: train.batch_size: must be >= 1 (got 0)``.
``--set key=value`` overrides parse ``value`` as YAML, so ``--set train.epochs=3`` and
``--set dataset.shape=[32,32,3]`` work as expected.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from aiperf.errors import AiperfError
from nas.defaults import DEFAULT_HPARAMS, HPARAM_RANGES, SEARCH

DEFAULT_CONFIG = "default"
BUILTIN_CONFIGS = ("default", "smoke", "imagenet", "fashion_mnist", "synthetic")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    name: str = "default"
    organization: str = Field("unspecified", description="who ran it (MLPerf-style log: submission_org)")
    time_budget_s: float = Field(300.0, gt=0, description="search time; trials still running then are stopped")
    max_trials: int | None = Field(None, ge=1, description="stop proposing after this many trials")
    seed: int = Field(0, ge=0)
    results_dir: str = "results"
    progress_interval_s: float = Field(5.0, gt=0)
    telemetry_interval_s: float = Field(5.0, gt=0)
    grace_s: float = Field(0.0, ge=0, description="after the budget, wait this long for running epochs to end")
    stop_after_failures: int = Field(
        5,
        ge=1,
        description="stop the run (failed) when this many trials in a row fail with the same error, on as many"
        " workers, with no epoch completing in between",
    )


class SyntheticConfig(_Section):
    shape: tuple[PositiveInt, PositiveInt, PositiveInt] = (32, 32, 3)
    classes: int = Field(10, ge=2, le=100_000)
    train_size: int = Field(10_000, ge=1)
    val_size: int = Field(2_000, ge=1)


class DatasetConfig(_Section):
    name: Literal["mnist", "digits", "fashion_mnist", "cifar10", "image_folder", "tfrecord", "synthetic"] = "mnist"
    path: str | None = Field(None, description="folder or file for fashion_mnist, cifar10, image_folder and tfrecord")
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    split_seed: int = Field(0, ge=0)
    image_size: tuple[PositiveInt, PositiveInt] | None = Field(
        None, description="resize images to (height, width) (image_folder, tfrecord)"
    )
    max_train_images: int | None = Field(None, ge=1, description="use at most this many training images")
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
        1, ge=0, description="tfrecord: subtracted from image/class/label (TensorFlow's ImageNet tooling: 1..1000)"
    )
    shuffle_buffer: int = Field(
        8192, ge=1, description="tfrecord: records in each worker's shuffle buffer (shards are read in sequence)"
    )
    synthetic: SyntheticConfig = SyntheticConfig()

    @field_validator("decode_threads")
    @classmethod
    def _positive_threads(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
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
    max_batch_size: int = Field(512, ge=1)
    learning_rate: float = Field(DEFAULT_HPARAMS["learning_rate"], gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(DEFAULT_HPARAMS["weight_decay"], ge=0, le=1)
    dropout: float = Field(DEFAULT_HPARAMS["dropout"], ge=0, lt=1)
    kernel_size: Literal[1, 3, 5, 7] = DEFAULT_HPARAMS["kernel_size"]
    eval_batch_size: int = Field(512, ge=1)

    @field_validator("batch_size")
    @classmethod
    def _positive_batch(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
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
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError("batch_sizes must be a non-empty list of positive integers")
        if not self.kernel_sizes:
            raise ValueError("kernel_sizes must not be empty")
        return self


class SearchConfig(_Section):
    strategy: Literal["bayesian", "random"] = SEARCH.strategy
    retune_fraction: float = Field(
        SEARCH.retune_fraction, ge=0, le=1, description="share of trials that re-tune a good architecture"
    )
    ucb_beta: float = Field(SEARCH.ucb_beta, ge=0)
    max_morphs_per_child: int = Field(SEARCH.max_morphs_per_child, ge=1, le=10)
    max_layers: int = Field(60, ge=1, description="weighted layers (conv, depthwise, dense)")
    max_params: int = Field(5_000_000, ge=1)
    max_flops_per_image: float = Field(2e9, gt=0, description="training FLOPs per image")
    gp_window: int = Field(SEARCH.gp_window, ge=8, description="observations the GP is fitted on (best + newest)")
    candidates: int = Field(SEARCH.candidates, ge=1, description="candidate architectures scored per acquisition")


class ClusterConfig(_Section):
    address: str | None = Field(None, description="Ray cluster to join; default: RAY_ADDRESS or a new local one")
    placement: Literal["per_accelerator", "per_node", "fractional"] = "per_accelerator"
    trials_per_accelerator: int = Field(2, ge=1, le=64, description="fractional placement: trials sharing a GPU")
    cpus_per_trial: int | Literal["auto"] = "auto"
    max_concurrent_trials: int | None = Field(None, ge=1)
    max_nodes: int | None = Field(None, ge=1, description="use at most this many nodes (head first); scaling studies")
    min_concurrent_trials: int = Field(2, ge=1, description="CPU-only runs oversubscribe cores to reach this")
    keep_weights: int = Field(64, ge=1, description="trained weight sets the master keeps for inheritance")
    max_trial_retries: int = Field(2, ge=0)
    checkpoint_every_epoch: bool = Field(True, description="send weights to the master after every epoch")
    queue_depth: int = Field(2, ge=1, le=4, description="trials queued per worker (>1 hides the master round trip)")


class RulesConfig(_Section):
    min_accuracy: float = Field(0.95, ge=0, le=1, description="best validation top-1 needed for a valid run")
    official_min_duration_s: float = Field(3600.0, ge=0, description="shorter runs are labelled unofficial")
    min_precision_bits: int = Field(16, ge=8)


class Config(_Section):
    run: RunConfig = RunConfig()
    dataset: DatasetConfig = DatasetConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    hpo: HpoConfig = HpoConfig()
    search: SearchConfig = SearchConfig()
    cluster: ClusterConfig = ClusterConfig()
    rules: RulesConfig = RulesConfig()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _format_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = err.get("input")
    if err["type"] != "extra_forbidden" and not isinstance(got, dict) and got is not None:
        msg = f"{msg} (got {got!r})"
    return f"config error: {loc or 'top level'}: {msg}"


def _builtin_path(name: str) -> Path | None:
    """The packaged ``aiperf/configs/<name>.yaml`` (shipped in the wheel; ``configs/`` in a checkout links to it)."""
    if name not in BUILTIN_CONFIGS:
        return None
    packaged = resources.files("aiperf") / "configs" / f"{name}.yaml"
    return Path(str(packaged)) if packaged.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise AiperfError(f"config error: {path}: no such file") from None
    except OSError as exc:
        raise AiperfError(f"config error: {path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise AiperfError(f"config error: {path}:{where} is not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise AiperfError(f"config error: {path}: the top level must be a mapping of sections")
    return data


def _apply_override(data: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise AiperfError(f"config error: --set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise AiperfError(f"config error: --set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise AiperfError(f"config error: {key}: {p} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a config file (or a built-in name such as ``smoke``) and apply ``key=value`` overrides."""
    if path is None:
        path = DEFAULT_CONFIG
    candidate = Path(path)
    if not candidate.suffix and not candidate.exists():
        builtin = _builtin_path(str(path))
        if builtin is None:
            raise AiperfError(
                f"config error: {path}: no such file or built-in config (built-in: {', '.join(BUILTIN_CONFIGS)})"
            )
        candidate = builtin
    data = _read_yaml(candidate)
    for item in overrides:
        _apply_override(data, item)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise AiperfError(_format_error(exc)) from None


def config_from_dict(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise AiperfError(_format_error(exc)) from None
