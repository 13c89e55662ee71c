"""The official workload end to end: `aiperf run --config imagenet` streaming a generated ImageNet
tree (folder and TFRecord shards, every installed backend), and runs that cannot train failing loudly."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, aiperf_cmd, cli_env

from aiperf.ledger.store import read_raw_ledger

pytestmark = pytest.mark.slow

STREAMED = [
    "dataset.storage=stream",
    "dataset.image_size=[32,32]",
    "dataset.max_bad_fraction=0.05",
    "model.seed_architecture=small_resnet",  # ResNet-50 takes minutes per epoch on 2 cores
    "model.width=8",
    "train.batch_size=16",
    "hpo.batch_sizes=[16,32]",
    "train.epochs_per_trial=2",
    "hpo.epochs=[1,2]",
    "run.max_trials=2",
    "cluster.max_concurrent_trials=1",  # one worker (a TensorFlow start-up less): the input path is under test
    "run.time_budget_s=120",
    "run.progress_interval_s=5",
]


def aiperf_run(results: Path, *overrides: str, env: dict | None = None, timeout: float = 400):
    args = ["run", "--config", "imagenet", "--set", f"run.results_dir={results}"]
    for item in overrides:
        args += ["--set", item]
    t0 = time.monotonic()
    proc = subprocess.run(
        aiperf_cmd(*args), capture_output=True, text=True, env=env or cli_env(), cwd=REPO, timeout=timeout
    )
    return proc, time.monotonic() - t0


def only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def manifest(tree: Path) -> dict:
    return json.loads((tree / "aiperf-dataset.json").read_text())


def check_streamed_run(run_dir: Path, tree: Path, stdout: str) -> list[dict]:
    """What every streamed run must show: trained epochs, counted ops, measured waits, skipped images."""
    records = read_raw_ledger(run_dir)
    m = manifest(tree)
    epochs = [r for r in records if r["type"] == "epoch"]
    assert epochs and sum(r["ops"] for r in epochs) > 0, "no epoch was trained"
    bad_train = sum(1 for b in m["bad"] if b.startswith("train/"))
    bad_val = len(m["bad"]) - bad_train
    for r in epochs:
        assert r["input"] == "stream"
        assert 0 < r["train_images"] <= m["train_images"] - bad_train and r["train_images"] % r["batch_size"] == 0
        assert r["eval_images"] == m["val_images"] - bad_val, "every decodable validation image, once"
        assert r["skipped_images"] == len(m["bad"])
        assert 0.0 <= r["data_wait_s"] <= r["train_s"]
    named = [f for r in records if r["type"] == "bad_images" for f in r["files"]]
    assert len(named) == len(set(named)) == len(m["bad"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["score"]["total_ops"] > 0
    assert summary["bad_images"]["count"] == len(m["bad"])
    assert summary["input"]["storage"] == "stream" and summary["input"]["wait_fraction"] is not None
    assert "input pipeline" in stdout and "% of step time waiting (streamed" in stdout
    assert f"bad images           {len(m['bad'])} skipped" in stdout
    assert records[0]["dataset"]["census"]["files"] > 0
    verify = subprocess.run(aiperf_cmd("verify", str(run_dir)), capture_output=True, text=True, env=cli_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return records


def test_imagenet_config_streams_a_generated_folder(imagenet_tree, tmp_path):
    proc, _ = aiperf_run(tmp_path, f"dataset.path={imagenet_tree}", *STREAMED)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = check_streamed_run(only_run(tmp_path), imagenet_tree, proc.stdout)
    bad = {f for r in records if r["type"] == "bad_images" for f in r["files"]}
    assert bad == set(manifest(imagenet_tree)["bad"]), "the skipped files are named as they are in the folder"
    report = (only_run(tmp_path) / "report.html").read_text()
    assert "Input pipeline" in report and "Skipped images" in report


def test_imagenet_config_streams_tfrecord_shards(imagenet_tree, tmp_path):
    proc, _ = aiperf_run(tmp_path, "dataset.name=tfrecord", f"dataset.path={imagenet_tree / 'tfrecord'}", *STREAMED)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = check_streamed_run(only_run(tmp_path), imagenet_tree, proc.stdout)
    assert records[0]["dataset"]["name"] == "tfrecord" and records[0]["dataset"]["label_offset"] == 1


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_imagenet_config_streams_on_the_other_backends(imagenet_tree, tmp_path, backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    proc, _ = aiperf_run(tmp_path, f"dataset.path={imagenet_tree}", *STREAMED, f"model.backend={backend}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_streamed_run(only_run(tmp_path), imagenet_tree, proc.stdout)


def test_too_many_undecodable_images_stop_the_run(tmp_path):
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(classes=2, train_per_class=20, val_per_class=4, max_side=24, min_side=8,
                                         quirks=False, bad=4))  # fmt: skip
    results = tmp_path / "results"
    proc, _ = aiperf_run(results, f"dataset.path={tree}", *STREAMED, "dataset.max_bad_fraction=0.01")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("aiperf: error: the run failed: ")
    assert "images cannot be decoded" in lines[0] and "max_bad_fraction=0.01" in lines[0] and "bad_" in lines[0]
    run_dir = only_run(results)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["bad_images"]["count"] >= 2
    assert any(r["type"] == "bad_images" and r["over_limit"] for r in read_raw_ledger(run_dir))
    assert "failed because" in proc.stdout


def test_a_folder_smaller_than_every_batch_size_trains_every_trial(tmp_path):
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(classes=2, train_per_class=8, val_per_class=2, max_side=24, min_side=8,
                                         quirks=False, bad=1))  # fmt: skip
    results = tmp_path / "results"
    proc, _ = aiperf_run(results, f"dataset.path={tree}", *STREAMED, "hpo.batch_sizes=[64,128]", "train.batch_size=32")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 17 training files (one truncated), 21 in all: 0.05 of them (1) may be skipped, so a batch of 16 always fills.
    assert (
        "hpo.batch_sizes 64, 128 and the plan's batch size 32 cannot be filled by the 16 training images" in proc.stderr
    )
    assert "every epoch surely delivers (17 in the split" in proc.stderr
    assert "trials use batch sizes 16 (default 16)" in proc.stderr
    records = check_streamed_run(only_run(results), tree, proc.stdout)
    starts = [r for r in records if r["type"] == "trial_start"]
    ends = [r for r in records if r["type"] == "trial_end"]
    assert len(starts) == 2 and {r["hparams"]["batch_size"] for r in starts} == {16}
    assert [r["status"] for r in ends] == ["completed"] * 2
    assert {r["batch_size"] for r in records if r["type"] == "epoch"} == {16}


def _delete_when_trials_start(tmp_path: Path, folder: Path) -> dict:
    """An environment whose workers delete ``folder`` as each trial starts: after the dataset was indexed
    and every node was checked to see it, as when a class folder is removed during a run."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import shutil\n"
        "import aiperf.families.image.trainer as trainer\n"
        "original = trainer.TrialRunner.run\n"
        "def run(self, spec, *args, **kwargs):\n"
        f"    shutil.rmtree({str(folder)!r}, ignore_errors=True)\n"
        "    return original(self, spec, *args, **kwargs)\n"
        "trainer.TrialRunner.run = run\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return env


def test_a_class_folder_deleted_mid_run_is_missing_not_undecodable(tmp_path):
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    tree = tmp_path / "tree"
    generate_imagenet(tree, GenerateSpec(classes=3, train_per_class=8, val_per_class=2, max_side=24, min_side=8,
                                         quirks=False, bad=1))  # fmt: skip
    gone = tree / "train" / "n00000002"
    results = tmp_path / "results"
    env = _delete_when_trials_start(tmp_path, gone)
    proc, _ = aiperf_run(results, f"dataset.path={tree}", *STREAMED, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "warning" not in ln]
    assert len(lines) == 1 and lines[0].startswith("aiperf: error: the run failed: "), lines
    assert re.search(r"\d+ of 31 images are missing \(deleted since the run began: train/n00000002/", lines[0])
    assert "cannot be decoded (train/n00000002" not in lines[0] and "max_bad_fraction=0.05" in lines[0]
    run_dir = only_run(results)
    records = read_raw_ledger(run_dir)
    bad = [r for r in records if r["type"] == "bad_images"]
    named = {f for r in bad for f in r["files"]}
    missing = {f for r in bad for f in r["missing"]}
    assert missing and missing == {f for f in named if f.startswith("train/n00000002/")}
    assert "train/n00000001/bad_0_truncated.JPEG" not in missing, "a damaged file is not a missing one"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["bad_images"]["missing"] == len(missing)
    assert summary["verdict"]["valid"] is False  # a failed run is never valid (rule "recorded end")
    (end,) = [r for r in summary["verdict"]["rules"] if r["name"] == "recorded end"]
    assert not end["passed"] and end["summary"].startswith("the run ended failed: ")


def test_a_backend_missing_on_the_head_is_refused_at_once(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text('import sys\nsys.modules["jax"] = None  # as if jax were not installed\n')
    env = cli_env()
    env["PYTHONPATH"] = f"{blocker}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "smoke", "--set", "model.backend=jax", "--set", f"run.results_dir={tmp_path}/r"),
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model.backend=jax" in lines[0] and "jax package is not installed" in lines[0]
    assert not (tmp_path / "r").exists(), "nothing was started, nothing written"


def test_workers_that_cannot_start_fail_the_run_long_before_its_budget(tmp_path):
    broken = tmp_path / "site" / "jax"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError(\"No module named 'jax' (a broken install, for a test)\")\n")
    env = cli_env()
    env["PYTHONPATH"] = f"{broken.parent}:{env['PYTHONPATH']}"  # the head finds a jax; the workers cannot import it
    results = tmp_path / "r"
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "smoke", "--set", "model.backend=jax", "--set", f"run.results_dir={results}",
                   "--set", "run.time_budget_s=600"),
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the run failed: no worker could start: worker w000" in lines[0]
    assert " on node " in lines[0] and "No module named 'jax'" in lines[0]
    records = read_raw_ledger(only_run(results))
    failed = [r for r in records if r["type"] == "worker_failed"]
    assert len(failed) == 2 and all(r["node"] and r["hostname"] and "jax" in r["cause"] for r in failed)
    stop = records[-1]
    assert stop["type"] == "run_stop" and stop["status"] == "failed"
    assert stop["t"] < 300, "stopped long before its 600 s budget"
    assert json.loads((only_run(results) / "summary.json").read_text())["status"] == "failed"


def test_trials_failing_the_same_way_fail_the_run(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import aiperf.families.image.trainer as trainer\n"
        "def run(self, spec, *args, **kwargs):\n"
        "    raise RuntimeError('simulated deterministic failure in trial ' + spec.trial_id)\n"
        "    yield\n"
        "trainer.TrialRunner.run = run\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    results = tmp_path / "r"
    proc = subprocess.run(
        aiperf_cmd("run", "--config", "smoke", "--set", f"run.results_dir={results}", "--set", "run.time_budget_s=600"),
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and re.search(
        r"the first \d+ trials all failed with the same error; the last on worker w000", lines[0]
    )
    assert "RuntimeError: simulated deterministic failure" in lines[0] and " on node " in lines[0]
    records = read_raw_ledger(only_run(results))
    assert records[-1]["status"] == "failed" and records[-1]["t"] < 300, "failed long before its 600 s budget"
    assert sum(r["type"] == "trial_end" and r["status"] == "failed" for r in records) >= 5


def test_a_node_that_does_not_see_the_dataset_is_named(imagenet_tree, tmp_path):
    from aiperf.cluster.dataset_check import check_nodes_see_dataset
    from aiperf.cluster.ray_session import start_ray
    from aiperf.cluster.resources import cluster_nodes
    from aiperf.config import DatasetConfig
    from aiperf.datasets import load_dataset
    from aiperf.errors import AiperfError

    tree = tmp_path / "tree"
    shutil.copytree(imagenet_tree, tree)
    dataset = load_dataset(DatasetConfig(name="image_folder", path=str(tree), image_size=[8, 8], storage="stream"))
    session = start_ray(num_cpus=1)
    try:
        nodes = cluster_nodes(probe=False)
        census = dataset.meta["census"]
        check_nodes_see_dataset(nodes, "image_folder", dataset.source, census)  # the node sees what the head saw
        next((tree / "train").rglob("*.JPEG")).unlink()  # now it sees one file fewer
        with pytest.raises(AiperfError) as excinfo:
            check_nodes_see_dataset(nodes, "image_folder", dataset.source, census)
        message = str(excinfo.value)
        assert f"sees {census['files'] - 1:,} files in {tree}, the head saw {census['files']:,}" in message
        assert message.startswith("node ") and "every node must see the same dataset" in message
        shutil.rmtree(tree)
        with pytest.raises(AiperfError, match=r"does not see the dataset: image_folder: folder .* not found"):
            check_nodes_see_dataset(nodes, "image_folder", dataset.source, census)
    finally:
        session.shutdown()


def test_resident_runs_measure_data_wait_too(smoke_run):
    run_dir, proc = smoke_run
    epochs = [r for r in read_raw_ledger(run_dir) if r["type"] == "epoch"]
    assert epochs and all(r["input"] == "memory" and 0.0 <= r["data_wait_s"] <= r["train_s"] for r in epochs)
    assert "% of step time waiting (resident arrays)" in proc.stdout
